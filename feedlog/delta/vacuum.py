"""VACUUM: physically delete the files no retained version of a table needs (delta-spark's
`VacuumCommand`, PROTOCOL.md "Add File and Remove File": a removed file stays until its tombstone
expires after `delta.deletedFileRetentionDuration`), and the time-travel horizon it implies.

What is kept (`referenced`): every file the latest version reads (adds and their deletion
vectors), and every file named by an add, remove or cdc action (with its deletion vector) of a
commit whose time is inside the retention window, plus the latest state's tombstones deleted
inside the window (a checkpoint keeps those even where the commits are cleaned up). Every
version committed inside the window therefore reads whole: any file it reads is either still
live or was removed by a later commit, which is inside the window too (commit times increase).

What is deleted (`plan`, pure): a listed file that nothing above names, that is not hidden (a
name starting with `_` or `.`, except partition directories `col=value`, `_change_data` and
`_delta_index`, as delta-spark skips them: `_delta_log/`, `_feedlog/`, in-flight `.tmp` files)
and whose modification time is older than the cutoff (now - retention). The last rule is what
keeps a running writer's uncommitted files: they are younger than the retention. A `--force`d
retention shorter than a writer's longest transaction can delete its files (delta-spark warns of
the same; delta#1470); the commits made while vacuum ran are read again before deleting, so an
append that committed meanwhile is never touched.

Commits: `VACUUM START` (operationParameters retentionCheckEnabled, defaultRetentionMillis,
specifiedRetentionMillis; operationMetrics numFilesToDelete, sizeOfDataToDelete) before the first
delete and `VACUUM END` (status COMPLETED or FAILED; numDeletedFiles, numVacuumedDirectories)
after the last, empty commits through the table's own committer, so a managed table's go through
its owner. START also records its cutoff (`commitInfo.feedlog.vacuum_cutoff_ms`): a forced, shorter
retention moves the time-travel horizon to it (`check_horizon`). A crash between them leaves a
readable table (only unreferenced files were deleted) and a START without an END; running vacuum
again finishes the job.

Directories left empty are deleted after the files (never the root or a hidden one), as delta-spark
deletes empty ones; a writer that finds its directory gone makes it again (LocalStorage retries).

Memory: the referenced paths (one per live file, as the latest state holds anyway) and one
directory's listing at a time; the files to delete go to a spooled buffer (`Paths`: a temporary
file past 8 MiB), not a Python object each, and are deleted a directory's run at a time.

Deliberate differences: delta-spark deletes a directory already empty when it lists it, and one its
files leave empty at its next run; feedlog deletes both at once. delta-rs's full mode treats only
the first path component as possibly hidden, so it deletes `p=a/.x` and `p=a/_tmp/y`, which
delta-spark and feedlog keep.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import tempfile
import urllib.parse
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from .. import failpoints
from ..errors import BeforeHorizon, Corruption, FeedlogError, InvalidArgument, NotFound
from . import dv
from .actions import DELETED_FILE_RETENTION, Add, Metadata, Remove
from .log import Listing, backfilled_if_gone, commit_bytes
from .maintenance import check_maintainable
from .replay import IctEnablement, TableState, ict_enablement, parse_interval
from .storage import FileInfo, Storage, delete_dir, delete_in, read_many, walk
from .timeline import Timeline, iso
from .transaction import CommitResult, Transaction

DEFAULT_RETENTION_MS = 7 * 86_400_000
#: directories under a hidden-looking name that hold table files all the same (delta-spark, delta-rs)
_NOT_HIDDEN = ("_change_data", "_delta_index")


@dataclass(frozen=True)
class VacuumResult:
    """What a vacuum deleted (or, dry run, would delete)."""

    dry_run: bool
    #: the deleted files (dry run: those that would be), relative to the table root, in listing order
    files: Paths
    #: their total size in bytes
    size: int
    #: directories walked
    directories: int
    retention_ms: int
    #: files modified before this time (ms) and not referenced are deleted
    cutoff_ms: int
    #: the versions of the VACUUM START and END commits (None for a dry run)
    start_version: int | None = None
    end_version: int | None = None
    #: directories left empty and deleted (none in a dry run, or on an object store)
    directories_deleted: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def table_retention(metadata: Metadata | None) -> int:
    """`delta.deletedFileRetentionDuration` in ms (default 7 days)."""
    raw = None if metadata is None else metadata.configuration.get(DELETED_FILE_RETENTION)
    return DEFAULT_RETENTION_MS if raw is None else parse_interval(raw)


def check_retention(retain_ms: int | None, table_ms: int, enforce: bool) -> int:
    """The retention to use: `retain_ms` or the table's. A negative one is refused; one shorter than
    the table's unless `enforce` is off (delta-spark's `retentionDurationCheck`)."""
    if retain_ms is None:
        return table_ms
    if retain_ms < 0:
        raise InvalidArgument(f"retention must not be negative, got {retain_ms} ms")
    if enforce and retain_ms < table_ms:
        raise InvalidArgument(
            f"retention {_hours(retain_ms)} is shorter than the table's delta.deletedFileRetentionDuration "
            f"({_hours(table_ms)}): a shorter one can delete files that readers of old versions and running "
            "writers still need; give --force (DeltaTable.vacuum(enforce_retention=False)) if you are sure"
        )
    return retain_ms


def _hours(ms: int) -> str:
    return f"{ms / 3_600_000:g} hours"


# the rule (pure)


def hidden(path: str, partition_dirs: Sequence[str] = ()) -> bool:
    """Whether `path` (relative to the table root) is under, or is, a hidden name: a component starting
    with `_` or `.`, except `_change_data`, `_delta_index` and partition directories (`col=` prefixes)."""
    if path[:1] not in ("_", ".") and "/_" not in path and "/." not in path:
        return False  # no component starts so (most paths: checked without splitting them)
    for part in path.split("/"):
        if part[:1] not in ("_", "."):
            continue
        if part.startswith(_NOT_HIDDEN) or any(part.startswith(d) for d in partition_dirs):
            continue
        return True
    return False


def plan(
    files: Iterable[FileInfo], referenced: Container[str], cutoff_ms: int, partition_dirs: Sequence[str] = ()
) -> Iterator[FileInfo]:
    """The listed `files` to delete: not hidden, not `referenced` (decoded paths relative to the table
    root), and modified before `cutoff_ms` (a file without a modification time is kept). Pure."""
    for info in files:
        if info.modified_ms is None or info.modified_ms >= cutoff_ms:
            continue
        if info.path in referenced or hidden(info.path, partition_dirs):
            continue
        yield info


#: schemes that name the same store (Hadoop's S3 connectors): a log may spell a table's files either way
_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3"}


def _inside(decoded: str, root: str, local: bool) -> str | None:
    """`decoded` relative to `root` (both absolute paths), after collapsing `//` and `.` (and, on a local
    disk, resolving links), or None if it lies outside."""
    if local:
        decoded, root = os.path.realpath(decoded), os.path.realpath(root)
    else:
        decoded, root = posixpath.normpath(decoded), posixpath.normpath(root)
    root = root.rstrip("/") + "/"
    return decoded[len(root) :] if decoded.startswith(root) else None


def relative(path: str, location: str) -> str | None:
    """A log path (URL-encoded, relative or absolute) as a path relative to the table root, decoded as
    listings name files; None for a file outside the table (never listed, so never deleted).

    Fail-safe: a file of the table that the log names another way (`s3a://` for `s3://`, a doubled
    slash, a local path through a link) must still be recognised, or vacuum would delete a live file."""
    if "%" not in path and ":" not in path and not path.startswith("/"):
        return path  # the usual relative path with nothing encoded (one parse per live file adds up)
    parts = urllib.parse.urlsplit(path)
    loc = urllib.parse.urlsplit(location)
    local_loc = not loc.scheme or (len(loc.scheme) == 1 and not location.startswith(f"{loc.scheme}://"))
    if not parts.scheme or (len(parts.scheme) == 1 and not path.startswith(f"{parts.scheme}://")):
        if path.startswith("/"):
            root = location if local_loc else urllib.parse.unquote(loc.path)
            return _inside(urllib.parse.unquote(path), root, local_loc or loc.scheme.lower() == "file")
        return urllib.parse.unquote(path)
    decoded = urllib.parse.unquote(parts.path)
    scheme = _SCHEME_ALIASES.get(parts.scheme.lower(), parts.scheme.lower())
    if not local_loc:
        if _SCHEME_ALIASES.get(loc.scheme.lower(), loc.scheme.lower()) != scheme or loc.netloc != parts.netloc:
            return None
        return _inside(decoded, urllib.parse.unquote(loc.path), scheme == "file")
    if scheme == "file":
        return _inside(decoded, location, True)
    return None


def _dv_path(raw: object) -> str | None:
    """The file a `deletionVector` descriptor names (relative 'u', absolute 'p'), None if inline."""
    if not isinstance(raw, Mapping):
        return None
    d = dv.Descriptor.from_json(raw)
    if d.storage_type == "u":
        return d.relative_path()
    if d.storage_type == "p":
        return d.path_or_inline_dv
    return None


def files_of(actions: Iterable[Add | Remove]) -> Iterator[str]:
    """The files (log paths, not decoded) an add or remove reads: its data file and deletion vector."""
    for a in actions:
        yield a.path
        if (p := _dv_path(a.extra.get("deletionVector"))) is not None:
            yield p


def commit_files(data: bytes, version: int) -> Iterator[str]:
    """The files (log paths) named by the add, remove and cdc actions of one commit file, with their
    deletion vectors. (Read here rather than through `decode_commit`, which drops cdc actions.)"""
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise Corruption(f"commit {version} line {lineno} is not JSON") from None
        if not isinstance(obj, dict):
            raise Corruption(f"commit {version} line {lineno} is not an action object")
        for kind in ("add", "remove", "cdc"):
            body = obj.get(kind)
            if isinstance(body, dict) and isinstance(body.get("path"), str):
                yield body["path"]
                if (p := _dv_path(body.get("deletionVector"))) is not None:
                    yield p


def partition_dirs(metadata: Metadata) -> list[str]:
    """The `name=` prefixes of the partition directories: by logical name, and by physical name under
    column mapping (which names directories by it)."""
    out = [f"{c}=" for c in metadata.partition_columns]
    try:
        schema = json.loads(metadata.schema_string) if metadata.schema_string else {}
    except ValueError:
        return out
    for f in schema.get("fields", []) if isinstance(schema, dict) else []:
        if isinstance(f, dict) and f.get("name") in metadata.partition_columns:
            physical = (f.get("metadata") or {}).get("delta.columnMapping.physicalName")
            if isinstance(physical, str):
                out.append(f"{physical}=")
    return out


# the I/O edge


class PathSet:
    """Relative paths grouped by directory, so a walk can pass over a directory's referenced files
    without a stat (`names`) and membership costs no joined string per listed file."""

    def __init__(self, paths: Iterable[str] = ()) -> None:
        self.dirs: dict[str, set[str]] = {}
        for path in paths:
            self.add(path)

    def add(self, path: str) -> None:
        directory, _, name = path.rpartition("/")
        names = self.dirs.get(directory)
        if names is None:
            names = self.dirs[directory] = set()
        names.add(name)

    def names(self, directory: str) -> Container[str]:
        return self.dirs.get(directory, _NONE)

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str):
            return False
        directory, _, name = path.rpartition("/")
        return name in self.dirs.get(directory, _NONE)

    def __len__(self) -> int:
        return sum(len(n) for n in self.dirs.values())


_NONE: frozenset[str] = frozenset()


class Paths:
    """The files vacuum deletes, compact, in listing order: `path NUL size NUL` records (no path holds a
    NUL) in one spooled buffer, in memory up to `spill_bytes` and in a temporary file (TMPDIR) past
    it, with their count and total size. Listing millions of files holds no Python object per file,
    and reading them back streams. A Collection: len, iteration, `in` (a scan)."""

    def __init__(self, spill_bytes: int | None = None) -> None:
        limit = SPILL_BYTES if spill_bytes is None else spill_bytes
        self._buf = tempfile.SpooledTemporaryFile(max_size=limit)  # noqa: SIM115 (lives as long as this)
        self._end = 0
        self.count = 0
        self.size = 0

    def add(self, path: str, size: int) -> None:
        self._end += self._buf.write(b"%b\0%d\0" % (path.encode("utf-8", "surrogateescape"), size))
        self.count += 1
        self.size += size

    @property
    def spilled(self) -> bool:
        return bool(getattr(self._buf, "_rolled", False))

    def _chunks(self) -> Iterator[list[bytes]]:
        """The records (path, size, path, size...), a chunk of whole pairs at a time."""
        buf, end = self._buf, self._end
        pos, rest = 0, b""
        try:
            while pos < end:
                buf.seek(pos)  # (again: two readers may take turns)
                block = buf.read(min(_READ_BLOCK, end - pos))
                pos += len(block)
                parts = (rest + block).split(b"\0")
                rest = parts.pop()
                if len(parts) % 2:
                    rest = parts.pop() + b"\0" + rest
                yield parts
        finally:
            buf.seek(end)  # where the next `add` writes, however far this reader got

    def __iter__(self) -> Iterator[str]:
        for chunk in self._chunks():
            for raw in chunk[::2]:
                yield raw.decode("utf-8", "surrogateescape")

    def sized(self) -> Iterator[tuple[str, int]]:
        """(path, size) of each."""
        for chunk in self._chunks():
            for i in range(0, len(chunk), 2):
                yield chunk[i].decode("utf-8", "surrogateescape"), int(chunk[i + 1])

    def by_directory(self, most: int) -> Iterator[tuple[str, list[str]]]:
        """(directory, names) for each run of paths in one directory, at most `most` names a run."""
        current: str | None = None
        names: list[str] = []
        for path in self:
            directory, _, name = path.rpartition("/")
            if directory != current or len(names) >= most:
                if names:
                    assert current is not None
                    yield current, names
                current, names = directory, []
            names.append(name)
        if names:
            assert current is not None
            yield current, names

    def __len__(self) -> int:
        return self.count

    def __contains__(self, path: object) -> bool:
        return any(p == path for p in self)

    def __repr__(self) -> str:
        return f"Paths({self.count} files, {self.size} bytes)"

    def close(self) -> None:
        self._buf.close()


#: bytes of paths `Paths` keeps in memory before it spills them to a temporary file (~100k paths)
SPILL_BYTES = 8 << 20
_READ_BLOCK = 1 << 20


@dataclass
class Referenced:
    """The decoded relative paths vacuum keeps, and how far back the window's commits were read."""

    paths: PathSet
    #: the oldest version whose commit was read as inside the window (None: none was)
    oldest: int | None


