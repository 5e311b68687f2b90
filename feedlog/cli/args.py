"""What the `feedlog` command modules share to declare and read arguments.

The parser whose usage mistakes are one line, the type of the subcommand table
each module's `register` fills, and the readers of secrets given on the command
line (a token file, a flag, an environment variable).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeAlias

from ..errors import InvalidArgument


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line, not a usage dump.

    The line is the command's one error form once printed (`feedlog: error: ...`),
    naming the subcommand and where its help is:
    `feedlog: error: table create: the following arguments are required: --schema (see feedlog table create --help)`.
    """

    def error(self, message: str) -> NoReturn:
        raise UsageError(usage_text(self.prog, message))


def usage_text(prog: str, message: str) -> str:
    """A usage mistake of the command `prog` (`feedlog table create`), without the `feedlog: error:` prefix."""
    sub = prog.partition(" ")[2]
    return f"{sub + ': ' if sub else ''}{message} (see {prog} --help)"


#: a command: parsed arguments in, its exit code out (None: 0)
Handler: TypeAlias = Callable[[argparse.Namespace], int | None]
#: the subcommands of a parser, which each command module's `register` adds to
Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"


def add_command(sub: Subcommands, name: str, handler: Handler, help_: str) -> Parser:
    """A subcommand running `handler`, with `help_` as its one-line help and its description."""
    p = sub.add_parser(name, help=help_, description=help_)
    p.set_defaults(handler=handler)
    return p


def seq_number(text: str) -> int:
    """An argument naming a position in a feed: a whole number, 0 or more (a usage mistake otherwise)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seq {text!r}: a whole number, 0 or more") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"invalid seq {text!r}: a seq is 0 or more")
    return n


def storage_option_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="an object-store option, delta-rs's keys (e.g. AWS_ENDPOINT_URL=http://127.0.0.1:9000, "
        "AWS_ALLOW_HTTP=true); repeatable; the usual environment variables fill in the rest",
    )


def storage_options_of(ns: argparse.Namespace) -> dict[str, str] | None:
    """--storage-option KEY=VALUE ... as a dict (None when none was given); a malformed one is InvalidArgument."""
    from ..delta.objectstore import parse_storage_options

    return parse_storage_options(getattr(ns, "storage_option", None))


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
        raise InvalidArgument(f"cannot read token file {path}: {getattr(e, 'strerror', None) or e}") from None
    if not words:
        raise InvalidArgument(f"token file {path} is empty")
    return words[0]
