"""Withdrawn keys in a feedlog table (issue 37): every earlier row of a forgotten key becomes a tombstone.

A forget entry (`feedlog forget`, `log/forgets.py`) lands as an ordinary
deletion row whose `block` holds `forget = true`. Every row of the same feed
and key at a lower seq then becomes a tombstone exactly as TTL compaction
makes them (`expire.py`): `value`, `block` and `stat` dropped, `leaf_hash` (the
Merkle leaf of the dropped block) kept, `cleared = true`; `feed`, `seq`, `key`,
`deleted`, `timestamp`, `expires_at` and `size` stay, so `feedlog audit`
still verifies every feed. The forget rows themselves stay: they are what
tells a reader (and the next rewrite) that the key was withdrawn.

`forget_rewrite` rewrites, in this process, only the files whose stats say
they may hold such a row, and commits `remove` + `add` through the table's
commit owner (operation `FORGET`). It finds the forget rows itself when not
told them (what `feedlog maintain` calls: idempotent, a table with nothing
left to clear gets no commit). The ingest sink calls `after_commit` with the
forget entries a commit just landed (`sink.FeedRange.forgets`), so the
tombstones land in the commit after the one that lands the forget entry. Rows
of a key landed after its forget are the feed's own business: the feed cleared
its copy before it served the forget, so those rows arrive cleared already.

The decisions (`forget_rows`, `may_hold`, `withdrawn`) are pure functions of
their inputs; the reads, writes and the commit are at the edge.
"""

from __future__ import annotations

import json
import urllib.parse
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..clock import Clock, SystemClock
from ..delta import DeltaTable, Snapshot
from ..delta.actions import Add
from ..delta.scan import ScanContext, read_file
from ..delta.writer import WriteOptions
from ..errors import Conflict, FeedlogError, InvalidArgument, Unsupported
from ..log import entries
from .rows import COLUMNS
from .tombstones import write_tombstoned

OPERATION = "FORGET"
#: a commit landed by ingest is followed by its forget rewrite; a concurrent writer may win the
#: race for the next version this many times before the rewrite is left to the next ingest or maintain
ATTEMPTS = 3


@dataclass(frozen=True, slots=True, order=True)
class Forget:
    """A forget entry of feed `feed` (hex key) at `seq`: rows of `key` below `seq` are withdrawn."""

    feed: str
    key: str
    seq: int


@dataclass
class ForgetResult:
    version: int | None  # the FORGET commit; None when no row was left to clear
    files_rewritten: int
    rows_cleared: int
    forgets: int  # forget entries considered


def forget_rows(data: pa.Table) -> list[Forget]:
    """The forget entries among `data`'s rows (deleted rows whose block holds `forget = true`)."""
    if not data.num_rows:
        return []
    cols = data.select(["feed", "seq", "deleted", "block"])
    cols = cols.filter(pc.and_(pc.fill_null(cols.column("deleted"), False), pc.is_valid(cols.column("block"))))
    out = []
    for row in cols.to_pylist():
        # any feed's block is an Entry envelope (a drive event's is too): read as one, the key is the row's
        for seq, key in entries.forgets_in(entries.ENTRY, row["seq"], [row["block"]]):
            out.append(Forget(row["feed"], key, seq))
    return out


def _string_bounds(stats: Mapping[str, Any], name: str) -> tuple[str | None, str | None]:
    lo, hi = stats.get("minValues", {}).get(name), stats.get("maxValues", {}).get(name)
    return (lo if isinstance(lo, str) else None), (hi if isinstance(hi, str) else None)


def may_hold(add: Add, f: Forget) -> bool:
    """Whether the file's stats allow a row of `f.feed`, `f.key` below `f.seq` (no stats: it may).

    A string's min is a prefix of the true min (delta/stats.py), so still a lower bound; a max is
    written only when whole."""
    if not add.stats:
        return True
    try:
        stats = json.loads(add.stats)
        seq_min = stats.get("minValues", {}).get("seq")
        if isinstance(seq_min, int) and seq_min >= f.seq:
            return False
        for name, value in (("feed", f.feed), ("key", f.key)):
            lo, hi = _string_bounds(stats, name)
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                return False
    except (ValueError, AttributeError, TypeError):
        return True
    return True


def withdrawn(data: pa.Table, forgets: Sequence[Forget]) -> pa.ChunkedArray | pa.Array:
    """Per row of `data`: a live row that one of `forgets` withdraws (same feed and key, lower seq)."""
    mask = pa.array([False] * data.num_rows)
    live = pc.invert(data.column("cleared"))
    for f in forgets:
        hit = pc.and_(pc.equal(data.column("feed"), f.feed), pc.equal(data.column("key"), f.key))
        hit = pc.and_(pc.fill_null(hit, False), pc.less(data.column("seq"), f.seq))
        mask = pc.or_(mask, hit)
    return pc.and_(mask, live)


