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

import bisect
import hashlib
import json
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import Corruption, Unsupported
from .actions import Action, Add, DomainMetadata, Metadata, Protocol, Remove, Txn, decode_commit
from .committer import LOG_DIR
from .parquet import read_parquet, write_parquet
from .replay import LazyActions, TableState

LAST_CHECKPOINT = f"{LOG_DIR}/_last_checkpoint"
SIDECAR_DIR = f"{LOG_DIR}/_sidecars"

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


_SIDECAR = pa.struct(
    [("path", pa.string()), ("sizeInBytes", pa.int64()), ("modificationTime", pa.int64()), ("tags", _STR_MAP)]
)
_CHECKPOINT_METADATA = pa.struct([("version", pa.int64()), ("tags", _STR_MAP)])


def v2_checkpoint_path(version: int, uuid: str, fmt: str = "parquet") -> str:
    return f"{LOG_DIR}/{version:020d}.checkpoint.{uuid}.{fmt}"


def sidecar_path(name: str) -> str:
    return f"{SIDECAR_DIR}/{name}"


def encode_sidecar(state: TableState) -> tuple[bytes, int, int]:
    """(parquet bytes, number of actions, number of adds) of a sidecar with all of `state`'s file actions."""
    rows = [r for r in _rows(state) if "add" in r or "remove" in r]
    schema = _schema_for(rows)
    schema = pa.schema([schema.field("add"), schema.field("remove")])
    return write_parquet(pa.Table.from_pylist(rows, schema=schema), "zstd"), len(rows), len(state.files)


def encode_v2(state: TableState, sidecars: Sequence[Sidecar] = ()) -> tuple[bytes, int]:
    """(parquet bytes, number of actions) of a V2-spec checkpoint (PROTOCOL.md "V2 Spec"): its
    checkpointMetadata, the non-file actions and either the `sidecars` holding every file action,
    or, with none, the file actions themselves (never some of each)."""
    rows = list(_rows(state))
    if sidecars:
        rows = [r for r in rows if "add" not in r and "remove" not in r]
        rows.extend({"sidecar": {**sc.to_json(), "tags": _map(sc.tags or {})}} for sc in sidecars)
    rows.insert(0, {"checkpointMetadata": {"version": state.version, "tags": []}})
    schema = _schema_for(rows).append(pa.field("checkpointMetadata", _CHECKPOINT_METADATA))
    schema = schema.append(pa.field("sidecar", _SIDECAR))
    return write_parquet(pa.Table.from_pylist(rows, schema=schema), "zstd"), len(rows)


def _strip_nulls(value: Any) -> Any:
    """A struct value as its JSON had it: Parquet fills absent struct fields with null."""
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


