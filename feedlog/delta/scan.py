"""A snapshot's `add` actions -> rows (delta-kernel-rs `scan/`): the data side of reading a table.

For each logical file: find the data file (a path relative to the table root, or an absolute URI
as shallow clones write), read its Parquet, take each column of the table schema from the file by
its display name, its physical name (column mapping `name`) or its Parquet field id (column
mapping `id`), nested fields too, cast it to the table's current type (timestamps to
microseconds, INT96 included; files written before a type widening), restore the partition
columns from `partitionValues` (PROTOCOL.md "Partition Value Serialization"), and drop the rows
the file's deletion vector marks.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import Corruption, NotFound, Unavailable, Unsupported
from . import dv
from .actions import Add, Metadata, Protocol
from .parquet import threads_for
from .storage import Storage

COLUMN_MAPPING_MODE = "delta.columnMapping.mode"
PHYSICAL_NAME = b"delta.columnMapping.physicalName"
FIELD_ID = b"delta.columnMapping.id"
PARQUET_FIELD_ID = b"PARQUET:field_id"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_TIMESTAMP = re.compile(
    r"(-?\d{4,})-(\d{1,2})-(\d{1,2})[ T](\d{1,2}):(\d{1,2})(?::(\d{1,2})(?:\.(\d{1,9}))?)?"
    r"\s*(Z|[+-]\d{2}:?\d{2}|UTC)?"
)
_ESCAPED_BYTES = re.compile(r"(?:\\u00[0-9A-Fa-f]{2})+")


def column_mapping_mode(protocol: Protocol, metadata: Metadata) -> str:
    """`none`, `name` or `id`: the property counts only where the protocol supports the feature."""
    supported = protocol.min_reader_version == 2 or (
        protocol.min_reader_version >= 3 and "columnMapping" in (protocol.reader_features or ())
    )
    mode = metadata.configuration.get(COLUMN_MAPPING_MODE, "none").lower() if supported else "none"
    if mode not in ("none", "name", "id"):
        raise Unsupported(f"column mapping mode {mode!r} is not one feedlog reads (none, name, id)")
    return mode


def physical_name(field: pa.Field, mode: str) -> str:
    if mode == "none" or not field.metadata or PHYSICAL_NAME not in field.metadata:
        if mode != "none":
            raise Corruption(f"column {field.name!r} has no {PHYSICAL_NAME.decode()} in a column-mapped table")
        return str(field.name)
    return str(field.metadata[PHYSICAL_NAME].decode())


def _field_id(field: pa.Field, key: bytes) -> int | None:
    if not field.metadata or key not in field.metadata:
        return None
    try:
        return int(json.loads(field.metadata[key]))
    except (ValueError, TypeError):
        return None


_INTEGERS = ("byte", "short", "integer", "long")
_DECIMAL_TYPE = re.compile(r"decimal\((\d+),\s*(\d+)\)")


def _decimal(t: str) -> tuple[int, int] | None:
    m = _DECIMAL_TYPE.fullmatch(t)
    return None if m is None else (int(m.group(1)), int(m.group(2)))


def widening_supported(from_type: Any, to_type: Any) -> bool:
    """PROTOCOL.md "Type Widening": the type changes a reader converts files across."""
    if not isinstance(from_type, str) or not isinstance(to_type, str):
        return False
    if from_type in _INTEGERS and to_type in _INTEGERS:
        return _INTEGERS.index(from_type) < _INTEGERS.index(to_type)
    if to_type == "double" and from_type in ("float", "byte", "short", "integer"):
        return True
    if (from_type, to_type) == ("date", "timestamp_ntz"):
        return True
    to_dec = _decimal(to_type)
    if to_dec is None:
        return False
    p, s = to_dec
    from_dec = _decimal(from_type)
    if from_dec is not None:
        k1, k2 = p - from_dec[0], s - from_dec[1]
    elif from_type in ("byte", "short", "integer"):
        k1, k2 = p - 10, s
    elif from_type == "long":
        k1, k2 = p - 20, s
    else:
        return False
    return k1 >= k2 >= 0


def check_type_changes(schema: pa.Schema) -> None:
    """Unsupported (reading refused) for a `delta.typeChanges` entry this reader cannot convert."""
    stack = list(schema)
    for _ in range(1_000_000):  # bounded: a schema is finite
        if not stack:
            return
        f = stack.pop()
        raw = (f.metadata or {}).get(b"delta.typeChanges")
        if raw is not None:
            try:
                changes = json.loads(raw)
            except ValueError:
                raise Corruption(f"column {f.name!r}: delta.typeChanges is not JSON") from None
            for c in changes if isinstance(changes, list) else [changes]:
                frm, to = (c.get("fromType"), c.get("toType")) if isinstance(c, dict) else (None, None)
                if not widening_supported(frm, to):
                    raise Unsupported(
                        f"reading refused: column {f.name!r} had type change {frm} -> {to}, "
                        "which is not a type widening the protocol defines"
                    )
        t = f.type
        if pa.types.is_struct(t):
            stack.extend(t.field(i) for i in range(t.num_fields))
        elif pa.types.is_list(t):
            stack.append(t.value_field)
        elif pa.types.is_map(t):
            stack.extend((t.key_field, t.item_field))


# --- partition values --------------------------------------------------------------------------


def decode_binary_partition(raw: str) -> bytes:
    """A binary partition value: the protocol's escaped bytes (`\\u0001\\u0002` as text, one escape
    per byte, as delta-rs writes them), else the string's UTF-8 (as delta-spark and the kernels
    write and read them: the JSON `"\\u0001\\u0002\\u0003"` of the protocol's example is bytes 1, 2, 3)."""
    if _ESCAPED_BYTES.fullmatch(raw):
        return bytes(int(raw[i + 2 : i + 6], 16) for i in range(0, len(raw), 6))
    return raw.encode("utf-8", "surrogatepass")


