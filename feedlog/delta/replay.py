"""Log replay (PROTOCOL.md "Action Reconciliation") and the in-commit-timestamp rules. Pure, no I/O.

`TableState` is the table at one version: protocol, metadata, live files,
unexpired tombstones, the latest `txn` version per appId and the latest
`domainMetadata` per domain (removed ones dropped). `apply` folds one
commit into it and checks what every commit must satisfy, so a corrupt or
non-conforming commit is reported with its version wherever it is read.
"""

from __future__ import annotations

import json
import re
from collections.abc import (
    Callable,
    ItemsView,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
    ValuesView,
)
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import Corruption, InvalidArgument, Unsupported
from .actions import (
    APPEND_ONLY,
    APPEND_ONLY_PROP,
    CATALOG_MANAGED,
    CATALOG_OWNED_PREVIEW,
    CHECKPOINT_PROTECTION,
    COLUMN_MAPPING,
    COLUMN_MAPPING_MODE,
    COORDINATED_COMMITS_PREVIEW,
    COORDINATOR_PREVIEW,
    DELETED_FILE_RETENTION,
    DOMAIN_METADATA,
    ENABLE_ICT,
    ICT,
    ICT_DRAFT,
    ICT_ENABLEMENT_TIMESTAMP,
    ICT_ENABLEMENT_VERSION,
    INVARIANTS,
    MANAGED_COMMITS,
    V2_CHECKPOINT,
    Action,
    Add,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    Remove,
    Txn,
)

DAY_MS = 86_400_000
#: `delta.deletedFileRetentionDuration` when the table does not set it (PROTOCOL.md: one week)
DEFAULT_TOMBSTONE_RETENTION_MS = 7 * DAY_MS
#: a state sweeps its expired tombstones only from this many on (`TableState.trim_tombstones`)
TRIM_TOMBSTONES_FROM = 1000

_INTERVAL = re.compile(r"\s*interval\s+(\d+)\s+([a-z]+?)s?\s*", re.IGNORECASE)
_UNIT_MS = {
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": DAY_MS,
    "week": 7 * DAY_MS,
}


def parse_interval(text: str) -> int:
    """Delta's duration properties, e.g. 'interval 30 days' -> ms."""
    m = _INTERVAL.fullmatch(text)
    if not m or m.group(2).lower() not in _UNIT_MS:
        raise InvalidArgument(f"bad interval {text!r}: expected e.g. 'interval 30 days'")
    return int(m.group(1)) * _UNIT_MS[m.group(2).lower()]


#: reader features this library reads correctly (H3 adds the ones that change how data files are read)
SUPPORTED_READER_FEATURES = frozenset(
    {
        "timestampNtz",
        "vacuumProtocolCheck",
        # V2 checkpoints (UUID-named, sidecars, checkpointMetadata): log.py and checkpoint.py read them
        V2_CHECKPOINT,
        # collations change comparisons, not stored values: a reader returns the strings as they are
        "collations",
        "collations-preview",
        # the backfilled log of a table a catalog or commit coordinator owns is read with a warning
        # that newer ratified commits may exist (`foreign_owner`); writing it is refused
        CATALOG_MANAGED,
        CATALOG_OWNED_PREVIEW,
        # scan.py: deletion vectors applied, columns by physical name / field id, older types cast
        "deletionVectors",
        COLUMN_MAPPING,
        "typeWidening",
        "typeWidening-preview",
        # unshredded variants read as their struct of two binaries (schema.VARIANT); writing is refused
        "variantType",
        "variantType-preview",
    }
)
#: writer features this library honours when it writes
SUPPORTED_WRITER_FEATURES = frozenset(
    {
        ICT,
        ICT_DRAFT,
        APPEND_ONLY,
        INVARIANTS,
        MANAGED_COMMITS,
        CHECKPOINT_PROTECTION,
        # feedlog writes no domain, and replay and checkpoints carry every domain through untouched
        DOMAIN_METADATA,
        "timestampNtz",
        "vacuumProtocolCheck",
        # feedlog writes V2 checkpoints for such tables (and never multi-part ones)
        V2_CHECKPOINT,
        # writer.py: data files with physical names and field ids, partition values and stats by them
        COLUMN_MAPPING,
        # feedlog changes no column's type and keeps the schema's delta.typeChanges as it is
        "typeWidening",
        "typeWidening-preview",
    }
)

