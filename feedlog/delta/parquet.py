"""Parquet bytes in and out, in memory (the storage boundary moves whole files).

Arrow buffers, never Python file objects, and `ParquetFile` rather than the
dataset-based `read_table`: with a Python file object Arrow's I/O threads call
back into Python, and a process that exits while they linger aborts with
"terminate called without an active exception" (measured here, pyarrow 25-26).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq


def read_parquet(data: bytes, columns: Sequence[str] | None = None) -> pa.Table:
    """The file's rows; only the named top-level columns if `columns` is given."""
    return pq.ParquetFile(pa.BufferReader(data)).read(columns=None if columns is None else list(columns))


def write_parquet(table: pa.Table, compression: str) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=compression)
    return bytes(sink.getvalue())
