"""`feedlog serve` and `feedlog owner serve`: what serving takes on the command line, and the server it runs.

The `feedlog` command registers these arguments and handlers (the CLI calls the
server package, never the reverse); `python -m feedlog_server ARGS` is
`feedlog serve ARGS` with nothing else of the command loaded (`main`).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from feedlog.errors import FeedlogError, InvalidArgument, Unavailable, exit_code
from feedlog.metrics import add_arguments as add_metrics_arguments
from feedlog.metrics import settings_of as metrics_settings

from .auth import TOKEN_ENV

if TYPE_CHECKING:  # the servers' modules load grpc: only once serving starts (main sets up gRPC first)
    from .app import ServerTls

PEER_HELP = "run a peer: host the feeds in --data over gRPC, follow feeds on other peers"
OWNER_HELP = "Ratify and backfill commits of managed Delta tables; state in one SQLite file."
EXIT_USAGE = 2


def _server_tls_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-cert", metavar="FILE", help="server certificate (PEM): serve TLS")
    p.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    p.add_argument("--client-ca", metavar="FILE", help="require client certificates signed by this CA (mutual TLS)")


def peer_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `feedlog serve`."""
    p.add_argument("--data", required=True, metavar="DIR", help="feeds live in DIR/<name>/ (created if missing)")
    p.add_argument("--listen", default="127.0.0.1:7000", metavar="HOST:PORT", help="default 127.0.0.1:7000")
    _server_tls_arguments(p)
    p.add_argument(
        "--follow", action="append", default=[], metavar="grpc://HOST:PORT/KEY", help="replicate a feed (repeatable)"
    )
    p.add_argument(
        "--gossip",
        action="append",
        default=[],
        metavar="grpc://HOST:PORT",
        help="exchange signed states of every hosted feed with this peer (repeatable; followed peers are "
        "gossiped with too): a key that signed two histories is caught as a fork proof",
    )
    p.add_argument("--gossip-every", default="1m", metavar="DURATION", help="gossip at least this often (default 1m)")
    p.add_argument("--tls-ca", metavar="FILE", help="CA of the peers in --follow and --gossip (TLS to them)")
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
    p.add_argument(
        "--max-streams-per-client",
        type=int,
        metavar="N",
        help="open streams of one client (an IP address; an IPv6 /64) at most (default: half of --max-streams)",
    )
    p.add_argument("--max-message-bytes", type=int, default=16 << 20, help="largest request accepted (16 MiB)")
    p.add_argument(
        "--max-feeds",
        type=int,
        default=1000,
        help="with --accept-new: unauthenticated pushes create no feed once this many are hosted (default 1000)",
    )
    p.add_argument(
        "--compact-every",
        default="1m",
        metavar="DURATION",
        help="clear expired payloads of every hosted and followed feed this often (default 1m; 0: never). "
        "Expired entries are never served either way; this bounds how long their bytes stay on disk",
    )
    add_metrics_arguments(p)
    p.add_argument("-v", "--verbose", action="store_true", help="debug-level events")


def compact_every(text: str) -> float:
    """`--compact-every` in seconds: a duration as `feedlog` writes them (30s, 1m, 1h), or 0 for never."""
    from feedlog.log.timestamps import parse_duration

    if re.fullmatch(r"0+(ms|s|m|h|d)?", text.strip()):
        return 0.0
    try:
        ms = parse_duration(text)
    except InvalidArgument as e:
        raise InvalidArgument(f"--compact-every {text!r}: {e}") from None
    if ms <= 0:
        raise InvalidArgument(f"--compact-every {text!r}: give a positive duration, or 0 to turn it off")
    return ms / 1000


