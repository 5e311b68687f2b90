"""Commit times: `history()` and `version_at(timestamp)` per the in-commit-timestamp reader rules.

From the ICT enablement version on, a commit's time is its `inCommitTimestamp`;
before it, the commit file's modification time, made monotonic the way Delta
does (a file time not after its predecessor's counts as predecessor + 1 ms).
A timestamp at or after the enablement timestamp is resolved only among ICT
versions, an earlier one only among the older versions (ICT reader rules 1-2).
ICTs strictly increase, so `version_at` binary-searches them and reads
O(log n) commit files; file times come from the one directory listing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ..errors import BeforeRetainedHistory, Corruption, FeedlogError, InvalidArgument, NotFound, Unavailable
from .actions import CommitInfo, decode_commit, to_json
from .committer import commit_path
from .log import FIRST_CHUNK, Listing, decoded_commit, next_chunk, read_commit
from .replay import IctEnablement, TableState
from .storage import Storage, read_many


def iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class HistoryEntry:
    version: int
    #: ms since the epoch: the ICT, or the (monotonised) file time before ICT enablement
    timestamp: int
    in_commit_timestamp: int | None
    operation: str | None
    operation_parameters: dict[str, Any] = field(default_factory=dict)
    commit_info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """What `feedlog table history --json` prints for the commit (the console shows the same)."""
        return {
            "version": self.version,
            "timestamp": self.timestamp,
            "in_commit_timestamp": self.in_commit_timestamp,
            "operation": self.operation,
            "operation_parameters": self.operation_parameters,
        }


class Timeline:
    def __init__(
        self,
        storage: Storage,
        listing: Listing,
        enablement: IctEnablement | None,
        relist: Callable[[], Listing] | None = None,
    ) -> None:
        self.storage = storage
        #: the same listing with file times (a listing without them is cheaper; times are rarely needed)
        self.relist = relist
        self.listing = listing
        self.enablement = enablement
        self._file_times: dict[int, int] | None = None
        self._infos: dict[int, CommitInfo | None] = {}
        #: files read ahead (`_read_ahead`), not decoded yet
        self._raw: dict[int, bytes | FeedlogError] = {}

    # commit times

    def _commit_info(self, version: int) -> CommitInfo | None:
        if version not in self._infos:
            raw = self._raw.pop(version, None)
            if raw is None:
                actions = read_commit(self.storage, self.listing, version)
            else:
                actions = decoded_commit(self.storage, version, raw)
            self._infos[version] = next((a for a in actions if isinstance(a, CommitInfo)), None)
        return self._infos[version]

    def _read_ahead(self, versions: Sequence[int]) -> int:
        """The files of those of `versions` (the next ones `_commit_info` will be asked for) not read
        yet, read at once (`read_many`: on an object store, in flight together); each is decoded
        when asked for, so errors come in the order they did one read at a time. The size of the
        largest file read."""
        todo = [v for v in versions if v not in self._infos and v not in self._raw and v in self.listing.commits]
        got = read_many(self.storage, [self.listing.commits[v].path for v in todo])
        self._raw.update(zip(todo, got, strict=True))
        return max((len(d) for d in got if isinstance(d, bytes)), default=0)

    def _uses_ict(self, version: int) -> bool:
        return self.enablement is not None and version >= self.enablement.version

    def ict(self, version: int) -> int:
        info = self._commit_info(version)
        if info is None or info.in_commit_timestamp is None:
            missing_ict(version, self.enablement.version if self.enablement else 0)
        return info.in_commit_timestamp

    def file_time(self, version: int) -> int:
        if self._file_times is None:
            listing = self.listing
            if self.relist is not None and any(info.modified_ms is None for info in listing.commits.values()):
                listing = self.relist()  # only now are file times needed
            times: dict[int, int] = {}
            last = None
            for v in sorted(listing.commits):
                t = listing.commits[v].modified_ms
                if t is None:
                    continue  # a commit only the owner knows of: an ICT commit, its file time is never asked for
                if last is not None and t <= last:
                    t = last + 1
                times[v] = last = t
            self._file_times = times
        if version not in self._file_times:
            raise Unavailable(f"{self.storage.location} reports no modification time for commit {version}")
        return self._file_times[version]

    def commit_time(self, version: int) -> int:
        return self.ict(version) if self._uses_ict(version) else self.file_time(version)

    # history

    def history(self, limit: int | None = None) -> list[HistoryEntry]:
        """Retained commits, newest first (like DESCRIBE HISTORY); Corruption naming the commit if an
        in-commit timestamp among them is missing or not after the one before (the times would lie)."""
        if limit is not None and limit < 0:
            raise InvalidArgument(f"history limit must be >= 0, got {limit}")
        versions = sorted(self.listing.commits, reverse=True)
        if limit is not None:
            versions = versions[:limit]
        out: list[HistoryEntry] = []
        ahead, size = 0, FIRST_CHUNK  # versions[:ahead] are read ahead
        for i, v in enumerate(versions):
            if i == ahead:
                ahead += size
                size = next_chunk(self._read_ahead(versions[i:ahead]))
            info = self._commit_info(v)
            entry = HistoryEntry(
                version=v,
                timestamp=self.commit_time(v),
                in_commit_timestamp=None if info is None else info.in_commit_timestamp,
                operation=None if info is None else info.operation,
                operation_parameters={} if info is None else dict(info.operation_parameters),
                commit_info={} if info is None else to_json(info)["commitInfo"],
            )
            newer = out[-1] if out else None
            adjacent = newer is not None and newer.version == v + 1 and self._uses_ict(v)
            if adjacent and newer is not None and newer.timestamp <= entry.timestamp:
                backward_ict(newer.version, newer.timestamp, v, entry.timestamp)
            out.append(entry)
        return out

    # time travel

    def version_at(self, timestamp_ms: int) -> int:
        """The newest version whose commit time is <= `timestamp_ms`.

        Only the unbroken run of commit files ending at the latest one is searched (a commit missing
        from an older part of the log says nothing about times after it); a bad ICT the search meets
        is reported (Corruption naming the commit), not guessed around."""
        latest = max(self.listing.commits, default=-1)
        earliest = latest
        while earliest - 1 in self.listing.commits:
            earliest -= 1
        gap = earliest - 1 if earliest > self.listing.earliest else None
        e = self.enablement
        if e is None:
            lo, hi, time_of = earliest, latest, self.file_time
        elif e.timestamp is None or timestamp_ms >= e.timestamp:
            lo, hi, time_of = max(e.version, earliest), latest, self.ict
        else:
            lo, hi, time_of = earliest, e.version - 1, self.file_time
        if lo > hi or latest < 0:
            raise NotFound(f"no retained version of the table was committed at or before {iso(timestamp_ms)}")
        try:
            return last_at_or_before(lo, hi, time_of, timestamp_ms)
        except NotFound:
            if lo > earliest:
                raise
            if gap is not None and any(v < gap for v in self.listing.commits):
                # a hole in the log with commits on both sides: not a cleanup (it removes a prefix)
                raise Corruption(
                    f"{iso(timestamp_ms)} is before version {lo}, and commit {gap} is missing from the log: "
                    f"the version current then cannot be told (versions {lo} to {hi} can)"
                ) from None
            if 0 in self.listing.commits and gap is None:
                raise  # the whole log is there: nothing was committed yet at that time
            # a cleaned-up log (commits before the oldest retained one deleted on purpose) is not corrupt
            raise BeforeRetainedHistory(
                f"{iso(timestamp_ms)} is before the table's retained history (before the earliest available "
                f"commit, version {lo} at {iso(time_of(lo))}): the commits before it were cleaned up, so the "
                "version current then cannot be told"
            ) from None


def missing_ict(version: int, enabled_from: int) -> NoReturn:
    raise Corruption(
        f"commit {version} has no inCommitTimestamp although in-commit timestamps are enabled "
        f"from version {enabled_from}: the table is corrupt"
    )


def backward_ict(version: int, ict: int, before: int, previous: int) -> NoReturn:
    raise Corruption(
        f"commit {version} has inCommitTimestamp {ict} ({iso(ict)}), not after version {before}'s "
        f"{previous}: commit times there are unreliable, so no time lookup can rely on them (data at "
        'every version still reads; docs/delta-tables.md, "Time", says how to repair in-commit timestamps)'
    )


def last_at_or_before(lo: int, hi: int, time_of: Callable[[int], int], target: int, unknown: int | None = None) -> int:
    """The newest version in lo..hi with time <= target, by binary search over times that must increase;
    the times it reads are checked against each other (Corruption naming a commit out of order), except
    the `unknown` value (a commit cleaned up meanwhile: earlier than every retained one)."""
    first = time_of(lo)
    last = time_of(hi) if hi > lo else first
    if hi > lo and last <= first and unknown not in (first, last):
        backward_ict(hi, last, lo, first)
    if first > target:
        raise NotFound(f"{iso(target)} is before the earliest available commit (version {lo} at {iso(first)})")
    if last <= target:  # the common "now" and the way past a bad commit: a time after the newest commit's
        return hi
    probes = {lo: first, hi: last}
    # invariant: time_of(lo) <= target < time_of(hi + 1 if known); answer in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        t = probes[mid] = time_of(mid)
        below = max((v for v in probes if v < mid), default=None)
        above = min((v for v in probes if v > mid), default=None)
        if below is not None and unknown not in (t, probes[below]) and probes[below] >= t:
            backward_ict(mid, t, below, probes[below])
        if unknown != t and above is not None and probes[above] <= t:
            backward_ict(above, probes[above], mid, t)
        if t <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def ict_version_at(storage: Storage, lo: int, hi: int, timestamp_ms: int) -> int | None:
    """The newest version in lo..hi (all with ICTs) whose ICT is <= `timestamp_ms`, by a binary
    search of ICTs without listing the log: O(log n) commit reads.

    Cleanup removes a prefix of the log, so a missing commit file counts as "earlier than
    everything retained"; None if the answer is not retained.
    """
    missing = -(2**63)

    def ict_of(v: int) -> int:
        try:
            actions = decode_commit(storage.read(commit_path(v)), v)
        except NotFound:
            return missing
        info = TableState.commit_info_of(actions)
        if info is None or info.in_commit_timestamp is None:
            missing_ict(v, lo)
        return info.in_commit_timestamp

    try:
        v = last_at_or_before(lo, hi, ict_of, timestamp_ms, unknown=missing)
    except NotFound:
        return None
    return None if ict_of(v) == missing else v