@dataclass(frozen=True)
class _Job:
    table: DeltaTable
    schema: pa.Schema
    options: WriteOptions
    written_ms: int


def _rewrite_file(job: _Job, add: Add, forgets: Sequence[Forget]) -> tuple[Add, Add | None, int]:
    """(old add, new add or None, rows cleared) for one file: withdrawn rows become tombstones."""
    storage = job.table.storage
    data = read_file(ScanContext(storage, job.schema, (), job.options.column_mapping), add)
    gone = withdrawn(data, forgets)
    n = pc.sum(gone.cast(pa.int64())).as_py() or 0
    if n == 0:
        return add, None, 0
    return add, write_tombstoned(storage, data, gone, job.schema, job.options, job.written_ms, "forget.rewrite"), n


def _scan_forgets(snap: Snapshot, ctx: ScanContext) -> list[Forget]:
    """Every forget entry in the snapshot's files (what `maintain` applies when told none)."""
    found: list[Forget] = []
    for add in snap.files():
        found += forget_rows(read_file(ctx, add))
    return found


def forget_rewrite(
    table: DeltaTable, forgets: Sequence[Forget] | None = None, *, clock: Clock | None = None
) -> ForgetResult:
    """Make every live row withdrawn by `forgets` (default: every forget entry in the table) a
    tombstone, in one commit through the table's owner; no commit if none is left.

    `table`: opened as a feedlog job opens one (`sink.open_table`: its owner token and owners).
    `Conflict` if another writer removed one of the rewritten files meanwhile (the new files are
    deleted: nothing half-done stays); running it again finishes the job."""
    clock = clock or SystemClock()
    tx = table.transaction(OPERATION)
    snap = Snapshot(table.storage, tx.base)
    if [c for c in COLUMNS if c not in snap.schema.names]:
        raise InvalidArgument(f"{table.storage.location} is not a feedlog table (feedlog ingest makes those)")
    if snap.partition_columns:
        raise Unsupported("forget rewrites of partitioned tables are not implemented")
    options = snap.write_options()
    ctx = ScanContext(table.storage, snap.schema, (), options.column_mapping)
    todo = sorted(set(forgets)) if forgets is not None else sorted(set(_scan_forgets(snap, ctx)))
    if not todo:
        return ForgetResult(None, 0, 0, 0)
    files = [(a, [f for f in todo if may_hold(a, f)]) for a in snap.files()]
    files = [(a, fs) for a, fs in files if fs]
    job = _Job(table, snap.schema, options, clock.now_ms())
    with ThreadPoolExecutor(max(1, min(len(files), 2))) as pool:  # pyarrow reads and writes without the GIL
        futures = [pool.submit(_rewrite_file, job, a, fs) for a, fs in files]
    failed = next((e for fut in futures if (e := fut.exception()) is not None), None)
    done = [fut.result() for fut in futures if fut.exception() is None]
    changed = [(old, new, n) for old, new, n in done if new is not None]
    if failed is not None:
        _discard(table, [new for _old, new, _n in changed])
        raise failed
    if not changed:
        return ForgetResult(None, 0, 0, len(todo))
    cleared = sum(n for _o, _a, n in changed)
    tx.operation_parameters = {"forgets": str(len(todo))}  # counts only: a key's name stays out of the log
    tx.remove_files([old for old, _new, _n in changed])
    tx.add_files([new for _old, new, _n in changed])
    tx.info_extra["feedlog"] = {"forgets": len(todo), "rows_cleared": cleared}
    try:
        result = tx.commit()
    except Conflict:  # definitely not committed: the new files are nobody's
        _discard(table, [new for _old, new, _n in changed])
        raise
    if result.version is not None:
        _settle(table, result.version)
    return ForgetResult(result.version, len(changed), cleared, len(todo))


def _settle(table: DeltaTable, version: int) -> None:
    """Backfilled before it is reported, as `sink.settle` does (readers without managed commits
    read `_delta_log/` alone); the commit is durable already, so a failure is a warning."""
    try:
        table.backfill(version)
    except FeedlogError as e:
        warnings.warn(f"committed version {version}, but its backfill to _delta_log is pending: {e}", stacklevel=3)


def _discard(table: DeltaTable, adds: Sequence[Add]) -> None:
    for a in adds:
        table.storage.delete(urllib.parse.unquote(a.path))


def after_commit(table: DeltaTable, forgets: Sequence[Forget], clock: Clock | None = None) -> ForgetResult | None:
    """The forget rewrite for the forget entries a commit just landed (the ingest sink's), retried
    when a concurrent writer wins the race; if it keeps losing, a warning says `forget_rewrite`
    without `forgets` (what maintenance runs) finishes it (the landed commit stands either way)."""
    for attempt in range(ATTEMPTS):
        try:
            return forget_rewrite(table, forgets, clock=clock)
        except Conflict as e:
            if attempt + 1 == ATTEMPTS:
                warnings.warn(f"forget rewrite deferred (table maintenance applies it): {e}", stacklevel=2)
    return None
