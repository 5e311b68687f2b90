"""The commit owner's decisions, as pure functions (the managed-commits RFC, "Commit Owner API").

`decide(row, request)` is ratification: given the owner's state of one table and
one staged commit, what happens. Its inputs are plain values the owner read
first (the table's row, which staged file, if any, is already ratified at that
version, and the verdict of reading the staged file); its outcome is a value the
owner then carries out in the same database transaction. `route(before, after)`
is the writer's side: which owner call an ownership change is.

No I/O, no clock, no database: the rules can be read, tested and proven apart
from their effects (tests/owner/test_rules_properties.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ...errors import AlreadyExists, FeedlogError, InvalidArgument, shorten
from ..committer import CommitConflict
from .protocol import FEEDLOG_OWNER, Binding

#: a table's lifecycle at its owner; see sqlite.py for the transitions
PROPOSED, ACTIVE, RELEASING, RELEASED = "proposed", "active", "releasing", "released"


@dataclass(frozen=True)
class TableRow:
    """The owner's state of one table (one row of its database)."""

    id: str
    path: str
    state: str
    token_hash: str
    principal: str | None
    #: the latest ratified version (backfilled or not) and its in-commit timestamp
    latest: int
    latest_ict: int
    backfilled: int
    batch_size: int
    #: a registration waiting for its commit to land (state proposed)
    proposal_version: int | None
    proposal_file: str | None
    proposal_ict: int | None


@dataclass(frozen=True)
class RatifyRequest:
    """A writer asks the owner to make staged file `staged` version `version`."""

    version: int
    staged: str
    ict: int
    #: the commit gives the table back to the filesystem (`release`), not an ordinary `commit`
    release: bool
    #: the staged file already ratified as `version`, if `version` is taken
    recorded: str | None
    #: what reading the staged file found: the owner it leaves the table with (None: none), or why it
    #: is unacceptable. It matters only if the request could otherwise be accepted.
    checked: Binding | FeedlogError | None


@dataclass(frozen=True)
class Ratify:
    """Accept: record the commit as `version`, the table's latest; the table's state becomes `state`."""

    version: int
    ict: int
    state: str


@dataclass(frozen=True)
class Repeat:
    """The same staged file was already ratified as this version: a repeated request whose answer was lost."""

    version: int


@dataclass(frozen=True)
class Refuse:
    """Not accepted; the answer is `conflict`. `winners` asks for the ratified commits from the
    version on to go with it (the loser of a race reads them without asking again)."""

    conflict: CommitConflict
    winners: bool = False


Outcome = Ratify | Repeat | Refuse


def decide(row: TableRow, request: RatifyRequest) -> Outcome:
    """Ratification. In order: a table whose registration is unsettled, or that was released, takes
    nothing; a taken version is a (retryable) conflict unless it is this very staged file; a
    releasing table takes nothing more; a version beyond latest + 1 would leave a gap; then the
    staged file must be acceptable (it keeps this owner, or removes it for a release) and its
    in-commit timestamp must exceed the previous commit's (ICT writer requirement: strictly
    increasing).

    Raises InvalidArgument (or the staged file's error) for a request that can never succeed.
    """
    v = request.version
    if row.state == PROPOSED:
        # registration is not settled: until its commit is known to have landed, nothing is ratified
        # (its row says latest = version - 1, and a commit there would be answered twice)
        return Refuse(CommitConflict(v, True, "the table is being registered with this owner: re-read it"))
    if row.state == RELEASED:
        reason = f"the table was converted to a filesystem table at version {row.latest}: re-read it"
        return Refuse(CommitConflict(v, v <= row.latest, reason))
    if v <= row.latest:
        if request.recorded == request.staged:
            return Repeat(v)
        return Refuse(CommitConflict(v, True, f"version {v} is taken (latest is {row.latest})"), winners=True)
    if row.state == RELEASING:
        return Refuse(CommitConflict(v, False, "the table is being converted to a filesystem table"))
    if v > row.latest + 1:
        reason = f"version {v} would leave a gap: the latest ratified version is {row.latest}"
        return Refuse(CommitConflict(v, False, reason))
    checked = request.checked
    if isinstance(checked, FeedlogError):
        raise checked
    name = request.staged
    if request.release and checked is not None:
        raise InvalidArgument(f"staged commit {name} does not remove the commit owner from the table")
    if not request.release and checked is None:
        raise InvalidArgument(f"staged commit {name} removes the commit owner: convert the table to filesystem instead")
    if checked is not None and checked.name != FEEDLOG_OWNER:
        raise InvalidArgument(f"staged commit {name} hands the table to another owner ({checked.name})")
    if request.ict <= row.latest_ict:
        raise InvalidArgument(
            f"inCommitTimestamp {request.ict} of version {v} is not after version {row.latest}'s {row.latest_ict}"
        )
    return Ratify(v, request.ict, RELEASING if request.release else row.state)


def decide_register(
    row: TableRow | None, other_at_path: str | None, path: str, version: int, staged: str
) -> Repeat | None:
    """Registration (taking a table over): Repeat for a repeated request whose answer was lost, None
    to propose; AlreadyExists if the table, or another table at its path, is managed here already."""
    if row is not None and row.state != RELEASED:
        if row.proposal_version == version and row.proposal_file == staged:
            return Repeat(version)
        raise AlreadyExists(f"table {shorten(row.id)} is already managed by this commit owner")
    if other_at_path is not None:
        raise AlreadyExists(
            f"another table ({shorten(other_at_path)}) at {shorten(path)} is managed by this commit owner"
        )
    return None


def make_proposal(
    table_id: str,
    path: str,
    token_hash: str,
    principal: str | None,
    version: int,
    staged: str,
    ict: int,
    batch_size: int,
) -> TableRow:
    """The row of a table proposed for ownership at `version`: nothing ratified yet, its commit to be
    settled by the filesystem (it lands put-if-absent, or a filesystem writer took the version)."""
    return TableRow(
        table_id, path, PROPOSED, token_hash, principal, version - 1, -1, version - 1, batch_size, version, staged, ict
    )


def backfill_due(row: TableRow, version: int, release: bool) -> bool:
    """Whether ratifying `version` should backfill at once: a release always (the table must be whole
    in `_delta_log` before it leaves the owner), otherwise every `batch_size` commits."""
    return release or version - row.backfilled >= row.batch_size


class Route(Enum):
    """Which call decides a commit, from the table's ownership before and after it."""

    FILESYSTEM = "filesystem"  # put-if-absent; no owner before or after
    COMMIT = "commit"  # the owner ratifies an ordinary commit
    REGISTER = "register"  # the commit installs an owner (creation, filesystem -> managed)
    RELEASE = "release"  # the commit removes the owner (managed -> filesystem)


def route(before: Binding | None, after: Binding | None, same_table: bool = True) -> Route:
    """The routing of a commit that takes the table from owner `before` to owner `after` (None:
    filesystem). An owner is changed in two steps, through the filesystem (the RFC's conversions)."""
    if before is None:
        return Route.FILESYSTEM if after is None else Route.REGISTER
    if after is None:
        return Route.RELEASE
    if after != before or not same_table:
        raise InvalidArgument(
            "a managed table's commit owner is changed in two steps: convert it to a filesystem table, "
            "then to the new owner"
        )
    return Route.COMMIT