@dataclass(frozen=True)
class Sidecar:
    """A V2 checkpoint's `sidecar` action (PROTOCOL.md "Sidecar File Information")."""

    path: str
    size_in_bytes: int | None = None
    modification_time: int | None = None
    tags: Mapping[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sizeInBytes": self.size_in_bytes,
            "modificationTime": self.modification_time,
            "tags": dict(self.tags or {}),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Sidecar:
        path = d["path"]
        if not isinstance(path, str) or not path:
            raise ValueError(f"sidecar needs a path: {d}")
        tags = d.get("tags")
        return cls(path, d.get("sizeInBytes"), d.get("modificationTime"), dict(tags) if tags else None)

    @property
    def log_path(self) -> str:
        """Where the sidecar is: always `_delta_log/_sidecars/` (only the file name is meaningful)."""
        name = urllib.parse.unquote(self.path.rsplit("/", 1)[-1])
        return f"{SIDECAR_DIR}/{name}"


@dataclass
class Decoded:
    """One checkpoint file's content: actions, the sidecars it names, its checkpointMetadata version;
    with `lazy` decoding, the add and remove rows as Arrow columns (`adds`, `removes`) instead."""

    actions: list[Action] = field(default_factory=list)
    sidecars: list[Sidecar] = field(default_factory=list)
    v2_version: int | None = None
    adds: list[pa.StructArray] = field(default_factory=list)
    removes: list[pa.StructArray] = field(default_factory=list)

    def files(self) -> LazyActions[Add]:
        """The adds kept as columns, by path (a later row of a path wins, as in a dict)."""
        rows = _FileRows("add", self.adds, checked=True)
        return LazyActions(_paths(self.adds), rows, rows.many)

    def tombstones(self) -> LazyActions[Remove]:
        rows = _FileRows("remove", self.removes, checked=True)
        return LazyActions(_paths(self.removes), rows, rows.many)


def _valid(table: pa.Table, name: str) -> pa.Array | None:
    """The non-null rows of column `name` (one action kind), None if it has none: filtering
    vectorised, so a 10,000-row checkpoint's mostly-null columns cost no Python per row."""
    if name not in table.column_names:
        return None
    col = table.column(name)
    if col.null_count == len(col):
        return None
    return col.drop_null().combine_chunks() if col.null_count else col.combine_chunks()


def _file_action(name: str, row: dict[str, Any]) -> dict[str, Any]:
    """An add or remove row as its JSON had it (what `Add.from_json` / `Remove.from_json` take)."""
    maps = {k: dict(row[k]) for k in ("partitionValues", "tags") if row.get(k) is not None}
    if name == "add" and row.get("stats") is None and isinstance(row.get("stats_parsed"), dict):
        row["stats"] = _counts_of(row["stats_parsed"])
    row = {k: _strip_nulls(v) for k, v in row.items() if v is not None and k not in maps and k not in _DERIVED}
    row.update(maps)  # a null partition value is a value, not an absent field
    return row


def _columns_ok(name: str, rows: pa.StructArray) -> bool:
    """Whether every row of `rows` (non-null adds or removes) decodes without error, so they may be
    decoded later: the fields `from_json` requires are there, typed, and never null."""
    types = {f.name: f.type for f in rows.type}
    required = {"path": pa.types.is_string, "size": pa.types.is_integer, "modificationTime": pa.types.is_integer}
    if name == "remove":
        required = {"path": pa.types.is_string}
    return all(f in types and check(types[f]) and not rows.field(f).null_count for f, check in required.items())


def _paths(batches: Sequence[pa.StructArray]) -> dict[str, Any]:
    live: dict[str, Any] = {}
    start = 0
    for rows in batches:
        paths = rows.field("path").to_pylist()
        live.update(zip(paths, range(start, start + len(paths)), strict=True))
        start += len(paths)
    return live


class _FileRows:
    """Row i (numbered across `batches`) of checkpoint add or remove columns, as an action; each
    batch's columns become Python lists once, on the first row read from it."""

    def __init__(self, name: str, batches: Sequence[pa.StructArray], checked: bool = False) -> None:
        #: the rows passed `_columns_ok` (adds may then be built directly; else errors name the field)
        self.checked = checked
        self.batches = list(batches)
        self.starts = [0]
        for rows in self.batches:
            self.starts.append(self.starts[-1] + len(rows))
        self.name = name
        self.parse: Callable[[Mapping[str, Any]], Any] = Add.from_json if name == "add" else Remove.from_json
        self.columns: dict[int, dict[str, list[Any]]] = {}

    def _columns(self, b: int) -> dict[str, list[Any]]:
        cols = self.columns.get(b)
        if cols is None:
            rows = self.batches[b]
            cols = self.columns[b] = {f.name: c.to_pylist() for f, c in zip(rows.type, rows.flatten(), strict=True)}
        return cols

    def __call__(self, i: int) -> Any:
        return self.many([i])[0]

    def many(self, indices: Sequence[int]) -> list[Any]:
        """Rows `indices` (ascending, as a path table lists them: one batch after another)."""
        out: list[Any] = []
        lo = 0
        for _ in range(len(indices) + 1):  # bounded: each round takes at least one index
            if lo >= len(indices):
                break
            b = bisect.bisect_right(self.starts, indices[lo]) - 1
            hi = bisect.bisect_left(indices, self.starts[b + 1], lo)
            cols, base = self._columns(b), self.starts[b]
            js = [i - base for i in indices[lo:hi]]
            if self.checked and self.name == "add":
                out.extend(_adds_of(cols, js))
            else:
                names = list(cols)
                values = list(cols.values())
                for j in js:
                    row = {n: v[j] for n, v in zip(names, values, strict=True)}
                    out.append(self.parse(_file_action(self.name, row)))
            lo = hi
        return out


_ADD_COLUMNS = ("path", "partitionValues", "size", "modificationTime", "dataChange", "stats", "tags")


def _adds_of(cols: dict[str, list[Any]], js: Sequence[int]) -> list[Add]:
    """Rows `js` of checkpoint add columns: the `Add`s that `Add.from_json(_file_action("add", row))`
    gives, built without the intermediate dicts (a snapshot's every file goes through here)."""
    missing = [None] * (max(js, default=-1) + 1)
    paths, pvs, sizes, mtimes, changes, stats_col, tags_col = (cols.get(k, missing) for k in _ADD_COLUMNS)
    parsed = cols.get("stats_parsed", missing)
    # the other columns (deletionVector, baseRowId, ...) that hold a value in any of these rows
    others = [
        (k, v)
        for k, v in cols.items()
        if k not in _ADD_COLUMNS and k not in _DERIVED and any(v[j] is not None for j in js)
    ]
    out = []
    for j in js:
        stats, pv, change, tags = stats_col[j], pvs[j], changes[j], tags_col[j]
        if stats is None and isinstance(parsed[j], dict):
            stats = _counts_of(parsed[j])
        extra = {k: _strip_nulls(v[j]) for k, v in others if v[j] is not None} if others else {}
        out.append(
            Add(
                str(paths[j]),
                {} if pv is None else dict(pv),
                int(sizes[j]),
                int(mtimes[j]),
                True if change is None else bool(change),
                stats,
                None if tags is None else dict(tags),
                extra,
            )
        )
    return out


def _parse_rows(table: pa.Table, version: int, out: Decoded, lazy: bool = False) -> None:
    """Rows of a checkpoint, part or sidecar Parquet file, appended to `out` (protocol and metaData
    first); with `lazy`, well-formed add and remove rows are kept as columns (`Decoded.adds`)."""
    for name, parse in (("protocol", Protocol.from_json), ("metaData", Metadata.from_json)):
        col = _valid(table, name)
        for row in col.to_pylist() if col is not None else ():
            row = dict(row)
            if name == "metaData":
                row["configuration"] = dict(row.get("configuration") or [])
                fmt = dict(row.get("format") or {})
                fmt["options"] = dict(fmt.get("options") or [])
                row["format"] = fmt
                row = {k: v if k in ("configuration", "format") else _strip_nulls(v) for k, v in row.items()}
            out.actions.append(parse(row))
    col = _valid(table, "checkpointMetadata")
    for row in col.to_pylist() if col is not None else ():
        out.v2_version = int(row["version"])
    col = _valid(table, "sidecar")
    for row in col.to_pylist() if col is not None else ():
        tags = row.get("tags")
        out.sidecars.append(Sidecar.from_json({**row, "tags": dict(tags) if tags else None}))
    others: list[tuple[str, Callable[[Mapping[str, Any]], Action]]] = [
        ("txn", Txn.from_json),
        ("domainMetadata", DomainMetadata.from_json),
    ]
    for name, parse_other in others:
        col = _valid(table, name)
        for row in col.to_pylist() if col is not None else ():
            row = {k: _strip_nulls(v) for k, v in row.items() if v is not None}
            out.actions.append(parse_other(row))
    for name, kept in (("add", out.adds), ("remove", out.removes)):
        col = _valid(table, name)
        if col is None:
            continue
        if lazy and pa.types.is_struct(col.type) and _columns_ok(name, col):
            kept.append(col)
            continue
        out.actions.extend(_FileRows(name, [col]).many(range(len(col))))


def _counts_of(parsed: dict[str, Any]) -> str | None:
    """The `stats` JSON of an add whose checkpoint has only `stats_parsed` (a writer's
    delta.checkpoint.writeStatsAsJson=false): its counts, which are exact; min/max values are left
    out rather than re-encoded (readers skip no file on stats they do not have)."""
    kept = ("numRecords", "nullCount", "tightBounds")
    counts = {k: _strip_nulls(parsed[k]) for k in kept if parsed.get(k) is not None}
    return json.dumps(counts) if "numRecords" in counts else None


def decode_parquet(
    data: bytes, version: int, columns: Sequence[str] | None = None, out: Decoded | None = None, lazy: bool = False
) -> Decoded:
    """One Parquet checkpoint file, part, V2 checkpoint or sidecar (only `columns` if given); with
    `lazy`, its add and remove rows stay columns (`Decoded.adds`, `Decoded.removes`)."""
    out = out if out is not None else Decoded()
    try:
        wanted = None
        if columns is not None:
            names = set(pq.ParquetFile(pa.BufferReader(data)).schema_arrow.names)
            wanted = [c for c in (*columns, "checkpointMetadata", "sidecar") if c in names]
        table = read_parquet(data, wanted)
    except (pa.ArrowInvalid, OSError) as e:
        raise Corruption(f"checkpoint {version} is not a readable Parquet file: {e}") from None
    try:
        _parse_rows(table, version, out, lazy)
    except (KeyError, TypeError, ValueError, pa.ArrowException) as e:
        raise Corruption(f"checkpoint {version} has a malformed action: {e!r}") from None
    return out


def decode_json(data: bytes, version: int, out: Decoded | None = None) -> Decoded:
    """A UUID-named V2 checkpoint in JSON: one action per line, like a commit (no commitInfo)."""
    out = out if out is not None else Decoded()
    try:
        lines = data.decode().split("\n")  # as commits: "\n" alone ends a line (actions.decode_commit)
    except UnicodeDecodeError as e:
        raise Corruption(f"checkpoint {version} is not UTF-8: {e}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as e:  # not JSON, or an integer longer than Python converts
            raise Corruption(f"checkpoint {version} line {lineno} is not JSON: {e}") from None
        if not isinstance(obj, dict):
            raise Corruption(f"checkpoint {version} line {lineno} is not an action object")
        try:
            if isinstance(obj.get("checkpointMetadata"), dict):
                out.v2_version = int(obj["checkpointMetadata"]["version"])
            if isinstance(obj.get("sidecar"), dict):
                out.sidecars.append(Sidecar.from_json(obj["sidecar"]))
        except (KeyError, TypeError, ValueError) as e:
            raise Corruption(f"checkpoint {version} line {lineno}: bad V2 checkpoint action ({e!r})") from None
        rest = {k: v for k, v in obj.items() if k not in ("checkpointMetadata", "sidecar", "commitInfo")}
        if rest:
            out.actions.extend(decode_commit(json.dumps(rest).encode(), version))
    return out


def finish(decoded: Decoded, version: int) -> list[Action]:
    """The actions of a whole checkpoint (all parts and sidecars read), protocol and metaData first;
    Corruption unless there is exactly one of each."""
    if decoded.v2_version is not None and decoded.v2_version != version:
        raise Corruption(f"checkpoint {version} says it is of version {decoded.v2_version} (checkpointMetadata)")
    protocols = [a for a in decoded.actions if isinstance(a, Protocol)]
    metadatas = [a for a in decoded.actions if isinstance(a, Metadata)]
    for name, found in (("protocol", protocols), ("metaData", metadatas)):
        if len(found) != 1:
            raise Corruption(f"checkpoint {version} has {len(found)} {name} rows, not 1")
    rest = [a for a in decoded.actions if not isinstance(a, (Protocol, Metadata))]
    return [protocols[0], metadatas[0], *rest]


def decode(data: bytes, version: int, columns: Sequence[str] | None = None) -> list[Action]:
    """The actions of a single-file classic checkpoint, protocol and metaData first (only `columns` if given)."""
    return finish(decode_parquet(data, version, columns), version)


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


def last_checkpoint_json(
    version: int, size: int, size_in_bytes: int, num_adds: int, extra: Mapping[str, Any] | None = None
) -> bytes:
    doc: dict[str, Any] = {"version": version, "size": size, "sizeInBytes": size_in_bytes, "numOfAddFiles": num_adds}
    doc.update(extra or {})
    doc["checksum"] = checksum(doc)
    return json.dumps(doc, separators=(",", ":")).encode()
