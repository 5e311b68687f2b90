"""Delta log actions (PROTOCOL.md "Actions"): typed values, JSON in and out. Pure, no I/O.

Each action serialises with the keys in the order the reference implementation
writes them, so a commit file is byte-for-byte predictable (golden tests pin it).
Fields this module does not model are kept in `extra` and written back, because
the protocol tells clients to ignore, not drop, what they do not understand.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import Corruption

# Table feature names (PROTOCOL.md appendix "Valid Feature Names in Table Features").
ICT = "inCommitTimestamp"
#: the RFC draft's spelling; accepted when reading, never written
ICT_DRAFT = "inCommitTimestamps"
APPEND_ONLY = "appendOnly"
MANAGED_COMMITS = "managedCommits"
CHECKPOINT_PROTECTION = "checkpointProtection"
INVARIANTS = "invariants"
DOMAIN_METADATA = "domainMetadata"
V2_CHECKPOINT = "v2Checkpoint"
COLUMN_MAPPING = "columnMapping"
#: delta-spark's commit ownership (PROTOCOL.md "Catalog-managed tables"; its preview name)
CATALOG_MANAGED = "catalogManaged"
CATALOG_OWNED_PREVIEW = "catalogOwned-preview"
COORDINATED_COMMITS_PREVIEW = "coordinatedCommits-preview"

# Table properties.
ENABLE_ICT = "delta.enableInCommitTimestamps"
ICT_ENABLEMENT_VERSION = "delta.inCommitTimestampEnablementVersion"
ICT_ENABLEMENT_TIMESTAMP = "delta.inCommitTimestampEnablementTimestamp"
APPEND_ONLY_PROP = "delta.appendOnly"
LOG_RETENTION = "delta.logRetentionDuration"
DELETED_FILE_RETENTION = "delta.deletedFileRetentionDuration"
COMPRESSION = "delta.parquet.compression.codec"
NUM_INDEXED_COLS = "delta.dataSkippingNumIndexedCols"
OWNER_NAME = "delta.managedCommitOwnerName"
OWNER_CONF = "delta.managedCommitOwnerConf"
REQUIRE_CHECKPOINT_PROTECTION = "delta.requireCheckpointProtectionBeforeVersion"
COLUMN_MAPPING_MODE = "delta.columnMapping.mode"
COORDINATOR_PREVIEW = "delta.coordinatedCommits.commitCoordinator-preview"


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


@dataclass(frozen=True)
class Protocol:
    min_reader_version: int
    min_writer_version: int
    reader_features: tuple[str, ...] | None = None
    writer_features: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "minReaderVersion": self.min_reader_version,
            "minWriterVersion": self.min_writer_version,
        }
        if self.reader_features is not None:
            out["readerFeatures"] = list(self.reader_features)
        if self.writer_features is not None:
            out["writerFeatures"] = list(self.writer_features)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Protocol:
        rf, wf = d.get("readerFeatures"), d.get("writerFeatures")
        return cls(
            int(d["minReaderVersion"]),
            int(d["minWriterVersion"]),
            None if rf is None else tuple(rf),
            None if wf is None else tuple(wf),
        )

    def supports_writer_feature(self, name: str) -> bool:
        return self.min_writer_version == 7 and name in (self.writer_features or ())

    def without_writer_feature(self, name: str) -> Protocol:
        if not self.supports_writer_feature(name):
            return self
        features = tuple(f for f in self.writer_features or () if f != name)
        return Protocol(self.min_reader_version, 7, self.reader_features, features)

    def with_writer_feature(self, name: str) -> Protocol:
        """This protocol upgraded to writer version 7 with `name` listed.

        Upgrading from writer version 2 lists the features version 2 implied
        (PROTOCOL.md "Table Features for New and Existing Tables": assume used).
        """
        if self.supports_writer_feature(name):
            return self
        if self.min_writer_version == 7:
            features = tuple(self.writer_features or ())
        else:
            implied = {1: (), 2: (APPEND_ONLY, INVARIANTS)}
            features = implied.get(self.min_writer_version, (APPEND_ONLY, INVARIANTS))
        reader = self.reader_features if self.min_reader_version == 3 else None
        return Protocol(self.min_reader_version, 7, reader, (*features, name))


@dataclass(frozen=True)
class Format:
    provider: str = "parquet"
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Metadata:
    id: str
    schema_string: str
    partition_columns: tuple[str, ...] = ()
    configuration: Mapping[str, str] = field(default_factory=dict)
    created_time: int | None = None
    name: str | None = None
    description: str | None = None
    format: Format = field(default_factory=Format)
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: required fields the action had no value for: an old, superseded metaData may lack them
    #: (delta-spark wrote some without schemaString); corruption only while it is in effect
    missing: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = _drop_none(
            {
                "id": self.id,
                "name": self.name,
                "description": self.description,
                "format": {"provider": self.format.provider, "options": dict(self.format.options)},
                "schemaString": self.schema_string,
                "partitionColumns": list(self.partition_columns),
                "configuration": dict(self.configuration),
                "createdTime": self.created_time,
            }
        )
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Metadata:
        fmt = d.get("format") or {}
        if not isinstance(fmt, Mapping):
            raise TypeError(f"format is not an object: {fmt!r}")
        known = {
            "id",
            "name",
            "description",
            "format",
            "schemaString",
            "partitionColumns",
            "configuration",
            "createdTime",
        }
        # An old metaData may lack fields (delta-spark wrote some without schemaString); it is only
        # corruption if it is still the one in effect (`Metadata.missing`, checked by replay's callers).
        return cls(
            id=str(d.get("id") or ""),
            schema_string=str(d.get("schemaString") or ""),
            partition_columns=tuple(d.get("partitionColumns") or ()),
            configuration=dict(d.get("configuration") or {}),
            created_time=d.get("createdTime"),
            name=d.get("name"),
            description=d.get("description"),
            format=Format(fmt.get("provider", "parquet"), dict(fmt.get("options") or {})),
            extra={k: v for k, v in d.items() if k not in known and v is not None},
            missing=tuple(k for k in ("id", "schemaString") if d.get(k) is None),
        )

    def with_configuration(self, updates: Mapping[str, str | None]) -> Metadata:
        conf = dict(self.configuration)
        for k, v in updates.items():
            if v is None:
                conf.pop(k, None)
            else:
                conf[k] = v
        return Metadata(
            self.id,
            self.schema_string,
            self.partition_columns,
            conf,
            self.created_time,
            self.name,
            self.description,
            self.format,
            self.extra,
            self.missing,
        )


def _long(value: Any) -> int:
    """A protocol `long` field: an integer that fits 64 bits (a checkpoint's column holds no more)."""
    n = int(value)
    if not -(2**63) <= n < 2**63:
        raise ValueError(f"{n} does not fit a long")
    return n


_ADD_KNOWN = frozenset({"path", "partitionValues", "size", "modificationTime", "dataChange", "stats", "tags"})
_COMMIT_INFO_KNOWN = frozenset({"inCommitTimestamp", "timestamp", "operation", "operationParameters"})


@dataclass(frozen=True)
class Add:
    path: str
    partition_values: Mapping[str, str | None]
    size: int
    modification_time: int
    data_change: bool = True
    stats: str | None = None
    tags: Mapping[str, str] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = _drop_none(
            {
                "path": self.path,
                "partitionValues": dict(self.partition_values),
                "size": self.size,
                "modificationTime": self.modification_time,
                "dataChange": self.data_change,
                "stats": self.stats,
                "tags": None if self.tags is None else dict(self.tags),
            }
        )
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Add:
        known = _ADD_KNOWN
        return cls(
            path=str(d["path"]),
            partition_values=dict(d.get("partitionValues") or {}),
            size=_long(d["size"]),
            modification_time=_long(d["modificationTime"]),
            data_change=bool(d.get("dataChange", True)),
            stats=d.get("stats"),
            tags=d.get("tags"),
            # (the subset test in C first: most adds carry nothing else, and replaying 10,000
            # commits spent a third of Add's parse in this comprehension)
            extra={} if d.keys() <= known else {k: v for k, v in d.items() if k not in known and v is not None},
        )

    def num_records(self) -> int | None:
        if self.stats is None:
            return None
        n = json.loads(self.stats).get("numRecords")
        return None if n is None else int(n)

    def remove(self, deletion_timestamp: int, data_change: bool = True) -> Remove:
        # The deletion vector is half of the logical file's key; row tracking's ids carry over
        # to the tombstone (PROTOCOL.md "Add File and Remove File", "Row Tracking").
        carried = {k: v for k, v in self.extra.items() if k in REMOVE_CARRIES}
        return Remove(
            self.path,
            deletion_timestamp,
            data_change,
            extended_file_metadata=True,
            partition_values=self.partition_values,
            size=self.size,
            stats=self.stats,
            tags=self.tags,
            extra=carried,
        )


#: the add fields a remove of the same file repeats
REMOVE_CARRIES = ("deletionVector", "baseRowId", "defaultRowCommitVersion")


@dataclass(frozen=True)
class Remove:
    path: str
    deletion_timestamp: int | None
    data_change: bool = True
    extended_file_metadata: bool | None = None
    partition_values: Mapping[str, str | None] | None = None
    size: int | None = None
    stats: str | None = None
    tags: Mapping[str, str] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = _drop_none(
            {
                "path": self.path,
                "deletionTimestamp": self.deletion_timestamp,
                "dataChange": self.data_change,
                "extendedFileMetadata": self.extended_file_metadata,
                "partitionValues": None if self.partition_values is None else dict(self.partition_values),
                "size": self.size,
                "stats": self.stats,
                "tags": None if self.tags is None else dict(self.tags),
            }
        )
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Remove:
        known = {
            "path",
            "deletionTimestamp",
            "dataChange",
            "extendedFileMetadata",
            "partitionValues",
            "size",
            "stats",
            "tags",
        }
        return cls(
            path=str(d["path"]),
            deletion_timestamp=d.get("deletionTimestamp"),
            data_change=bool(d.get("dataChange", True)),
            extended_file_metadata=d.get("extendedFileMetadata"),
            partition_values=d.get("partitionValues"),
            size=d.get("size"),
            stats=d.get("stats"),
            tags=d.get("tags"),
            extra={k: v for k, v in d.items() if k not in known and v is not None},
        )


@dataclass(frozen=True)
class Txn:
    app_id: str
    version: int
    last_updated: int | None = None

    def to_json(self) -> dict[str, Any]:
        return _drop_none({"appId": self.app_id, "version": self.version, "lastUpdated": self.last_updated})

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Txn:
        return cls(str(d["appId"]), int(d["version"]), d.get("lastUpdated"))


@dataclass(frozen=True)
class DomainMetadata:
    """A named domain's configuration (PROTOCOL.md "Domain Metadata"); `removed` is a tombstone.

    feedlog interprets no domain, but replay and checkpoints keep every one: writers must
    preserve domains they do not understand (row tracking's high-water mark, clustering columns).
    """

    domain: str
    configuration: str
    removed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"domain": self.domain, "configuration": self.configuration, "removed": self.removed}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DomainMetadata:
        domain, conf, removed = d["domain"], d["configuration"], d.get("removed", False)
        if not isinstance(domain, str) or not isinstance(conf, str) or not isinstance(removed, bool):
            raise TypeError(f"domainMetadata needs a string domain and configuration and a boolean removed: {d}")
        return cls(domain, conf, removed)


