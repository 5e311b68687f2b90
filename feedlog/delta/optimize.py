"""OPTIMIZE: a table's small files bin-packed into files near a target size, and auto-compaction.

    plan      which files go together (pure): live files, a target size, a threshold -> bins
    optimize  the I/O edge: read each bin's files (deletion vectors applied), write one file per bin
              with the table's writer (stats as any write's), commit `remove` + `add` in one version

As delta-rs and delta-spark do it:

- The target is the table's `delta.targetFileSize` when set, else delta-rs's default, 100 MiB
  (delta-spark's OPTIMIZE aims at 1 GiB; a streaming table's files would wait months for that).
- Bins are per partition. A file at or over the target is left alone; so is a bin of one file,
  which rewriting would not change, unless the file has a deletion vector (rewriting purges the
  deleted rows, as delta-spark's OPTIMIZE does).
- Files go into bins in (feed, seq) order by their stats, or in the order they were written for a
  table without those columns, and a bin takes only a contiguous run of them: a file too big to
  compact ends the run rather than being jumped over. A bin's rows are written sorted by (feed,
  seq). So each new file holds a contiguous range of each feed, and data skipping on `seq` stays
  as tight as it was (delta-rs keeps insertion order the same way).
- Every `add` and `remove` carries `dataChange=false`: the rows are the same, so streaming readers
  skip the commit (PROTOCOL.md "Add File and Remove File"). commitInfo is delta-spark's: operation
  `OPTIMIZE`, operationParameters `predicate`, `zOrderBy`, `clusterBy`, `auto`, operationMetrics
  `numAddedFiles` ... `p75FileSize` as strings (DeltaOperations.Optimize, DeltaOperationMetrics.OPTIMIZE).
- Conflicts as Delta's: a concurrent blind append never conflicts (the commit rebases over it); a
  concurrent rewrite (TTL compaction, a forget rewrite, another OPTIMIZE) is rebased over only if
  every file this one compacted is still live (`transaction.check_winner`), otherwise the new files
  are deleted and `CompactionConflict` (retryable: the next run plans afresh) is raised.

Auto-compaction (`auto_compact_rule`) is delta-spark's post-commit hook: on when the table's
`delta.autoOptimize.autoCompact` is true (the tables feedlog ingest creates have it), it compacts a
partition once it holds at least `spark.databricks.delta.autoCompact.minNumFiles` (50) small
files, small meaning under half of the target (`autoCompact.maxFileSize`, 128 MiB, or the table's
`delta.targetFileSize`). feedlog's `feedlog.autoCompact.minNumFiles` property sets the threshold
per table. So a month of one commit a second keeps the live files, and the checkpoint that lists
them, bounded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..clock import Clock
from ..errors import Conflict, FeedlogError, InvalidArgument
from .actions import Add
from .scan import ScanContext, read_file
from .snapshot import Snapshot
from .storage import Storage
from .transaction import CommitResult, ConcurrentModification, Transaction
from .writer import write_files

OPERATION = "OPTIMIZE"
#: the table property delta-rs and delta-spark read for the size OPTIMIZE aims at
TARGET_FILE_SIZE = "delta.targetFileSize"
#: delta-rs's default `delta.targetFileSize`
DEFAULT_TARGET_SIZE = 100 * 1024 * 1024
#: delta-spark's (and Databricks') table property that turns auto-compaction on
AUTO_COMPACT = "delta.autoOptimize.autoCompact"
#: feedlog's per-table setting of delta-spark's `spark.databricks.delta.autoCompact.minNumFiles`
AUTO_COMPACT_MIN_FILES = "feedlog.autoCompact.minNumFiles"
#: delta-spark's `spark.databricks.delta.autoCompact.minNumFiles` default
DEFAULT_AUTO_MIN_FILES = 50
#: delta-spark's `spark.databricks.delta.autoCompact.maxFileSize` default (its minFileSize is half)
DEFAULT_AUTO_TARGET = 128 * 1024 * 1024

#: `delta.autoOptimize.autoCompact` values that mean on (Databricks also takes `auto` and `legacy`)
_ON = frozenset({"true", "auto", "legacy"})
#: Spark's byte-size suffixes (JavaUtils.byteStringAs: powers of 1024), and the IEC ones
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"\s*(\d+)\s*([a-zA-Z]*)\s*")


class CompactionConflict(ConcurrentModification):
    """A concurrent commit removed a file this compaction rewrote (or changed the table's schema or
    protocol): nothing was committed. Running it again plans from the new state."""

    retryable = True


# --- sizes and settings (pure) -------------------------------------------------------------------


def parse_size(text: str) -> int:
    """'128MiB', '1GB', '100m', '1048576' -> bytes. Units are powers of 1024, as Spark reads
    `delta.targetFileSize` (a value delta-spark wrote means the same here); at least one byte."""
    m = _SIZE.fullmatch(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise InvalidArgument(
            f"bad size {text!r}: a whole number of bytes, or with a unit (KiB, MiB, GiB, TiB; "
            "KB, MB, GB, TB and k, m, g, t are the same powers of 1024, as in Spark), e.g. 128MiB"
        )
    n = int(m.group(1)) * _UNITS[unit]
    if n < 1:
        raise InvalidArgument(f"bad size {text!r}: must be at least one byte")
    return n


def target_size(conf: Mapping[str, str], given: int | None = None, default: int = DEFAULT_TARGET_SIZE) -> int:
    """The size to aim at: `given`, else the table's `delta.targetFileSize`, else `default`."""
    if given is not None:
        if given < 1:
            raise InvalidArgument(f"the target size must be at least one byte, not {given}")
        return given
    raw = conf.get(TARGET_FILE_SIZE)
    if raw is None:
        return default
    try:
        return parse_size(raw)
    except InvalidArgument as e:
        raise InvalidArgument(f"table property {TARGET_FILE_SIZE}: {e}") from None


