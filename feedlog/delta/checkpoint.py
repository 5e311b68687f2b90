"""V1 classic checkpoints (`<v>.checkpoint.parquet`) and `_last_checkpoint` (PROTOCOL.md "Checkpoints").

One Parquet row per action, one struct column per action kind. The column
types follow the protocol's checkpoint schema; the protocol versions are int32
(readers such as delta-rs and DuckDB refuse int64 there) and `stats` stays a
JSON string. Checkpoints hold no commitInfo, so the commit file at the
checkpoint's version is always kept next to it (it carries that version's ICT).

A checkpoint replaces the commits before it, so it carries every action and
field the protocol defines whether feedlog interprets them or not: domain
metadata, row tracking's `baseRowId` / `defaultRowCommitVersion`, clustering's
`clusteringProvider`, deletion vectors, tags. File-action fields no protocol
version defines (on metaData, add, remove) get a column whose type is inferred from their values;
one that cannot be typed refuses the checkpoint rather than dropping it.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from ..errors import Corruption, Unsupported
from .actions import Action, Add, DomainMetadata, Metadata, Protocol, Remove, Txn
from .committer import LOG_DIR
from .parquet import read_parquet, write_parquet
from .replay import TableState

LAST_CHECKPOINT = f"{LOG_DIR}/_last_checkpoint"

_STR_MAP = pa.map_(pa.string(), pa.string())
#: PROTOCOL.md "Deletion Vector Descriptor Schema"
_DELETION_VECTOR = pa.struct(
    [
        ("storageType", pa.string()),
        ("pathOrInlineDv", pa.string()),
        ("offset", pa.int32()),
        ("sizeInBytes", pa.int32()),
        ("cardinality", pa.int64()),
    ]
)
SCHEMA = pa.schema(
    [
        pa.field("txn", pa.struct([("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())])),
        pa.field(
            "add",
            pa.struct(
                [
                    ("path", pa.string()),
                    ("partitionValues", _STR_MAP),
                    ("size", pa.int64()),
                    ("modificationTime", pa.int64()),
                    ("dataChange", pa.bool_()),
                    ("stats", pa.string()),
                    ("tags", _STR_MAP),
                    ("deletionVector", _DELETION_VECTOR),
                    ("baseRowId", pa.int64()),
                    ("defaultRowCommitVersion", pa.int64()),
                    ("clusteringProvider", pa.string()),
                ]
            ),
        ),
        pa.field(
            "remove",
            pa.struct(
                [
                    ("path", pa.string()),
                    ("deletionTimestamp", pa.int64()),
                    ("dataChange", pa.bool_()),
                    ("extendedFileMetadata", pa.bool_()),
                    ("partitionValues", _STR_MAP),
                    ("size", pa.int64()),
                    ("deletionVector", _DELETION_VECTOR),
                    ("baseRowId", pa.int64()),
                    ("defaultRowCommitVersion", pa.int64()),
                ]
            ),
        ),
        pa.field(
            "metaData",
            pa.struct(
                [
                    ("id", pa.string()),
                    ("name", pa.string()),
                    ("description", pa.string()),
                    ("format", pa.struct([("provider", pa.string()), ("options", _STR_MAP)])),
                    ("schemaString", pa.string()),
                    ("partitionColumns", pa.list_(pa.string())),
                    ("configuration", _STR_MAP),
                    ("createdTime", pa.int64()),
                ]
            ),
        ),
        pa.field(
            "protocol",
            pa.struct(
                [
                    ("minReaderVersion", pa.int32()),
                    ("minWriterVersion", pa.int32()),
                    ("readerFeatures", pa.list_(pa.string())),
                    ("writerFeatures", pa.list_(pa.string())),
                ]
            ),
        ),
        pa.field(
            "domainMetadata",
            pa.struct([("domain", pa.string()), ("configuration", pa.string()), ("removed", pa.bool_())]),
        ),
    ]
)
#: checkpoint-only typed copies of `stats` / `partitionValues` (other writers' option): derived, not kept
_DERIVED = ("stats_parsed", "partitionValues_parsed")
#: remove fields checkpoints leave out: tombstones serve VACUUM only (PROTOCOL.md "Checkpoints")
_TOMBSTONE_DROPS = ("stats", "tags")


def checkpoint_path(version: int) -> str:
    return f"{LOG_DIR}/{version:020d}.checkpoint.parquet"


def _map(d: Any) -> list[tuple[str, Any]] | None:
    return None if d is None else list(d.items())


def _rows(state: TableState) -> Iterator[dict[str, Any]]:
    assert state.protocol is not None and state.metadata is not None
    p, m = state.protocol, state.metadata
    yield {"protocol": p.to_json()}
    md = m.to_json()
    md["format"] = {"provider": m.format.provider, "options": _map(m.format.options)}
    md["configuration"] = _map(m.configuration)
    yield {"metaData": md}
    for t in state.txns.values():
        yield {"txn": t.to_json()}
    for dm in state.domains.values():
        yield {"domainMetadata": dm.to_json()}
    for a in state.files.values():
        yield {"add": {**a.to_json(), "partitionValues": _map(a.partition_values), "tags": _map(a.tags)}}
    for r in state.tombstones.values():
        d = r.to_json()
        for key in _TOMBSTONE_DROPS:
            d.pop(key, None)
        d["partitionValues"] = _map(r.partition_values)
        yield {"remove": d}


def _schema_for(rows: list[dict[str, Any]]) -> pa.Schema:
    """SCHEMA plus a column for each metaData or file-action field it does not define (so none is lost)."""
    schema = SCHEMA
    for kind in ("metaData", "add", "remove"):
        struct = schema.field(kind).type
        known = {struct.field(i).name for i in range(struct.num_fields)}
        unknown: dict[str, list[Any]] = {}
        for row in rows:
            for k in row.get(kind, {}):
                if k not in known:
                    unknown.setdefault(k, [])
        if not unknown:
            continue
        fields = [struct.field(i) for i in range(struct.num_fields)]
        for k in unknown:
            values = [row[kind].get(k) if kind in row else None for row in rows]
            try:
                typ = pa.array(values).type
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
                raise Unsupported(
                    f"{kind} field {k!r} (not in the Delta protocol) has values no checkpoint column can hold "
                    f"({e}); refusing to write a checkpoint that would drop it"
                ) from None
            fields.append(pa.field(k, pa.string() if pa.types.is_null(typ) else typ))
        schema = schema.set(schema.get_field_index(kind), pa.field(kind, pa.struct(fields)))
    return schema


def encode(state: TableState) -> tuple[bytes, int, int]:
    """(parquet bytes, number of actions, number of add actions) of a checkpoint of `state`."""
    rows = list(_rows(state))
    table = pa.Table.from_pylist(rows, schema=_schema_for(rows))
    return write_parquet(table, "zstd"), len(rows), len(state.files)


def _strip_nulls(value: Any) -> Any:
    """A struct value as its JSON had it: Parquet fills absent struct fields with null."""
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def decode(data: bytes, version: int, columns: Sequence[str] | None = None) -> list[Action]:
    """The actions of a checkpoint file, protocol and metaData first (only `columns` if given)."""
    try:
        table = read_parquet(data, columns)
    except (pa.ArrowInvalid, OSError) as e:
        raise Corruption(f"checkpoint {version} is not a readable Parquet file: {e}") from None
    out: list[Action] = []
    try:
        for name, parse in (("protocol", Protocol.from_json), ("metaData", Metadata.from_json)):
            if name not in table.column_names:
                raise Corruption(f"checkpoint {version} has no {name} column")
            rows = [r for r in table.column(name).to_pylist() if r is not None]
            if len(rows) != 1:
                raise Corruption(f"checkpoint {version} has {len(rows)} {name} rows, not 1")
            row = dict(rows[0])
            if name == "metaData":
                row["configuration"] = dict(row.get("configuration") or [])
                fmt = dict(row.get("format") or {})
                fmt["options"] = dict(fmt.get("options") or [])
                row["format"] = fmt
                row = {k: v if k in ("configuration", "format") else _strip_nulls(v) for k, v in row.items()}
            out.append(parse(row))
        kinds: list[tuple[str, Any]] = [
            ("txn", Txn.from_json),
            ("domainMetadata", DomainMetadata.from_json),
            ("add", Add.from_json),
            ("remove", Remove.from_json),
        ]
        for name, parse in kinds:
            if name not in table.column_names:
                continue
            for row in table.column(name).to_pylist():
                if row is None:
                    continue
                maps = {k: dict(row[k]) for k in ("partitionValues", "tags") if row.get(k) is not None}
                row = {
                    k: _strip_nulls(v) for k, v in row.items() if v is not None and k not in maps and k not in _DERIVED
                }
                row.update(maps)  # a null partition value is a value, not an absent field
                out.append(parse(row))
    except (KeyError, TypeError, ValueError) as e:
        raise Corruption(f"checkpoint {version} has a malformed action: {e!r}") from None
    return out


# _last_checkpoint checksum (PROTOCOL.md "JSON checksum")


def _quote(s: str) -> str:
    return '"' + urllib.parse.quote(s, safe="-._~") + '"'


def _canonical_pairs(value: Any, path: list[str]) -> Iterator[tuple[str, str]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _canonical_pairs(v, [*path, _quote(k)])
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _canonical_pairs(v, [*path, str(i)])
    else:
        if value is None or isinstance(value, bool):
            text = json.dumps(value)
        elif isinstance(value, str):
            text = _quote(value)
        else:
            text = json.dumps(value)
        yield "+".join(path), text


def canonical_json(doc: dict[str, Any]) -> str:
    pairs = list(_canonical_pairs({k: v for k, v in doc.items() if k != "checksum"}, []))
    pairs.sort(key=lambda kv: kv[0].encode())
    return ",".join(f"{k}={v}" for k, v in pairs)


def checksum(doc: dict[str, Any]) -> str:
    return hashlib.md5(canonical_json(doc).encode(), usedforsecurity=False).hexdigest()


def last_checkpoint_json(version: int, size: int, size_in_bytes: int, num_adds: int) -> bytes:
    doc: dict[str, Any] = {"version": version, "size": size, "sizeInBytes": size_in_bytes, "numOfAddFiles": num_adds}
    doc["checksum"] = checksum(doc)
    return json.dumps(doc, separators=(",", ":")).encode()
