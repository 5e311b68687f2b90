"""What every feedlog gRPC client and server shares: addresses, channels, credentials, and the one map
between library errors and status codes.

Both services use it (the `Feeds` peers of `feedlog.replication` and the commit owner of
`feedlog.delta.managed`), as do the servers in `feedlog_server`; it imports nothing of feedlog but
`errors`, so neither half depends on the other to talk gRPC.

Errors cross the wire without losing their kind. The status code is the coarse, standard meaning
(`STATUS_OF`); trailing metadata names the exact kind (`feedlog-error: ReadOnly`) and carries the
fields a kind has (a stale append's current length, a rate limit's retry-after), and `error_of`
raises that kind again. A status without the name (gRPC's own, such as DEADLINE_EXCEEDED or a
failed connection, or a server that does not send it) becomes the code's kind (`ERROR_OF`).
"""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc

from . import errors

SCHEME = "grpc://"
#: a client channel's send and receive limit unless it asks for another receive limit
MAX_MESSAGE_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class Address:
    """`grpc://HOST:PORT[/KEY]`: a peer, and optionally a feed on it (key hex, or a name the peer knows)."""

    target: str
    feed: str | None = None

    @classmethod
    def parse(cls, url: str, *, need_feed: bool = False) -> Address:
        if not url.startswith(SCHEME):
            raise errors.InvalidArgument(f"{url!r}: expected grpc://HOST:PORT{'/KEY' if need_feed else ''}")
        rest = url[len(SCHEME) :]
        target, _, feed = rest.partition("/")
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise errors.InvalidArgument(f"{url!r}: expected grpc://HOST:PORT with a port number")
        if need_feed and not feed:
            raise errors.InvalidArgument(f"{url!r}: name a feed: grpc://HOST:PORT/KEY")
        return cls(target, feed or None)

    @property
    def key(self) -> bytes:
        """The feed key named by the address (64 hex digits)."""
        try:
            key = bytes.fromhex(self.feed or "")
        except ValueError:
            key = b""
        if len(key) != 32:
            raise errors.InvalidArgument(f"{self.feed!r} is not a feed key (64 hex digits)")
        return key

    def __str__(self) -> str:
        return f"{SCHEME}{self.target}" + (f"/{self.feed}" if self.feed else "")


@dataclass(frozen=True, slots=True)
class Tls:
    """TLS for a client: the CA that signed the peer's certificate, and our own cert for mutual TLS."""

    ca: bytes
    cert: bytes | None = None
    key: bytes | None = None

    @classmethod
    def from_files(cls, ca: str, cert: str | None = None, key: str | None = None) -> Tls:
        if (cert is None) != (key is None):
            raise errors.InvalidArgument("a client certificate needs its key, and a key its certificate")
        try:
            return cls(
                Path(ca).read_bytes(),
                Path(cert).read_bytes() if cert else None,
                Path(key).read_bytes() if key else None,
            )
        except OSError as e:
            raise errors.InvalidArgument(f"cannot read TLS file: {e}") from None


#: what a client's connection takes in ahead of what it has read, per stream: a loopback clone runs as fast
#: with it as with gRPC's bandwidth-probed window (`python tools/bench/bench_peers.py --replication`: 0.52x
#: both), and a reader under a flood grows ~70 MB instead of 83-95 (158 MB once, on a loaded machine)
RECEIVE_WINDOW_BYTES = 256 << 10


def channel_options(
    max_message_bytes: int = MAX_MESSAGE_BYTES, max_receive: int | None = None
) -> list[tuple[str, int]]:
    """`max_receive` (default `max_message_bytes`): a reader's is its budget plus one block."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_receive or max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # a fixed receive window: gRPC otherwise grows it from measured bandwidth x round trip, and a
        # loaded machine's slow round trips let a flooding peer park tens of MB more in a reader
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", RECEIVE_WINDOW_BYTES),
    ]


def open_channel(target: str, tls: Tls | None = None, *, max_receive: int | None = None) -> grpc.Channel:
    options = channel_options(max_receive=max_receive)
    if tls is None:
        return grpc.insecure_channel(target, options=options)
    creds = grpc.ssl_channel_credentials(tls.ca, tls.key, tls.cert)
    return grpc.secure_channel(target, creds, options=options)


def is_loopback(listen: str) -> bool:
    """Whether `listen` (HOST:PORT) binds only this machine: 127.0.0.0/8, ::1 or localhost."""
    host = listen.rpartition(":")[0].strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name, empty (all interfaces), ...: assume the network can reach it
        return False


def client_key(host: str) -> str:
    """Whom a connection counts against (pure): an IPv4 address, or an IPv6 address's /64 (one
    machine commonly has a whole /64 to pick source addresses from)."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def new_token(nbytes: int = 32) -> str:
    """`nbytes` random bytes as URL-safe text that never starts with '-': a command line would take
    `--token -x...` for an option (one token in 64 did, and `table backfill --token` failed with a
    usage error). For peer write tokens and commit-owner table tokens alike."""
    while (token := secrets.token_urlsafe(nbytes)).startswith("-"):
        pass
    return token


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    """Call metadata carrying a peer write token (server/auth.py), None without one."""
    if token is None:
        return None
    token = token.strip()
    if not token or not token.isascii() or not token.isprintable() or " " in token:
        raise errors.InvalidArgument("a write token is printable ASCII without spaces")
    return (("authorization", f"Bearer {token}"),)


# ---- errors as status codes, and back --------------------------------------------------------------