def _add_files(raw: set[str], actions: Iterable[Add | Remove]) -> None:
    """`files_of(actions)` into `raw` (the loop inlined: it runs once per live file)."""
    add = raw.add
    for a in actions:
        add(a.path)
        d = a.extra.get("deletionVector")
        if d is not None and (p := _dv_path(d)) is not None:
            add(p)


def referenced(
    storage: Storage,
    state: TableState,
    listing: Listing,
    enablement: IctEnablement | None,
    file_time: Callable[[int], int],
    cutoff_ms: int,
) -> Referenced:
    """Every file a version committed at or after `cutoff_ms` may read (module docstring): the live
    files of `state` (the latest), its tombstones deleted since the cutoff, and every file the commits
    since the cutoff name, read newest first until one older than the cutoff."""
    where = storage.location
    raw: set[str] = set()
    assert state.protocol is not None
    features = set(state.protocol.reader_features or ()) | set(state.protocol.writer_features or ())
    if "deletionVectors" in features:
        _add_files(raw, state.files.values())
    else:
        raw.update(state.files)  # keyed by path, and no deletion vectors: no add need be decoded
    recent = [r for r in state.tombstones.values() if r.deletion_timestamp is None or r.deletion_timestamp >= cutoff_ms]
    _add_files(raw, recent)
    oldest = None
    for v in sorted((v for v in listing.commits if v <= state.version), reverse=True):
        if enablement is None or v < enablement.version:  # a file time: known before reading the file
            with contextlib.suppress(FeedlogError):
                if file_time(v) < cutoff_ms:
                    break
        try:  # (a ratified commit's staged file backfilled meanwhile is read from the log)
            data = commit_bytes(storage, listing, v)
        except NotFound:
            break  # cleaned up meanwhile: older commits are gone too; the tombstones stand for them
        when = _commit_time(data, v, enablement, file_time)
        if when is not None and when < cutoff_ms:
            break
        raw.update(commit_files(data, v))
        oldest = v
    paths = PathSet()
    for r in raw:
        if "%" not in r and ":" not in r and r[:1] != "/":
            paths.add(r)  # the usual relative path, nothing encoded (`relative` would return it)
        elif (rel := relative(r, where)) is not None:
            paths.add(rel)
    return Referenced(paths, oldest)