def encode_binary_partition(value: bytes) -> str:
    """Bytes that are UTF-8 text as that text (every reader reads them back); other bytes, and text
    that would read as escapes, as the protocol's escapes (one `\\u00XX` per byte, as delta-rs)."""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and not _ESCAPED_BYTES.fullmatch(text):
        return text
    return "".join(f"\\u{b:04X}" for b in value)


def parse_timestamp(raw: str, column: str) -> dt.datetime:
    """`2021-09-08 11:11:11[.ffffff]` or ISO 8601 (`2021-09-08T11:11:11.123456Z`, offsets too), naive in UTC."""
    m = _TIMESTAMP.fullmatch(raw.strip())
    if m is None:
        raise Corruption(f"partition value {raw!r} of column {column!r} is not a timestamp")
    year, month, day, hour, minute = (int(m.group(i)) for i in range(1, 6))
    second = int(m.group(6) or 0)
    micros = int((m.group(7) or "0").ljust(6, "0")[:6])
    try:
        value = dt.datetime(year, month, day, hour, minute, second, micros)
    except ValueError as e:
        raise Corruption(f"partition value {raw!r} of column {column!r}: {e}") from None
    zone = m.group(8)
    if zone and zone not in ("Z", "UTC"):
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        shift = dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
        try:
            value = value - sign * shift
        except OverflowError:
            raise Corruption(f"partition value {raw!r} of column {column!r} is out of range") from None
    return value


def partition_scalar(raw: str | None, t: pa.DataType, column: str) -> Any:
    """One serialized partition value -> the Python value of Arrow type `t` (None for null)."""
    if raw is None or raw == "" or pa.types.is_null(t):
        return None
    try:
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return raw
        if pa.types.is_boolean(t):
            low = raw.strip().lower()
            if low not in ("true", "false"):
                raise ValueError("not true or false")
            return low == "true"
        if pa.types.is_integer(t):
            return int(raw)
        if pa.types.is_floating(t):
            return float(raw)
        if pa.types.is_decimal(t):
            return decimal.Decimal(raw)
        if pa.types.is_date(t):
            if _TIMESTAMP.fullmatch(raw.strip()):  # a date column widened from... or written with a time
                return parse_timestamp(raw, column).date()
            return dt.date.fromisoformat(raw.strip())
        if pa.types.is_timestamp(t):
            return parse_timestamp(raw, column)
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return decode_binary_partition(raw)
    except (ValueError, decimal.InvalidOperation) as e:
        raise Corruption(f"partition value {raw!r} of column {column!r} is not a {t}: {e}") from None
    raise Corruption(f"column {column!r} of type {t} cannot be a partition column")


def partition_array(raw: str | None, t: pa.DataType, n: int, column: str) -> pa.Array:
    value = partition_scalar(raw, t, column)
    if value is None:
        return pa.nulls(n, t)
    try:
        return pa.repeat(pa.scalar(value, t), n)
    except (pa.ArrowInvalid, OverflowError) as e:
        raise Corruption(f"partition value {raw!r} of column {column!r} does not fit {t}: {e}") from None


# --- columns -----------------------------------------------------------------------------------


