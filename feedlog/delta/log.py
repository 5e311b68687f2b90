"""Reading `_delta_log`: one listing, then the table state at any retained version.

A snapshot is rebuilt from the newest checkpoint at or before the wanted
version plus the commits after it. `list_log` and `commits_after` see the
filesystem only (`_delta_log/<v>.json`, the backfilled log); `list_table` and
`catch_up` add a managed table's ratified, not yet backfilled commits, from a
`Ratified` source the caller chooses (a writer's committer, or a reader's
trusted owner).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import BeforeRetainedHistory, Corruption, FeedlogError, NotFound, Unavailable
from . import checkpoint, fast_commit
from .actions import MANAGED_COMMITS, Action, Add, CommitInfo, Metadata, Protocol, Remove, decode_commit
from .committer import LOG_DIR, commit_path
from .managed.protocol import OwnerNotConsulted
from .replay import TableState, foreign_owner
from .storage import FileInfo, LocalStorage, Storage, read_many

# ASCII digits only: `\d` also matches other scripts' digits, which int() reads, so "\u0661" * 20 +
# ".json" would have passed for a commit's file and shadowed the real one
_COMMIT = re.compile(r"(\d{20})\.json", re.ASCII)
_CLASSIC = re.compile(r"(\d{20})\.checkpoint\.parquet", re.ASCII)
_PART = re.compile(r"(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet", re.ASCII)
_UUID = re.compile(
    r"(\d{20})\.checkpoint\.([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})\.(json|parquet)",
    re.ASCII,
)


class TableNotFound(NotFound):
    """No Delta table at this location."""


#: A managed table's ratified, not yet backfilled commits >= a version, as (version, staged file),
#: ascending; asked with the table's protocol and metadata at the version before (they name the owner).
Ratified = Callable[[Protocol | None, Metadata | None, int], list[tuple[int, FileInfo]]]


def backfilled_only(protocol: Protocol | None, metadata: Metadata | None, start: int) -> list[tuple[int, FileInfo]]:
    """The `Ratified` source of a filesystem table, or of a reader that does not ask the owner."""
    return []


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint of a version: its kind and its files (several for a multi-part one)."""

    version: int
    kind: str  # "classic", "multi-part" or "v2" (UUID-named; JSON or Parquet)
    files: tuple[FileInfo, ...]

    @property
    def path(self) -> str:
        return self.files[0].path


def _choose(version: int, found: list[Checkpoint]) -> list[Checkpoint]:
    """A version's complete checkpoints, the preferred first: UUID-named V2, classic, then multi-part
    (fewest parts first). Several may exist when writers raced (PROTOCOL.md "Checkpoints")."""
    order = {"v2": 0, "classic": 1, "multi-part": 2}
    return sorted(found, key=lambda c: (order[c.kind], len(c.files), c.path))


@dataclass(frozen=True)
class Listing:
    commits: dict[int, FileInfo]
    #: the preferred complete checkpoint of each version that has one
    checkpoints: dict[int, Checkpoint]
    #: every complete checkpoint of each version, preferred first (a fallback if one is unreadable)
    alternatives: dict[int, list[Checkpoint]] = field(default_factory=dict)

    @property
    def latest(self) -> int:
        """The newest version: a checkpoint whose commit file is gone still is that version."""
        return max(max(self.commits, default=-1), max(self.checkpoints, default=-1))

    @property
    def earliest(self) -> int:
        """The oldest version a snapshot can be built at."""
        start = min(self.checkpoints, default=None)
        if 0 in self.commits or start is None:
            return min(self.commits, default=0)
        return start

    def first_missing_commit(self, after: int, through: int) -> int | None:
        """The first version in (after, through] without a commit file, None if there is none."""
        return next((v for v in range(after + 1, through + 1) if v not in self.commits), None)


def list_log(storage: Storage, stat: bool = False) -> Listing:
    """The log's commits and complete checkpoints (a multi-part one with a part missing is ignored, as
    the protocol asks); file sizes and times only with `stat` (names suffice for replay)."""
    return _listing(storage, storage.list(LOG_DIR, stat=stat))