def _commit_time(
    data: bytes, version: int, enablement: IctEnablement | None, file_time: Callable[[int], int]
) -> int | None:
    """The commit's time (ICT from the enablement version on, else its file's); None if it cannot be
    told (kept, then: only a time shows a commit is outside the window)."""
    try:
        if enablement is not None and version >= enablement.version:
            for line in data.split(b"\n"):
                if b"commitInfo" in line:
                    info = json.loads(line).get("commitInfo")
                    ict = info.get("inCommitTimestamp") if isinstance(info, dict) else None
                    return ict if isinstance(ict, int) and not isinstance(ict, bool) else None
            return None
        return file_time(version)
    except (ValueError, FeedlogError):
        return None


#: deletes in flight at once (a local unlink and an object store's DELETE both wait without the GIL)
DELETE_PARALLEL = 4
#: most names one delete call takes (S3's DeleteObjects takes 1000 keys a request)
DELETE_BATCH = 1000


def delete_files(storage: Storage, doomed: Paths, spare: Container[str] = _NONE) -> int:
    """Delete `doomed` but `spare`, a directory's run at a time (`storage.delete_in`), up to
    `DELETE_PARALLEL` runs at once and as many more queued (memory stays bounded); the number deleted
    (all, or the first error is raised). A fail point before each delete (crash tests)."""

    def names(directory: str, batch: list[str]) -> Iterator[str]:
        prefix = f"{directory}/" if directory else ""
        for name in batch:
            if spare is _NONE or prefix + name not in spare:
                failpoints.point("vacuum.delete")
                yield name

    def one(run: tuple[str, list[str]]) -> int:
        return delete_in(storage, run[0], names(*run))

    runs = doomed.by_directory(DELETE_BATCH)
    if len(doomed) < 2 * DELETE_BATCH:
        return sum(one(run) for run in runs)
    deleted = 0
    with ThreadPoolExecutor(DELETE_PARALLEL, thread_name_prefix="feedlog-vacuum") as pool:
        pending: set[Future[int]] = set()
        for run in runs:
            if len(pending) >= 2 * DELETE_PARALLEL:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                deleted += sum(f.result() for f in done)
            pending.add(pool.submit(one, run))
        deleted += sum(f.result() for f in pending)
    return deleted


