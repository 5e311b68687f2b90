"""Managed commits, the client side (the managed-commits RFC): the owner interface and the committer.

With `managedCommits` the filesystem holds what a commit says and the commit
owner decides whether it happened. A writer stages version v as
`_delta_log/_commits/<v>.<uuid>.json`, then asks the owner to ratify it; the
owner backfills ratified commits to `_delta_log/<v>.json` in order and forgets
them. Readers that know the owner add its un-backfilled commits to the listing.

Trust: a table's metadata names its owner, and whoever can write a table can
make it name any database file or endpoint. So a process talks only to owners
it was told to trust (`owner=`, $FEEDLOG_OWNER, the CLI's --owner). Readers of a
table whose owner is not trusted, or not reachable, read the backfilled log
(the RFC puts no restriction on readers) and get an `OwnerNotConsulted`
warning; writers are refused (`OwnerNotTrusted`). One owner is trusted for
writers without being named: the table's own embedded owner,
`<table>/_feedlog/owner.db` (the Spark sink's default), which lives inside the
directory they write anyway.

`CommitOwner` is the one interface both owners implement: `LocalOwner`
(`owner.py`, SQLite, in process) and `GrpcOwner` (`owner_client.py`, the
`feedlog owner serve` service). Both pass one behaviour suite.

Ownership changes (create, filesystem -> managed, managed -> filesystem) are
ordinary commits routed to `register` / `release` instead of `commit`; the
table decides which from the metadata before and after (`DeltaTable._commit`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol as TypingProtocol

from .. import faults
from ..errors import (
    AlreadyExists,
    Corruption,
    FeedlogError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
    Unsupported,
)
from .actions import MANAGED_COMMITS, OWNER_CONF, OWNER_NAME, Action, CommitInfo, Metadata, Protocol
from .committer import LOG_DIR, CommitConflict, CommitResponse, Committed, commit_path
from .replay import ict_enabled
from .storage import FileInfo, Storage

COMMITS_DIR = f"{LOG_DIR}/_commits"
#: the `delta.managedCommitOwnerName` of feedlog's owners
FEEDLOG_OWNER = "feedlog"
DEFAULT_BATCH_SIZE = 1
TOKEN_ENV = "FEEDLOG_OWNER_TOKEN"
#: the commit owner(s) this process trusts when no `owner=` is given (comma-separated)
OWNER_ENV = "FEEDLOG_OWNER"
#: the embedded owner's database, relative to the table directory
EMBEDDED_DB = ("_feedlog", "owner.db")
#: how much of a table-supplied owner description goes into a message
_DESCRIBE_MAX = 200

#: a line of a commit file that holds commitInfo, protocol or metaData (the writer's line format:
#: the action's key first, maybe after spaces)
_HEAD_ACTION = re.compile(rb'^[ \t]*\{[ \t]*"(?:commitInfo|protocol|metaData)"', re.MULTILINE)
_STAGED = re.compile(r"(\d{20})\.([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.json")


def staged_name(version: int) -> str:
    return f"{version:020d}.{uuid.uuid4()}.json"


def staged_version(name: str) -> int | None:
    """The version of a staged commit file name, None if the name is not one."""
    m = _STAGED.fullmatch(name)
    return int(m.group(1)) if m else None


def check_staged_name(name: str, version: int) -> None:
    if staged_version(name) != version:
        raise InvalidArgument(
            f"staged commit file {name!r} is not named <version>.<uuid>.json for version {version} "
            f"(20-digit version, lowercase UUID)"
        )


# ---- which owner a table names ----------------------------------------------------------------


@dataclass(frozen=True)
class Binding:
    """The owner a table's metadata names: `delta.managedCommitOwnerName` and its JSON `...Conf`."""

    name: str
    conf: tuple[tuple[str, str], ...] = ()

    @property
    def config(self) -> dict[str, str]:
        return dict(self.conf)

    @classmethod
    def of(cls, protocol: Protocol | None, metadata: Metadata | None) -> Binding | None:
        """The table's owner, None for a filesystem table; Corruption for a half-managed table."""
        if protocol is None or metadata is None:
            return None
        feature = protocol.supports_writer_feature(MANAGED_COMMITS)
        name = metadata.configuration.get(OWNER_NAME)
        if feature != (name is not None):
            raise Corruption(
                "the table is invalid: "
                + (
                    f"writer feature {MANAGED_COMMITS} without {OWNER_NAME}"
                    if feature
                    else f"{OWNER_NAME} without writer feature {MANAGED_COMMITS}"
                )
            )
        if name is None:
            return None
        if not ict_enabled(protocol, metadata):
            raise Corruption("the table is invalid: managed commits require in-commit timestamps to be enabled")
        return cls(name, tuple(sorted(parse_conf(metadata.configuration.get(OWNER_CONF, "{}")).items())))

    @classmethod
    def feedlog(cls, endpoint: str | None = None, db: str | None = None, batch_size: int | None = None) -> Binding:
        """feedlog's owner: the gRPC service at `endpoint`, or the in-process owner on SQLite file `db`."""
        if (endpoint is None) == (db is None):
            raise InvalidArgument("name the commit owner by exactly one of a grpc:// endpoint or a database file")
        conf = {"endpoint": endpoint} if endpoint is not None else {"db": os.path.abspath(db or "")}
        if batch_size is not None:
            if batch_size < 1:
                raise InvalidArgument(f"backfill batch size must be >= 1, got {batch_size}")
            conf["batchSize"] = str(batch_size)
        return cls(FEEDLOG_OWNER, tuple(sorted(conf.items())))

    @classmethod
    def parse(cls, spec: str, batch_size: int | None = None) -> Binding:
        """'grpc://HOST:PORT' (the service) or a path to a SQLite file (in process)."""
        if spec.startswith("grpc://"):
            return cls.feedlog(endpoint=spec, batch_size=batch_size)
        if "://" in spec:
            raise InvalidArgument(f"bad commit owner {spec!r}: use grpc://HOST:PORT or a database file path")
        return cls.feedlog(db=spec, batch_size=batch_size)

    def properties(self) -> dict[str, str]:
        return {OWNER_NAME: self.name, OWNER_CONF: json.dumps(self.config, sort_keys=True, separators=(",", ":"))}

    @property
    def batch_size(self) -> int:
        try:
            return max(1, int(self.config.get("batchSize", DEFAULT_BATCH_SIZE)))
        except ValueError:
            return DEFAULT_BATCH_SIZE

    def describe(self) -> str:
        c = self.config
        text = c.get("endpoint") or c.get("db") or self.name
        # the table chose this text: bounded, so a hostile one cannot flood a message
        return text if len(text) <= _DESCRIBE_MAX else text[:_DESCRIBE_MAX] + "..."

    def identity(self) -> tuple[str, str, str]:
        """Which owner this is, batch size aside: the endpoint, or the database file's real path."""
        c = self.config
        if "endpoint" in c:
            return (self.name, "endpoint", c["endpoint"])
        if "db" in c:
            return (self.name, "db", os.path.realpath(c["db"]))
        return (self.name, "conf", json.dumps(c, sort_keys=True))


