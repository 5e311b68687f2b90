"""The client side of a managed table: `ManagedCommitter` stages a commit and asks the owner;
`Router` sends each commit of a table to the right call.

`resolve_owner` turns the owner a table names into a client: the in-process
owner (`sqlite.py`, its state in a SQLite file or PostgreSQL) or the gRPC
service (`client.py`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence

from ... import failpoints
from ...errors import AlreadyExists, Corruption, FeedlogError, InvalidArgument, NotFound, Unavailable, Unsupported
from ...rpc import Tls
from ..actions import OWNER_CONF, Action, CommitInfo, Metadata, Protocol
from ..committer import CommitConflict, CommitResponse, Committed, FilesystemCommitter, commit_path
from ..storage import FileInfo, Storage, put_new
from .client import GrpcOwner
from .database import is_postgres
from .protocol import FEEDLOG_OWNER, Auth, Binding, CommitOwner, TableRef, check_owner_url
from .rules import Route, route
from .sqlite import LocalOwner
from .staged import COMMITS_DIR, staged_name

_LOCAL_OWNERS: dict[str, CommitOwner] = {}
_LOCAL_OWNERS_LOCK = threading.Lock()  # tables opened in several threads share one owner per database
_FILESYSTEM = FilesystemCommitter()


def resolve_owner(binding: Binding, tls: Tls | None = None) -> CommitOwner:
    """A client for the owner a table names (one per database file, PostgreSQL URL or endpoint in a
    process). A table may name a `postgresql://` URL only without a password (`check_owner_url`):
    the in-process owner finds one, if it needs one, where libpq looks (PGPASSWORD, ~/.pgpass)."""
    if binding.name != FEEDLOG_OWNER:
        raise Unsupported(f"commit owner {binding.name!r} is not one feedlog can talk to (only {FEEDLOG_OWNER!r})")
    conf = binding.config
    if "endpoint" in conf:
        return GrpcOwner.shared(conf["endpoint"], tls)
    if "db" in conf:
        db = conf["db"]
        if is_postgres(db):
            check_owner_url(db)  # a table written by someone else may still carry one: never use it
        with _LOCAL_OWNERS_LOCK:
            if db not in _LOCAL_OWNERS:
                _LOCAL_OWNERS[db] = LocalOwner(db)
            return _LOCAL_OWNERS[db]
    raise Corruption(f"{OWNER_CONF} names neither an endpoint nor a db: {conf}")


def ict_of(actions: Sequence[Action]) -> int:
    info = actions[0] if actions else None
    if not isinstance(info, CommitInfo) or info.in_commit_timestamp is None:
        raise InvalidArgument("a managed commit must start with commitInfo carrying its inCommitTimestamp")
    return info.in_commit_timestamp


class ManagedCommitter:
    """Commits one managed table through its owner (a `Committer`, plus the ownership changes).

    A call whose answer is lost (the owner unreachable, a dropped connection) is
    repeated with the same staged file, which the owner treats idempotently; if
    the owner has meanwhile backfilled and forgotten the version, the backfilled
    file is compared with ours. So an uncertain commit is resolved by asking,
    never by committing the same change twice.
    """

    def __init__(self, owner: CommitOwner, table: TableRef, auth: Auth, *, attempts: int = 6) -> None:
        self.owner = owner
        self.table = table
        self.auth = auth
        self.attempts = attempts

    def _stage(self, storage: Storage, version: int, data: bytes) -> str:
        name = staged_name(version)
        if not put_new(storage, f"{COMMITS_DIR}/{name}", data):  # a name of its own: written in place
            raise Unavailable(f"staged commit {name} already exists (a UUID collision?)")
        failpoints.point("managed.staged")
        return name

    def _resolve(
        self, storage: Storage, version: int, data: bytes, staged: str, call: Callable[[], CommitResponse]
    ) -> CommitResponse:
        doubt: Unavailable | None = None
        for attempt in range(self.attempts):
            try:
                response = call()
            except Unavailable as e:
                doubt = e
                time.sleep(min(2.0, 0.05 * 2**attempt))
                continue
            except AlreadyExists:
                if self._backfilled_as(storage, version, data):
                    return Committed(version)
                storage.delete(f"{COMMITS_DIR}/{staged}")
                raise
            except FeedlogError:
                if doubt is None:  # refused outright: the staged file will never be a commit
                    storage.delete(f"{COMMITS_DIR}/{staged}")
                raise
            if isinstance(response, CommitConflict):
                # Ours after all? Not only after a call we know went unanswered: a client that fails
                # over to another owner process repeats a call the first may have ratified, and once
                # that is backfilled (and forgotten) the owner can only answer Conflict. Our staged
                # bytes are unique (txnId, ICT), so equal bytes in the log are our commit.
                if self._backfilled_as(storage, version, data):
                    return Committed(version)
                storage.delete(f"{COMMITS_DIR}/{staged}")
            failpoints.point("managed.answered")
            return response
        raise Unavailable(
            f"the commit owner did not answer whether version {version} of {self.table.path} is committed "
            f"({doubt}); it may be: re-read the table before retrying"
        )

    def _backfilled_as(self, storage: Storage, version: int, data: bytes) -> bool:
        try:
            return storage.read(commit_path(version)) == data
        except NotFound:
            return False

    def commit(
        self,
        storage: Storage,
        version: int,
        data: bytes,
        actions: Sequence[Action],
        turn: bytes | None = None,
        base: str | None = None,
    ) -> CommitResponse:
        """With a `turn`, the owner may answer a conflict while the winner is still being ratified
        (`CommitConflict.pending`): the caller rebases on it (Transaction.commit), and its next commit
        names that commit's staged file as its `base`, which the owner checks."""
        name, ict = self._stage(storage, version, data), ict_of(actions)
        return self._resolve(
            storage,
            version,
            data,
            name,
            lambda: self.owner.commit(
                self.table, version, name, ict, self.auth, turn, pending_ok=turn is not None, base=base
            ),
        )

    def end_turn(self, turn: bytes) -> None:
        """The transaction `turn` holds the table's turn and will not commit after all: pass it on now
        (errors are the caller's to ignore: Transaction._end_turn, as the turn lapses anyway)."""
        self.owner.end_turn(self.table, turn, self.auth)

    def register(
        self, storage: Storage, version: int, data: bytes, actions: Sequence[Action], batch_size: int
    ) -> CommitResponse:
        name, ict = self._stage(storage, version, data), ict_of(actions)
        return self._resolve(
            storage,
            version,
            data,
            name,
            lambda: self.owner.register(self.table, version, name, ict, self.auth, batch_size),
        )

    def release(self, storage: Storage, version: int, data: bytes, actions: Sequence[Action]) -> CommitResponse:
        name, ict = self._stage(storage, version, data), ict_of(actions)
        return self._resolve(
            storage, version, data, name, lambda: self.owner.release(self.table, version, name, ict, self.auth)
        )

    def ratified_commits(self, storage: Storage, start_version: int) -> list[tuple[int, FileInfo]]:
        found = self.owner.get_commits(self.table, start_version)
        pairs = [(c.version, c.file) for c in found.commits]
        # Versions from start_version up to the owner's latest that it no longer tracks were
        # backfilled (and forgotten) after the caller listed the log: the owner forgets a commit
        # only once its `_delta_log/<v>.json` exists, and it reads its latest before its commits.
        # Without them a writer would build on a stale version and lose to, say, its own commit.
        first = pairs[0][0] if pairs else found.latest + 1
        gone = range(max(start_version, 0), min(first, found.latest + 1))
        if gone:
            return [(v, FileInfo(commit_path(v), None, None)) for v in gone] + [
                (v, FileInfo(f"{COMMITS_DIR}/{f}", None, None)) for v, f in pairs
            ]
        return [(v, FileInfo(f"{COMMITS_DIR}/{f}", None, None)) for v, f in pairs]

    def backfill(self, version: int | None = None) -> int:
        return self.owner.backfill(self.table, -1 if version is None else version, self.auth)


