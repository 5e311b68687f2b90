"""`feedlog prove FEED SEQ` and `feedlog check-proof FILE`: an entry's proof as a file anyone can check.

`prove` writes the proof of one block (feedlog.log.proofs: the block, its Merkle path, the roots
and the signed tree state) as JSON; the console offers the same document for download.
`check-proof` needs only that file and the feed key the reader trusts: no feed, no peer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from ..errors import Corruption, InvalidArgument, NotFound, PermissionDenied, printable
from .args import Subcommands, add_command, seq_number
from .fmt import Json, emit, fmt_ts, json_line

#: the largest proof file read (a block is at most 8 MiB, twice that as hex, plus the path)
MAX_PROOF_BYTES = 20 << 20


def cmd_prove(ns: argparse.Namespace) -> None:
    from ..lake.feeds import FeedSource
    from ..log.proofs import proof_json

    if ns.seq == 0:
        raise InvalidArgument("seq 0 is the feed header; prove an entry (seq 1 or more)")
    src = FeedSource.parse(ns.path)
    doc = proof_json(src.proof(ns.seq), src.key)
    if ns.out is None:
        print(json_line(doc))
        return
    tmp = f"{ns.out}.{os.getpid()}.tmp"  # the file appears whole or not at all
    try:
        with open(tmp, "w") as f:
            f.write(json_line(doc) + "\n")
        os.replace(tmp, ns.out)
    except OSError as e:
        raise InvalidArgument(f"--out {ns.out}: {e.strerror}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    if not ns.quiet:
        print(f"proof of seq {ns.seq} of feed {src.key_hex} written to {ns.out}", file=sys.stderr)


def read_proof_file(name: str) -> object:
    try:
        if name == "-":
            text = sys.stdin.buffer.read(MAX_PROOF_BYTES + 1)
        else:
            with open(name, "rb") as f:
                text = f.read(MAX_PROOF_BYTES + 1)
    except FileNotFoundError:
        raise NotFound(f"{name}: no such file") from None
    except IsADirectoryError:
        raise InvalidArgument(f"{name}: is a directory, not a proof file") from None
    except PermissionError:
        raise PermissionDenied(f"{name}: permission denied") from None
    if len(text) > MAX_PROOF_BYTES:
        raise InvalidArgument(f"{name}: larger than any proof ({MAX_PROOF_BYTES:,} bytes)")
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidArgument(f"{name}: not JSON") from None


def cmd_check_proof(ns: argparse.Namespace) -> int:
    from ..log.entries import decode_record, record_json
    from ..log.merkle import verify_proof
    from ..log.proofs import proof_from_json

    proof, named = proof_from_json(read_proof_file(ns.file))
    trusted = named
    if ns.key is not None:
        try:
            trusted = bytes.fromhex(ns.key)
        except ValueError:
            trusted = b""
        if len(trusted) != 32:
            raise InvalidArgument(f"--key {ns.key!r} is not a feed key (64 hex digits)")
        if trusted != named:
            raise Corruption(f"the proof names feed {named.hex()}, not the key given ({trusted.hex()})")
    verify_proof(proof, trusted)
    # the entry as `cat --json` shows it; the type is not in a proof: hyperdb's entry is the default
    try:
        entry = record_json(decode_record("entry", proof.seq, proof.block), 0)
    except Corruption:
        entry = None
    data: dict[str, Json] = {
        "ok": True,
        "key": trusted.hex(),
        "trusted": ns.key is not None,
        "seq": proof.seq,
        "signed_length": proof.state.length,
        "entry": entry,
    }

    def human() -> None:
        print(f"ok: seq {proof.seq} is in the tree of length {proof.state.length} signed by {trusted.hex()}")
        if ns.key is None:
            print("note: no --key given; checked against the key the file names (this proves what that key")
            print("      signed, not whose key it is)")
        if entry is not None and "key" in entry:
            value = entry.get("value")
            shown = (
                "(deleted)"
                if entry.get("deleted")
                else bytes.fromhex(value).decode("utf-8", "replace")
                if value
                else "-"
            )
            print(f"entry: {printable(str(entry['key']))} = {printable(shown)} at {fmt_ts(entry.get('timestamp'))}")

    emit(ns, data, human)
    return 0


def register(sub: Subcommands) -> None:
    p = add_command(sub, "prove", cmd_prove, "write an entry's proof (block, Merkle path, signed root) as JSON")
    p.add_argument("path", help="a feed directory, or grpc://HOST:PORT/KEY (the peer's proof is checked first)")
    p.add_argument("seq", type=seq_number)
    p.add_argument("--out", metavar="FILE", help="write it to FILE (default: stdout, one line)")
    p.add_argument("-q", "--quiet", action="store_true", help="no note on stderr")

    p = add_command(sub, "check-proof", cmd_check_proof, "check a proof file from `prove` or the console")
    p.add_argument("file", help="the proof (JSON), or - for stdin")
    p.add_argument("--key", metavar="KEY", help="the feed key you trust (64 hex); default: the key the file names")
    p.add_argument("--json", action="store_true", help="machine-readable output")
