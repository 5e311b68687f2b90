"""`feedlog console`: its arguments, the checks before it listens, and the listener (uvicorn).

Loopback by default, like every feedlog listener. Beyond loopback it needs TLS (--tls-cert and
--tls-key, or --insecure to send pages in the clear) and a token (--token-file or
$FEEDLOG_CONSOLE_TOKEN): the pages show every entry of the feeds, so they are not for whoever
reaches the port (issue 39; `feedlog serve` makes the same demands of its writers). The
listener bounds what one client can hold: connections at once (`--max-connections`, 503
beyond, and `--max-connections-per-client` of them for one address), a deadline for each
request head (`--head-timeout`: an idle or trickling connection is closed, see
`connections`), a short keep-alive, small request heads (h11's limit), Starlette's thread
pool for the pages' reads, and one heavy page computed at a time (`pages`).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from ..errors import InvalidArgument
from .connections import HEAD_TIMEOUT_S, PER_CLIENT

#: the environment variable holding the console's token
TOKEN_ENV = "FEEDLOG_CONSOLE_TOKEN"
DEFAULT_LISTEN = "127.0.0.1:8080"


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="DIR",
        help="a feed directory, or a directory of feeds as `feedlog serve --data` keeps them (repeatable)",
    )
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="grpc://HOST:PORT/KEY",
        help="a feed on a peer, read and verified as it is shown (repeatable; a peer does not list its feeds)",
    )
    p.add_argument(
        "--table",
        action="append",
        default=[],
        metavar="TABLE",
        help="a Delta table directory or object-store URL (repeatable)",
    )
    p.add_argument(
        "--owner",
        action="append",
        default=[],
        metavar="OWNER",
        help="a commit owner to trust for managed tables, grpc://HOST:PORT or a database file "
        "(repeatable; default $FEEDLOG_OWNER): its ratified, not yet backfilled commits are shown",
    )
    p.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="object-store option for the tables (delta-rs's keys); repeatable",
    )
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help=f"default {DEFAULT_LISTEN}")
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="tokens a browser must give (HTTP Basic password, or Bearer), one a line or sha256:HEX; "
        f"also ${TOKEN_ENV}",
    )
    p.add_argument("--insecure", action="store_true", help="allow a --listen beyond loopback without TLS")
    p.add_argument(
        "--max-connections",
        type=int,
        default=64,
        metavar="N",
        help="connections served at once (default 64; more get 503)",
    )
    p.add_argument(
        "--max-connections-per-client",
        type=int,
        metavar="N",
        help=f"connections one client address (an IPv6 /64) may hold (default {PER_CLIENT}, "
        "at most half of --max-connections); more are closed",
    )
    p.add_argument(
        "--head-timeout",
        type=float,
        default=HEAD_TIMEOUT_S,
        metavar="SECONDS",
        help=f"a connection that has not sent a whole request within this long of opening, or of its "
        f"last answer, is closed (default {HEAD_TIMEOUT_S:g})",
    )


def token_hashes(ns: argparse.Namespace) -> list[bytes]:
    from feedlog_server.auth import check_token, read_token_file, token_hash

    hashes: list[bytes] = []
    if ns.token_file:
        hashes += read_token_file(ns.token_file)
    if os.environ.get(TOKEN_ENV):
        hashes.append(token_hash(check_token(os.environ[TOKEN_ENV])))
    return hashes


def check_exposure(listen: str, tls: bool, insecure: bool, tokens: list[bytes]) -> None:
    """Refuse a listener beyond loopback without TLS (unless --insecure) or without a token."""
    from feedlog_server.rpc import is_loopback, require_tls_off_loopback

    require_tls_off_loopback(listen, True if tls else None, insecure)
    if not is_loopback(listen) and not tokens:
        raise InvalidArgument(
            f"--listen {listen} is reachable from other machines: give --token-file FILE or ${TOKEN_ENV} "
            "(the pages show every entry of the feeds)"
        )


def bind(listen: str) -> socket.socket:
    """The listening socket (port 0: any free port), bound before the server starts so a taken
    port is one clean line and the address printed is the real one."""
    from feedlog_server.serve import check_listen

    check_listen(listen)
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    family, kind, proto, _name, address = socket.getaddrinfo(
        host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def run(ns: argparse.Namespace) -> None:
    """Serve the console as `ns` says until SIGINT or SIGTERM."""
    from ..delta.objectstore import parse_storage_options
    from ..extras import require

    for module in ("starlette", "uvicorn", "jinja2", "matplotlib"):
        require(module)  # a missing extra is named before anything else happens
    import uvicorn

    from . import catalog as catalog_mod
    from .connections import guarded_protocol, per_client_cap
    from .pages import create_app

    if (ns.tls_cert is None) != (ns.tls_key is None):
        raise InvalidArgument("--tls-cert and --tls-key go together")
    if ns.max_connections < 1:
        raise InvalidArgument("--max-connections must be at least 1")
    if ns.max_connections_per_client is not None and ns.max_connections_per_client < 1:
        raise InvalidArgument("--max-connections-per-client must be at least 1")
    if not 0 < ns.head_timeout <= 3600:
        raise InvalidArgument("--head-timeout must be more than 0 and at most 3600 seconds")
    tokens = token_hashes(ns)
    check_exposure(ns.listen, ns.tls_cert is not None, ns.insecure, tokens)
    owners = ns.owner or ([os.environ["FEEDLOG_OWNER"]] if os.environ.get("FEEDLOG_OWNER") else [])
    options = parse_storage_options(ns.storage_option) or {}
    cat = catalog_mod.build(ns.data, ns.peer, ns.table, owners, sorted(options.items()))
    app = create_app(cat, token_hashes=tokens)
    sock = bind(ns.listen)
    host, port = sock.getsockname()[:2]
    scheme = "https" if ns.tls_cert else "http"
    shown_host = f"[{host}]" if ":" in host else host
    print(
        f"console: serving {len(cat.feeds)} feed(s) and {len(cat.tables)} table(s) at {scheme}://{shown_host}:{port}/"
        + (" (a token is needed)" if tokens else ""),
        flush=True,
    )
    config = uvicorn.Config(
        app,
        ssl_certfile=ns.tls_cert,
        ssl_keyfile=ns.tls_key,
        http=guarded_protocol(ns.head_timeout, per_client_cap(ns.max_connections, ns.max_connections_per_client)),
        limit_concurrency=ns.max_connections,
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=16 * 1024,
        server_header=False,
        proxy_headers=False,
        lifespan="off",
        log_level="warning",
        access_log=False,
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
    print("console: stopped", file=sys.stderr)
