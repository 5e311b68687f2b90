"""Checkpoints and metadata cleanup (PROTOCOL.md "Checkpoints", "Metadata Cleanup").

Cleanup keeps everything replay and time lookups need: the newest checkpoint
not newer than the retention cutoff commit, the commit file at that checkpoint's
version (checkpoints drop commitInfo, which holds its ICT) and every commit
after it. It deletes older files in ascending version order, each version's
commit before its checkpoint, so a crash midway leaves a readable log.

One deliberate difference from the protocol's recipe: the cutoff is exactly
now - retention, not rounded down to midnight UTC, so `--retain 1h` means an hour.

Managed tables (the managed-commits RFC): both work only on the backfilled log,
`_delta_log/<v>.json`, which is all these functions list; cleanup always keeps
the newest backfilled commit. Checkpoint protection (its RFC), for a table whose
protocol has `checkpointProtection` and property
`delta.requireCheckpointProtectionBeforeVersion` = P:
(a) no checkpoint before P is deleted, unless the cleanup takes everything before P;
(b) a checkpoint before P is written only if feedlog supports the protocol at that version;
(c) history is truncated only over versions whose protocol feedlog supports, or else in one
    go through P; (d) commits are deleted before checkpoints.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..errors import Corruption, FeedlogError, InvalidArgument, NotFound, Unsupported
from . import checkpoint
from .actions import (
    CHECKPOINT_PROTECTION,
    DELETED_FILE_RETENTION,
    LOG_RETENTION,
    REQUIRE_CHECKPOINT_PROTECTION,
    V2_CHECKPOINT,
    Metadata,
    Protocol,
)
from .committer import LOG_DIR
from .log import Listing, list_log, load_protocol_metadata, load_state, read_commit
from .managed.protocol import Binding
from .managed.staged import clean_staged
from .replay import DEFAULT_TOMBSTONE_RETENTION_MS, check_writable, ict_enablement, parse_interval
from .storage import Storage
from .timeline import Timeline, last_at_or_before

DAY_MS = 86_400_000
DEFAULT_LOG_RETENTION_MS = 30 * DAY_MS
_VERSIONED = re.compile(r"(\d{20})\.(json|checkpoint\..*|crc)", re.ASCII)
#: log compaction files `<x>.<y>.compacted.json` (PROTOCOL.md "Log Compaction Files")
_COMPACTED = re.compile(r"(\d{20})\.\d{20}\.compacted\.json", re.ASCII)


def _retention(conf: Mapping[str, str], key: str, default: int) -> int:
    value = conf.get(key)
    return default if value is None else parse_interval(value)


def log_retention(conf: Mapping[str, str]) -> int:
    """`delta.logRetentionDuration` in ms (default 30 days)."""
    return _retention(conf, LOG_RETENTION, DEFAULT_LOG_RETENTION_MS)


def check_maintainable(protocol: Protocol, metadata: Metadata | None, what: str) -> None:
    """Maintenance writes the log like any commit: a table feedlog may not write is left alone.

    A checkpoint or cleanup by a writer that does not know a feature can destroy what the
    feature keeps in the log (row tracking's high-water mark, clustering domains...).
    """
    try:
        check_writable(protocol, metadata=metadata)
    except Unsupported as e:
        raise Unsupported(f"no {what}: {e}") from None


def write_checkpoint(
    storage: Storage,
    listing: Listing,
    now_ms: int,
    version: int | None = None,
    *,
    new_id: Callable[[], str] | None = None,
    sidecars: bool | None = None,
) -> int:
    """Write a checkpoint of `version` (default latest) and point `_last_checkpoint` at it.

    A table with the `v2Checkpoint` feature gets a UUID-named V2 checkpoint (`new_id` names it and
    its sidecar): its file actions in one sidecar in `_delta_log/_sidecars/` (or, with
    `sidecars=False` or no file actions, in the checkpoint itself); any other table a V1 classic
    checkpoint. feedlog never writes multi-part checkpoints (deprecated by the protocol).
    `listing` is the backfilled log (`list_log`): a checkpoint needs `_delta_log/<v>.json`; `now_ms`
    decides which tombstones have expired."""
    protocol, metadata = load_protocol_metadata(storage, listing)
    check_maintainable(protocol, metadata, "checkpoint")
    if version is not None and version > listing.latest and Binding.of(protocol, metadata) is not None:
        raise InvalidArgument(
            f"version {version} is not backfilled yet (backfilled through {listing.latest}): "
            "backfill before checkpointing it"
        )
    state = load_state(storage, listing, version)
    assert state.metadata is not None and state.protocol is not None
    boundary = protection_boundary(protocol, metadata)
    if state.version < boundary:
        try:  # requirement (b): only a protocol we fully support may be checkpointed
            check_writable(state.protocol, metadata=state.metadata)
        except Unsupported as e:
            raise Unsupported(
                f"cannot checkpoint version {state.version}, before the protected version {boundary}: {e}"
            ) from None
    state.expire_tombstones(
        now_ms,
        _retention(state.metadata.configuration, DELETED_FILE_RETENTION, DEFAULT_TOMBSTONE_RETENTION_MS),
    )
    v2 = V2_CHECKPOINT in (state.protocol.reader_features or ()) and state.protocol.min_reader_version == 3
    extra: dict[str, Any] = {}
    if not v2:
        data, size, adds = checkpoint.encode(state)
        # A classic checkpoint may be rewritten (both writers write the same state): atomic replace.
        storage.write_atomic(checkpoint.checkpoint_path(state.version), data)
    else:
        make_id = new_id or (lambda: str(uuid.uuid4()))
        written: list[checkpoint.Sidecar] = []
        has_files = bool(state.files or state.tombstones)
        if has_files and sidecars is not False:
            side, _, _ = checkpoint.encode_sidecar(state)
            name = f"{make_id()}.parquet"
            storage.write_atomic(checkpoint.sidecar_path(name), side)  # before the checkpoint naming it
            written.append(checkpoint.Sidecar(name, len(side), now_ms, {}))
        data, size = checkpoint.encode_v2(state, written)
        if written:  # the actions of the checkpoint: the sidecar's in place of the sidecar rows
            size += len(state.files) + len(state.tombstones) - len(written)
        adds = len(state.files)
        path = checkpoint.v2_checkpoint_path(state.version, make_id())
        storage.write_atomic(path, data)
        extra["v2Checkpoint"] = {
            "path": path.rsplit("/", 1)[-1],
            "sizeInBytes": len(data),
            "modificationTime": now_ms,
            "sidecarFiles": [sc.to_json() for sc in written],
        }
    try:
        current = json.loads(storage.read(checkpoint.LAST_CHECKPOINT)).get("version", -1)
    except (NotFound, json.JSONDecodeError, AttributeError):
        current = -1
    if not isinstance(current, int) or state.version >= current:
        body = checkpoint.last_checkpoint_json(state.version, size, len(data), adds, extra)
        storage.write_atomic(checkpoint.LAST_CHECKPOINT, body)
    return state.version


def cleanup_log(storage: Storage, listing: Listing, now_ms: int, retain_ms: int | None = None) -> list[str]:
    """Delete commits and checkpoints older than the retention at `now_ms`; returns the deleted paths.

    `listing` is the backfilled log (`list_log`), so the newest backfilled commit is always kept. What
    goes is decided first (`cleanup_plan`, pure), then deleted."""
    protocol, metadata = load_protocol_metadata(storage, listing)
    check_maintainable(protocol, metadata, "cleanup")
    if retain_ms is None:
        retain_ms = _retention(metadata.configuration, LOG_RETENTION, DEFAULT_LOG_RETENTION_MS)
    if retain_ms < 0:
        raise InvalidArgument("retention must not be negative")
    cutoff_ms = now_ms - retain_ms
    timeline = Timeline(storage, listing, ict_enablement(protocol, metadata), lambda: list_log(storage, stat=True))
    # Commit times are monotonic across the ICT enablement boundary (ICT writer requirement 5),
    # so the cutoff commit is found by the same binary search as time travel.
    deleted = clean_staged(storage, listing.latest)
    # the unbroken run of commit files ending at the newest: times are only known there
    newest = max(listing.commits, default=-1)
    first = newest
    while first - 1 in listing.commits:
        first -= 1
    try:
        cutoff_commit = last_at_or_before(max(first, listing.earliest), newest, timeline.commit_time, cutoff_ms)
    except NotFound:
        return deleted + _clean_sidecars(storage, now_ms)
    protected = max((v for v in listing.checkpoints if v <= cutoff_commit), default=None)
    if protected is None:
        return deleted + _clean_sidecars(storage, now_ms)  # no checkpoint to stand in for older commits
    keep_checkpoints_before = 0
    boundary = protection_boundary(protocol, metadata)
    if protected < boundary:
        # checkpoint protection: not everything before the boundary goes in this cleanup, so
        # checkpoints before it stay (a), and commits go only if we support every protocol among them (c)
        if not _all_supported(storage, listing, protected):
            return deleted
        keep_checkpoints_before = boundary
    doomed = cleanup_plan((info.path for info in storage.list(LOG_DIR)), protected, keep_checkpoints_before)
    for path in doomed:
        storage.delete(path)
    return deleted + doomed + _clean_sidecars(storage, now_ms)


def _clean_sidecars(storage: Storage, now_ms: int) -> list[str]:
    """Delete sidecars no retained checkpoint names and older than a day (PROTOCOL.md "Metadata
    Cleanup" steps 4-5: a younger one may belong to a checkpoint being written). If any retained
    V2 checkpoint cannot be read, every sidecar stays."""
    files = storage.list(checkpoint.SIDECAR_DIR, stat=True)
    if not files:
        return []
    try:
        listing = list_log(storage)
    except NotFound:
        return []
    needed: set[str] = set()
    try:
        for cps in listing.alternatives.values():
            for cp in cps:
                if cp.kind == "multi-part":
                    continue
                for info in cp.files:
                    data = storage.read(info.path)
                    if info.path.endswith(".json"):
                        decoded = checkpoint.decode_json(data, cp.version)
                    else:
                        decoded = checkpoint.decode_parquet(data, cp.version, ("checkpointMetadata",))
                    needed.update(sc.log_path for sc in decoded.sidecars)
    except FeedlogError:
        return []
    doomed = [
        info.path
        for info in files
        if info.path not in needed and info.modified_ms is not None and info.modified_ms < now_ms - DAY_MS
    ]
    for path in doomed:
        storage.delete(path)
    return doomed


def cleanup_plan(paths: Iterable[str], protected: int, keep_checkpoints_before: int = 0) -> list[str]:
    """Which log files go, in the order they go: commits and checkpoints of versions before the
    `protected` checkpoint, except checkpoints before `keep_checkpoints_before` (checkpoint
    protection (a)); every commit before any checkpoint (d), oldest first; log compactions starting at
    or before `protected` first of all (readers may use them in place of commits). Pure."""
    doomed = []
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        if (c := _COMPACTED.fullmatch(name)) and int(c.group(1)) <= protected:
            doomed.append((-1, int(c.group(1)), path))  # startVersion <= the cutoff checkpoint's (step 3)
            continue
        m = _VERSIONED.fullmatch(name)
        if not m or int(m.group(1)) >= protected:
            continue
        is_commit = m.group(2) == "json"
        if not is_commit and int(m.group(1)) < keep_checkpoints_before:
            continue
        doomed.append((0 if is_commit else 1, int(m.group(1)), path))
    doomed.sort()
    return [p for _, _, p in doomed]


def protection_boundary(protocol: Protocol, metadata: Metadata) -> int:
    """`delta.requireCheckpointProtectionBeforeVersion` when checkpointProtection is on, else 0."""
    if not protocol.supports_writer_feature(CHECKPOINT_PROTECTION):
        return 0
    raw = metadata.configuration.get(REQUIRE_CHECKPOINT_PROTECTION, "0")
    try:
        return max(0, int(raw))
    except ValueError:
        raise Corruption(f"{REQUIRE_CHECKPOINT_PROTECTION} is not a version number: {raw!r}") from None


def _all_supported(storage: Storage, listing: Listing, before: int) -> bool:
    """Whether feedlog supports the protocol of every retained version < `before`."""
    try:
        start = listing.earliest
        state = load_state(storage, listing, start)
        assert state.protocol is not None
        check_writable(state.protocol)
        for v in range(start + 1, before):
            for a in read_commit(storage, listing, v):
                if isinstance(a, Protocol):
                    check_writable(a)
    except FeedlogError:
        return False
    return True
