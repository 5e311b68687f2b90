"""The `feedlog` command: parse, call the library, print, map errors to exit codes.

Human text by default, `--json` for machines. A user mistake prints one line
on stderr and exits non-zero; tracebacks are for bugs only.

One module per group of commands (feed_cmds, peer_cmds, table_cmds,
owner_cmds, lake_cmds), sharing the argument helpers (args), output (fmt)
and the way to a peer (remote); `serve` and `owner serve` are the server
package's (`feedlog_server.serve`).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import NoReturn, TextIO

from .. import errors
from .args import Handler, Parser, UsageError

EXIT_USAGE = 2


def build_parser() -> Parser:
    from . import feed_cmds, insight_cmds, lake_cmds, owner_cmds, peer_cmds, table_cmds

    parser = Parser(
        prog="feedlog",
        description="Signed, timestamped, append-only feeds (hypercore-compatible Merkle log).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    feed_cmds.register(sub)
    peer_cmds.register(sub)
    table_cmds.register(sub)
    owner_cmds.register(sub)
    lake_cmds.register(sub)
    insight_cmds.register(sub)
    return parser


def _one_line_warnings() -> Callable[..., None]:
    """feedlog's own warnings as one `feedlog: warning:` line each on stderr (once per text)."""
    seen: set[str] = set()
    fallback = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if not category.__module__.startswith("feedlog"):
            fallback(message, category, filename, lineno, file, line)
            return
        text = " ".join(str(message).split())
        if text not in seen:
            seen.add(text)
            print(f"feedlog: warning: {text}", file=sys.stderr)

    return show


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC core logs at INFO when Spark's launcher forks beside its threads; keep the CLI's stderr for
    # errors. Set before the commands' modules load grpc (build_parser).
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
        ns = parser.parse_args(args)
        handler: Handler = ns.handler
        with warnings.catch_warnings():
            warnings.simplefilter("always", UserWarning)
            warnings.showwarning = _one_line_warnings()
            return handler(ns) or 0
    except UsageError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    except errors.FeedlogError as e:
        print(f"feedlog: error: {e}", file=sys.stderr)
        return errors.exit_code(e)
    except KeyboardInterrupt:
        print("feedlog: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `feedlog cat ... | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:
        print(f"feedlog: error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1


def entrypoint() -> NoReturn:
    sys.exit(main())
