"""`feedlog owner serve`: the commit owner for managed Delta tables, as a gRPC service."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from ..errors import InvalidArgument


def cmd_serve(ns: argparse.Namespace) -> None:
    from feedlog_server.app import ServerTls
    from feedlog_server.events import configure
    from feedlog_server.owner import OwnerServer
    from feedlog_server.rpc import require_tls_off_loopback, serve_forever

    if (ns.tls_cert is None) != (ns.tls_key is None):
        raise InvalidArgument("--tls-cert and --tls-key go together")
    if ns.client_ca and not ns.tls_cert:
        raise InvalidArgument("--client-ca (mutual TLS) needs --tls-cert and --tls-key")
    tls = ServerTls.from_files(ns.tls_cert, ns.tls_key, ns.client_ca) if ns.tls_cert else None
    require_tls_off_loopback(ns.listen, tls, ns.insecure)  # table tokens travel in every commit's metadata
    server = OwnerServer(ns.db, ns.listen, roots=ns.root or None, tls=tls)  # bad arguments fail here
    configure(logging.DEBUG if ns.verbose else logging.INFO)
    serve_forever(server)


def register(sub: Any) -> None:
    owner = sub.add_parser("owner", help="the commit owner of managed Delta tables", description=__doc__)
    osub = owner.add_subparsers(dest="owner_command", metavar="COMMAND", parser_class=type(owner))
    osub.required = True
    p = osub.add_parser(
        "serve",
        help="serve the commit owner (gRPC) until SIGTERM",
        description="Ratify and backfill commits of managed Delta tables; state in one SQLite file.",
    )
    p.set_defaults(handler=cmd_serve)
    p.add_argument("--db", required=True, metavar="FILE", help="the owner's SQLite database (created if missing)")
    p.add_argument("--listen", default="127.0.0.1:7070", metavar="HOST:PORT", help="default 127.0.0.1:7070")
    p.add_argument(
        "--root",
        action="append",
        metavar="DIR",
        help="tables must live under this directory (repeatable; default: the current directory)",
    )
    p.add_argument("--tls-cert", metavar="FILE", help="server certificate (PEM): serve TLS")
    p.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    p.add_argument("--client-ca", metavar="FILE", help="require client certificates signed by this CA (mutual TLS)")
    p.add_argument(
        "--insecure", action="store_true", help="allow a --listen beyond loopback without TLS (tokens in the clear)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