#: library error -> status code (most specific first)
STATUS_OF: tuple[tuple[type[errors.FeedlogError], grpc.StatusCode], ...] = (
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    # a signature that does not verify: the writer is not the key holder
    (errors.SignatureError, grpc.StatusCode.UNAUTHENTICATED),
    # a peer that holds a fork proof refuses to go past the fork point (issue 40): the feed's state, not
    # damaged data; GetInfo carries the proof
    (errors.Fork, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.Corruption, grpc.StatusCode.DATA_LOSS),
    # the state is not what the call needs (a stale length; a feed whose secret key is elsewhere):
    # the kind in the trailers tells the two apart
    (errors.Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.ReadOnly, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.Unsupported, grpc.StatusCode.UNIMPLEMENTED),
)

#: status code -> library error, for a status that does not name its kind
ERROR_OF: dict[grpc.StatusCode, type[errors.FeedlogError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: errors.InvalidArgument,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.InvalidArgument,
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.ALREADY_EXISTS: errors.AlreadyExists,
    grpc.StatusCode.UNAUTHENTICATED: errors.SignatureError,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    grpc.StatusCode.DATA_LOSS: errors.Corruption,
    grpc.StatusCode.FAILED_PRECONDITION: errors.Conflict,
    grpc.StatusCode.ABORTED: errors.Conflict,
    grpc.StatusCode.UNIMPLEMENTED: errors.Unsupported,
}

#: every kind of `feedlog.errors` by name: what the kind trailer may name
KINDS: dict[str, type[errors.FeedlogError]] = {
    name: kind
    for name, kind in vars(errors).items()
    if isinstance(kind, type) and issubclass(kind, errors.FeedlogError) and kind.__module__ == errors.__name__
}

#: trailing metadata naming the error's kind (a class of `feedlog.errors`)
KIND_METADATA = "feedlog-error"
#: trailing metadata key carrying the feed's current length on a stale append (`errors.StaleLength`)
LENGTH_METADATA = "feedlog-length"
#: trailing metadata telling a missing credential (UNAUTHENTICATED) from a bad signature (also UNAUTHENTICATED)
AUTH_METADATA = ("feedlog-auth", "credentials")
#: trailing metadata on RESOURCE_EXHAUSTED from a rate limit: when to retry
RETRY_AFTER_METADATA = "retry-after-ms"


def status_of(err: errors.FeedlogError | type[errors.FeedlogError]) -> grpc.StatusCode:
    """The status code of an error (or of a kind)."""
    kind = err if isinstance(err, type) else type(err)
    for base, code in STATUS_OF:
        if issubclass(kind, base):
            return code
    return grpc.StatusCode.INTERNAL


def kind_name(err: errors.FeedlogError) -> str:
    """The name of the `feedlog.errors` kind `err` is (its nearest one, for a subclass defined elsewhere)."""
    for cls in type(err).__mro__:
        if KINDS.get(cls.__name__) is cls:
            return cls.__name__
    return errors.FeedlogError.__name__


def error_metadata(err: errors.FeedlogError) -> tuple[tuple[str, str], ...]:
    """Trailing metadata that lets `error_of` rebuild the precise error on the client."""
    md: list[tuple[str, str]] = [(KIND_METADATA, kind_name(err))]
    if isinstance(err, errors.Unauthenticated):
        md.append(AUTH_METADATA)
    if isinstance(err, errors.ResourceExhausted):
        md.append((RETRY_AFTER_METADATA, str(max(1, round(err.retry_after * 1000)))))
    if isinstance(err, errors.StaleLength):
        md.append((LENGTH_METADATA, str(err.current_length)))
    return tuple(md)


#: the most of a peer's status detail an error keeps
MAX_DETAIL = 4000


def error_of(err: grpc.RpcError, peer: str) -> errors.FeedlogError:
    """A typed library error for a failed call, naming the peer."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    detail = (err.details() if hasattr(err, "details") else None) or str(code)
    # the peer's words, shown as one line of at most a few thousand characters
    message = f"{peer}: {errors.printable(errors.shorten(detail, MAX_DETAIL))}"
    md = dict(_trailers(err))
    named = KINDS.get(str(md.get(KIND_METADATA, "")))
    # the name refines the code, never contradicts it: a kind of another status is ignored
    kind = named if named is not None and status_of(named) == code else _coarse_kind(code, detail, md)
    if issubclass(kind, errors.ResourceExhausted) and RETRY_AFTER_METADATA in md:
        return kind(message, retry_after=_int(md[RETRY_AFTER_METADATA], 1000) / 1000)
    if issubclass(kind, errors.StaleLength):
        length = _int(md.get(LENGTH_METADATA, ""), -1)
        return kind(message, current_length=length) if length >= 0 else errors.Conflict(message)
    return kind(message)


def _coarse_kind(code: grpc.StatusCode, detail: str, md: dict[str, str]) -> type[errors.FeedlogError]:
    """The kind of a status that does not name one (gRPC's own statuses, or an older server)."""
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if RETRY_AFTER_METADATA in md:
            return errors.ResourceExhausted
        if "message" not in detail.lower():
            # too many calls or streams at once ("Concurrent RPC limit exceeded!"): retry shortly
            return errors.ResourceExhausted
    if code == grpc.StatusCode.UNAUTHENTICATED and md.get(AUTH_METADATA[0]) == AUTH_METADATA[1]:
        return errors.Unauthenticated
    if code == grpc.StatusCode.FAILED_PRECONDITION and LENGTH_METADATA in md:
        return errors.StaleLength
    return ERROR_OF.get(code, errors.Unavailable)


def _int(text: str, default: int) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def _trailers(err: grpc.RpcError) -> Iterable[tuple[str, str]]:
    try:
        return [(str(k), v if isinstance(v, str) else v.decode("latin-1")) for k, v in err.trailing_metadata() or ()]
    except Exception:  # not a call (e.g. a channel error): no trailers
        return []