class OwnerNotTrusted(PermissionDenied):
    """A write to a managed table whose owner this process was not configured to trust."""


class OwnerNotConsulted(UserWarning):
    """A read of a managed table saw only its backfilled log: the owner is untrusted or unreachable."""


def trusted_owners(owner: Binding | str | Sequence[Binding | str] | None) -> tuple[Binding, ...]:
    """The owners `owner` names (a binding, a spec, or several); None: $FEEDLOG_OWNER, or none."""
    if owner is None:
        owner = [s for s in (os.environ.get(OWNER_ENV) or "").split(",") if s.strip()]
    items = [owner] if isinstance(owner, (str, Binding)) else list(owner)
    return tuple(o if isinstance(o, Binding) else Binding.parse(o.strip()) for o in items)


def is_trusted(binding: Binding, trusted: Sequence[Binding]) -> bool:
    me = binding.identity()
    return any(t.identity() == me for t in trusted)


def is_embedded(binding: Binding, location: str) -> bool:
    """Whether `binding` is the table's own embedded owner, `<table>/_feedlog/owner.db`.

    The expected path is the table's real path plus `_feedlog/owner.db`, unresolved, while the
    binding's is fully resolved: a `_feedlog` that is a symlink to somewhere else does not match.
    """
    if not os.path.isdir(location):
        return False  # not a local table
    expected = os.path.join(os.path.realpath(location), *EMBEDDED_DB)
    return binding.identity() == (FEEDLOG_OWNER, "db", expected)