def _find(fields: list[pa.Field], want: pa.Field, mode: str) -> int | None:
    """The index among a file's `fields` of the table field `want`."""
    if mode == "id":
        fid = _field_id(want, FIELD_ID)
        if fid is None:
            raise Corruption(f"column {want.name!r} has no {FIELD_ID.decode()} in an id-mapped table")
        for i, f in enumerate(fields):
            if _field_id(f, PARQUET_FIELD_ID) == fid:
                return i
        return None
    name = physical_name(want, mode)
    for i, f in enumerate(fields):
        if f.name == name:
            return i
    lower = name.lower()
    for i, f in enumerate(fields):
        if f.name.lower() == lower:
            return i
    return None


def _cast(arr: pa.Array, t: pa.DataType, where: str) -> pa.Array:
    if arr.type == t:
        return arr
    if pa.types.is_null(t):
        return pa.nulls(len(arr), t)
    try:
        if pa.types.is_timestamp(arr.type) and pa.types.is_timestamp(t):
            # nanoseconds (or INT96) to the protocol's microseconds: truncation, never overflow
            return pc.cast(arr, t, safe=False) if arr.type.unit == "ns" else pc.cast(arr, t)
        return pc.cast(arr, t)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise Corruption(f"column {where}: the file's {arr.type} does not read as the table's {t}: {e}") from None