def vacuum(
    storage: Storage,
    state: TableState,
    listing: Listing,
    now_ms: int,
    retain_ms: int | None = None,
    *,
    enforce_retention: bool = True,
    dry_run: bool = False,
    transaction: Callable[[str], Transaction] | None = None,
    commit: Callable[[Transaction], CommitResult] | None = None,
    relist: Callable[[], Listing] | None = None,
    reread: Callable[[int], Iterable[tuple[int, bytes]]] | None = None,
) -> VacuumResult:
    """Vacuum the table whose latest `state` and log `listing` (with ratified commits) are given.

    `transaction(operation)` starts a commit on the latest state and `commit(tx)` commits it (the
    table's own committer: a managed table's owner); `reread(after)` gives the commits after a version
    (raw), read again after VACUUM START so that a commit made meanwhile keeps its files. A dry run
    decides and deletes nothing, and commits nothing."""
    assert state.protocol is not None and state.metadata is not None
    # Refused by name on a table with a writer feature feedlog does not support: vacuum must know
    # every feature that can reference a file. `vacuumProtocolCheck` (a reader-writer feature) asks
    # exactly this of vacuum, to check the writer protocol first: here it is checked always.
    check_maintainable(state.protocol, state.metadata, "vacuum")
    table_ms = table_retention(state.metadata)
    retention = check_retention(retain_ms, table_ms, enforce_retention)
    cutoff = now_ms - retention
    enablement = ict_enablement(state.protocol, state.metadata)
    timeline = Timeline(storage, listing, enablement, relist)
    keep = referenced(storage, state, listing, enablement, timeline.file_time, cutoff)
    dirs = partition_dirs(state.metadata)
    walked: dict[str, None] = {}  # parents before children (a directory is found in its parent's listing)

    def prune(directory: str) -> bool:
        if hidden(directory.rsplit("/", 1)[-1], dirs):
            return True
        walked[directory] = None
        return False

    # the referenced files are passed over unlisted (a local walk does not even stat them); the rule
    # (`plan`) decides on the rest, and what it dooms is kept compact (Paths) until it is deleted
    doomed = Paths()
    for info in plan(walk(storage, prune, keep.paths.names), keep.paths, cutoff, dirs):
        doomed.add(info.path, info.size or 0)
    keep = Referenced(PathSet(), keep.oldest)  # done with: free it before deleting
    n_dirs = len(walked) + 1  # the table root too
    if dry_run:
        return VacuumResult(True, doomed, doomed.size, n_dirs, retention, cutoff)
    assert transaction is not None and commit is not None
    start_tx = transaction("VACUUM START")
    start_tx.operation_parameters = {
        "retentionCheckEnabled": enforce_retention,
        "defaultRetentionMillis": table_ms,
        **({} if retain_ms is None else {"specifiedRetentionMillis": retain_ms}),
    }
    start_tx.info_extra = {
        "operationMetrics": {"numFilesToDelete": str(len(doomed)), "sizeOfDataToDelete": str(doomed.size)},
        # the time-travel horizon this vacuum sets (`start_cutoff`): exact, where delta-spark's own
        # START leaves it to be told from its time and parameters
        "feedlog": {CUTOFF_FIELD: cutoff},
    }
    started = commit(start_tx)
    assert started.version is not None
    failpoints.point("vacuum.started")
    deleted = 0
    try:
        meanwhile: Container[str] = _NONE
        if reread is not None and started.version > state.version + 1:
            # commits made while vacuum decided: what they name is referenced now, so it stays
            named = PathSet()
            for v, data in reread(state.version):
                if v < started.version:
                    for r in commit_files(data, v):
                        if (p := relative(r, storage.location)) is not None:
                            named.add(p)
            if len(named):
                meanwhile = named
                kept = Paths()
                for path, size in doomed.sized():
                    if path not in named:
                        kept.add(path, size)
                doomed.close()
                doomed = kept
        deleted = delete_files(storage, doomed, meanwhile)
        # then the directories left empty, children first (delta-spark deletes empty directories
        # too): only walked ones, so never the root, `_delta_log`, `_feedlog` or a hidden one; rmdir
        # removes only an empty one, so one a writer has put a file in since stays
        emptied = sum(1 for d in reversed(walked) if delete_dir(storage, d))
    except Exception:
        with contextlib.suppress(FeedlogError):  # what the delete raised is what the caller must see
            _end(transaction, commit, "FAILED", deleted, n_dirs)
        raise
    failpoints.point("vacuum.deleted")
    # numDeletedFiles counts the directories too, as delta-spark's does ("Deleted N files and
    # directories in a total of M directories", M its numVacuumedDirectories: those it listed)
    ended = _end(transaction, commit, "COMPLETED", deleted + emptied, n_dirs)
    return VacuumResult(False, doomed, doomed.size, n_dirs, retention, cutoff, started.version, ended.version, emptied)


