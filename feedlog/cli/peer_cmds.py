"""`feedlog serve|push|clone|pull|tail`, and the remote forms of create/put/del/info (grpc://HOST:PORT/KEY)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from ..errors import InvalidArgument, Unavailable
from ..log import entries
from ..log.feed import Write
from ..log.timestamps import parse_duration
from . import emit, given_token

REMOTE = "grpc://"


def is_remote(target: str) -> bool:
    return target.startswith(REMOTE)


#: the environment variable holding a peer write token (`feedlog serve` and the commands that write to a peer)
TOKEN_ENV = "FEEDLOG_PEER_TOKEN"


def tls_args(p: argparse.ArgumentParser, write: bool = False) -> None:
    g = p.add_argument_group("TLS to the peer")
    g.add_argument("--tls-ca", metavar="FILE", help="CA certificate that signed the peer's certificate (enables TLS)")
    g.add_argument("--tls-cert", metavar="FILE", help="our client certificate (mutual TLS)")
    g.add_argument("--tls-key", metavar="FILE", help="the key of --tls-cert")
    if write:
        g = p.add_argument_group("write credentials (remote targets; or a client certificate above)")
        g.add_argument("--token-file", metavar="FILE", help=f"the peer's write token (default: ${TOKEN_ENV}, if set)")
        g.add_argument("--token", help="the token itself (visible to other users in ps: prefer --token-file)")


def token_of(ns: argparse.Namespace) -> str | None:
    """The write token from --token-file, --token (warned about) or $FEEDLOG_PEER_TOKEN."""
    return given_token(ns, TOKEN_ENV)


def tls_of(ns: argparse.Namespace) -> Any:
    from ..rpc import Tls

    ca = getattr(ns, "tls_ca", None)
    if ca is None:
        if getattr(ns, "tls_cert", None) or getattr(ns, "tls_key", None):
            raise InvalidArgument("--tls-cert/--tls-key need --tls-ca")
        return None
    return Tls.from_files(ca, getattr(ns, "tls_cert", None), getattr(ns, "tls_key", None))


def client_for(ns: argparse.Namespace, url: str, need_feed: bool = True, write: bool = False) -> tuple[Any, Any]:
    from ..replication.client import FeedClient
    from ..rpc import Address

    address = Address.parse(url, need_feed=need_feed)
    tls, token = tls_of(ns), token_of(ns) if write else None
    warn_if_clear(address.target, tls, token)
    return address, FeedClient(address.target, tls=tls, token=token)


def warn_if_clear(target: str, tls: Any, token: str | None) -> None:
    from feedlog_server.rpc import is_loopback

    if token and tls is None and not is_loopback(target):
        print(f"feedlog: warning: sending the write token to {target} without TLS (--tls-ca)", file=sys.stderr)


# ---- remote forms of the feed commands ------------------------------------------------------


def remote_create(ns: argparse.Namespace) -> None:
    from ..replication import wire

    _address, client = client_for(ns, ns.path, need_feed=False, write=True)
    with client:
        info = wire.info_json(client.create(ns.type, str(ns.timestamps), ns.ttl or ""))
    emit(ns, info, f"created on {ns.path}\nkey {info['key']}")


def remote_put(ns: argparse.Namespace, deleted: bool) -> None:
    from .feed_cmds import appended_json, fmt_ts, parse_value

    address, client = client_for(ns, ns.path, write=True)
    with client:
        key = address.key
        if deleted:
            value: Any = None
        else:
            value = parse_value(client.info(key).content_type, ns.value, ns.hex)
        ttl = parse_duration(ns.ttl) if getattr(ns, "ttl", None) else None
        a = client.put(key, [Write(ns.key, value, deleted, ttl, ns.timestamps)])[0]
    emit(ns, appended_json(a), f"{a.seq}\t{fmt_ts(a.timestamp)}")


def remote_info(ns: argparse.Namespace) -> dict[str, Any]:
    from ..replication import wire

    address, client = client_for(ns, ns.path)
    with client:
        return wire.info_json(client.info(address.key))


# ---- replication commands ----------------------------------------------------------------------


def cmd_serve(ns: argparse.Namespace) -> None:
    from feedlog_server.app import PeerServer, ServerTls
    from feedlog_server.auth import Rate, check_token, read_token_file, token_hash
    from feedlog_server.events import configure
    from feedlog_server.rpc import require_tls_off_loopback, serve_forever

    from ..rpc import Address

    if (ns.tls_cert is None) != (ns.tls_key is None):
        raise InvalidArgument("--tls-cert and --tls-key go together")
    if ns.client_ca and not ns.tls_cert:
        raise InvalidArgument("--client-ca (mutual TLS) needs --tls-cert and --tls-key")
    tls = ServerTls.from_files(ns.tls_cert, ns.tls_key, ns.client_ca) if ns.tls_cert else None
    require_tls_off_loopback(ns.listen, tls, ns.insecure)
    tokens: list[str] | None = None  # None: the peer generates one (unless --client-ca)
    if ns.write_token_file or os.environ.get(TOKEN_ENV):
        tokens = []
        if ns.write_token_file:
            tokens += ["sha256:" + h.hex() for h in read_token_file(ns.write_token_file)]
        if os.environ.get(TOKEN_ENV):
            tokens.append("sha256:" + token_hash(check_token(os.environ[TOKEN_ENV])).hex())
    write_rate, create_rate = Rate.parse(ns.write_rate), Rate.parse(ns.create_rate)
    follow = [Address.parse(u, need_feed=True) for u in ns.follow]
    for a in follow:
        a.key  # noqa: B018 -- validates the key before the server starts
    configure(logging.DEBUG if ns.verbose else logging.INFO)
    serve_forever(
        PeerServer(
            ns.data,
            ns.listen,
            tls=tls,
            follow=follow,
            follow_tls=tls_of(ns),
            accept_new=ns.accept_new,
            write_tokens=tokens,
            write_rate=write_rate,
            create_rate=create_rate,
            max_streams=ns.max_streams,
            max_message_bytes=ns.max_message_bytes,
        )
    )


def cmd_push(ns: argparse.Namespace) -> None:
    from ..replication.sync import push
    from ..rpc import Address

    address = Address.parse(ns.url)
    tls, token = tls_of(ns), token_of(ns)
    warn_if_clear(address.target, tls, token)
    done = push(ns.path, address, tls=tls, token=token)
    emit(ns, {"pushed": done.blocks, "length": done.length}, f"pushed {done.blocks} blocks; the peer has {done.length}")


def cmd_clone(ns: argparse.Namespace) -> None:
    from ..replication.sync import clone
    from ..rpc import Address

    done = clone(Address.parse(ns.url, need_feed=True), ns.path, tls=tls_of(ns))
    emit(ns, {"fetched": done.blocks, "length": done.length}, f"cloned {done.length} blocks into {ns.path}")


def cmd_pull(ns: argparse.Namespace) -> None:
    from ..replication.sync import pull

    done = pull(ns.path, tls=tls_of(ns))
    emit(ns, {"fetched": done.blocks, "length": done.length}, f"fetched {done.blocks} blocks; length {done.length}")


def cmd_tail(ns: argparse.Namespace) -> None:
    from .feed_cmds import record_json, record_line

    if ns.from_ < 0:
        raise InvalidArgument("--from must be 0 or more")
    address, client = client_for(ns, ns.url)
    key = address.key
    shown = 0
    with client:
        content_type = client.info(key).content_type
        sub = client.subscribe(key, ns.from_, with_roots=True)
        try:
            for batch in sub.verified(key, ns.from_):
                for k, block in enumerate(batch.blocks):
                    seq = batch.start + k
                    if seq == 0:
                        continue
                    r = (
                        entries.cleared_record(seq)
                        if block is None
                        else entries.decode_record(content_type, seq, block)
                    )
                    if ns.json:
                        print(json_line(record_json(r, 0)), flush=True)
                    else:
                        print(record_line(r, 0), flush=True)
                    shown += 1
                    if ns.count is not None and shown >= ns.count:
                        return
            # a tail runs until interrupted: a peer that ends it (shutting down, or misbehaving) is not success
            raise Unavailable(f"{address.target}: the peer ended the tail after {shown} entries")
        finally:
            sub.cancel()


def json_line(obj: Any) -> str:
    import json

    return json.dumps(obj, separators=(",", ":"))


def register(sub: Any) -> None:
    def add(name: str, handler: Any, help_: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(handler=handler)
        return p

    p = add("serve", cmd_serve, "run a peer: host the feeds in --data over gRPC, follow feeds on other peers")
    p.add_argument("--data", required=True, metavar="DIR", help="feeds live in DIR/<name>/ (created if missing)")
    p.add_argument("--listen", default="127.0.0.1:7000", metavar="HOST:PORT", help="default 127.0.0.1:7000")
    p.add_argument("--tls-cert", metavar="FILE", help="server certificate (PEM): serve TLS")
    p.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    p.add_argument("--client-ca", metavar="FILE", help="require client certificates signed by this CA (mutual TLS)")
    p.add_argument(
        "--follow", action="append", default=[], metavar="grpc://HOST:PORT/KEY", help="replicate a feed (repeatable)"
    )
    p.add_argument("--tls-ca", metavar="FILE", help="CA of the peers in --follow (TLS to them)")
    p.add_argument(
        "--insecure", action="store_true", help="allow a --listen beyond loopback without TLS (tokens in the clear)"
    )
    p.add_argument(
        "--write-token-file",
        metavar="FILE",
        help=f"write tokens, one a line (or sha256:HEX of one); also ${TOKEN_ENV}. Neither, and no --client-ca: "
        "a token is generated into DATA/_peer/write-token",
    )
    p.add_argument(
        "--accept-new", action="store_true", help="let unauthenticated clients push feeds this peer does not host yet"
    )
    p.add_argument("--no-accept-new", action="store_true", help=argparse.SUPPRESS)  # the default now
    p.add_argument(
        "--write-rate",
        default="10000/s,20000",
        metavar="RATE",
        help="write requests per client (default 10000/s,20000)",
    )
    p.add_argument("--create-rate", default="1/s,20", metavar="RATE", help="new feeds per client (default 1/s,20)")
    p.add_argument(
        "--max-streams", type=int, default=64, help="open streams of any kind (reads, tails, pipelined appends) at most"
    )
    p.add_argument("--max-message-bytes", type=int, default=16 << 20, help="largest request accepted (16 MiB)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug-level events")

    p = add("push", cmd_push, "send a local feed's signed batches that the peer lacks")
    p.add_argument("path")
    p.add_argument("url", metavar="grpc://HOST:PORT")
    tls_args(p, write=True)
    p.add_argument("--json", action="store_true")

    p = add("clone", cmd_clone, "copy a feed from a peer, verifying every block and signature")
    p.add_argument("url", metavar="grpc://HOST:PORT/KEY")
    p.add_argument("path")
    tls_args(p)
    p.add_argument("--json", action="store_true")

    p = add("pull", cmd_pull, "fetch and verify new blocks from where the feed was cloned")
    p.add_argument("path")
    tls_args(p)
    p.add_argument("--json", action="store_true")

    p = add("tail", cmd_tail, "follow a feed on a peer live, verifying every block")
    p.add_argument("url", metavar="grpc://HOST:PORT/KEY")
    p.add_argument("--from", dest="from_", type=int, default=1, metavar="N", help="first seq (default 1)")
    p.add_argument("--count", type=int, metavar="N", help="stop after N entries (default: run until interrupted)")
    tls_args(p)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
