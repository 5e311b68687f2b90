"""Reading `_delta_log`: one listing, then the table state at any retained version.

A snapshot is rebuilt from the newest checkpoint at or before the wanted
version plus the commits after it. `list_log` and `commits_after` see the
filesystem only (`_delta_log/<v>.json`, the backfilled log); `list_table` and
`catch_up` add a managed table's ratified, not yet backfilled commits, from a
`Ratified` source the caller chooses (a writer's committer, or a reader's
trusted owner).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import Corruption, NotFound, Unavailable
from . import checkpoint
from .actions import Action, Metadata, Protocol, decode_commit
from .committer import LOG_DIR, commit_path
from .replay import TableState
from .storage import FileInfo, Storage

_COMMIT = re.compile(r"(\d{20})\.json")
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint\.parquet")


class TableNotFound(NotFound):
    """No Delta table at this location."""


#: A managed table's ratified, not yet backfilled commits >= a version, as (version, staged file),
#: ascending; asked with the table's protocol and metadata at the version before (they name the owner).
Ratified = Callable[[Protocol | None, Metadata | None, int], list[tuple[int, FileInfo]]]


def backfilled_only(protocol: Protocol | None, metadata: Metadata | None, start: int) -> list[tuple[int, FileInfo]]:
    """The `Ratified` source of a filesystem table, or of a reader that does not ask the owner."""
    return []


@dataclass(frozen=True)
class Listing:
    commits: dict[int, FileInfo]
    checkpoints: dict[int, FileInfo]

    @property
    def latest(self) -> int:
        return max(self.commits)

    @property
    def earliest(self) -> int:
        """The oldest version a snapshot can be built at."""
        start = min(self.checkpoints, default=None)
        if 0 in self.commits or start is None:
            return min(self.commits)
        return start


def list_log(storage: Storage, stat: bool = False) -> Listing:
    """The log's commits and checkpoints; file sizes and times only with `stat` (names suffice for replay)."""
    commits: dict[int, FileInfo] = {}
    checkpoints: dict[int, FileInfo] = {}
    for info in storage.list(LOG_DIR, stat=stat):
        name = info.path.rsplit("/", 1)[-1]
        if m := _COMMIT.fullmatch(name):
            commits[int(m.group(1))] = info
        elif m := _CHECKPOINT.fullmatch(name):
            checkpoints[int(m.group(1))] = info
    if not commits:
        raise TableNotFound(f"no Delta table at {storage.location} (no commits in {LOG_DIR}/)")
    return Listing(commits, checkpoints)


def commits_after(storage: Storage, version: int) -> dict[int, FileInfo]:
    """Commit files of versions > `version` (a list-from: old files are not even looked at)."""
    commits = {}
    for info in storage.list(LOG_DIR, start_after=f"{version:020d}.json", stat=False):
        if m := _COMMIT.fullmatch(info.path.rsplit("/", 1)[-1]):
            commits[int(m.group(1))] = info
    return commits


def read_commit(storage: Storage, listing: Listing, version: int) -> list[Action]:
    info = listing.commits.get(version)
    if info is None:
        raise NotFound(f"commit {version} is not in the log of {storage.location}")
    try:
        data = storage.read(info.path)
    except NotFound:
        try:  # a ratified commit is backfilled, then its staged file cleaned up: read the backfilled copy
            data = storage.read(commit_path(version))
        except NotFound:
            raise NotFound(f"commit {version} disappeared while reading (cleaned up?)") from None
    return decode_commit(data, version)


def load_protocol_metadata(storage: Storage, listing: Listing) -> tuple[Protocol, Metadata]:
    """The latest protocol and metadata alone (delta-kernel's P&M replay): newest commits first,
    stopping at the first of each, else only those two columns of the newest checkpoint."""
    protocol: Protocol | None = None
    metadata: Metadata | None = None
    newest_cp = max(listing.checkpoints, default=-1)
    for v in range(listing.latest, newest_cp, -1):
        if v not in listing.commits:
            break
        for a in read_commit(storage, listing, v):
            if protocol is None and isinstance(a, Protocol):
                protocol = a
            elif metadata is None and isinstance(a, Metadata):
                metadata = a
        if protocol is not None and metadata is not None:
            return protocol, metadata
    if newest_cp >= 0 and all(v in listing.commits for v in range(newest_cp + 1, listing.latest + 1)):
        data = storage.read(listing.checkpoints[newest_cp].path)
        cp = TableState.from_checkpoint(newest_cp, checkpoint.decode(data, newest_cp, ("protocol", "metaData")))
        assert cp.protocol is not None and cp.metadata is not None
        return protocol or cp.protocol, metadata or cp.metadata
    state = load_state(storage, listing)
    assert state.protocol is not None and state.metadata is not None
    return state.protocol, state.metadata


def load_state(storage: Storage, listing: Listing, version: int | None = None) -> TableState:
    """The table at `version` (default: latest), from the newest usable checkpoint plus commits."""
    latest = listing.latest
    target = latest if version is None else version
    if target < 0 or target > latest:
        raise NotFound(f"version {target} does not exist (latest is {latest})")
    start = -1
    for cp in sorted((v for v in listing.checkpoints if v <= target), reverse=True):
        if all(v in listing.commits for v in range(cp + 1, target + 1)):
            start = cp
            break
    if start < 0 and 0 not in listing.commits:
        raise NotFound(f"version {target} is older than the retained log (earliest available: {listing.earliest})")
    state = TableState()
    if start >= 0:
        data = storage.read(listing.checkpoints[start].path)
        state = TableState.from_checkpoint(start, checkpoint.decode(data, start))
        # Checkpoints drop commitInfo; the commit file at the checkpoint's version carries its ICT.
        if start in listing.commits:
            state.commit_info = TableState.commit_info_of(read_commit(storage, listing, start))
    for v in range(start + 1, target + 1):
        if v not in listing.commits:
            raise Corruption(f"commit {v} is missing from {storage.location}/{LOG_DIR}: the log has a gap")
        state.apply(v, read_commit(storage, listing, v))
    return state


def list_table(storage: Storage, ratified: Ratified, stat: bool = False) -> Listing:
    """The backfilled log plus the ratified commits after it."""
    for _ in range(10):
        fs = list_log(storage, stat=stat)
        protocol, metadata = load_protocol_metadata(storage, fs)
        pending = ratified(protocol, metadata, fs.latest + 1)
        if not pending or pending[0][0] == fs.latest + 1:
            return Listing({**fs.commits, **dict(pending)}, fs.checkpoints)
        # the owner backfilled and forgot commits between the listing and its answer: list again
    raise Unavailable(f"the log of {storage.location} kept changing while it was being listed")


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
            newer = commits_after(storage, current.version)
        else:
            newer = dict(ratified(current.protocol, current.metadata, current.version + 1))
        versions = sorted(newer)
        if versions != list(range(current.version + 1, current.version + 1 + len(versions))):
            return None
        if versions:
            current = current.copy() if current is state else current
            partial = Listing(newer, {})
            for v in versions:
                actions = read_commit(storage, partial, v)
                if check is not None:
                    check(v, actions)
                current.apply(v, actions)
    return current