def parse_conf(text: str) -> dict[str, str]:
    try:
        conf = json.loads(text)
    except json.JSONDecodeError as e:
        raise Corruption(f"{OWNER_CONF} is not JSON: {e}") from None
    if not isinstance(conf, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in conf.items()):
        raise Corruption(f"{OWNER_CONF} must be a JSON object of strings, got {text!r}")
    return conf


# ---- the owner interface ----------------------------------------------------------------------


@dataclass(frozen=True)
class TableRef:
    """How a client names a table to its owner: the stable metaData id and where the table lives."""

    table_id: str
    path: str


@dataclass(frozen=True)
class Auth:
    #: the table's token (a bearer secret chosen when the table was registered)
    token: str | None = None
    #: a verified client-certificate identity; only the gRPC service sets it
    principal: str | None = None


@dataclass(frozen=True)
class RatifiedCommit:
    version: int
    file: str  # the staged file's name in _delta_log/_commits
    ict: int


@dataclass(frozen=True)
class Commits:
    commits: list[RatifiedCommit]
    #: the latest ratified version (backfilled or not)
    latest: int


@dataclass(frozen=True)
class TableStatus:
    table_id: str
    path: str
    state: str  # proposed | active | releasing | released
    latest: int
    backfilled: int
    batch_size: int
    tracked: int


class CommitOwner(TypingProtocol):
    def register(
        self, table: TableRef, version: int, staged: str, ict: int, auth: Auth, batch_size: int
    ) -> CommitResponse:
        """Take ownership: ratify the staged commit that installs this owner and backfill it put-if-absent
        (version 0 creates the table). Conflict if a filesystem writer took that version first."""
        ...

    def commit(self, table: TableRef, version: int, staged: str, ict: int, auth: Auth) -> CommitResponse:
        """Ratify version `version` iff version-1 is the latest ratified. Idempotent for the same staged file."""
        ...

    def get_commits(self, table: TableRef, start_version: int) -> Commits:
        """Ratified, un-backfilled commits >= start_version, contiguous and ascending, and the latest version."""
        ...

    def backfill(self, table: TableRef, version: int, auth: Auth) -> int:
        """Backfill every ratified commit <= version, in order; returns the version backfilled through."""
        ...

    def release(self, table: TableRef, version: int, staged: str, ict: int, auth: Auth) -> CommitResponse:
        """Give the table back to the filesystem: backfill everything, ratify and backfill the staged
        commit that removes the owner, accept nothing after it."""
        ...

    def status(self, table_id: str, auth: Auth) -> TableStatus:
        """The owner's state of the table (it names the table's path, so it needs the token)."""
        ...

    def close(self) -> None: ...


_LOCAL_OWNERS: dict[str, CommitOwner] = {}


