"""Every error kind crosses a real gRPC call and comes back as itself, with its fields."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from feedlog import errors, rpc
from feedlog.clock import ClockWentBackwards
from feedlog_server.rpc import abort

SERVICE = "feedlog.test.Errors"


def instance(kind: type[errors.FeedlogError]) -> errors.FeedlogError:
    if kind is errors.StaleLength:
        return errors.StaleLength("the feed has length 7, the append expected 5", current_length=7)
    if kind is errors.ResourceExhausted:
        return errors.ResourceExhausted("write rate limit reached", retry_after=2.5)
    return kind(f"a {kind.__name__} for the test")


#: what the server raises, by request: a kind of feedlog.errors, or one defined elsewhere
RAISED: dict[str, errors.FeedlogError] = {name: instance(kind) for name, kind in rpc.KINDS.items()} | {
    "ClockWentBackwards": ClockWentBackwards("the clock went backwards"),
}


@pytest.fixture(scope="module")
def channel() -> Iterator[grpc.Channel]:
    def raise_(request: bytes, context: grpc.ServicerContext) -> bytes:
        name = request.decode()
        if name == "untyped":  # a server that sends no kind (another implementation, an older peer)
            context.set_trailing_metadata(((rpc.LENGTH_METADATA, "9"),))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "stale")
        if name == "contradicting":  # a kind that does not match the status code is not believed
            context.set_trailing_metadata(((rpc.KIND_METADATA, "NotFound"),))
            context.abort(grpc.StatusCode.DATA_LOSS, "bad bytes")
        abort(context, RAISED[name])
        return b""

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(raise_)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Raise": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ch = rpc.open_channel(f"127.0.0.1:{port}")
    try:
        yield ch
    finally:
        ch.close()
        server.stop(0).wait(5)


def call(channel: grpc.Channel, name: str) -> errors.FeedlogError:
    try:
        channel.unary_unary(f"/{SERVICE}/Raise")(name.encode(), timeout=10)
    except grpc.RpcError as e:
        return rpc.error_of(e, "peer")
    raise AssertionError(f"{name}: the call succeeded")


def test_the_kinds_are_every_error_class_of_the_library() -> None:
    assert {"ReadOnly", "Conflict", "StaleLength", "Fork", "Unauthenticated", "FeedlogError"} <= set(rpc.KINDS)
    assert "ClockWentBackwards" not in rpc.KINDS  # defined elsewhere: travels as its nearest kind


@pytest.mark.parametrize("name", sorted(rpc.KINDS))
def test_every_kind_comes_back_as_itself(channel: grpc.Channel, name: str) -> None:
    sent = RAISED[name]
    got = call(channel, name)
    assert type(got) is type(sent)
    assert str(got) == f"peer: {sent}"
    assert rpc.status_of(got) == rpc.status_of(sent)


def test_the_fields_of_a_kind_come_back(channel: grpc.Channel) -> None:
    stale = call(channel, "StaleLength")
    assert isinstance(stale, errors.StaleLength) and stale.current_length == 7
    limited = call(channel, "ResourceExhausted")
    assert isinstance(limited, errors.ResourceExhausted) and limited.retry_after == 2.5


def test_read_only_and_a_stale_length_share_a_status_but_not_a_kind(channel: grpc.Channel) -> None:
    read_only, stale = call(channel, "ReadOnly"), call(channel, "StaleLength")
    assert rpc.status_of(read_only) == rpc.status_of(stale) == grpc.StatusCode.FAILED_PRECONDITION
    assert isinstance(read_only, errors.ReadOnly) and not isinstance(read_only, errors.Conflict)
    assert isinstance(stale, errors.Conflict)


def test_a_kind_defined_elsewhere_travels_as_its_nearest_library_kind(channel: grpc.Channel) -> None:
    assert type(call(channel, "ClockWentBackwards")) is errors.InvalidArgument


def test_a_status_without_a_kind_falls_back_to_its_code(channel: grpc.Channel) -> None:
    stale = call(channel, "untyped")
    assert isinstance(stale, errors.StaleLength) and stale.current_length == 9
    assert type(call(channel, "contradicting")) is errors.Corruption


def test_typed_fields_survive_pickling() -> None:
    for err in (RAISED["StaleLength"], RAISED["ResourceExhausted"]):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and vars(back) == vars(err)


def test_generated_tokens_never_start_with_a_dash() -> None:
    """Peer write tokens and owner table tokens come from `new_token`; one in 64 random ones starts
    with '-', which a command line reads as an option (`--token -x...`)."""
    tokens = [rpc.new_token(32) for _ in range(5000)]
    assert not any(t.startswith("-") for t in tokens) and len(set(tokens)) == len(tokens)
    assert len(rpc.new_token(24)) == 32 and len(rpc.new_token(32)) == 43  # base64 of 24 and 32 bytes


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    from feedlog.errors import printable

    assert printable("a\nb\r\x1b[2J\x07\x7f\x9b\u2028c") == "a\\nb\\r\\x1b[2J\\x07\\x7f\\x9b\\u2028c"
    assert printable("tab\tand é ü 日本") == "tab\tand é ü 日本"  # what is not a control stays
    assert printable("ok\u202egnp.exe\u2066") == "ok\\u202egnp.exe\\u2066"  # no reordering of the line