def list_log_tail(storage: Storage) -> Listing:
    """Enough of the log for its latest state: from the checkpoint `_last_checkpoint` names on, if it
    is there with every commit after it (what delta-rs and Spark list), else the whole log. Older
    versions are not in it (`earliest` is that checkpoint's): for the latest state and protocol only.

    Listing 10,000 log files costs more than reading a checkpoint of 10,000 files (measured). On a
    local disk the files after the hint are looked up one by one instead (`_probe_tail`): a
    directory has no list-from, so a listing reads every name in it, which grows with the log's
    age (100,000 commits: ~90 ms, most of a snapshot load; tools/bench/bench_growth.py)."""
    doc = _last_checkpoint(storage)
    hint = _last_checkpoint_version(storage, doc)
    if hint is not None:
        if isinstance(storage, LocalStorage):
            probed = _probe_tail(storage, hint, doc)
            if probed is not None:
                return probed
        tail = _listing(storage, storage.list(LOG_DIR, start_after=f"{hint:020d}", stat=False))
        if hint in tail.checkpoints and tail.first_missing_commit(hint, tail.latest) is None:
            return tail
    return list_log(storage)


def _probe_tail(storage: LocalStorage, hint: int, doc: Mapping[str, Any]) -> Listing | None:
    """`list_log_tail`'s answer found by lookups, without a listing: the classic or V2 checkpoint
    `_last_checkpoint` names, and the commits from its version on (`_probe_commits_after`'s rule: while
    the checkpoint's commit is there, the commits after it are those found one by one). None where
    only a listing can tell: a multi-part checkpoint, a checkpoint or commit missing, many commits
    after it. A newer checkpoint `_last_checkpoint` does not name yet is not seen: the state is
    the same, from the older one plus the commits after it."""
    if "parts" in doc:
        return None  # multi-part (feedlog writes none): every part must be there; let a listing count them
    v2 = doc.get("v2Checkpoint")
    name = v2.get("path") if isinstance(v2, dict) else f"{hint:020d}.checkpoint.parquet"
    if not isinstance(name, str) or "/" in name:
        return None
    m = _UUID.fullmatch(name) if v2 is not None else _CLASSIC.fullmatch(name)
    if m is None or int(m.group(1)) != hint or not os.path.isfile(os.path.join(storage.root, LOG_DIR, name)):
        return None
    after = _probe_commits_after(storage, hint)  # None if the checkpoint's own commit is gone
    if after is None:
        return None
    cp = Checkpoint(hint, "v2" if v2 is not None else "classic", (FileInfo(f"{LOG_DIR}/{name}", None, None),))
    commits = {hint: FileInfo(commit_path(hint), None, None), **after}
    return Listing(commits, {hint: cp}, {hint: [cp]})


