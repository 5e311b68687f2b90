"""Checkpoints and metadata cleanup (PROTOCOL.md "Checkpoints", "Metadata Cleanup").

Cleanup keeps everything replay and time lookups need: the newest checkpoint
not newer than the retention cutoff commit, the commit file at that checkpoint's
version (checkpoints drop commitInfo, which holds its ICT) and every commit
after it. It deletes older files in ascending version order, each version's
commit before its checkpoint, so a crash midway leaves a readable log.

One deliberate difference from the protocol's recipe: the cutoff is exactly
now - retention, not rounded down to midnight UTC, so `--retain 1h` means an hour.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..errors import Corruption, InvalidArgument, NotFound
from . import checkpoint
from .actions import DELETED_FILE_RETENTION, LOG_RETENTION
from .committer import LOG_DIR
from .log import list_log, load_protocol_metadata, load_state
from .replay import ict_enablement
from .timeline import Timeline, last_at_or_before

if TYPE_CHECKING:
    from .table import DeltaTable

DAY_MS = 86_400_000
DEFAULT_LOG_RETENTION_MS = 30 * DAY_MS
DEFAULT_TOMBSTONE_RETENTION_MS = 7 * DAY_MS

_INTERVAL = re.compile(r"\s*interval\s+(\d+)\s+([a-z]+?)s?\s*", re.IGNORECASE)
_UNIT_MS = {
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": DAY_MS,
    "week": 7 * DAY_MS,
}
_VERSIONED = re.compile(r"(\d{20})\.(json|checkpoint\..*|crc)")


def parse_interval(text: str) -> int:
    """Delta's duration properties, e.g. 'interval 30 days' -> ms."""
    m = _INTERVAL.fullmatch(text)
    if not m or m.group(2).lower() not in _UNIT_MS:
        raise InvalidArgument(f"bad interval {text!r}: expected e.g. 'interval 30 days'")
    return int(m.group(1)) * _UNIT_MS[m.group(2).lower()]


def _retention(conf: Mapping[str, str], key: str, default: int) -> int:
    value = conf.get(key)
    return default if value is None else parse_interval(value)


def write_checkpoint(table: DeltaTable, version: int | None = None) -> int:
    """Write a V1 classic checkpoint of `version` (default latest) and point `_last_checkpoint` at it."""
    storage = table.storage
    listing = list_log(storage, table.committer)
    state = load_state(storage, listing, version)
    assert state.metadata is not None
    state.expire_tombstones(
        table.clock.now_ms(),
        _retention(state.metadata.configuration, DELETED_FILE_RETENTION, DEFAULT_TOMBSTONE_RETENTION_MS),
    )
    data, size, adds = checkpoint.encode(state)
    # A classic checkpoint may be rewritten (both writers write the same state): atomic replace.
    storage.write_atomic(checkpoint.checkpoint_path(state.version), data)
    try:
        current = json.loads(storage.read(checkpoint.LAST_CHECKPOINT)).get("version", -1)
    except (NotFound, json.JSONDecodeError, AttributeError):
        current = -1
    if not isinstance(current, int) or state.version >= current:
        body = checkpoint.last_checkpoint_json(state.version, size, len(data), adds)
        storage.write_atomic(checkpoint.LAST_CHECKPOINT, body)
    return state.version


def cleanup_log(table: DeltaTable, retain_ms: int | None = None) -> list[str]:
    """Delete commits and checkpoints older than the retention; returns the deleted paths."""
    storage = table.storage
    listing = list_log(storage, table.committer)
    protocol, metadata = load_protocol_metadata(storage, listing)
    if retain_ms is None:
        retain_ms = _retention(metadata.configuration, LOG_RETENTION, DEFAULT_LOG_RETENTION_MS)
    if retain_ms < 0:
        raise InvalidArgument("retention must not be negative")
    cutoff_ms = table.clock.now_ms() - retain_ms
    timeline = Timeline(storage, table.committer, listing, ict_enablement(protocol, metadata))
    # Commit times are monotonic across the ICT enablement boundary (ICT writer requirement 5),
    # so the cutoff commit is found by the same binary search as time travel.
    try:
        cutoff_commit = last_at_or_before(listing.earliest, listing.latest, timeline.commit_time, cutoff_ms)
    except NotFound:
        return []
    protected = max((v for v in listing.checkpoints if v <= cutoff_commit), default=None)
    if protected is None:
        return []  # no checkpoint to stand in for older commits: nothing may go
    if protected not in listing.commits:
        raise Corruption(f"checkpoint {protected} has no commit file beside it; refusing to clean up")
    doomed = []
    for info in storage.list(LOG_DIR):
        m = _VERSIONED.fullmatch(info.path.rsplit("/", 1)[-1])
        if m and int(m.group(1)) < protected:
            kind_order = 0 if m.group(2) == "json" else 1
            doomed.append((int(m.group(1)), kind_order, info.path))
    doomed.sort()
    for _, _, path in doomed:
        storage.delete(path)
    return [p for _, _, p in doomed]
