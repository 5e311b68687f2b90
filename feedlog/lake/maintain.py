"""One maintenance pass over a feedlog table: everything that makes it forget, in a safe order.

    expire      TTL compaction: rows past `expires_at` become tombstones (leaf hash kept)
    forget      rows a writer withdrew (a signed forget entry) become tombstones the same way
    compact     auto-compaction's rule (delta/optimize.py): small files bin-packed, if the table has
                `delta.autoOptimize.autoCompact` on and a partition holds enough of them
    backfill    a managed table's ratified commits copied into `_delta_log/` (what the rest reads)
    checkpoint  of the newest backfilled version, if it has none yet
    cleanup     log files older than `delta.logRetentionDuration` (their stats can hold keys)
    vacuum      data files no version inside `delta.deletedFileRetentionDuration` references

Why this order: the rewrites first, so the files they remove start their retention as early as
possible; compaction after them, so it packs the rewritten files (and a rewrite never has to
redo a freshly compacted file), and before the checkpoint, which then lists fewer files; then
the checkpoint, so cleanup can take the commits before it (cleanup keeps what time
travel to the retained versions needs); vacuum last, with the horizon the retention sets.

Each step is one commit through the table's owner (or none) or deletes only what no retained
version needs, so a pass can be killed at any point and rerun: a rerun finds the work not done and
does it (idempotent); nothing a concurrent ingest commits is lost, since the rewrites conflict only
with another rewrite of the same files (Delta's rules), which the next pass retries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..clock import Clock, SystemClock
from ..delta import DeltaTable
from ..delta.log import list_log
from ..delta.vacuum import check_retention, table_retention
from ..errors import Conflict, FeedlogError, InvalidArgument
from .expire import expire
from .forget import forget_rewrite
from .rows import COLUMNS
from .sink import table_token, trusted

#: a rewrite that lost to another rewrite of the same files is tried again this many times in one pass
REWRITE_ATTEMPTS = 3


@dataclass
class MaintainReport:
    """What one pass did; None where a step found nothing to do."""

    #: whether the table has feedlog's columns (else there is no TTL or forget to apply)
    feedlog_table: bool = True
    expired_version: int | None = None
    rows_expired: int = 0
    forgotten_version: int | None = None
    rows_forgotten: int = 0
    #: the auto-compaction's OPTIMIZE commit, and the files it removed and added
    compacted_version: int | None = None
    files_compacted: int = 0
    files_written: int = 0
    backfilled_through: int | None = None
    checkpoint: int | None = None
    log_files_deleted: int = 0
    vacuum: dict[str, Any] | None = None
    #: the steps a concurrent rewrite beat every time (tried again on the next pass)
    deferred: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _retrying(step: str, report: MaintainReport, fn: Callable[[], Any]) -> Any:
    for _ in range(REWRITE_ATTEMPTS):
        try:
            return fn()
        except Conflict:
            continue  # another rewrite took some of the same files: choose again from the new state
    report.deferred.append(step)
    return None


def maintain(
    path: str,
    *,
    token: str | None = None,
    owner: str | None = None,
    clock: Clock | None = None,
    storage_options: Mapping[str, str] | None = None,
    spark: Any | Callable[[], Any] | None = None,
    engine: str = "auto",
    vacuum_retain_ms: int | None = None,
    vacuum_force: bool = False,
) -> MaintainReport:
    """One pass of TTL compaction, forget rewrites, backfill, checkpoint, log cleanup and vacuum.

    `spark` (a session or a function giving one) is used only if a rewrite is big enough for it
    (`engine` as `expire`'s). Retentions are the table's (`delta.logRetentionDuration`,
    `delta.deletedFileRetentionDuration`); `vacuum_retain_ms` shorter than the table's needs
    `vacuum_force`, as `DeltaTable.vacuum` does."""
    clock = clock or SystemClock()
    report = MaintainReport()
    opts = dict(storage_options) if storage_options else None
    table = DeltaTable.open(
        path, owner_token=table_token(path, token), owner=trusted(path, owner), clock=clock, storage_options=opts
    )
    snap = table.snapshot()
    # bad input changes nothing: vacuum's retention is checked before the first step commits anything
    check_retention(vacuum_retain_ms, table_retention(snap.metadata), not vacuum_force)
    # TTL and forget rewrites are for the tables feedlog ingest makes; any other Delta table still gets the rest
    report.feedlog_table = all(c in snap.schema.names for c in COLUMNS)
    if report.feedlog_table:

        def ttl() -> None:
            r = expire(spark, path, token=token, owner=owner, clock=clock, storage_options=opts, engine=engine)
            report.expired_version, report.rows_expired = r.version, r.rows_cleared

        def withdrawn() -> None:
            r = forget_rewrite(table, clock=clock)
            report.forgotten_version, report.rows_forgotten = r.version, r.rows_cleared

        _retrying("expire", report, ttl)
        _retrying("forget", report, withdrawn)

    def compact() -> None:
        r = table.auto_compact()
        if r is not None and r.version is not None:
            report.compacted_version, report.files_compacted, report.files_written = (
                r.version,
                r.files_removed,
                r.files_added,
            )

    _retrying("compact", report, compact)
    report.backfilled_through = table.backfill()
    listing = list_log(table.storage)
    if listing.latest >= 0 and listing.latest not in listing.checkpoints:
        report.checkpoint = table.checkpoint(listing.latest)
    report.log_files_deleted = len(table.cleanup())
    # a pass that has nothing to delete commits nothing: `maintain --every` on a quiet table must not
    # grow its log by a VACUUM START/END pair a pass
    enforce = not vacuum_force
    if table.vacuum(vacuum_retain_ms, dry_run=True, enforce_retention=enforce).files:
        done = table.vacuum(vacuum_retain_ms, enforce_retention=enforce)
        report.vacuum = {
            "files_deleted": len(done.files),
            "bytes_deleted": done.size,
            "directories_deleted": done.directories_deleted,
            "cutoff_ms": done.cutoff_ms,
            "start_version": done.start_version,
            "end_version": done.end_version,
        }
    return report


def maintain_every(
    path: str,
    every_ms: int,
    *,
    rounds: int | None = None,
    on_report: Callable[[MaintainReport], None] = lambda _r: None,
    on_error: Callable[[FeedlogError], None] = lambda _e: None,
    sleep: Callable[[float], None] = time.sleep,
    **kwargs: Any,
) -> int:
    """`maintain` every `every_ms` (`rounds` passes, or until interrupted); returns the passes made.

    A pass that fails with a retryable error (`Unavailable`: the owner or the store away) is told to
    `on_error` and the loop goes on: a maintenance loop left running for months must outlive a blip."""
    if every_ms <= 0:
        raise InvalidArgument("the interval must be greater than zero")
    if rounds is not None and rounds < 1:
        raise InvalidArgument("rounds must be >= 1")
    done = 0
    while True:
        try:
            on_report(maintain(path, **kwargs))
        except FeedlogError as e:
            if not e.retryable:
                raise  # a mistake (bad input, a table feedlog may not write) is the same next time
            # an owner or a store that is away for a moment: this pass is over, the next one retries
            on_error(e)
        done += 1
        if rounds is not None and done >= rounds:
            return done
        sleep(every_ms / 1000)