@dataclass(frozen=True)
class AutoCompact:
    """Auto-compaction's thresholds for one table (delta-spark's AutoCompact configuration)."""

    #: bins fill up to this many bytes (`autoCompact.maxFileSize`)
    max_file_size: int
    #: only files under this many bytes count as small and are compacted (`autoCompact.minFileSize`)
    min_file_size: int
    #: a partition is compacted once it holds this many small files (`autoCompact.minNumFiles`)
    min_num_files: int


def auto_compact_rule(conf: Mapping[str, str], min_num_files: int | None = None) -> AutoCompact | None:
    """The table's auto-compaction thresholds, or None when `delta.autoOptimize.autoCompact` is not on.

    `min_num_files` overrides the table's `feedlog.autoCompact.minNumFiles` (default 50)."""
    if conf.get(AUTO_COMPACT, "false").strip().lower() not in _ON:
        return None
    biggest = target_size(conf, None, DEFAULT_AUTO_TARGET)
    if min_num_files is None:
        raw = conf.get(AUTO_COMPACT_MIN_FILES)
        try:
            min_num_files = DEFAULT_AUTO_MIN_FILES if raw is None else int(raw)
        except ValueError:
            raise InvalidArgument(
                f"table property {AUTO_COMPACT_MIN_FILES} must be a whole number, not {raw!r}"
            ) from None
    if min_num_files < 2:
        raise InvalidArgument(f"auto-compaction needs at least 2 files to compact, not {min_num_files}")
    return AutoCompact(biggest, max(1, biggest // 2), min_num_files)


# --- planning (pure) -----------------------------------------------------------------------------

Partition = tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class Bin:
    """Files of one partition that become one file."""

    partition: Partition
    files: tuple[Add, ...]

    @property
    def size(self) -> int:
        return sum(a.size for a in self.files)


def partition_of(add: Add) -> Partition:
    return tuple(sorted(add.partition_values.items()))


def has_deletion_vector(add: Add) -> bool:
    return add.extra.get("deletionVector") is not None


def order_key(add: Add) -> tuple[str, int, int, str]:
    """Where a file goes in its partition: by its rows' smallest (feed, seq) when its stats have them
    (a feedlog table), then by when it was written, then by name."""
    feed, seq = "", -1
    if add.stats:
        try:
            mins = json.loads(add.stats).get("minValues") or {}
        except (ValueError, AttributeError):
            mins = {}
        if isinstance(mins.get("feed"), str):
            feed = mins["feed"]
        if isinstance(mins.get("seq"), int) and not isinstance(mins.get("seq"), bool):
            seq = mins["seq"]
    return (feed, seq, add.modification_time, add.path)


def plan(
    files: Iterable[Add],
    target: int,
    *,
    small_below: int | None = None,
    min_num_files: int = 0,
) -> list[Bin]:
    """The bins OPTIMIZE writes, each partition's in order (`order_key`).

    A file is compacted if it is smaller than `small_below` (default: the target) or has a deletion
    vector. Each partition's such files are cut into contiguous runs (a file that is not compacted
    ends a run) and each run into bins of at most `target` bytes, greedily. A bin of one file is
    dropped unless it purges a deletion vector. With `min_num_files`, a partition holding fewer
    small files than that is left alone (auto-compaction's threshold)."""
    if target < 1:
        raise InvalidArgument(f"the target size must be at least one byte, not {target}")
    below = target if small_below is None else small_below
    by_partition: dict[Partition, list[Add]] = {}
    for a in files:
        by_partition.setdefault(partition_of(a), []).append(a)
    bins: list[Bin] = []
    for part in sorted(by_partition, key=repr):
        ordered = sorted(by_partition[part], key=order_key)
        small = [a.size < below or has_deletion_vector(a) for a in ordered]
        if sum(small) < max(min_num_files, 1):
            continue
        runs: list[list[Add]] = [[]]
        size = 0
        for a, is_small in zip(ordered, small, strict=True):
            if not is_small or (runs[-1] and size + a.size > target):
                runs.append([])
                size = 0
            if is_small:
                runs[-1].append(a)
                size += a.size
        bins += [Bin(part, tuple(r)) for r in runs if len(r) > 1 or (r and has_deletion_vector(r[0]))]
    return bins


def tiered(bins: Sequence[Bin], target: int) -> list[Bin]:
    """Auto-compaction's choice among the small files `plan` found: the smallest ones, as a binary
    counter would merge them (pure).

    Bin-packing every small file, as OPTIMIZE does, rewrites a stream's merged file each time 50 new
    ones arrive, until it passes half the target (64 MiB): the bytes rewritten grow with the square
    of the table's age (a soak at 200 puts/s kept 16x its live bytes on disk). Here a partition's
    small files are taken smallest first, and a bigger one joins only if it is no bigger than the
    files taken so far, or about the size of a typical new file (twice the median): merged files
    double as in a binary counter, so each row is rewritten about log2(commits / 50) times and a
    partition keeps its new files plus O(log n) merged ones. Half the files at least are at or under
    the median, so a partition over the threshold always makes progress. The chosen files are then
    binned in (feed, seq) order (`plan`). Files with a deletion vector are always taken."""
    by_partition: dict[Partition, list[Add]] = {}
    for b in bins:
        by_partition.setdefault(b.partition, []).extend(b.files)
    out: list[Bin] = []
    for part in sorted(by_partition, key=repr):
        files = sorted(by_partition[part], key=lambda a: (a.size, order_key(a)))
        typical = 2 * files[len(files) // 2].size
        chosen: list[Add] = []
        gathered = 0
        for a in files:
            if chosen and a.size > max(gathered, typical) and not has_deletion_vector(a):
                continue  # (files come smallest first: only deletion vectors follow)
            chosen.append(a)
            gathered += a.size
        out += plan(chosen, target)
    return out


def _percentile(sizes: Sequence[int], p: int) -> int:
    """The nearest-rank percentile of sorted `sizes` (0 for none)."""
    if not sizes:
        return 0
    rank = max(1, -(-p * len(sizes) // 100))
    return sizes[rank - 1]


def operation_metrics(removed: Sequence[Add], added: Sequence[Add]) -> dict[str, str]:
    """delta-spark's OPTIMIZE operationMetrics (DeltaOperationMetrics.OPTIMIZE): counts and bytes of
    the files removed and added, and the added files' size distribution; every value a string."""
    sizes = sorted(a.size for a in added)
    return {
        "numRemovedFiles": str(len(removed)),
        "numRemovedBytes": str(sum(a.size for a in removed)),
        "numAddedFiles": str(len(added)),
        "numAddedBytes": str(sum(sizes)),
        "minFileSize": str(sizes[0] if sizes else 0),
        "p25FileSize": str(_percentile(sizes, 25)),
        "p50FileSize": str(_percentile(sizes, 50)),
        "p75FileSize": str(_percentile(sizes, 75)),
        "maxFileSize": str(sizes[-1] if sizes else 0),
        "numDeletionVectorsRemoved": str(sum(1 for a in removed if has_deletion_vector(a))),
    }


def operation_parameters(target: int, auto: bool) -> dict[str, Any]:
    """delta-spark's OPTIMIZE parameters (JSON-encoded lists, as it writes them), and delta-rs's
    `targetSize`. feedlog compacts the whole table: no predicate, no z-order, no clustering."""
    return {"predicate": "[]", "zOrderBy": "[]", "clusterBy": "[]", "auto": auto, "targetSize": str(target)}


# --- the I/O edge --------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptimizeResult:
    #: the OPTIMIZE commit; None when nothing needed compacting (no commit is made then)
    version: int | None
    target_size: int
    auto: bool
    files_before: int
    files_after: int
    files_removed: int = 0
    files_added: int = 0
    bytes_removed: int = 0
    bytes_added: int = 0
    partitions_optimized: int = 0
    seconds: float = 0.0
    metrics: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _sort_rows(data: pa.Table) -> pa.Table:
    """A bin's rows in (feed, seq) order when the table has those columns, else as they were read
    (the files in their order: insertion order)."""
    if "feed" not in data.column_names or "seq" not in data.column_names:
        return data
    keys = data.select(["feed", "seq"]).combine_chunks()
    if keys.num_rows < 2:
        return data
    feed, seq = keys.column("feed"), keys.column("seq")
    n = keys.num_rows
    f0, f1, s0, s1 = feed.slice(0, n - 1), feed.slice(1), seq.slice(0, n - 1), seq.slice(1)
    # in order already (the files were taken in order; the common case): an O(n) check, no copy
    ordered = pc.or_(pc.less(f0, f1), pc.and_(pc.equal(f0, f1), pc.less_equal(s0, s1)))
    if pc.all(ordered).as_py() is not False:
        return data
    order = pc.sort_indices(keys, sort_keys=[("feed", "ascending"), ("seq", "ascending")])
    return data.combine_chunks().take(order)  # (a sort or take over one chunk is far faster than over many)


def _compact(snap: Snapshot, b: Bin, now_ms: int, new_id: Callable[[], str]) -> Add | None:
    """One bin's rows, as a reader sees them (deletion vectors applied), written as one new file
    (None if deletion vectors deleted every row: the bin's files are removed and nothing replaces them)."""
    ctx = ScanContext.of(snap.storage, snap.schema, snap.protocol, snap.metadata)
    data = pa.concat_tables([read_file(ctx, a) for a in b.files])
    data = _sort_rows(data)
    options = dataclasses.replace(snap.write_options(), max_rows_per_file=max(1, data.num_rows))
    adds = write_files(snap.storage, snap.schema, snap.partition_columns, data, now_ms, new_id, options)
    if not adds and data.num_rows == 0:
        return None
    if len(adds) != 1:  # one partition's rows, one file's worth: anything else is a bug
        _discard(snap.storage, adds)
        raise FeedlogError(f"compacting {len(b.files)} files wrote {len(adds)} files, not one")
    return dataclasses.replace(adds[0], data_change=False)


def _discard(storage: Storage, adds: Iterable[Add]) -> None:
    for a in adds:
        with contextlib.suppress(OSError, FeedlogError):
            storage.delete(urllib.parse.unquote(a.path))


def _rewrite(snap: Snapshot, bins: Sequence[Bin], now_ms: int, new_id: Callable[[], str]) -> list[Add]:
    """Every bin written, by threads (pyarrow reads, encodes and writes without the GIL); if one
    fails, the files the others wrote are deleted (no commit will hold them) and its error raised."""
    with ThreadPoolExecutor(max(1, min(len(bins), os.cpu_count() or 1))) as pool:
        futures = [pool.submit(_compact, snap, b, now_ms, new_id) for b in bins]
    failed = next((e for f in futures if (e := f.exception()) is not None), None)
    written = [a for f in futures if f.exception() is None and (a := f.result()) is not None]
    if failed is not None:
        _discard(snap.storage, written)
        raise failed
    return written


def optimize(
    storage: Storage,
    transaction: Callable[[str], Transaction],
    commit: Callable[[Transaction], CommitResult],
    clock: Clock,
    new_id: Callable[[], str],
    *,
    target: int | None = None,
    auto: AutoCompact | None = None,
) -> OptimizeResult:
    """Compact the table's small files (`plan`) in one commit; none if there is nothing to compact.

    `transaction(operation)` starts a write on the latest state and `commit(tx)` commits it (the
    table's: through its commit owner). `target`: bytes per file (default: `delta.targetFileSize`,
    else 100 MiB). `auto`: auto-compaction's thresholds instead (`auto_compact_rule`).
    CompactionConflict if a concurrent commit removed a file it compacted (nothing is left behind)."""
    started = time.monotonic()
    tx = transaction(OPERATION)
    snap = Snapshot(storage, tx.base)
    live = snap.files()
    if auto is not None:
        size = auto.max_file_size
        bins = tiered(plan(live, size, small_below=auto.min_file_size, min_num_files=auto.min_num_files), size)
    else:
        size = target_size(snap.metadata.configuration, target)
        bins = plan(live, size)
    if not bins:
        return OptimizeResult(None, size, auto is not None, len(live), len(live), seconds=time.monotonic() - started)
    added = _rewrite(snap, bins, clock.now_ms(), new_id)
    removed = [a for b in bins for a in b.files]
    tx.operation_parameters = operation_parameters(size, auto is not None)
    metrics = operation_metrics(removed, added)
    tx.info_extra["operationMetrics"] = metrics
    tx.remove_files(removed, data_change=False)
    tx.add_files(added)
    try:
        result = commit(tx)
    except Conflict as e:  # definitely not committed: the new files are nobody's
        _discard(storage, added)
        if isinstance(e, ConcurrentModification):
            raise CompactionConflict(f"OPTIMIZE not committed, nothing changed: {e}") from None
        raise
    after = len(result.state.files) if result.state is not None else len(live) - len(removed) + len(added)
    return OptimizeResult(
        result.version,
        size,
        auto is not None,
        len(live),
        after,
        len(removed),
        len(added),
        sum(a.size for a in removed),
        sum(a.size for a in added),
        len({b.partition for b in bins}),
        time.monotonic() - started,
        metrics,
    )


def needs_compaction(files: Iterable[Add], rule: AutoCompact) -> bool:
    """Whether some partition holds at least `rule.min_num_files` small files: the cheap test a
    writer makes after each commit before it plans anything. Pure."""
    counts: dict[Partition, int] = {}
    for a in files:
        if a.size < rule.min_file_size or has_deletion_vector(a):
            p = partition_of(a)
            counts[p] = counts.get(p, 0) + 1
            if counts[p] >= rule.min_num_files:
                return True
    return False
