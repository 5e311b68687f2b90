"""`feedlog console`: read-only web pages over feeds and tables (feedlog.console; the `console` extra)."""

from __future__ import annotations

import argparse

from .args import Subcommands, add_command


def cmd_console(ns: argparse.Namespace) -> None:
    from ..console.serve import run

    run(ns)


def register(sub: Subcommands) -> None:
    from ..console.serve import arguments

    p = add_command(sub, "console", cmd_console, "serve read-only web pages over feeds and tables (the console extra)")
    p.description = (
        "Read-only pages a person looks at: the feeds (key, type, length, timestamp policy, last write, "
        "verification), one feed (entries newest first, a key's history, an entry's proof as JSON, the activity "
        "of `feedlog activity` and recent events), the tables (history with in-commit timestamps and the feed "
        "ranges each commit landed, the audit on demand, maintenance state, the owner's commits not yet "
        "backfilled). Loopback by default; beyond it, TLS and a token."
    )
    arguments(p)