def _last_checkpoint(storage: Storage) -> dict[str, Any]:
    """`_last_checkpoint` as a JSON object; empty if it is missing or unreadable (a hint only)."""
    try:
        doc = json.loads(storage.read(checkpoint.LAST_CHECKPOINT))
    except (NotFound, ValueError, RecursionError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _last_checkpoint_version(storage: Storage, doc: Mapping[str, Any] | None = None) -> int | None:
    """The version `_last_checkpoint` names (`doc`, if the caller read it); None if it is missing or
    unreadable (a hint only)."""
    v = (_last_checkpoint(storage) if doc is None else doc).get("version")
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _listing(storage: Storage, names: list[FileInfo]) -> Listing:
    commits: dict[int, FileInfo] = {}
    found: dict[int, list[Checkpoint]] = {}
    parts: dict[tuple[int, int], dict[int, FileInfo]] = {}
    for info in names:
        name = info.path.rsplit("/", 1)[-1]
        if len(name) == 25 and name.endswith(".json") and name.isascii() and name[:20].isdecimal():  # _COMMIT
            commits[int(name[:20])] = info
        elif m := _CLASSIC.fullmatch(name):
            found.setdefault(int(m.group(1)), []).append(Checkpoint(int(m.group(1)), "classic", (info,)))
        elif m := _UUID.fullmatch(name):
            found.setdefault(int(m.group(1)), []).append(Checkpoint(int(m.group(1)), "v2", (info,)))
        elif m := _PART.fullmatch(name):
            part, total = int(m.group(2)), int(m.group(3))
            if 1 <= part <= total:
                parts.setdefault((int(m.group(1)), total), {})[part] = info
    for (version, total), got in parts.items():
        if len(got) == total:
            files = tuple(got[i] for i in range(1, total + 1))
            found.setdefault(version, []).append(Checkpoint(version, "multi-part", files))
    if not commits and not found:
        raise TableNotFound(f"no Delta table at {storage.location} (no commits or checkpoints in {LOG_DIR}/)")
    alternatives = {v: _choose(v, cps) for v, cps in found.items()}
    return Listing(commits, {v: cps[0] for v, cps in alternatives.items()}, alternatives)


def read_checkpoint(
    storage: Storage, listing: Listing, version: int, columns: Sequence[str] | None = None
) -> list[Action]:
    """The actions of the checkpoint of `version`: all its parts, and the sidecars a V2 one names;
    if the preferred checkpoint of that version cannot be read whole, another complete one is."""
    return _read_any(storage, listing, version, columns, lazy=False)[0]


def checkpoint_state(storage: Storage, listing: Listing, version: int) -> TableState:
    """The table state the checkpoint of `version` holds, its adds and removes decoded on demand."""
    actions, decoded = _read_any(storage, listing, version, None, lazy=True)
    files = decoded.files() if decoded.adds else None
    tombstones = decoded.tombstones() if decoded.removes else None
    return TableState.from_checkpoint(version, actions, files, tombstones)


def _read_any(
    storage: Storage, listing: Listing, version: int, columns: Sequence[str] | None, lazy: bool
) -> tuple[list[Action], checkpoint.Decoded]:
    candidates = listing.alternatives.get(version) or [listing.checkpoints[version]]
    problem: FeedlogError | None = None
    for cp in candidates:
        try:
            return _read_one(storage, cp, columns, lazy)
        except (NotFound, Corruption) as e:
            problem = problem or e
    assert problem is not None
    raise problem


def _read_one(
    storage: Storage, cp: Checkpoint, columns: Sequence[str] | None, lazy: bool
) -> tuple[list[Action], checkpoint.Decoded]:
    decoded = checkpoint.Decoded()
    for info in cp.files:
        try:
            data = storage.read(info.path)
        except NotFound:
            raise NotFound(
                f"checkpoint {cp.version} file {info.path} disappeared while reading (cleaned up?)"
            ) from None
        if info.path.endswith(".json"):
            checkpoint.decode_json(data, cp.version, decoded)
        else:
            checkpoint.decode_parquet(data, cp.version, columns, decoded, lazy)
    if decoded.sidecars and (columns is None or {"add", "remove"} & set(columns)):
        for sidecar in decoded.sidecars:
            try:
                data = storage.read(sidecar.log_path)
            except NotFound:
                raise Corruption(
                    f"checkpoint {cp.version} names sidecar {sidecar.path}, which is not in {checkpoint.SIDECAR_DIR}/"
                ) from None
            before = len(decoded.actions)
            checkpoint.decode_parquet(data, cp.version, columns, decoded, lazy)
            if any(not isinstance(a, (Add, Remove)) for a in decoded.actions[before:]):
                raise Corruption(
                    f"sidecar {sidecar.path} of checkpoint {cp.version} holds actions other than add and remove"
                )
    if cp.kind == "v2" and decoded.v2_version is None:
        raise Corruption(f"UUID-named checkpoint {cp.path} has no checkpointMetadata action")
    return checkpoint.finish(decoded, cp.version), decoded


def commits_after(storage: Storage, version: int, managed: bool = False) -> dict[int, FileInfo]:
    """Commit files of versions > `version` (a list-from: old files are not even looked at); `managed`:
    the table's commits are ratified by an owner before they are backfilled here."""
    if isinstance(storage, LocalStorage) and version >= 0:
        probed = _probe_commits_after(storage, version, managed)
        if probed is not None:
            return probed
    commits = {}
    for info in storage.list(LOG_DIR, start_after=f"{version:020d}.json", stat=False):
        if m := _COMMIT.fullmatch(info.path.rsplit("/", 1)[-1]):
            commits[int(m.group(1))] = info
    return commits


def _managed(state: TableState) -> bool:
    return state.protocol is not None and state.protocol.supports_writer_feature(MANAGED_COMMITS)


def _probe_commits_after(storage: LocalStorage, version: int, managed: bool = False) -> dict[int, FileInfo] | None:
    """`commits_after` on a local disk by asking for each next version's file, None if `version`'s own
    commit is gone (cleaned up: newer commits may be gone too, so only a listing can tell), unless
    the table is `managed` and the commit is only not backfilled yet.

    A directory has no list-from: listing `_delta_log` reads every name in it, ~5 ms per 10,000
    commits, and a writer's every transaction asked for it (a table written every 10 s keeps
    ~260,000 commits over the default 30-day retention). Commits are created in version order and
    cleanup removes the oldest first, so while `version`'s commit is there, the versions after it
    are exactly those found one by one: two lookups for a table nobody else wrote. None too past
    `_PROBE_LIMIT` versions.
    """
    root = os.path.join(storage.root, LOG_DIR)
    if not os.path.exists(os.path.join(root, f"{version:020d}.json")):
        if not managed:
            return None
        # A managed table's commits are ratified first and copied here later, in order, up to a
        # batch behind: not backfilled yet, so no later one is here either? Only if nothing may
        # have been cleaned up from it on: an older commit is still here (looked for 1, 2, 4, ...
        # versions back), and `_last_checkpoint` names no checkpoint past it (a cleanup that
        # deletes out of order, as an object store's batch delete may, deletes only below one).
        step, older = 1, version
        while older > 0:
            older = max(version - step, 0)
            if os.path.exists(os.path.join(root, f"{older:020d}.json")):
                newest = _last_checkpoint_version(storage)
                return {} if newest is None or newest < version else None
            step *= 2
        return None
    commits: dict[int, FileInfo] = {}
    for v in range(version + 1, version + 1 + _PROBE_LIMIT):
        if not os.path.exists(os.path.join(root, name := f"{v:020d}.json")):
            return commits
        commits[v] = FileInfo(f"{LOG_DIR}/{name}", None, None)
    return None  # far behind: one listing costs less than a lookup per version


#: versions `commits_after` looks up one by one on a local disk before it lists the directory instead
_PROBE_LIMIT = 64


def _commit_bytes(storage: Storage, listing: Listing, version: int) -> bytes | FeedlogError:
    """Commit `version`'s file, or the NotFound of a file the listing named that is gone since."""
    info = listing.commits.get(version)
    if info is None:
        raise NotFound(f"commit {version} is not in the log of {storage.location}")
    try:
        return storage.read(info.path)
    except NotFound as e:
        return e


def commit_bytes(storage: Storage, listing: Listing, version: int) -> bytes:
    """Commit `version`'s bytes where the listing found it; a ratified commit's staged file that is
    gone since is read from the log instead (its owner backfills it, then deletes the staged file:
    a served owner does so in the background, so any reader can lose that race). NotFound if the
    commit is gone from both (cleaned up)."""
    return backfilled_if_gone(storage, version, _commit_bytes(storage, listing, version))


def backfilled_if_gone(storage: Storage, version: int, data: bytes | FeedlogError) -> bytes:
    """`data` as read for commit `version`, or, where the read found nothing, the backfilled commit."""
    if isinstance(data, NotFound):
        try:
            return storage.read(commit_path(version))
        except NotFound:
            raise NotFound(f"commit {version} disappeared while reading (cleaned up?)") from None
    if isinstance(data, FeedlogError):
        raise data
    return data


def read_commit(storage: Storage, listing: Listing, version: int, ict_only: bool = False) -> list[Action]:
    """Commit `version`'s actions (with `ict_only`, its commitInfo holds the in-commit timestamp only)."""
    return decoded_commit(storage, version, _commit_bytes(storage, listing, version), ict_only)


def read_commit_info(storage: Storage, listing: Listing, version: int) -> CommitInfo | None:
    """Commit `version`'s commitInfo, where a checkpoint stands for its other actions: its own line
    decoded where a line starts with it (as every writer puts it), not the whole commit (one of
    50,000 removes cost a table load 0.4 s for it); else the whole commit is."""
    data = _commit_bytes(storage, listing, version)
    if isinstance(data, bytes):
        at = data.find(b'{"commitInfo"')
        if at == 0 or (at > 0 and data[at - 1 : at] == b"\n"):
            end = data.find(b"\n", at)
            data = data[at:] if end < 0 else data[at:end]
    return TableState.commit_info_of(decoded_commit(storage, version, data))


def decoded_commit(storage: Storage, version: int, data: bytes | FeedlogError, ict_only: bool = False) -> list[Action]:
    """A commit read as `data` (or the error its read met), decoded; a staged file gone is read again
    from the log: a ratified commit is backfilled, then its staged file cleaned up."""
    data = backfilled_if_gone(storage, version, data)
    fast = fast_commit.decode(data, ict_only)  # the common commit; None: the reference decides
    return fast if fast is not None else decode_commit(data, version, ict_only)


#: most commit files a replay reads at once (`storage.read_many`: a local directory opened once for
#: them all, an object store's reads in flight together), and about how many bytes of them it may
#: hold: after a chunk whose largest file was big, the next chunk is smaller (down to one file)
READ_CHUNK = 256
READ_CHUNK_BYTES = 32 << 20
#: the first chunk: a search that stops at the newest commits reads few in vain
FIRST_CHUNK = 16


def read_commits(
    storage: Storage,
    commits: Mapping[int, FileInfo],
    versions: Sequence[int],
    last: int | None = None,
    chunk: int = READ_CHUNK,
) -> Iterator[tuple[int, list[Action]]]:
    """`read_commit` of each version in the order given, read up to `chunk` at a time (fewer while
    commits are large); the commitInfo of each below `last` holds its in-commit timestamp only
    (replay needs no more of them). Each is decoded in turn, so an error reading a later version
    never pre-empts an earlier one's. A version missing from `commits` is a gap: Corruption, once
    the versions before it are yielded."""
    i, size = 0, min(chunk, FIRST_CHUNK)
    while i < len(versions):
        wanted = versions[i : i + size]
        found = list(itertools.takewhile(lambda v: v in commits, wanted))
        got = read_many(storage, [commits[v].path for v in found])
        largest = max((len(d) for d in got if isinstance(d, bytes)), default=0)
        for v, data in zip(found, got, strict=True):
            yield v, decoded_commit(storage, v, data, last is not None and v < last)
        if len(found) < len(wanted):
            missing = wanted[len(found)]
            raise Corruption(f"commit {missing} is missing from {storage.location}/{LOG_DIR}: the log has a gap")
        i += len(wanted)
        size = next_chunk(largest, chunk)


def next_chunk(largest: int, chunk: int = READ_CHUNK) -> int:
    """How many commit files to read at once next, after a chunk whose largest file had `largest` bytes."""
    return max(1, min(chunk, READ_CHUNK_BYTES // max(largest, 1)))


#: newest commits searched for the protocol and metadata before a table without checkpoints is
#: replayed whole (`load_protocol_metadata`)
_TAIL_SCAN = 16


def load_protocol_metadata(storage: Storage, listing: Listing) -> tuple[Protocol, Metadata]:
    """The latest protocol and metadata alone (delta-kernel's P&M replay): newest commits first,
    stopping at the first of each, else only those two columns of the newest checkpoint."""
    protocol: Protocol | None = None
    metadata: Metadata | None = None
    newest_cp = max(listing.checkpoints, default=-1)
    # With no checkpoint, they are usually in commit 0 alone: past the newest few commits, the
    # whole log is replayed from 0 instead (each commit read once, as the snapshot does) and the
    # state remembered, so that the snapshot asked for next reads none of it again.
    replay_below = (
        listing.latest - _TAIL_SCAN
        if newest_cp < 0
        and isinstance(storage, LocalStorage)
        and listing.first_missing_commit(-1, listing.latest) is None
        else -1
    )
    # the newest commits down to the first gap, read `_TAIL_SCAN` at a time (on an object store,
    # those reads in flight together) until both are found
    floor = max(newest_cp, replay_below)
    scan = list(itertools.takewhile(lambda v: v in listing.commits, range(listing.latest, floor, -1)))
    for _, actions in read_commits(storage, listing.commits, scan, chunk=_TAIL_SCAN):
        for a in actions:
            if protocol is None and isinstance(a, Protocol):
                protocol = a
            elif metadata is None and isinstance(a, Metadata):
                metadata = a
        if protocol is not None and metadata is not None:
            return _complete(protocol, metadata, listing.latest)
    if replay_below >= 0 and len(scan) == listing.latest - floor and replay_below in listing.commits:
        state = load_state(storage, listing)
        _remember(storage, state)
        assert state.protocol is not None and state.metadata is not None
        return state.protocol, state.metadata
    if newest_cp >= 0 and listing.first_missing_commit(newest_cp, listing.latest) is None:
        cp_protocol, cp_metadata = _checkpoint_protocol_metadata(storage, listing, newest_cp)
        return _complete(protocol or cp_protocol, metadata or cp_metadata, listing.latest)
    state = load_state(storage, listing)
    assert state.protocol is not None and state.metadata is not None
    return state.protocol, state.metadata


#: The protocol and metadata of recent local checkpoints, by (table, version): every listing of a table
#: asks for them (its owner is in the metadata), and decoding them from a checkpoint's Parquet costs ~2 ms.
#: An entry is used only while that version's commit file still holds the same bytes (as `_STATES`).
_CHECKPOINT_PM: OrderedDict[tuple[str, int], tuple[bytes, Protocol, Metadata]] = OrderedDict()
_KEEP_PM = 64


def _checkpoint_protocol_metadata(storage: Storage, listing: Listing, version: int) -> tuple[Protocol, Metadata]:
    local = isinstance(storage, LocalStorage)
    stamp = _fingerprint(storage, version) if local else None
    key = (storage.location, version)
    if stamp is not None:
        with _STATES_LOCK:
            hit = _CHECKPOINT_PM.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1], hit[2]
    cp = TableState.from_checkpoint(version, read_checkpoint(storage, listing, version, ("protocol", "metaData")))
    assert cp.protocol is not None and cp.metadata is not None
    if stamp is not None:
        with _STATES_LOCK:
            _CHECKPOINT_PM[key] = (stamp, cp.protocol, cp.metadata)
            _CHECKPOINT_PM.move_to_end(key)
            while len(_CHECKPOINT_PM) > _KEEP_PM:
                _CHECKPOINT_PM.popitem(last=False)
    return cp.protocol, cp.metadata


def _complete(protocol: Protocol, metadata: Metadata, version: int) -> tuple[Protocol, Metadata]:
    state = TableState(version, protocol, metadata)
    state.check_complete()
    _warn_foreign_owner(state)
    return protocol, metadata


def _warn_foreign_owner(state: TableState) -> None:
    owner = foreign_owner(state.protocol, state.metadata)
    if owner is not None:
        warnings.warn(
            f"the table is {owner}: feedlog reads its backfilled log only, and commits the owner has "
            "ratified but not yet published may be newer; feedlog refuses to write it",
            OwnerNotConsulted,
            stacklevel=3,
        )


def load_state(storage: Storage, listing: Listing, version: int | None = None) -> TableState:
    """The table at `version` (default: latest), from the newest usable checkpoint plus commits."""
    latest = listing.latest
    target = latest if version is None else version
    if target < 0 or target > latest:
        raise NotFound(f"version {target} does not exist (latest is {latest})")
    start = -1
    for cp in sorted((v for v in listing.checkpoints if v <= target), reverse=True):
        if listing.first_missing_commit(cp, target) is None:
            start = cp
            break
    if start < 0 and 0 not in listing.commits:
        if target < listing.earliest:
            raise BeforeRetainedHistory(
                f"version {target} is older than the retained log (earliest available: {listing.earliest}): "
                "it is before the table's retained history"
            )
        below = max((v for v in listing.checkpoints if v <= target), default=-1)
        gap = listing.first_missing_commit(below, target)
        raise Corruption(
            f"commit {gap} is missing from {storage.location}/{LOG_DIR}: the log has a gap, so version "
            f"{target} cannot be rebuilt (no checkpoint after the gap at or before it)"
        )
    state = TableState()
    if start >= 0:
        state = checkpoint_state(storage, listing, start)
        # Checkpoints drop commitInfo; the commit file at the checkpoint's version carries its ICT.
        if start in listing.commits:
            state.set_checkpoint_commit_info(read_commit_info(storage, listing, start))
    # only the last commit's commitInfo stays in the state: the others' ICTs are all replay needs
    for v, actions in read_commits(storage, listing.commits, range(start + 1, target + 1), last=target):
        state.apply(v, actions)
    state.check_complete()
    _warn_foreign_owner(state)
    return state


def list_table(storage: Storage, ratified: Ratified, stat: bool = False) -> Listing:
    """The backfilled log plus the ratified commits after it."""
    for _ in range(10):
        fs = list_log(storage, stat=stat)
        protocol, metadata = load_protocol_metadata(storage, fs)
        pending = ratified(protocol, metadata, fs.latest + 1)
        if not pending or pending[0][0] == fs.latest + 1:
            return Listing({**fs.commits, **dict(pending)}, fs.checkpoints, fs.alternatives)
        # the owner backfilled and forgot commits between the listing and its answer: list again
    raise Unavailable(f"the log of {storage.location} kept changing while it was being listed")


#: The latest backfilled state read of each local table (LRU, at most `_KEEP` tables, none with more
#: than `_KEEP_FILES` file actions), so a table opened again in this process reads only the commits
#: written since. An entry is used only while the commit file of its version still holds the same
#: bytes (commits are never rewritten; a table deleted and created again has other commits).
_STATES: OrderedDict[str, tuple[bytes, TableState]] = OrderedDict()
_STATES_LOCK = threading.Lock()
_KEEP = 8
_KEEP_FILES = 500_000


def forget_states() -> None:
    """Empty the process's caches of latest states and checkpoint protocols (the next load of each
    table reads its log)."""
    with _STATES_LOCK:
        _STATES.clear()
        _CHECKPOINT_PM.clear()


def _fingerprint(storage: Storage, version: int) -> bytes | None:
    try:
        return hashlib.blake2b(storage.read(commit_path(version)), digest_size=16).digest()
    except NotFound:
        return None


def _remember(storage: Storage, state: TableState) -> None:
    if not isinstance(storage, LocalStorage) or len(state.files) + len(state.tombstones) > _KEEP_FILES:
        return
    stamp = _fingerprint(storage, state.version)
    if stamp is None:
        return
    with _STATES_LOCK:
        _STATES[storage.location] = (stamp, state.copy())
        _STATES.move_to_end(storage.location)
        while len(_STATES) > _KEEP:
            _STATES.popitem(last=False)


def _remembered(storage: Storage) -> TableState | None:
    """The cached latest state of this table extended by the commits written since, or None."""
    if not isinstance(storage, LocalStorage):
        return None
    with _STATES_LOCK:
        entry = _STATES.get(storage.location)
    if entry is None:
        return None
    stamp, cached = entry
    newer = commits_after(storage, cached.version, _managed(cached))
    versions = sorted(newer)
    if _fingerprint(storage, cached.version) != stamp or versions != list(
        range(cached.version + 1, cached.version + 1 + len(versions))
    ):
        with _STATES_LOCK:
            if _STATES.get(storage.location) is entry:
                del _STATES[storage.location]
        return None
    state = cached.copy()
    for v, actions in read_commits(storage, newer, versions, last=versions[-1] if versions else None):
        state.apply(v, actions)
    state.check_complete()
    _warn_foreign_owner(state)
    if versions:
        _remember(storage, state)
    return state


def load_latest(storage: Storage, ratified: Ratified) -> TableState:
    """The latest state, backfilled log plus ratified commits, read from the newest checkpoint on
    (`list_log_tail`), or extended from the one this process read last; the owner is asked with
    the backfilled state's protocol and metadata."""
    state = _remembered(storage)
    if state is None:
        state = load_state(storage, list_log_tail(storage))
        _remember(storage, state)
    pending = ratified(state.protocol, state.metadata, state.version + 1)
    if not pending:
        return state
    versions = [v for v, _ in pending]
    if versions != list(range(state.version + 1, state.version + 1 + len(versions))):
        # the owner backfilled and forgot commits since the listing: list_table lists again
        return load_state(storage, list_table(storage, ratified))
    for v, actions in read_commits(storage, dict(pending), versions):
        state.apply(v, actions)
    state.check_complete()
    return state


def catch_up(
    storage: Storage,
    state: TableState,
    ratified: Ratified,
    check: Callable[[int, list[Action]], None] | None = None,
) -> TableState | None:
    """`state` plus the commits after it (backfilled, then ratified); None if that cannot be done
    incrementally (a gap: cleaned up or backfilled meanwhile, so read afresh). `state` is not
    modified. `check` sees each newer commit before it is applied (a rebasing transaction's
    conflict check)."""
    current = state
    for step in ("backfilled", "ratified"):
        if step == "backfilled":
            newer = commits_after(storage, current.version, _managed(current))
        else:
            newer = dict(ratified(current.protocol, current.metadata, current.version + 1))
        versions = sorted(newer)
        if versions != list(range(current.version + 1, current.version + 1 + len(versions))):
            return None
        if versions:
            current = current.copy() if current is state else current
            for v, actions in read_commits(storage, newer, versions):
                if check is not None:
                    check(v, actions)
                current.apply(v, actions)
    if current is not state:
        current.check_complete()
    return current