class Router:
    """The `Committer` of a table whose ownership may change in a commit (managed or not).

    Each commit goes where `rules.route` sends it from the table's owner before (the snapshot the
    transaction read) and after (what the commit's protocol and metadata say): put-if-absent for
    a filesystem table, the owner's `register` when it installs an owner, `release` when it removes
    one, `commit` otherwise. `committer_for(binding, table_id, registering)` supplies the owner's
    committer (and refuses owners this process does not trust).
    """

    def __init__(
        self,
        protocol: Protocol | None,
        metadata: Metadata | None,
        committer_for: Callable[[Binding, str, bool], ManagedCommitter],
    ) -> None:
        self.protocol, self.metadata = protocol, metadata
        self.before = Binding.of(protocol, metadata)
        self.committer_for = committer_for
        #: names the transaction (a Router serves one) to its owner, the same on every attempt:
        #: writers that lose races take turns (turns.py)
        self.turn = os.urandom(16)
        #: the winners the last conflict answer named, and which of them was still being ratified:
        #: the rebase that follows reads them without asking again. This transaction's alone (a
        #: table handle's committers serve every transaction and read on it): a commit named
        #: before it was ratified, which may never be, is seen by no one else.
        self._hint: tuple[int, tuple[tuple[int, str], ...], int | None] | None = None
        #: (version, staged file) of the commit the last rebase took before it was ratified: the
        #: next commit names it as its `base`
        self._base: tuple[int, str] | None = None

    def commit(self, storage: Storage, version: int, data: bytes, actions: Sequence[Action]) -> CommitResponse:
        base = self._base[1] if self._base is not None and self._base[0] == version - 1 else None
        self._hint = self._base = None
        response = self._commit(storage, version, data, actions, base)
        if isinstance(response, CommitConflict) and response.winners:
            self._hint = (version, response.winners, response.pending)
        return response

    def _commit(
        self, storage: Storage, version: int, data: bytes, actions: Sequence[Action], base: str | None
    ) -> CommitResponse:
        protocol = next((a for a in actions if isinstance(a, Protocol)), self.protocol)
        metadata = next((a for a in actions if isinstance(a, Metadata)), self.metadata)
        try:
            after = Binding.of(protocol, metadata)
        except Corruption as e:
            raise InvalidArgument(f"this commit would make the table invalid ({e}); use convert_to_managed") from None
        same = self.metadata is None or (metadata is not None and metadata.id == self.metadata.id)
        how = route(self.before, after, same)
        if how is Route.FILESYSTEM:
            return _FILESYSTEM.commit(storage, version, data, actions)
        if how is Route.REGISTER:
            assert after is not None and metadata is not None
            committer = self.committer_for(after, metadata.id, True)
            return committer.register(storage, version, data, actions, after.batch_size)
        assert self.before is not None and self.metadata is not None
        committer = self.committer_for(self.before, self.metadata.id, False)
        if how is Route.RELEASE:
            return committer.release(storage, version, data, actions)
        return committer.commit(storage, version, data, actions, self.turn, base)

    def end_turn(self) -> None:
        """This transaction was given its table's turn and will not commit after all (Transaction.commit)."""
        if self.before is not None and self.metadata is not None:
            self.committer_for(self.before, self.metadata.id, False).end_turn(self.turn)

    def forget_answer(self) -> None:
        """Rebase without the last conflict answer's winners: ask the owner what is ratified."""
        self._hint = self._base = None

    def ratified_commits(self, storage: Storage, start_version: int) -> list[tuple[int, FileInfo]]:
        hint, self._hint, self._base = self._hint, None, None
        if self.before is None or self.metadata is None:
            return []
        if hint is not None and hint[0] <= start_version <= hint[1][-1][0] + 1:
            # what won the race just lost (all the owner held from that version on), less what the
            # caller found backfilled meanwhile: no second round trip for the rebase
            pairs = [(v, f) for v, f in hint[1] if v >= start_version]
            pending = hint[2]
            if pending is not None and pairs and pairs[-1][0] == pending:
                self._base = pairs[-1]  # still being ratified: the next commit says it built on it
            return [(v, FileInfo(f"{COMMITS_DIR}/{f}", None, None)) for v, f in pairs]
        return self.committer_for(self.before, self.metadata.id, False).ratified_commits(storage, start_version)
