"""Log replay (PROTOCOL.md "Action Reconciliation") and the in-commit-timestamp rules. Pure, no I/O.

`TableState` is the table at one version: protocol, metadata, live files,
unexpired tombstones, the latest `txn` version per appId and the latest
`domainMetadata` per domain (removed ones dropped). `apply` folds one
commit into it and checks what every commit must satisfy, so a corrupt or
non-conforming commit is reported with its version wherever it is read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..errors import Corruption, Unsupported
from .actions import (
    APPEND_ONLY,
    CHECKPOINT_PROTECTION,
    DOMAIN_METADATA,
    ENABLE_ICT,
    ICT,
    ICT_DRAFT,
    ICT_ENABLEMENT_TIMESTAMP,
    ICT_ENABLEMENT_VERSION,
    INVARIANTS,
    MANAGED_COMMITS,
    Action,
    Add,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    Remove,
    Txn,
)

#: reader features whose only effect is on data this library reads as plain Parquet
SUPPORTED_READER_FEATURES = frozenset({"timestampNtz", "vacuumProtocolCheck"})
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
    }
)


def check_readable(protocol: Protocol) -> None:
    """Raise Unsupported unless this library can read a table with `protocol` correctly."""
    if protocol.min_reader_version > 3:
        raise Unsupported(f"table needs Delta reader version {protocol.min_reader_version}; feedlog reads up to 3")
    if protocol.min_reader_version == 2:
        raise Unsupported("table needs Delta reader version 2 (column mapping), which feedlog does not read")
    if protocol.min_reader_version == 3:
        missing = set(protocol.reader_features or ()) - SUPPORTED_READER_FEATURES
        if missing:
            raise Unsupported(f"table uses reader feature(s) feedlog does not support: {sorted(missing)}")


def check_writable(protocol: Protocol, extra_supported: Iterable[str] = ()) -> None:
    """Raise Unsupported unless this library may write a table with `protocol`."""
    check_readable(protocol)
    if protocol.min_writer_version == 7:
        missing = set(protocol.writer_features or ()) - SUPPORTED_WRITER_FEATURES - set(extra_supported)
        if missing:
            raise Unsupported(
                f"table uses writer feature(s) feedlog does not support: {sorted(missing)}; "
                "feedlog reads such a table but refuses to write it"
            )
    elif protocol.min_writer_version > 2:
        raise Unsupported(
            f"table needs Delta writer version {protocol.min_writer_version} (CHECK constraints, generated "
            "columns...), which feedlog does not write; it writes versions up to 2 and 7 with table features"
        )


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


@dataclass
class TableState:
    version: int = -1
    protocol: Protocol | None = None
    metadata: Metadata | None = None
    files: dict[str, Add] = field(default_factory=dict)
    tombstones: dict[str, Remove] = field(default_factory=dict)
    txns: dict[str, Txn] = field(default_factory=dict)
    #: live domains (PROTOCOL.md "Action Reconciliation": the latest per domain, tombstones dropped)
    domains: dict[str, DomainMetadata] = field(default_factory=dict)
    #: commitInfo of the commit at `version` (not in checkpoints: read from that commit's file)
    commit_info: CommitInfo | None = None

    def copy(self) -> TableState:
        return TableState(
            self.version,
            self.protocol,
            self.metadata,
            dict(self.files),
            dict(self.tombstones),
            dict(self.txns),
            dict(self.domains),
            self.commit_info,
        )

    @classmethod
    def from_checkpoint(cls, version: int, actions: Sequence[Action]) -> TableState:
        """The state a checkpoint holds (already reconciled; no commitInfo to check)."""
        state = cls(version=version)
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
        check_readable(state.protocol)
        return state

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
        protocols = [a for a in actions if isinstance(a, Protocol)]
        metadatas = [a for a in actions if isinstance(a, Metadata)]
        if len(protocols) > 1 or len(metadatas) > 1:
            raise Corruption(f"commit {version} has more than one protocol or metaData action")
        if version == 0 and not (protocols and metadatas):
            raise Corruption("commit 0 lacks the protocol or metaData action a new table needs")
        protocol = protocols[0] if protocols else self.protocol
        metadata = metadatas[0] if metadatas else self.metadata
        if protocols:
            check_readable(protocols[0])
        if ict_enabled(protocol, metadata):  # checked before anything changes: a refused commit leaves no trace
            _check_ict(protocol, metadata, version, actions, self.ict)
        self.protocol, self.metadata = protocol, metadata
        self.commit_info = self.commit_info_of(actions)
        for a in actions:
            if isinstance(a, Add):
                self.files[a.path] = a
                self.tombstones.pop(a.path, None)
            elif isinstance(a, Remove):
                self.files.pop(a.path, None)
                self.tombstones[a.path] = a
            elif isinstance(a, Txn):
                self.txns[a.app_id] = a
            elif isinstance(a, DomainMetadata):
                if a.removed:
                    self.domains.pop(a.domain, None)
                else:
                    self.domains[a.domain] = a
        self.version = version

    def expire_tombstones(self, now_ms: int, retention_ms: int) -> None:
        """Drop tombstones older than the retention (PROTOCOL.md "Add File and Remove File")."""
        self.tombstones = {
            p: r
            for p, r in self.tombstones.items()
            if r.deletion_timestamp is None or r.deletion_timestamp + retention_ms > now_ms
        }


def _check_ict(
    protocol: Protocol | None,
    metadata: Metadata | None,
    version: int,
    actions: Sequence[Action],
    previous_ict: int | None,
) -> None:
    enablement = ict_enablement(protocol, metadata)
    if enablement is None or version < enablement.version:
        return
    # ICT writer requirements 1-3: commitInfo first, with an integer inCommitTimestamp.
    first = actions[0] if actions else None
    if not isinstance(first, CommitInfo) or first.in_commit_timestamp is None:
        raise Corruption(
            f"commit {version} lacks the commitInfo-with-inCommitTimestamp first action that "
            "in-commit timestamps require: the table is corrupt"
        )
    # ICTs strictly increase; time travel's binary search depends on it.
    if previous_ict is not None and first.in_commit_timestamp <= previous_ict:
        raise Corruption(
            f"commit {version} has inCommitTimestamp {first.in_commit_timestamp}, not after the "
            f"previous commit's {previous_ict}: the table is corrupt"
        )
