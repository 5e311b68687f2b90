"""Table schema as Delta's `schemaString` (PROTOCOL.md "Schema Serialization Format") <-> Arrow. Pure.

Each Delta type maps to one canonical Arrow type, which is what data files are
written with: `timestamp` is microseconds adjusted to UTC (the Parquet mapping
the protocol requires), strings and binaries are the 32-bit-offset kinds.
Arrow types with no Delta equivalent (unsigned integers, naive timestamps,
which need the `timestampNtz` reader feature) are refused with the column named.
Delta's `void` (a column Spark leaves untyped: all nulls, never in data files) is Arrow's null type;
`variant` is the struct of its two binaries `metadata` and `value` (the protocol's alternate
exposure of the raw physical struct).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa

from ..errors import Corruption, InvalidArgument

_PRIMITIVE_TO_ARROW: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}
#: how a `variant` column reads: the Parquet Variant encoding's two binaries, not interpreted
VARIANT = pa.struct([pa.field("metadata", pa.binary(), False), pa.field("value", pa.binary(), False)])
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")


class SchemaMismatch(InvalidArgument):
    """Data does not fit the table's schema (appending with the wrong columns or types)."""


def _type_to_delta(t: pa.DataType, where: str, ntz: bool = False) -> Any:
    if pa.types.is_null(t):
        return "void"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_timestamp(t):
        if t.tz is None and ntz:  # comparing with an existing table's timestamp_ntz column
            return "timestamp_ntz"
        if t.tz is None:
            raise InvalidArgument(
                f"column {where}: timestamps without a time zone need Delta's timestampNtz feature, "
                "which feedlog does not write; give the column a time zone (UTC)"
            )
        return "timestamp"
    if pa.types.is_decimal(t):
        if t.precision > 38:
            raise InvalidArgument(f"column {where}: decimal precision {t.precision} > 38")
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_struct(t):
        return {"type": "struct", "fields": [_field_to_delta(t.field(i), where, ntz) for i in range(t.num_fields)]}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {
            "type": "array",
            "elementType": _type_to_delta(t.value_type, where + ".element", ntz),
            "containsNull": t.value_field.nullable,
        }
    if pa.types.is_map(t):
        return {
            "type": "map",
            "keyType": _type_to_delta(t.key_type, where + ".key", ntz),
            "valueType": _type_to_delta(t.item_type, where + ".value", ntz),
            "valueContainsNull": t.item_field.nullable,
        }
    for name, arrow in _PRIMITIVE_TO_ARROW.items():
        if t == arrow:
            return name
    raise InvalidArgument(f"column {where}: Arrow type {t} has no Delta equivalent")


def _field_to_delta(f: pa.Field, parent: str = "", ntz: bool = False) -> dict[str, Any]:
    where = f"{parent}.{f.name}" if parent else f.name
    meta = {}
    if f.metadata:
        for k, v in f.metadata.items():
            if k.startswith(b"delta."):
                meta[k.decode()] = v.decode()
    return {"name": f.name, "type": _type_to_delta(f.type, where, ntz), "nullable": f.nullable, "metadata": meta}


def to_schema_string(schema: pa.Schema) -> str:
    """Arrow schema -> the JSON `schemaString` of a metaData action."""
    seen: set[str] = set()
    for name in schema.names:
        if name.lower() in seen:
            raise InvalidArgument(f"column names must be unique regardless of case: {name!r}")
        seen.add(name.lower())
    doc = {"type": "struct", "fields": [_field_to_delta(f) for f in schema]}
    return json.dumps(doc, separators=(",", ":"))


def _type_to_arrow(t: Any) -> pa.DataType:
    if isinstance(t, str):
        if t in _PRIMITIVE_TO_ARROW:
            return _PRIMITIVE_TO_ARROW[t]
        m = _DECIMAL.fullmatch(t)
        if m:
            return pa.decimal128(int(m.group(1)), int(m.group(2)))
        if t == "timestamp_ntz":
            return pa.timestamp("us")
        if t == "void":  # PROTOCOL.md "Void Type": all nulls, never in data files
            return pa.null()
        if t == "variant":  # PROTOCOL.md "Variant Data Type": the raw struct-of-binary (unshredded)
            return VARIANT
        raise Corruption(f"unknown Delta type {t!r} in schemaString")
    kind = t.get("type")
    if kind == "struct":
        return pa.struct([_field_to_arrow(f) for f in t["fields"]])
    if kind == "array":
        return pa.list_(pa.field("element", _type_to_arrow(t["elementType"]), t.get("containsNull", True)))
    if kind == "map":
        return pa.map_(
            _type_to_arrow(t["keyType"]),
            pa.field("value", _type_to_arrow(t["valueType"]), t.get("valueContainsNull", True)),
        )
    raise Corruption(f"unknown Delta type {kind!r} in schemaString")


def _field_to_arrow(f: dict[str, Any]) -> pa.Field:
    meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in (f.get("metadata") or {}).items()}
    return pa.field(f["name"], _type_to_arrow(f["type"]), f.get("nullable", True), meta or None)


def from_schema_string(schema_string: str) -> pa.Schema:
    try:
        doc = json.loads(schema_string)
        if doc.get("type") != "struct":
            raise Corruption("schemaString is not a struct")
        return pa.schema([_field_to_arrow(f) for f in doc["fields"]])
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise Corruption(f"bad schemaString: {e!r}") from None


def _shape(t: Any) -> Any:
    """A Delta type without its fields' metadata (column mapping's physical names and ids are the
    table's, not the data's)."""
    if isinstance(t, dict):
        return {k: _shape(v) for k, v in t.items() if k != "metadata"}
    if isinstance(t, list):
        return [_shape(v) for v in t]
    return t


def conform(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """`data` cast to the table's canonical schema, or SchemaMismatch saying what differs.

    Column order may differ; nullable columns may be missing (filled with nulls,
    as PROTOCOL.md lets readers do for files anyway); extra columns, type
    changes beyond representation (string vs large_string, timestamp unit) and
    nulls in a non-nullable column are refused.
    """
    by_lower = {n.lower(): n for n in data.column_names}
    extra = set(by_lower) - {n.lower() for n in schema.names}
    if extra:
        raise SchemaMismatch(f"columns not in the table schema: {sorted(by_lower[e] for e in extra)}")
    columns = []
    for f in schema:
        src = by_lower.get(f.name.lower())
        if src is None:
            if not f.nullable:
                raise SchemaMismatch(f"missing non-nullable column {f.name!r}")
            columns.append(pa.nulls(data.num_rows, f.type))
            continue
        col = data.column(src)
        if pa.types.is_null(col.type):  # an untyped all-null column (e.g. from an empty list) fits any type
            if not f.nullable and len(col):
                raise SchemaMismatch(f"column {f.name!r} is not nullable but has {len(col)} null(s)")
            columns.append(pa.nulls(len(col), f.type))
            continue
        expected = _type_to_delta(f.type, f.name, ntz=True)
        try:
            # naive timestamps fit only where the table has timestamp_ntz
            incoming = _type_to_delta(col.type, src, ntz="timestamp_ntz" in json.dumps(expected))
        except InvalidArgument as e:
            raise SchemaMismatch(str(e)) from None
        if _shape(incoming) != _shape(expected):
            raise SchemaMismatch(f"column {f.name!r} is {incoming} in the data but {expected} in the table")
        if not f.nullable and col.null_count:
            raise SchemaMismatch(f"column {f.name!r} is not nullable but has {col.null_count} null(s)")
        columns.append(col if col.type == f.type else col.cast(f.type))
    return pa.Table.from_arrays(columns, schema=schema)
