"""Managed commits (the managed-commits RFC): the protocol types, names and trust rules.

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

A table names the in-process owner by its database: a SQLite file or a
`postgresql://` URL, trusted by the URL exactly as written, and never with a
password in it (`check_owner_url`: a table's properties are public to its
readers; libpq finds the password in PGPASSWORD or ~/.pgpass).

`CommitOwner` is the one interface both owners implement: `LocalOwner`
(`sqlite.py`, in process, on SQLite or PostgreSQL) and `GrpcOwner` (`client.py`,
the `feedlog owner serve` service). Both pass one behaviour suite.

Ownership changes (create, filesystem -> managed, managed -> filesystem) are
ordinary commits routed to `register` / `release` instead of `commit`; the
table decides which from the metadata before and after (`DeltaTable._commit`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol as TypingProtocol
from urllib.parse import parse_qs, urlsplit

from ... import rpc
from ...errors import Corruption, InvalidArgument, PermissionDenied
from ...rpc import SCHEME, Address
from ..actions import MANAGED_COMMITS, OWNER_CONF, OWNER_NAME, Metadata, Protocol
from ..committer import CommitResponse
from ..replay import ict_enabled
from .database import is_postgres, redact

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
        """feedlog's owner: the gRPC service at `endpoint`, or the in-process owner on database `db`
        (a SQLite file, or a `postgresql://` URL without a password: see `check_owner_url`).

        `endpoint` may list several processes serving one owner (sharing its PostgreSQL database):
        `grpc://h1:7070,h2:7070`; a client tries the next when one is unreachable."""
        if (endpoint is None) == (db is None):
            raise InvalidArgument(
                "name the commit owner by exactly one of a grpc:// endpoint or a database (file or postgresql:// URL)"
            )
        if endpoint is not None and "," in endpoint:
            owner_endpoints(endpoint)  # every member must be a grpc://HOST:PORT
        if endpoint is not None:
            conf = {"endpoint": endpoint}
        elif is_postgres(db or ""):
            conf = {"db": check_owner_url(db or "")}
        else:
            conf = {"db": os.path.abspath(db or "")}
        if batch_size is not None:
            if batch_size < 1:
                raise InvalidArgument(f"backfill batch size must be >= 1, got {batch_size}")
            conf["batchSize"] = str(batch_size)
        return cls(FEEDLOG_OWNER, tuple(sorted(conf.items())))

    @classmethod
    def parse(cls, spec: str, batch_size: int | None = None) -> Binding:
        """'grpc://HOST:PORT[,HOST:PORT...]' (the service, at one or several endpoints), or the owner
        in process on a database: 'postgresql://USER@HOST:PORT/DBNAME' or a SQLite file path."""
        if spec.startswith("grpc://"):
            return cls.feedlog(endpoint=spec, batch_size=batch_size)
        if is_postgres(spec):
            return cls.feedlog(db=spec, batch_size=batch_size)
        if "://" in spec:
            raise InvalidArgument(
                f"bad commit owner {redact(spec)!r}: use grpc://HOST:PORT, postgresql://USER@HOST/DBNAME "
                "or a database file path"
            )
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
        text = c.get("endpoint") or redact(c.get("db") or "") or self.name
        # the table chose this text: bounded, so a hostile one cannot flood a message
        return text if len(text) <= _DESCRIBE_MAX else text[:_DESCRIBE_MAX] + "..."

    def identity(self) -> tuple[str, str, str]:
        """Which owner this is, batch size aside: the endpoint, the PostgreSQL URL exactly as written
        (trusting one names every connection parameter), or the database file's real path."""
        c = self.config
        if "endpoint" in c:
            return (self.name, "endpoint", c["endpoint"])
        if "db" in c:
            db = c["db"]
            return (self.name, "db", db if is_postgres(db) else os.path.realpath(db))
        return (self.name, "conf", json.dumps(c, sort_keys=True))


#: connection parameters that are secrets: never in a table's properties
_SECRET_PARAMS = ("password", "sslpassword")


def check_owner_url(url: str) -> str:
    """A PostgreSQL URL a table may name as its owner's database (returned unchanged): one without a
    password. A table's properties are readable by whoever reads the table, so the password goes
    where libpq finds it on the owner's side: PGPASSWORD, ~/.pgpass, a pg_service.conf service, or
    the configuration of a `feedlog owner serve --db URL` the table names by its grpc:// endpoint."""
    try:
        parts = urlsplit(url)
        has_password = parts.password is not None
        params = parse_qs(parts.query, keep_blank_values=True)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as e:
        raise InvalidArgument(f"commit owner database {redact(url)!r} is not a valid URL: {e}") from None
    secret = next((p for p in _SECRET_PARAMS if p in params), None)
    if has_password or secret:
        where = "a password" if has_password else f"a {secret} parameter"
        raise InvalidArgument(
            f"commit owner database {redact(url)!r} holds {where}, and a table's properties are readable "
            "by all its readers: leave it out of the URL and give it through PGPASSWORD or ~/.pgpass "
            "(or a pg_service.conf service), or keep it in the owner's own configuration "
            "(feedlog owner serve --db URL) and name that owner's grpc:// endpoint"
        )
    return url