@dataclass(frozen=True)
class CommitInfo:
    """Provenance; with in-commit timestamps it is the first action and carries the ICT."""

    in_commit_timestamp: int | None
    timestamp: int | None
    operation: str | None = None
    operation_parameters: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = _drop_none(
            {
                "inCommitTimestamp": self.in_commit_timestamp,
                "timestamp": self.timestamp,
                "operation": self.operation,
                "operationParameters": dict(self.operation_parameters) if self.operation else None,
            }
        )
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CommitInfo:
        known = _COMMIT_INFO_KNOWN
        ict = d.get("inCommitTimestamp")
        return cls(
            in_commit_timestamp=ict if isinstance(ict, int) and not isinstance(ict, bool) else None,
            timestamp=d.get("timestamp"),
            operation=d.get("operation"),
            operation_parameters=dict(d.get("operationParameters") or {}),
            extra={k: v for k, v in d.items() if k not in known},
        )


Action = Protocol | Metadata | Add | Remove | Txn | DomainMetadata | CommitInfo

_KEYS: dict[type[Action], str] = {
    Protocol: "protocol",
    Metadata: "metaData",
    Add: "add",
    Remove: "remove",
    Txn: "txn",
    DomainMetadata: "domainMetadata",
    CommitInfo: "commitInfo",
}
_PARSERS: dict[str, Callable[[Mapping[str, Any]], Action]] = {v: k.from_json for k, v in _KEYS.items()}
#: the standard library's scanner (C where available): one JSON value from a position in a string
_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def to_json(action: Action) -> dict[str, Any]:
    return {_KEYS[type(action)]: action.to_json()}