def _end(
    transaction: Callable[[str], Transaction],
    commit: Callable[[Transaction], CommitResult],
    status: str,
    deleted: int,
    directories: int,
) -> CommitResult:
    tx = transaction("VACUUM END")
    tx.operation_parameters = {"status": status}
    tx.info_extra = {"operationMetrics": {"numDeletedFiles": str(deleted), "numVacuumedDirectories": str(directories)}}
    return commit(tx)


# time travel at the horizon


#: the field of commitInfo.feedlog where a VACUUM START records its cutoff (ms)
CUTOFF_FIELD = "vacuum_cutoff_ms"
#: the cutoff of a VACUUM START whose time cannot be told: every older version may have lost files
UNKNOWN_CUTOFF = 2**63 - 1


def start_cutoff(data: bytes) -> int | None:
    """The cutoff of a VACUUM START commit (raw commit file), None for any other commit. Pure.

    A version committed before the cutoff may have lost files to that vacuum (it kept only what
    versions committed since read). feedlog's START records it (`commitInfo.feedlog.vacuum_cutoff_ms`);
    another engine's is its time (ICT, else `timestamp`) less its retention (`specifiedRetentionMillis`,
    else `defaultRetentionMillis`; delta-spark and delta-rs write them as strings). A START that tells
    neither has UNKNOWN_CUTOFF: refusing an old version is safe, answering it in part is not."""
    if b"VACUUM START" not in data:
        return None  # most commits: no JSON parsed
    for line in data.split(b"\n"):
        if b"commitInfo" not in line:
            continue
        try:
            info = json.loads(line).get("commitInfo")
        except (ValueError, AttributeError):
            continue
        if not isinstance(info, dict) or info.get("operation") != "VACUUM START":
            return None
        ours = info.get("feedlog")
        if isinstance(ours, dict) and (cutoff := _millis(ours.get(CUTOFF_FIELD))) is not None:
            return cutoff
        when = _millis(info.get("inCommitTimestamp"))
        when = _millis(info.get("timestamp")) if when is None else when
        params = info.get("operationParameters")
        params = params if isinstance(params, dict) else {}
        retention = _millis(params.get("specifiedRetentionMillis"))
        retention = _millis(params.get("defaultRetentionMillis")) if retention is None else retention
        if when is None or retention is None:
            return UNKNOWN_CUTOFF
        return when - retention
    return None


