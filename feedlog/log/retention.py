"""Which payloads a copy of a feed may keep and serve: the one place that decides (issue 37).

Every copy asks the same question of an entry before it serves, stores,
refills or keeps its payload: compaction (`Feed.compact`, a peer's scheduled
`compact_step`), a peer building a Read or Subscribe message, a replica storing
a batch, and a replica filling a hole from another peer. SlateDB drops an entry
once its TTL passed (specs/slatedb-timestamps-ttl.md, "Compaction filter"); here
the signed `expires_at` in the entry decides, read by the copy's own (injected)
clock, so no copy serves an expired payload whether its compaction ran yet or not.

`keeps` is the rule on a decoded record. `dropped` applies it to raw blocks the
way a peer serving a message needs: a block that cannot hold an `expires_at`
(its tag byte is nowhere in it) is kept without decoding, so a feed without
TTLs costs one memchr per block. A rule that drops payloads for another reason
(e.g. a later signed withdrawal of the key) must widen `_may_drop` with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import entries
from .entries import Record

#: InflatedEntry.expires_at (field 10, varint) as a one-byte tag, and the first byte of any longer
#: (non-minimal) encoding of the same tag that upb would also accept
_EXPIRES_TAGS = (b"\x50", b"\xd0")


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


def _may_drop(block: bytes) -> bool:
    """False only for a block `keeps` surely keeps whatever the clock says: it holds no expires_at tag."""
    return _EXPIRES_TAGS[0] in block or _EXPIRES_TAGS[1] in block


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
    for k, block in enumerate(blocks):
        if block is None or start + k == 0 or not _may_drop(block):
            continue
        r = entries.decode_record(content_type, start + k, block)
        if not keeps(r, now_ms):
            out.append(k)
        elif r.expires_at is not None and r.invalid is None and (soonest is None or r.expires_at < soonest):
            soonest = r.expires_at
    return out, soonest
