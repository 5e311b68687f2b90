"""The commit path: who decides that version v happened.

A `Committer` takes a fully encoded commit for version v and either makes it
version v or says someone else got there first, as a value (delta-kernel-rs's
`CommitResponse::Conflict`), because losing a race is the normal outcome the
transaction then rebases on. Filesystem tables decide by put-if-absent on
`_delta_log/<v>.json`; the managed-commit owner decides for managed tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .actions import Action
from .storage import FileInfo, Storage

LOG_DIR = "_delta_log"


def commit_path(version: int) -> str:
    return f"{LOG_DIR}/{version:020d}.json"


@dataclass(frozen=True)
class Committed:
    version: int


@dataclass(frozen=True)
class CommitConflict:
    """Version `version` was not ours to take.

    `retryable` is False when retrying at a later version cannot help (e.g. a
    commit owner refusing a gap), True for a plain lost race.
    """

    version: int
    retryable: bool = True
    reason: str = "another writer committed this version first"
    #: a commit owner's un-backfilled commits from `version` on, as (version, staged file name)
    winners: tuple[tuple[int, str], ...] = ()
    #: the commit owner holds the table's next version for this transaction (managed/turns.py):
    #: rebase and retry at once, no jitter
    turn: bool = False
    #: the last of `winners` is being ratified, not yet ratified (its version; managed/turns.py
    #: `ahead`): a commit rebased on it tells the owner so (`base`), and rebases again if refused
    pending: int | None = None


CommitResponse = Committed | CommitConflict


class Committer(Protocol):
    def commit(self, storage: Storage, version: int, data: bytes, actions: Sequence[Action]) -> CommitResponse:
        """Make `data` (the encoded `actions`) version `version`, or report a conflict.

        Callers commit the version after the one they read, never beyond: the filesystem committer
        cannot tell a gap (put-if-absent does not know the latest), and readers then report the log
        as corrupt; a commit owner refuses a gap as a non-retryable conflict. The contract suite
        (tests/delta/test_committer_contract.py) holds every committer to this."""
        ...

    def ratified_commits(self, storage: Storage, start_version: int) -> list[tuple[int, FileInfo]]:
        """Ratified commits >= start_version that the caller's listing of `_delta_log` may lack: ascending,
        contiguous from start_version (or none). A commit owner names those it still tracks by their
        staged files and those it has backfilled and forgotten (after the caller listed the log,
        perhaps) by their `_delta_log/<v>.json`, so a caller is never left with a stale latest."""
        ...


class FilesystemCommitter:
    """Delta's default: the storage's atomic put-if-absent is the commit (PROTOCOL.md "Creation of New Log Entries")."""

    def commit(self, storage: Storage, version: int, data: bytes, actions: Sequence[Action]) -> CommitResponse:
        if storage.put_if_absent(commit_path(version), data):
            return Committed(version)
        return CommitConflict(version)

    def ratified_commits(self, storage: Storage, start_version: int) -> list[tuple[int, FileInfo]]:
        return []  # every filesystem commit is in _delta_log the moment it exists