#: what a legacy writer version implies (PROTOCOL.md "Writer Version Requirements"), each feature
#: with the test of whether a table's metadata uses it: only a used feature must be honoured
_LEGACY_WRITER: tuple[tuple[int, str], ...] = (
    (2, APPEND_ONLY),
    (2, INVARIANTS),
    (3, "checkConstraints"),
    (4, "changeDataFeed"),
    (4, "generatedColumns"),
    (5, COLUMN_MAPPING),
    (6, "identityColumns"),
)


def _schema_metadata_keys(metadata: Metadata) -> set[str]:
    """Every key of every field's metadata in the schema (nested fields too)."""
    try:
        schema = json.loads(metadata.schema_string) if metadata.schema_string else {}
    except json.JSONDecodeError:
        return set()
    keys: set[str] = set()
    stack: list[Any] = [schema]
    for _ in range(1_000_000):  # bounded: a schema string is finite, this only guards the loop
        if not stack:
            break
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("metadata"), dict):
                keys.update(node["metadata"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return keys


def invariant_columns(metadata: Metadata | None) -> list[str]:
    """The (dotted) names of the columns whose schema metadata sets `delta.invariants`, the
    expressions a writer honouring the `invariants` feature must check on every row it adds."""
    if metadata is None or not metadata.schema_string:
        return []
    try:
        schema = json.loads(metadata.schema_string)
    except json.JSONDecodeError:
        return []
    found: list[str] = []
    stack: list[tuple[str, Any]] = [("", schema)]
    for _ in range(1_000_000):  # bounded: a schema string is finite, this only guards the loop
        if not stack:
            break
        prefix, node = stack.pop()
        if not isinstance(node, dict):
            continue
        for f in node.get("fields", ()) if isinstance(node.get("fields"), list) else ():
            if not isinstance(f, dict):
                continue
            name = f"{prefix}{f.get('name')}"
            if isinstance(f.get("metadata"), dict) and "delta.invariants" in f["metadata"]:
                found.append(name)
            stack.append((f"{name}.", f.get("type")))
        for key in ("elementType", "valueType", "keyType"):
            if isinstance(node.get(key), dict):
                stack.append((prefix, node[key]))
    return sorted(found)


def _in_use(feature: str, metadata: Metadata | None) -> bool:
    """Whether a legacy-implied feature is in use by a table with `metadata` (None: assume so)."""
    if metadata is None:
        return True
    conf = metadata.configuration
    if feature == COLUMN_MAPPING:
        return conf.get(COLUMN_MAPPING_MODE, "none").lower() != "none"
    if feature == "checkConstraints":
        return any(k.startswith("delta.constraints.") for k in conf)
    if feature == "changeDataFeed":
        return conf.get("delta.enableChangeDataFeed", "false").lower() == "true"
    if feature == "generatedColumns":
        return "delta.generationExpression" in _schema_metadata_keys(metadata)
    if feature == "identityColumns":
        return any(k.startswith("delta.identity.") for k in _schema_metadata_keys(metadata))
    if feature == APPEND_ONLY:
        return conf.get(APPEND_ONLY_PROP, "false").lower() == "true"
    return True


def reader_features(protocol: Protocol, metadata: Metadata | None = None) -> set[str]:
    """The reader features a reader must support: listed ones (reader version 3), or what a legacy
    version implies and the table uses (version 2: column mapping, only with a mapping mode)."""
    if protocol.min_reader_version == 3:
        return set(protocol.reader_features or ())
    if protocol.min_reader_version == 2 and _in_use(COLUMN_MAPPING, metadata):
        return {COLUMN_MAPPING}
    return set()


def writer_features(protocol: Protocol, metadata: Metadata | None = None) -> set[str]:
    """The writer features a writer must honour: listed ones (writer version 7), or those a legacy
    version implies that the table uses (a (2,5) table without a column mapping mode needs none)."""
    if protocol.min_writer_version == 7:
        return set(protocol.writer_features or ())
    implied = {f for v, f in _LEGACY_WRITER if protocol.min_writer_version >= v}
    return {f for f in implied if f in (APPEND_ONLY, INVARIANTS) or _in_use(f, metadata)}


def check_readable(protocol: Protocol, metadata: Metadata | None = None) -> None:
    """Raise Unsupported unless this library can read a table with `protocol` (and `metadata`:
    a legacy reader version 2 needs column mapping only when a mapping mode is set)."""
    if protocol.min_reader_version > 3:
        raise Unsupported(
            f"reading refused: the table needs Delta reader version {protocol.min_reader_version}; "
            "feedlog reads up to 3"
        )
    missing = reader_features(protocol, metadata) - SUPPORTED_READER_FEATURES
    if missing:
        raise Unsupported(f"reading refused: table uses reader feature(s) feedlog does not support: {sorted(missing)}")


def check_writable(protocol: Protocol, extra_supported: Iterable[str] = (), metadata: Metadata | None = None) -> None:
    """Raise Unsupported unless this library may write a table with `protocol` (and `metadata`,
    which tells which features a legacy writer version implies are in use; None: all of them)."""
    check_readable(protocol, metadata)
    if protocol.min_writer_version > 7:
        raise Unsupported(
            f"writing refused: the table needs Delta writer version {protocol.min_writer_version}; "
            "feedlog writes up to 7"
        )
    features = writer_features(protocol, metadata)
    missing = features - SUPPORTED_WRITER_FEATURES - set(extra_supported)
    invariants = invariant_columns(metadata) if INVARIANTS in features else []
    if invariants:
        # feedlog evaluates no SQL: appending rows it cannot check would break the table's invariants
        raise Unsupported(
            f"writing refused: the table's feature {INVARIANTS!r} sets column invariants (delta.invariants) "
            f"on {invariants}, which feedlog does not check; feedlog reads such a table but refuses to write it"
        )
    if missing:
        v = protocol.min_writer_version
        used = "" if metadata is None else " and the table uses them"
        legacy = "" if v == 7 else f" (Delta writer version {v} implies them{used})"
        raise Unsupported(
            f"writing refused: table uses writer feature(s) feedlog does not support: {sorted(missing)}{legacy}; "
            "feedlog reads such a table but refuses to write it"
        )


def foreign_owner(protocol: Protocol | None, metadata: Metadata | None) -> str | None:
    """How a table owned by a catalog or commit coordinator feedlog does not speak for says so
    (delta-spark's `catalogManaged` / `catalogOwned-preview`, or `coordinatedCommits-preview` with
    its `delta.coordinatedCommits.commitCoordinator-preview` property), else None. Such a table's
    ratified commits may not be backfilled yet: readers see the backfilled log only."""
    if protocol is None:
        return None
    features = set(protocol.reader_features or ()) | set(protocol.writer_features or ())
    conf = metadata.configuration if metadata is not None else {}
    for name in (CATALOG_MANAGED, CATALOG_OWNED_PREVIEW):
        if name in features:
            return f"catalog-managed ({name})"
    coordinator = conf.get(COORDINATOR_PREVIEW)
    if COORDINATED_COMMITS_PREVIEW in features or coordinator is not None:
        return f"coordinated commits ({COORDINATED_COMMITS_PREVIEW}, coordinator {coordinator or 'unnamed'!r})"
    return None


def ict_enabled(protocol: Protocol | None, metadata: Metadata | None) -> bool:
    """In-commit timestamps are active: writer version 7, the feature listed, the property true."""
    if protocol is None or metadata is None:
        return False
    listed = protocol.supports_writer_feature(ICT) or protocol.supports_writer_feature(ICT_DRAFT)
    return listed and metadata.configuration.get(ENABLE_ICT, "false").lower() == "true"


@dataclass(frozen=True)
class IctEnablement:
    """Where ICT starts: versions >= `version` have ICTs, the first one being `timestamp`."""

    version: int
    timestamp: int | None  # None when ICT was on from the table's first retained commit


def ict_enablement(protocol: Protocol | None, metadata: Metadata | None) -> IctEnablement | None:
    """ICT reader rules: None when ICT is off, else from which version commit times are ICTs."""
    if not ict_enabled(protocol, metadata):
        return None
    assert metadata is not None
    conf = metadata.configuration
    v, ts = conf.get(ICT_ENABLEMENT_VERSION), conf.get(ICT_ENABLEMENT_TIMESTAMP)
    if v is None or ts is None:
        if (v is None) != (ts is None):
            raise Corruption(f"table sets only one of {ICT_ENABLEMENT_VERSION} and {ICT_ENABLEMENT_TIMESTAMP}")
        return IctEnablement(0, None)
    try:
        return IctEnablement(int(v), int(ts))
    except ValueError:
        raise Corruption(f"bad ICT enablement properties: version={v!r} timestamp={ts!r}") from None


def next_ict(attempt_ms: int, previous_ict: int | None) -> int:
    # ICT writer requirement 3: the larger of the attempt time and one ms after the previous commit's ICT.
    return attempt_ms if previous_ict is None else max(attempt_ms, previous_ict + 1)


F = TypeVar("F", Add, Remove)


class LazyActions(MutableMapping[str, F]):
    """path -> file action, a dict whose entries from a checkpoint stay row numbers until read.

    Decoding a checkpoint's adds into objects costs more than reading it (10,000 rows: ~75% of a
    snapshot load, measured): here a row becomes an `Add` (or `Remove`) when it is first looked
    up, by `rows(i)`, which must not fail (the decoder checked the rows). Otherwise a dict:
    insertion order, and replacing or deleting entries, work as on one.
    """

    __slots__ = ("_live", "_many", "_rows")

    def __init__(
        self, live: dict[str, F | int], rows: Callable[[int], F], many: Callable[[list[int]], list[F]]
    ) -> None:
        self._live: dict[str, F | int] = live
        self._rows: Callable[[int], F] = rows
        #: rows i, j, ... at once (ascending): what iterating every value takes
        self._many: Callable[[list[int]], list[F]] = many

    def _decode_all(self) -> None:
        pending = sorted((v, k) for k, v in self._live.items() if isinstance(v, int))
        if pending:
            for (_, path), action in zip(pending, self._many([i for i, _ in pending]), strict=True):
                self._live[path] = action

    def values(self) -> ValuesView[F]:
        self._decode_all()
        return ValuesView(self)

    def items(self) -> ItemsView[str, F]:
        self._decode_all()
        return ItemsView(self)

    def __getitem__(self, path: str) -> F:
        v = self._live[path]
        if not isinstance(v, int):
            return v
        action = self._rows(v)
        self._live[path] = action
        return action

    def __setitem__(self, path: str, action: F) -> None:
        self._live[path] = action

    def __delitem__(self, path: str) -> None:
        del self._live[path]

    def __contains__(self, path: object) -> bool:
        return path in self._live

    def __iter__(self) -> Iterator[str]:
        return iter(self._live)

    def __len__(self) -> int:
        return len(self._live)

    def __repr__(self) -> str:
        return f"LazyActions({len(self._live)} paths)"

    def copy(self) -> LazyActions[F]:
        """A copy sharing the decoded rows (they are immutable), not the path table."""
        return LazyActions(dict(self._live), self._rows, self._many)


def _copy(actions: Mapping[str, F]) -> MutableMapping[str, F]:
    return actions.copy() if isinstance(actions, LazyActions) else dict(actions)


@dataclass
class TableState:
    version: int = -1
    protocol: Protocol | None = None
    metadata: Metadata | None = None
    #: live files by path: a dict, or from a checkpoint a `LazyActions` (the same, decoded on demand)
    files: MutableMapping[str, Add] = field(default_factory=dict)
    tombstones: MutableMapping[str, Remove] = field(default_factory=dict)
    txns: dict[str, Txn] = field(default_factory=dict)
    #: live domains (PROTOCOL.md "Action Reconciliation": the latest per domain, tombstones dropped)
    domains: dict[str, DomainMetadata] = field(default_factory=dict)
    #: commitInfo of the commit at `version` (not in checkpoints: read from that commit's file)
    commit_info: CommitInfo | None = None
    #: the largest ICT among the commits replayed here (from the checkpoint's commit on): a new
    #: commit's ICT must exceed it even when the latest commit's ICT is missing or went backwards
    ict_floor: int | None = field(default=None, compare=False)
    #: how many tombstones the last sweep of expired ones kept (`trim_tombstones`)
    trimmed: int = field(default=0, compare=False, repr=False)

    def copy(self) -> TableState:
        return TableState(
            self.version,
            self.protocol,
            self.metadata,
            _copy(self.files),
            _copy(self.tombstones),
            dict(self.txns),
            dict(self.domains),
            self.commit_info,
            self.ict_floor,
            self.trimmed,
        )

    @classmethod
    def from_checkpoint(
        cls,
        version: int,
        actions: Sequence[Action],
        files: MutableMapping[str, Add] | None = None,
        tombstones: MutableMapping[str, Remove] | None = None,
    ) -> TableState:
        """The state a checkpoint holds (already reconciled; no commitInfo to check): `actions`,
        plus the adds and removes the decoder kept as columns (`files`, `tombstones`), if any."""
        state = cls(version=version)
        if files is not None:
            state.files = files
        if tombstones is not None:
            state.tombstones = tombstones
        for a in actions:
            if isinstance(a, Protocol):
                state.protocol = a
            elif isinstance(a, Metadata):
                state.metadata = a
            elif isinstance(a, Add):
                state.files[a.path] = a
            elif isinstance(a, Remove):
                state.tombstones[a.path] = a
            elif isinstance(a, Txn):
                state.txns[a.app_id] = a
            elif isinstance(a, DomainMetadata) and not a.removed:
                state.domains[a.domain] = a
        if state.protocol is None or state.metadata is None:
            raise Corruption(f"checkpoint {version} lacks the protocol or metaData action")
        check_readable(state.protocol, state.metadata)
        return state

    def set_checkpoint_commit_info(self, info: CommitInfo | None) -> None:
        """The commitInfo of the commit file at a checkpoint's version (checkpoints drop it)."""
        self.commit_info = info
        self.ict_floor = self.ict

    def check_complete(self) -> None:
        """Corruption if the metaData in effect lacks a required field (an old, superseded one may)."""
        if self.metadata is not None and self.metadata.missing:
            raise Corruption(
                f"the metaData in effect at version {self.version} has no {', '.join(self.metadata.missing)}: "
                "the table is corrupt"
            )

    @staticmethod
    def commit_info_of(actions: Sequence[Action]) -> CommitInfo | None:
        return next((a for a in actions if isinstance(a, CommitInfo)), None)

    @property
    def ict(self) -> int | None:
        return None if self.commit_info is None else self.commit_info.in_commit_timestamp

    def apply(self, version: int, actions: Sequence[Action]) -> None:
        """Fold commit `version` into this state (it must be the next version)."""
        if version != self.version + 1:
            raise Corruption(f"commit {version} applied after version {self.version}: the log has a gap")
        # one pass sorts the actions by kind (replaying 10,000 commits: per-commit passes added up)
        protocols: list[Protocol] = []
        metadatas: list[Metadata] = []
        removes: list[Remove] = []
        rest: list[Action] = []
        info: CommitInfo | None = None
        for a in actions:
            if isinstance(a, Add):
                rest.append(a)
            elif isinstance(a, CommitInfo):
                if info is None:
                    info = a
            elif isinstance(a, Remove):
                removes.append(a)
            elif isinstance(a, Protocol):
                protocols.append(a)
            elif isinstance(a, Metadata):
                metadatas.append(a)
            else:
                rest.append(a)
        if len(protocols) > 1 or len(metadatas) > 1:
            raise Corruption(f"commit {version} has more than one protocol or metaData action")
        if version == 0 and not (protocols and metadatas):
            raise Corruption("commit 0 lacks the protocol or metaData action a new table needs")
        protocol = protocols[0] if protocols else self.protocol
        metadata = metadatas[0] if metadatas else self.metadata
        if protocols or metadatas:
            assert protocol is not None
            check_readable(protocol, metadata)
        # In-commit timestamps are not checked here: a commit with a missing or backward ICT must
        # not make other versions unreadable. The checks are where an answer depends on commit
        # times (timeline.py) and when a commit is written (`ict_floor`: the next ICT goes past it).
        self.protocol, self.metadata = protocol, metadata
        self.commit_info = info
        ict = None if info is None else info.in_commit_timestamp
        if ict is not None and (self.ict_floor is None or ict > self.ict_floor):
            self.ict_floor = ict
        # A commit's actions are unordered (PROTOCOL.md): a deletion vector update is `remove(path,
        # old DV)` + `add(path, new DV)` in either order, so removes go first; a valid commit never
        # adds and removes one (path, DV) pair.
        files, tombstones = self.files, self.tombstones
        for r in removes:
            files.pop(r.path, None)
            tombstones[r.path] = r
        for a in rest:
            if isinstance(a, Add):
                files[a.path] = a
                if tombstones:
                    tombstones.pop(a.path, None)
            elif isinstance(a, Txn):
                self.txns[a.app_id] = a
            elif isinstance(a, DomainMetadata):
                if a.removed:
                    self.domains.pop(a.domain, None)
                else:
                    self.domains[a.domain] = a
        self.version = version
        self.trim_tombstones()

    def trim_tombstones(self) -> None:
        """Forget the tombstones expired by the time of the latest commit applied (PROTOCOL.md "Add
        File and Remove File": a remove is a tombstone until its retention has passed; a checkpoint
        drops the expired ones too). A state extended commit after commit for the life of a process
        (a stream's table handle, `log._STATES`) otherwise kept every file a compaction ever removed:
        the stream's memory grew ~10 tombstones a second. The latest commit's time rather than a
        clock: the state stays a function of the log, and that time is not ahead of a vacuum's now,
        so a tombstone vacuum needs is never dropped. A sweep runs once the tombstones have doubled
        since the last one (from `TRIM_TOMBSTONES_FROM` on): O(1) a commit, amortised."""
        if len(self.tombstones) < max(2 * self.trimmed, TRIM_TOMBSTONES_FROM) or self.metadata is None:
            return
        now_ms = self.ict_floor
        if now_ms is None and self.commit_info is not None:  # no in-commit timestamps: the writer's time
            now_ms = self.commit_info.timestamp
        if now_ms is None:
            return
        try:
            retention_ms = tombstone_retention_ms(self.metadata.configuration)
        except InvalidArgument:  # a bad property: keep them all (maintenance reports it)
            return
        self.expire_tombstones(now_ms, retention_ms)
        self.trimmed = len(self.tombstones)

    def expire_tombstones(self, now_ms: int, retention_ms: int) -> None:
        """Drop tombstones older than the retention (PROTOCOL.md "Add File and Remove File")."""
        self.tombstones = {
            p: r
            for p, r in self.tombstones.items()
            if r.deletion_timestamp is None or r.deletion_timestamp + retention_ms > now_ms
        }


def tombstone_retention_ms(configuration: Mapping[str, str]) -> int:
    """`delta.deletedFileRetentionDuration` in ms (default one week); InvalidArgument if malformed."""
    value = configuration.get(DELETED_FILE_RETENTION)
    return DEFAULT_TOMBSTONE_RETENTION_MS if value is None else parse_interval(value)