class OwnerNotTrusted(PermissionDenied):
    """A write to a managed table whose owner this process was not configured to trust."""


class OwnerNotConsulted(UserWarning):
    """A read of a managed table saw only its backfilled log: the owner is untrusted or unreachable."""


_HOST_PORT = re.compile(r"^[A-Za-z0-9.\[\]:-]+:\d+$")


def env_owners(text: str) -> list[str]:
    """$FEEDLOG_OWNER's comma-separated owners. A bare HOST:PORT after a grpc:// owner continues
    that owner's endpoint list (`grpc://h1:7070,h2:7070` is one owner served by two processes,
    as in a table's binding); anything else starts a new owner."""
    out: list[str] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        if out and out[-1].startswith(SCHEME) and "://" not in item and _HOST_PORT.match(item):
            out[-1] += "," + item
        else:
            out.append(item)
    return out


def trusted_owners(owner: Binding | str | Sequence[Binding | str] | None) -> tuple[Binding, ...]:
    """The owners `owner` names (a binding, a spec, or several); None: $FEEDLOG_OWNER, or none."""
    if owner is None:
        owner = env_owners(os.environ.get(OWNER_ENV) or "")
    items = [owner] if isinstance(owner, (str, Binding)) else list(owner)
    return tuple(o if isinstance(o, Binding) else Binding.parse(o.strip()) for o in items)


def owner_endpoints(endpoint: str) -> tuple[str, ...]:
    """The members of an endpoint list, each as grpc://HOST:PORT: `grpc://h1:7070,h2:7070` (a member
    without a scheme takes grpc://) names two processes serving one owner."""
    members = [m.strip() for m in endpoint.split(",")]
    if len(members) == 1:
        return (endpoint,)
    out = []
    for m in members:
        if not m:
            raise InvalidArgument(f"commit owner endpoints {endpoint!r}: an empty member")
        url = m if "://" in m else SCHEME + m
        out.append(str(Address.parse(url)))
    return tuple(out)


def _members(binding: Binding) -> frozenset[tuple[str, str, str]]:
    kind = binding.identity()
    if kind[1] != "endpoint":
        return frozenset([kind])
    try:
        return frozenset((kind[0], "endpoint", e) for e in owner_endpoints(kind[2]))
    except InvalidArgument:
        return frozenset([kind])  # a malformed list is only ever itself


def is_trusted(binding: Binding, trusted: Sequence[Binding]) -> bool:
    """Whether every process `binding` may send a commit to is one this process trusts.

    An endpoint list (`grpc://h1:7070,h2:7070`) is trusted when each of its members is: a client
    may talk to any of them, so trusting only some would let a table route commits to an owner
    nobody vouched for. A trusted list trusts each of its members, and
    FEEDLOG_OWNER=grpc://h1:7070,grpc://h2:7070 trusts both (so a table naming either, or both, is
    trusted)."""
    mine = _members(binding)
    vouched: set[tuple[str, str, str]] = set()
    for t in trusted:
        vouched |= _members(t)
    return mine <= vouched


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

    def commit(
        self,
        table: TableRef,
        version: int,
        staged: str,
        ict: int,
        auth: Auth,
        turn: bytes | None = None,
        *,
        pending_ok: bool = False,
        base: str | None = None,
    ) -> CommitResponse:
        """Ratify version `version` iff version-1 is the latest ratified. Idempotent for the same staged file.
        `turn`: the transaction's id, the same on every attempt; writers that lose races take turns.
        `pending_ok`: the caller rebases on a commit still being ratified (a conflict's `pending`),
        and then names its staged file as `base`: ratified only if version-1 is that commit."""
        ...

    def end_turn(self, table: TableRef, turn: bytes, auth: Auth) -> bool:
        """The transaction `turn`, given the table's turn by a conflict answer, will not commit after all
        (a real conflict, its work committed already, an error): the next writer in line need not wait
        for the turn to lapse. Whether it held the turn."""
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


def default_token() -> str | None:
    return os.environ.get(TOKEN_ENV) or None


def new_token() -> str:
    """A table's owner token: 192 random bits, URL-safe, never starting with '-' (`rpc.new_token`)."""
    return rpc.new_token(24)
