"""`feedlog verify-fork`: check a fork proof offline, with nothing but the feed key (issue 40)."""

from __future__ import annotations

import argparse

from ..log import forks
from ..replication import wire
from ..rpc import Address
from .args import Subcommands, add_command
from .fmt import emit


def witness_args(p: argparse.ArgumentParser) -> None:
    """`--witness grpc://HOST:PORT` (repeatable): peers whose signed state must agree with what is read."""
    p.add_argument(
        "--witness",
        action="append",
        default=[],
        metavar="grpc://HOST:PORT",
        help="cross-check the source's signed state with this peer's (repeatable): a key that signed two "
        "histories fails the command with a fork proof (exit 5)",
    )


def witnesses_of(ns: argparse.Namespace) -> list[Address]:
    return [Address.parse(u) for u in getattr(ns, "witness", None) or []]


def cmd_verify_fork(ns: argparse.Namespace) -> int:
    proof = forks.read(ns.proof)
    forks.verify(proof, wire.check_key(bytes.fromhex(ns.key)) if ns.key else None)
    emit(
        ns,
        {"valid": True, "key": proof.key.hex(), "fork_point": proof.fork_point, **forks.to_json(proof)},
        f"valid fork proof: {proof.describe()} (fork point {proof.fork_point})",
    )
    return 0


def _hex_key(text: str) -> str:
    try:
        if len(bytes.fromhex(text)) == 32:
            return text
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r} is not a 64-digit hex feed key")


def register(sub: Subcommands) -> None:
    p = add_command(
        sub,
        "verify-fork",
        cmd_verify_fork,
        "check a fork proof (two states a feed's key signed that cannot both hold) with nothing but the key",
    )
    p.add_argument("proof", metavar="PROOF.json")
    p.add_argument("--key", type=_hex_key, metavar="HEX", help="the feed the proof must be for (default: its own)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