def resolve_owner(binding: Binding, tls: object | None = None) -> CommitOwner:
    """A client for the owner a table names (one per database file / endpoint in a process)."""
    if binding.name != FEEDLOG_OWNER:
        raise Unsupported(f"commit owner {binding.name!r} is not one feedlog can talk to (only {FEEDLOG_OWNER!r})")
    conf = binding.config
    if "endpoint" in conf:
        from .owner_client import GrpcOwner

        return GrpcOwner.shared(conf["endpoint"], tls)
    if "db" in conf:
        from .owner import LocalOwner

        db = conf["db"]
        if db not in _LOCAL_OWNERS:
            _LOCAL_OWNERS[db] = LocalOwner(db)
        return _LOCAL_OWNERS[db]
    raise Corruption(f"{OWNER_CONF} names neither an endpoint nor a db: {conf}")


def default_token() -> str | None:
    return os.environ.get(TOKEN_ENV) or None


def new_token() -> str:
    return secrets.token_urlsafe(24)


# ---- the committer ----------------------------------------------------------------------------


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
        #: the winners a conflict answer named: the rebase that follows reads them without asking again
        self._hint: tuple[int, tuple[tuple[int, str], ...]] | None = None

    def _stage(self, storage: Storage, version: int, data: bytes) -> str:
        name = staged_name(version)
        if not storage.put_if_absent(f"{COMMITS_DIR}/{name}", data):
            raise Unavailable(f"staged commit {name} already exists (a UUID collision?)")
        faults.point("managed.staged")
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
                if doubt is not None and self._backfilled_as(storage, version, data):
                    return Committed(version)
                storage.delete(f"{COMMITS_DIR}/{staged}")
                raise
            except FeedlogError:
                if doubt is None:  # refused outright: the staged file will never be a commit
                    storage.delete(f"{COMMITS_DIR}/{staged}")
                raise
            if isinstance(response, CommitConflict):
                if doubt is not None and self._backfilled_as(storage, version, data):
                    return Committed(version)
                storage.delete(f"{COMMITS_DIR}/{staged}")
                self._hint = (version, response.winners) if response.winners else None
            faults.point("managed.answered")
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

    def commit(self, storage: Storage, version: int, data: bytes, actions: Sequence[Action]) -> CommitResponse:
        name, ict = self._stage(storage, version, data), ict_of(actions)
        return self._resolve(
            storage, version, data, name, lambda: self.owner.commit(self.table, version, name, ict, self.auth)
        )

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
        hint, self._hint = self._hint, None
        if hint is not None and hint[0] == start_version:
            pairs = list(hint[1])  # what won the race just lost: at least as new as the caller's base
        else:
            pairs = [(c.version, c.file) for c in self.owner.get_commits(self.table, start_version).commits]
        return [(v, FileInfo(f"{COMMITS_DIR}/{f}", None, None)) for v, f in pairs]

    def backfill(self, version: int | None = None) -> int:
        return self.owner.backfill(self.table, -1 if version is None else version, self.auth)


def staged_actions(data: bytes) -> tuple[CommitInfo | None, Protocol | None, Metadata | None]:
    """The commitInfo, protocol and metaData of a commit file, without parsing its add/remove lines."""
    info = protocol = metadata = None
    # only the lines that start with one of these actions, found by a scan in C: a file of millions
    # of short lines must cost neither a list of them nor a Python loop over them
    for m in _HEAD_ACTION.finditer(data):
        start = m.start()
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        try:
            obj = json.loads(data[start:end])
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InvalidArgument(f"staged commit is not newline-delimited JSON: {e}") from None
        except RecursionError:
            raise InvalidArgument("staged commit has a line nested too deeply to be an action") from None
        try:
            if "commitInfo" in obj and info is None:
                info = CommitInfo.from_json(obj["commitInfo"])
            elif "protocol" in obj:
                protocol = Protocol.from_json(obj["protocol"])
            elif "metaData" in obj:
                metadata = Metadata.from_json(obj["metaData"])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InvalidArgument(f"staged commit has a malformed action: {e!r}") from None
    return info, protocol, metadata