def encode_commit(actions: Iterable[Action]) -> bytes:
    """Newline-delimited JSON, one action per line (PROTOCOL.md "Delta Log Entries")."""
    lines = (json.dumps(to_json(a), separators=(",", ":"), ensure_ascii=False) for a in actions)
    return ("\n".join(lines) + "\n").encode()


def _ict_only(d: Mapping[str, Any]) -> CommitInfo:
    ict = d.get("inCommitTimestamp")
    return CommitInfo(ict if isinstance(ict, int) and not isinstance(ict, bool) else None, None)


def decode_commit(data: bytes, version: int, ict_only: bool = False) -> list[Action]:
    """Parse one commit file; actions no snapshot holds (cdc, and kinds from the future) are skipped.

    Anything that is not a JSON object per line, or a known action missing a
    required field, is a corrupt commit and the error names the version. With `ict_only` the
    commitInfo keeps its in-commit timestamp alone (replay needs no more of a commit before the last).
    """
    out: list[Action] = []
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise Corruption(f"commit {version} is not UTF-8: {e}") from None
    # lines end at "\n" alone (a "\r" before it is JSON whitespace): str.splitlines would also
    # break a line at characters a JSON string may hold unescaped (U+0085, U+2028, ...)
    for lineno, line in enumerate(text.split("\n"), 1):
        try:  # the C scanner alone, without json.loads' per-call checks (10,000 commits: it adds up)
            obj, end = _scan_once(line, 0)
            if end != len(line):
                raise ValueError(line)
        except (StopIteration, ValueError, RecursionError):
            # blank, padded or not JSON: json.loads decides, and says what is wrong
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise Corruption(f"commit {version} line {lineno} is not JSON: {e}") from None
            except ValueError as e:  # an integer longer than Python converts (sys.get_int_max_str_digits)
                raise Corruption(f"commit {version} line {lineno}: {e}") from None
            except RecursionError:  # nesting deeper than the parser's stack: no action is shaped like that
                raise Corruption(f"commit {version} line {lineno} nests too deeply to be an action") from None
        if not isinstance(obj, dict) or not obj:
            raise Corruption(f"commit {version} line {lineno} is not a single action object")
        if len(obj) == 1:  # the usual line: one action, nothing beside it
            [(kind, body)] = obj.items()
            parse = _ict_only if ict_only and kind == "commitInfo" else _PARSERS.get(kind)
            if parse is not None and isinstance(body, dict):
                try:
                    out.append(parse(body))
                except (KeyError, TypeError, ValueError, OverflowError) as e:
                    raise Corruption(f"commit {version} line {lineno}: bad {kind} action ({e!r})") from None
                continue
        # Keys this library does not know (a future action, or a sibling field some writer adds
        # next to the action) are ignored, as the protocol asks of unrecognised fields.
        known = [(kind, body) for kind, body in obj.items() if kind in _PARSERS]
        if len(known) > 1:
            kinds = ", ".join(k for k, _ in known)
            raise Corruption(f"commit {version} line {lineno} holds more than one action ({kinds})")
        for kind, body in known:
            if not isinstance(body, dict):
                raise Corruption(f"commit {version} line {lineno}: {kind} is not an object")
            parse = _ict_only if ict_only and kind == "commitInfo" else _PARSERS[kind]
            try:
                out.append(parse(body))
            except (KeyError, TypeError, ValueError, OverflowError) as e:
                raise Corruption(f"commit {version} line {lineno}: bad {kind} action ({e!r})") from None
    return out
