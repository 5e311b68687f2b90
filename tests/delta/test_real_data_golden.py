"""Real tables' data side: logs written by other Delta implementations (tests/delta/golden/real/data/
README.md), read at every version by feedlog, deltalake and DuckDB. The logs are verbatim; the data
files they name are built from each add's stats and padded to the size the add records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from feedlog.delta import DeltaTable

from .conftest import deltalake_read, duckdb_read
from .test_real_data_scan import canon

GOLDEN = Path(__file__).parent / "golden" / "real" / "data"


def parquet_of_size(table: pa.Table, size: int) -> bytes:
    """`table` as small Parquet (plain, uncompressed, no statistics) of exactly `size` bytes, padded in
    the footer's key-value metadata (kernels read a file by the size its add records)."""
    pad = 0
    for _ in range(64):  # each round moves the length by the shortfall; converges in a few
        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(sink, table.schema, store_schema=False, compression="none", use_dictionary=False,
                              write_statistics=False) as writer:  # fmt: skip
            writer.write_table(table)
            if pad:
                writer.add_key_value_metadata({"p": "x" * pad})
        data = bytes(sink.getvalue())
        if len(data) == size:
            return data
        if len(data) > size and pad <= 1:
            raise AssertionError(f"{table.num_rows} rows need more than {size} bytes")
        pad = max(1, pad + size - len(data))
    raise AssertionError(f"cannot pad a file to {size} bytes")


def materialize(name: str, tmp_path: Path, columns: dict[str, pa.DataType]) -> Path:
    """A copy of golden table `name` with its data files: the named columns, one value per row from
    the add's min (numRecords rows), each file exactly as large as its add says."""
    root = tmp_path / name
    shutil.copytree(GOLDEN / name, root)
    for commit in sorted((root / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            add = json.loads(line).get("add")
            if add is None:
                continue
            stats = json.loads(add["stats"])
            n = stats["numRecords"]
            data = pa.table({c: pa.array([stats["minValues"][c]] * n, t) for c, t in columns.items()})
            (root / add["path"]).write_bytes(parquet_of_size(data, add["size"]))
    return root


def test_every_partition_type_with_extreme_values_as_delta_kernel_rs_writes_them(tmp_path: Path) -> None:
    """delta-kernel-rs's all-partition-types-and-extreme-values: 13 partition columns of every type,
    nulls, Infinity/NaN/-0.0, extreme integers, subnormal floats, pre-1970 dates and timestamps,
    timestamp_ntz with microseconds, and binary values as UTF-8 text ("\\u0001\\u0002\\u0003", "ü", an emoji)."""
    root = materialize("all-partition-types-and-extreme-values", tmp_path, {"value": pa.int32()})
    table = DeltaTable.open(root)
    for v in range(9):
        ours = canon(table.to_arrow(v))
        assert ours == canon(deltalake_read(root, v)), f"version {v}: feedlog != deltalake"
        assert ours == canon(duckdb_read(root, v)), f"version {v}: feedlog != DuckDB"
    rows: dict[int, dict[str, Any]] = {r["value"]: r for r in table.to_arrow().to_pylist()}
    assert rows[6]["p_binary"] == b"\x01\x02\x03" and rows[8]["p_binary"] == "ü".encode()
    assert rows[3]["p_long"] == 2**63 - 1 and rows[8]["p_long"] == -(2**63)
    assert rows[3]["p_string"] == 'special chars: /=:%"'
    assert rows[8]["p_timestamp_ntz"].microsecond == 999999
    assert all(x is None for k, x in rows[4].items() if k != "value")