def conform_array(arr: pa.Array, want: pa.Field, mode: str, where: str) -> pa.Array:
    """A file's column `arr` as the table's field `want` (nested fields matched like top-level ones)."""
    t = want.type
    if pa.types.is_null(t):
        return pa.nulls(len(arr))
    mask = arr.is_null() if arr.null_count else None
    if pa.types.is_struct(t) and pa.types.is_struct(arr.type):
        src_fields = [arr.type.field(i) for i in range(arr.type.num_fields)]
        children = []
        for i in range(t.num_fields):
            child = t.field(i)
            j = _find(src_fields, child, mode)
            if j is None:
                children.append(pa.nulls(len(arr), child.type))
            else:
                children.append(conform_array(arr.field(j), child, mode, f"{where}.{child.name}"))
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    if pa.types.is_list(t) and (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        values = conform_array(arr.values, t.value_field, mode, f"{where}.element")
        offsets = arr.offsets if pa.types.is_list(arr.type) else pc.cast(arr.offsets, pa.int32())
        return pa.ListArray.from_arrays(offsets, values, type=t, mask=mask)
    if pa.types.is_map(t) and pa.types.is_map(arr.type):
        keys = conform_array(arr.keys, t.key_field, mode, f"{where}.key")
        items = conform_array(arr.items, t.item_field, mode, f"{where}.value")
        return pa.MapArray.from_arrays(arr.offsets, keys, items, type=t, mask=mask)
    return _cast(arr, t, where)


def _physical_field(f: pa.Field, mode: str) -> pa.Field:
    """The field as a data file of a column-mapped table stores it: physical names, Parquet field ids."""
    t = f.type
    if pa.types.is_struct(t):
        t = pa.struct([_physical_field(t.field(i), mode) for i in range(t.num_fields)])
    elif pa.types.is_list(t):
        t = pa.list_(_physical_field(t.value_field, mode))
    elif pa.types.is_map(t):
        t = pa.map_(_physical_field(t.key_field, mode), _physical_field(t.item_field, mode))
    if f.name in ("element", "key", "value") and not (f.metadata and PHYSICAL_NAME in f.metadata):
        return pa.field(f.name, t, f.nullable)  # list elements and map entries have no physical name
    fid = _field_id(f, FIELD_ID)
    meta = None if fid is None else {PARQUET_FIELD_ID: str(fid).encode()}
    return pa.field(physical_name(f, mode), t, f.nullable, meta)


def _rename(arr: pa.Array, target: pa.DataType) -> pa.Array:
    """`arr` rebuilt with `target`'s field names (same shape, positions match)."""
    mask = arr.is_null() if arr.null_count else None
    if pa.types.is_struct(target):
        children = [_rename(arr.field(i), target.field(i).type) for i in range(target.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)
    if pa.types.is_list(target):
        return pa.ListArray.from_arrays(arr.offsets, _rename(arr.values, target.value_type), type=target, mask=mask)
    if pa.types.is_map(target):
        keys, items = _rename(arr.keys, target.key_type), _rename(arr.items, target.item_type)
        return pa.MapArray.from_arrays(arr.offsets, keys, items, type=target, mask=mask)
    return arr


def to_physical(table: pa.Table, mode: str) -> pa.Table:
    """Rows in the table's logical schema -> as a column-mapped table's data files hold them."""
    fields = [_physical_field(f, mode) for f in table.schema]
    cols = []
    for f, column in zip(fields, table.columns, strict=True):
        chunk = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        cols.append(_rename(chunk, f.type))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


# --- files -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScanContext:
    """What reading one logical file needs from its snapshot."""

    storage: Storage
    schema: pa.Schema
    partition_columns: tuple[str, ...]
    mode: str

    @classmethod
    def of(cls, storage: Storage, schema: pa.Schema, protocol: Protocol, metadata: Metadata) -> ScanContext:
        check_type_changes(schema)
        return cls(storage, schema, tuple(metadata.partition_columns), column_mapping_mode(protocol, metadata))


def read_uri(storage: Storage, path: str) -> bytes:
    """An `add` path (or a 'p' DV path): relative to the table root, or an absolute URI
    (`file:///...`, or one under the table's own location); percent-decoded as the protocol says."""
    m = _SCHEME.match(path)
    if m is None or (len(m.group(1)) == 1 and os.name == "nt"):
        if path.startswith("/"):
            return _read_local(urllib.parse.unquote(path))
        return storage.read(urllib.parse.unquote(path))
    parts = urllib.parse.urlsplit(path)
    scheme = m.group(1).lower()
    decoded = urllib.parse.unquote(parts.path)
    location = storage.location.rstrip("/")
    loc = _SCHEME.match(location)
    if scheme == "file":
        local_root = urllib.parse.unquote(urllib.parse.urlsplit(location).path) if loc else os.path.abspath(location)
        if (loc is None or loc.group(1).lower() == "file") and decoded.startswith(local_root.rstrip("/") + "/"):
            return storage.read(decoded[len(local_root.rstrip("/")) + 1 :])
        return _read_local(decoded)
    if loc is not None:
        lp = urllib.parse.urlsplit(location)
        same = loc.group(1).lower() == scheme and lp.netloc == parts.netloc
        prefix = urllib.parse.unquote(lp.path).rstrip("/") + "/"
        if same and decoded.startswith(prefix):
            return storage.read(decoded[len(prefix) :])
    raise Unsupported(
        f"data file {path} is outside the table at {storage.location}: feedlog reads absolute paths on the "
        "local file system (file://) or under the table's own location"
    )


def _read_local(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        raise NotFound(f"{path} does not exist") from None
    except OSError as e:
        raise Unavailable(f"cannot read {path}: {e.strerror}") from None


def _read_parquet(data: bytes, where: str) -> pa.Table:
    try:
        # INT96 (Spark's legacy timestamps) as microseconds: years 0001..9999 fit, nanoseconds do not
        file = pq.ParquetFile(pa.BufferReader(data), coerce_int96_timestamp_unit="us")
        return file.read(use_threads=threads_for(data))
    except (pa.ArrowInvalid, OSError) as e:
        raise Corruption(f"data file {where} is not readable Parquet: {e}") from None


def deleted_rows(ctx: ScanContext, add: Add) -> np.ndarray[Any, np.dtype[np.uint64]] | None:
    raw = add.extra.get("deletionVector")
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise Corruption(f"add {add.path}: deletionVector is not an object")
    return dv.load(dv.Descriptor.from_json(raw), lambda p: read_uri(ctx.storage, p))


def logical_num_records(add: Add) -> int | None:
    """Rows of the logical file: numRecords less the deletion vector's cardinality."""
    n = add.num_records()
    if n is None:
        return None
    raw = add.extra.get("deletionVector")
    if isinstance(raw, Mapping):
        return n - dv.Descriptor.from_json(raw).cardinality
    return n


def read_file(ctx: ScanContext, add: Add) -> pa.Table:
    """The logical file's rows as the table's schema."""
    t = _read_parquet(read_uri(ctx.storage, add.path), add.path)
    n = t.num_rows
    file_fields = list(t.schema)
    partitions = set(ctx.partition_columns)
    cols = []
    for f in ctx.schema:
        if f.name in partitions:
            key = physical_name(f, ctx.mode) if ctx.mode != "none" else f.name
            raw = add.partition_values.get(key, add.partition_values.get(f.name))
            cols.append(partition_array(raw, f.type, n, f.name))
            continue
        i = _find(file_fields, f, ctx.mode)
        if i is None:
            cols.append(pa.nulls(n, f.type))
            continue
        column = t.column(i)
        chunk = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        cols.append(conform_array(chunk, f, ctx.mode, f.name))
    out = pa.Table.from_arrays(cols, schema=ctx.schema)
    rows = deleted_rows(ctx, add)
    if rows is not None and len(rows):
        if int(rows[-1]) >= n:
            raise Corruption(f"deletion vector of {add.path} deletes row {int(rows[-1])} of a {n}-row file")
        keep = np.ones(n, dtype=bool)
        keep[rows.astype(np.int64)] = False
        out = out.filter(pa.array(keep))
    return out