def _millis(raw: object) -> int | None:
    """An integer as delta writes them in commitInfo: a JSON number or a decimal string."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str) and raw.strip().lstrip("-").isdigit():
        return int(raw)
    return None


def check_horizon(
    version: int,
    latest: int,
    commit_ms: int | None,
    needed: Iterable[str],
    live: Container[str],
    now_ms: int,
    retention_ms: int,
    vacuumed_ms: int | None = None,
) -> None:
    """BeforeHorizon if `version` may have lost files to vacuum. Pure.

    The rule (decided here, after delta-spark, which blocks time travel older than the deleted-file
    retention): a version is before the horizon when its commit time is older than the horizon, it
    is not the latest, and it reads a file (`needed`: data files and deletion vectors) the latest
    version does not (`live`): vacuum never deletes those, so such a version stays whole. The horizon
    is now - retention (vacuum keeps every file of a younger version: see the module docstring), or
    later where a vacuum with a shorter, forced retention ran since the version was committed:
    `vacuumed_ms`, the greatest cutoff of a VACUUM START after it (`start_cutoff`). A version whose
    time cannot be told (`commit_ms` None) counts as old. The answer depends on the log alone, not on
    which files happen to be left, so a version is refused whole, never answered in part."""
    by_retention = now_ms - retention_ms
    horizon = by_retention if vacuumed_ms is None else max(by_retention, vacuumed_ms)
    if version >= latest or (commit_ms is not None and commit_ms >= horizon):
        return
    if all(p in live for p in needed):
        return
    when = "an unknown time" if commit_ms is None else iso(commit_ms)
    if horizon == by_retention:
        why = f"now - delta.deletedFileRetentionDuration of {_hours(retention_ms)}"
    elif horizon == UNKNOWN_CUTOFF:
        why = "a later vacuum whose cutoff the log does not tell"
    else:
        why = "the cutoff of a later vacuum with a retention shorter than the table's"
    raise BeforeHorizon(
        f"version {version} (committed {when}) is before the table's time-travel horizon "
        f"{'(unknown)' if horizon == UNKNOWN_CUTOFF else iso(horizon)} ({why}): files it reads are no longer "
        "part of the table and vacuum may have deleted them; read a version committed after the horizon",
        horizon,
    )


class VacuumCutoffs:
    """The cutoffs of the VACUUM STARTs in the log, read once per commit and kept per table handle:
    a time travel reads only the commits after its version it has not read before (commits after a
    version inside the retention window are inside it too, so the work is bounded by the window)."""

    def __init__(self) -> None:
        #: the versions read so far, a contiguous run (None: none)
        self.read: range | None = None
        self.starts: dict[int, int] = {}

    def after(self, storage: Storage, listing: Listing, version: int, latest: int) -> int | None:
        """The greatest cutoff of a VACUUM START committed after `version`, through `latest`; None if
        none. A commit gone from the log (a checkpoint standing for it, or cleaned up meanwhile) cannot
        tell and is passed over: a read of a file vacuum deleted still fails whole (NotFound), never
        answers in part. One that cannot be read for another reason raises."""
        done = self.read
        want = range(version + 1, latest + 1)
        if done is not None:  # one run still: a gap between the two is read too
            want = range(min(want.start, done.start), max(want.stop, done.stop))
        todo = [v for v in want if done is None or v not in done]
        if todo:
            present = [v for v in todo if v in listing.commits]
            for v, got in zip(present, read_many(storage, [listing.commits[v].path for v in present]), strict=True):
                try:  # (a ratified commit's staged file backfilled meanwhile is read from the log)
                    data = backfilled_if_gone(storage, v, got)
                except NotFound:
                    continue
                if (cutoff := start_cutoff(data)) is not None:
                    self.starts[v] = cutoff
            self.read = want
        return max((c for v, c in self.starts.items() if version < v <= latest), default=None)