def _gossip_every(text: str) -> float:
    """`--gossip-every` in seconds (issue 40): a positive duration (30s, 1m, 1h)."""
    from feedlog.log.timestamps import parse_duration

    try:
        ms = parse_duration(text)
    except InvalidArgument as e:
        raise InvalidArgument(f"--gossip-every {text!r}: {e}") from None
    if ms < 1000:
        raise InvalidArgument(f"--gossip-every {text!r}: give at least 1s")
    return ms / 1000


def owner_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `feedlog owner serve`."""
    p.add_argument(
        "--db",
        "--db-url",
        dest="db",
        required=True,
        metavar="FILE|URL",
        help="the owner's state: a SQLite file, or postgresql://USER@HOST:PORT/DBNAME that several owner "
        "processes may share (tables created if missing; give the password by PGPASSWORD or ~/.pgpass, "
        "not on the command line)",
    )
    p.add_argument("--listen", default="127.0.0.1:7070", metavar="HOST:PORT", help="default 127.0.0.1:7070")
    p.add_argument(
        "--root",
        action="append",
        metavar="DIR|URL",
        help="tables must live under this directory or object-store prefix, e.g. s3://lake/tables "
        "(repeatable; default: the current directory)",
    )
    p.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="the owner's own object-store option for its URL roots, delta-rs's keys (e.g. "
        "AWS_ENDPOINT_URL=http://127.0.0.1:9000); repeatable; the usual environment variables fill in the rest",
    )
    _server_tls_arguments(p)
    p.add_argument(
        "--insecure", action="store_true", help="allow a --listen beyond loopback without TLS (tokens in the clear)"
    )
    add_metrics_arguments(p)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def serve_peer(ns: argparse.Namespace) -> None:
    """Run a peer as `ns` (parsed by `peer_arguments`) says, until SIGTERM or SIGINT."""
    from feedlog.rpc import Address, Tls

    from .app import PeerServer
    from .auth import Rate, check_token, read_token_file, token_hash
    from .events import configure
    from .rpc import require_tls_off_loopback, serve_forever

    tls = _server_tls(ns)
    check_listen(ns.listen)  # first: a --listen without its port is not "reachable from other machines"
    require_tls_off_loopback(ns.listen, tls, ns.insecure)
    metrics = metrics_settings(ns)
    tokens: list[str] | None = None  # None: the peer generates one (unless --client-ca)
    if ns.write_token_file or os.environ.get(TOKEN_ENV):
        tokens = []
        if ns.write_token_file:
            tokens += ["sha256:" + h.hex() for h in read_token_file(ns.write_token_file)]
        if os.environ.get(TOKEN_ENV):
            tokens.append("sha256:" + token_hash(check_token(os.environ[TOKEN_ENV])).hex())
    write_rate, create_rate = Rate.parse(ns.write_rate), Rate.parse(ns.create_rate)
    every = compact_every(ns.compact_every)
    if ns.max_streams_per_client is not None and ns.max_streams_per_client < 1:
        raise InvalidArgument(f"--max-streams-per-client must be >= 1, got {ns.max_streams_per_client}")
    follow = [Address.parse(u, need_feed=True) for u in ns.follow]
    for a in follow:
        a.key  # noqa: B018 -- validates the key before the server starts
    gossip = [Address.parse(u) for u in ns.gossip]
    gossip_every = _gossip_every(ns.gossip_every)
    # TLS to the followed peers: their CA, and our own certificate for those that ask for one
    follow_tls = Tls.from_files(ns.tls_ca, ns.tls_cert, ns.tls_key) if ns.tls_ca else None
    configure(logging.DEBUG if ns.verbose else logging.INFO)
    serve_forever(
        PeerServer(
            ns.data,
            ns.listen,
            tls=tls,
            follow=follow,
            follow_tls=follow_tls,
            accept_new=ns.accept_new,
            write_tokens=tokens,
            write_rate=write_rate,
            create_rate=create_rate,
            max_streams=ns.max_streams,
            max_streams_per_client=ns.max_streams_per_client,
            max_message_bytes=ns.max_message_bytes,
            max_feeds=ns.max_feeds,
            compact_every=every,
            metrics=metrics,
            gossip=gossip,
            gossip_every=gossip_every,
        )
    )


def serve_owner(ns: argparse.Namespace) -> None:
    """Run the commit owner as `ns` (parsed by `owner_arguments`) says, until SIGTERM or SIGINT."""
    from .events import configure
    from .owner import OwnerServer
    from .rpc import require_tls_off_loopback, serve_forever

    tls = _server_tls(ns)
    check_listen(ns.listen)
    require_tls_off_loopback(ns.listen, tls, ns.insecure)  # table tokens travel in every commit's metadata
    metrics = metrics_settings(ns)
    from feedlog.delta.objectstore import parse_storage_options

    options = parse_storage_options(ns.storage_option)
    # bad arguments fail here
    server = OwnerServer(ns.db, ns.listen, roots=ns.root or None, tls=tls, storage_options=options, metrics=metrics)
    configure(logging.DEBUG if ns.verbose else logging.INFO)
    serve_forever(server)


def check_listen(listen: str) -> None:
    """Refuse a --listen that is not HOST:PORT, or whose port another process holds, before serving.

    gRPC would find out too, but only after logging its own line (`E... add_port.cc: Failed
    to add port`) and with a message pointing at GRPC_VERBOSITY: the operator gets
    one clean line instead. The probe binds as gRPC does (SO_REUSEADDR, no SO_REUSEPORT)
    and lets go at once; port 0 (any free port) needs no probe.
    """
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InvalidArgument(f"--listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:7000")
    if int(port) == 0:
        return
    try:
        addresses = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise InvalidArgument(f"--listen {listen}: cannot resolve {host!r}: {e.strerror}") from None
    failures: list[OSError] = []
    for family, kind, proto, _name, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
                return  # gRPC serves when one resolved address binds (localhost: 127.0.0.1 without ::1)
            except OSError as e:
                failures.append(e)
    codes = {e.errno for e in failures}
    if errno.EADDRINUSE in codes:
        raise Unavailable(
            f"cannot listen on {listen}: the port is in use by another process; stop it or give another --listen"
        )
    if errno.EADDRNOTAVAIL in codes:
        raise InvalidArgument(f"cannot listen on {listen}: not an address of this machine")
    if failures:
        raise Unavailable(f"cannot listen on {listen}: {failures[0].strerror}")


def _server_tls(ns: argparse.Namespace) -> ServerTls | None:
    from .app import ServerTls

    if (ns.tls_cert is None) != (ns.tls_key is None):
        raise InvalidArgument("--tls-cert and --tls-key go together")
    if ns.client_ca and not ns.tls_cert:
        raise InvalidArgument("--client-ca (mutual TLS) needs --tls-cert and --tls-key")
    return ServerTls.from_files(ns.tls_cert, ns.tls_key, ns.client_ca) if ns.tls_cert else None


# ---- python -m feedlog_server --------------------------------------------------------------------


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """A usage mistake is one line, as in the `feedlog` command (`feedlog: error: serve: ...`)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"serve: {message} (see {self.prog} --help)")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m feedlog_server ARGS`: `feedlog serve ARGS`, with its messages and exit codes."""
    # gRPC core logs at INFO when a process forks beside its threads; keep stderr for events and errors
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = _Parser(prog="feedlog serve", description=PEER_HELP)
    peer_arguments(parser)
    try:
        serve_peer(parser.parse_args(argv))
    except UsageError as e:
        print(f"feedlog: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except FeedlogError as e:
        print(f"feedlog: error: {e}", file=sys.stderr)
        return exit_code(e)
    except KeyboardInterrupt:
        print("feedlog: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        what = e.strerror or str(e)
        print(f"feedlog: error: {e.filename}: {what}" if e.filename else f"feedlog: error: {what}", file=sys.stderr)
        return 1
    return 0
