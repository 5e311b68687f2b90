"""The `feedlog` command: parse, call the library, print, map errors to exit codes.

Human text by default, `--json` for machines. A user mistake prints one line
on stderr and exits non-zero; tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from .. import errors

# gRPC core logs at INFO when Spark's launcher forks beside its threads; keep the CLI's stderr for errors
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

#: the one place library errors become exit codes (most specific first)
EXIT_CODES: tuple[tuple[type[errors.FeedlogError], int], ...] = (
    (errors.InvalidArgument, 2),
    (errors.NotFound, 3),
    (errors.AlreadyExists, 4),
    (errors.SignatureError, 5),
    (errors.Corruption, 5),
    (errors.Conflict, 6),
    (errors.ReadOnly, 7),
    (errors.PermissionDenied, 7),
    (errors.Unavailable, 8),
    (errors.Unsupported, 9),
)
EXIT_USAGE = 2


def exit_code(err: errors.FeedlogError) -> int:
    for kind, code in EXIT_CODES:
        if isinstance(err, kind):
            return code
    return 1


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see --help)")


Handler = Callable[[argparse.Namespace], int | None]


def given_token(ns: argparse.Namespace, env: str) -> str | None:
    """A secret from --token-file, --token (warned about: `ps` shows it) or the variable `env`, in that order."""
    if getattr(ns, "token_file", None):
        return read_token_file(ns.token_file)
    if getattr(ns, "token", None):
        print(
            "feedlog: warning: --token is visible to every user of this machine (ps); use --token-file", file=sys.stderr
        )
        return str(ns.token)
    return os.environ.get(env) or None


def read_token_file(path: str) -> str:
    """The token in a file: its first word."""
    try:
        words = Path(path).read_text().split()
    except (OSError, UnicodeDecodeError) as e:
        raise errors.InvalidArgument(f"cannot read token file {path}: {getattr(e, 'strerror', None) or e}") from None
    if not words:
        raise errors.InvalidArgument(f"token file {path} is empty")
    return words[0]


def emit(ns: argparse.Namespace, data: Any, human: Callable[[], None] | str | None = None) -> None:
    """Print `data` as JSON with --json, else the human form."""
    if getattr(ns, "json", False):
        print(json.dumps(data, sort_keys=False))
    elif callable(human):
        human()
    elif human is not None:
        print(human)


def build_parser() -> Parser:
    from . import feed_cmds, lake_cmds, owner_cmds, peer_cmds, table_cmds

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
        return exit_code(e)
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
