"""The `feedlog` command: parse, call the library, print, map errors to exit codes.

Human text by default, `--json` for machines (one JSON document per line). A
user mistake prints one line on stderr, `feedlog: error: ...` (argparse's usage
mistakes too), and exits with its kind's code (`feedlog.errors.EXIT_CODES`; a
missing file is 3, like any NotFound); tracebacks are for bugs only.

One module per group of commands (feed_cmds, peer_cmds, table_cmds,
owner_cmds, lake_cmds), sharing the argument helpers (args), output (fmt)
and the way to a peer (remote); `serve` and `owner serve` are the server
package's (`feedlog_server.serve`).
"""

from __future__ import annotations

import errno
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import NoReturn, TextIO

from .. import errors, extras
from ..leave import leave
from .args import Handler, Parser, UsageError
from .fmt import error_line, interrupted_line

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
#: an OS error's exit code: the FeedlogError kind it amounts to (anything else: 1)
OS_EXIT_CODES = {
    errno.ENOENT: 3,  # NotFound
    errno.ENOTDIR: 3,
    errno.EISDIR: 2,  # InvalidArgument: a directory where a file was expected
    errno.EEXIST: 4,  # AlreadyExists
    errno.EACCES: 7,  # PermissionDenied
    errno.EPERM: 7,
    errno.EROFS: 7,
}


def build_parser() -> Parser:
    from ..version import __version__
    from . import (
        console_cmds,
        feed_cmds,
        fork_cmds,
        insight_cmds,
        lake_cmds,
        owner_cmds,
        peer_cmds,
        proof_cmds,
        table_cmds,
    )

    parser = Parser(
        prog="feedlog",
        description="Signed, timestamped, append-only feeds (hypercore-compatible Merkle log).",
        epilog="Errors are one line on stderr, `feedlog: error: ...`, and exit with their kind: 2 invalid input, "
        "3 not found, 4 already exists, 5 corruption or bad signature, 6 conflict, 7 read-only or not permitted, "
        "8 unavailable, 9 unsupported, 1 anything else, 130 interrupted. Long work reports progress on stderr "
        "(a bar on a terminal, else a line every 5 s, $FEEDLOG_PROGRESS_EVERY); --quiet or --json turn it off.",
    )
    parser.add_argument("--version", action="version", version=f"feedlog {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    feed_cmds.register(sub)
    proof_cmds.register(sub)
    peer_cmds.register(sub)
    table_cmds.register(sub)
    owner_cmds.register(sub)
    lake_cmds.register(sub)
    insight_cmds.register(sub)
    console_cmds.register(sub)
    fork_cmds.register(sub)
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
        print(error_line(e), file=sys.stderr)
        return EXIT_USAGE
    except errors.FeedlogError as e:
        print(error_line(e), file=sys.stderr)
        return errors.exit_code(e)
    except ModuleNotFoundError as e:
        # an optional part (Spark, plotting, the foreign readers) that this install lacks
        missing = extras.missing_extra(e)
        if missing is None:
            raise
        print(error_line(missing), file=sys.stderr)
        return errors.exit_code(missing)
    except KeyboardInterrupt:
        print(interrupted_line(), file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `feedlog cat ... | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:
        print(error_line(os_error_text(e)), file=sys.stderr)
        return OS_EXIT_CODES.get(e.errno or 0, 1)


def os_error_text(e: OSError) -> str:
    """`FILE: No such file or directory`: the file first, as the other errors name their subject first."""
    what = e.strerror or str(e)
    return f"{e.filename}: {what}" if e.filename else what


def entrypoint() -> NoReturn:
    # The command is done and has said everything: leave without the interpreter's shutdown (leave.py)
    leave(main())
