"""`feedlog owner serve`: the commit owner for managed Delta tables, as a gRPC service."""

from __future__ import annotations

from feedlog_server.serve import OWNER_HELP, owner_arguments, serve_owner

from .args import Parser, Subcommands


def register(sub: Subcommands) -> None:
    owner = sub.add_parser("owner", help="the commit owner of managed Delta tables", description=__doc__)
    osub = owner.add_subparsers(dest="owner_command", metavar="COMMAND", parser_class=Parser)
    osub.required = True
    p = osub.add_parser("serve", help="serve the commit owner (gRPC) until SIGTERM", description=OWNER_HELP)
    p.set_defaults(handler=serve_owner)
    owner_arguments(p)
