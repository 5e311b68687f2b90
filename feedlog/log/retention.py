"""Which payloads a copy of a feed may keep and serve: the one place that decides (issue 37).

Every copy asks the same question of an entry before it serves, stores,
refills or keeps its payload: compaction (`Feed.compact`, a peer's scheduled
`compact_step`), a peer building a Read or Subscribe message, a replica storing
a batch, and a replica filling a hole from another peer. SlateDB drops an entry
once its TTL passed (specs/slatedb-timestamps-ttl.md, "Compaction filter"); here
the signed `expires_at` in the entry decides, read by the copy's own (injected)
clock, so no copy serves an expired payload whether its compaction ran yet or not.

`keeps` is the rule on a decoded record. `dropped` applies it to raw blocks the
way a peer serving a message needs, decoding only blocks that may carry an
`expires_at`: an entry laid out as `encode_entry` writes it (field order checked
in C, `entry_scan.expiry_candidates`) has it last, so one whose last field is
not field 10 has none; any other block is decoded. (A byte search for the tag is no
filter: the high bytes of a millisecond timestamp are the same for days, and
for weeks at a time one of them is 0x50.) A rule that drops payloads for
another reason (e.g. a later signed withdrawal of the key) must widen
`_candidates` with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from . import entries, merkle
from .entries import Record
from .timestamps import format_duration


def keeps(record: Record, now_ms: int) -> bool:
    """Whether a copy may hold and serve `record`'s payload at clock reading `now_ms`.

    An entry past its signed `expires_at` is not kept (Record.expired: strictly
    after, as `get` hides it). A block that is no valid entry is kept: it has no
    expiry to judge it by, and its author signed it. A cleared record has no
    payload to keep.
    """
    if record.cleared:
        return False
    if record.invalid is not None:
        return True
    return not record.expired(now_ms)


def _candidates(blocks: Sequence[bytes]) -> list[int]:
    """Positions of the blocks that may carry an expires_at (all that `keeps` may refuse)."""
    native = getattr(merkle._native, "expiry_shape", None)  # None: no C build, or one from before it had this
    if native is None:  # numpy's (entry_scan loads pyarrow: ~60 MB a peer never needed to serve)
        from .entry_scan import expiry_candidates

        found: list[int] = expiry_candidates(blocks).nonzero()[0].tolist()
        return found
    flags: bytes = native(blocks)
    out = []
    at = flags.find(1)
    while at >= 0:
        out.append(at)
        at = flags.find(1, at + 1)
    return out


def dropped(content_type: str, start: int, blocks: Sequence[bytes | None], now_ms: int) -> list[int]:
    """Positions in `blocks` (seqs start...) whose payloads `keeps` refuses at `now_ms`.

    Cleared blocks (None) and the header (seq 0) are never listed. Only blocks
    that may carry an expiry are decoded.
    """
    return scan(content_type, start, blocks, now_ms)[0]


def scan(content_type: str, start: int, blocks: Sequence[bytes | None], now_ms: int) -> tuple[list[int], int | None]:
    """`dropped`, and the earliest moment after `now_ms` at which `keeps` will refuse one of the
    others (None: never, as far as expiry goes): a scheduled compaction skips these blocks until then."""
    out: list[int] = []
    soonest: int | None = None
    if start and None not in blocks:  # the usual message: every block there, no header
        at: Sequence[int] = range(len(blocks))
        present = cast(Sequence[bytes], blocks)
    else:
        at = [k for k, b in enumerate(blocks) if b is not None and start + k != 0]
        present = [cast(bytes, blocks[k]) for k in at]
    for j in _candidates(present):
        k = at[j]
        r = entries.decode_record(content_type, start + k, present[j])
        if not keeps(r, now_ms):
            out.append(k)
        elif r.expires_at is not None and r.invalid is None and (soonest is None or r.expires_at < soonest):
            soonest = r.expires_at
    return out, soonest


def forgetting(compact_every_ms: int | None, *, peer: bool) -> str:
    """When a copy's expired and forgotten payloads are physically gone from it (issue 37's deadline)."""
    if not peer:
        return (
            "forgotten keys: cleared as the forget entry is stored; "
            "expired payloads: hidden at expiry, cleared from this disk by `feedlog compact`"
        )
    forgotten = "forgotten keys: cleared before the forget entry is served"
    if compact_every_ms is None:
        return f"{forgotten}; expired payloads: never served after expiry (the peer does not say when it compacts)"
    if compact_every_ms == 0:
        return f"{forgotten}; expired payloads: never served after expiry, kept on the peer's disk (compaction off)"
    return (
        f"{forgotten}; expired payloads: never served after expiry, cleared from the peer's disk within "
        f"{format_duration(compact_every_ms)} of it"
    )
