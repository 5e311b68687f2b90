"""Parquet bytes in and out, in memory (the storage boundary moves whole files).

Arrow buffers, never Python file objects, and `ParquetFile` rather than the
dataset-based `read_table`: with a Python file object Arrow's I/O threads call
back into Python, and a process that exits while they linger aborts with
"terminate called without an active exception" (measured here, pyarrow 25-26).
A small file is also decoded in the calling thread (`threads_for`): a process that only ever
reads small files (a commit's checkpoint, a small table) never starts Arrow's CPU pool, whose
workers are what that abort at exit is about; a script that did exited 134 after complete
output about once in five full test runs (README block, pyarrow 26).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

#: files up to this size are decoded in the calling thread (a few milliseconds at most)
SMALL_FILE = 8 << 20


def threads_for(data: bytes) -> bool:
    """Whether to decode a Parquet file of these bytes on Arrow's CPU pool (large files only)."""
    return len(data) > SMALL_FILE


def read_parquet(data: bytes, columns: Sequence[str] | None = None) -> pa.Table:
    """The file's rows; only the named top-level columns if `columns` is given."""
    return pq.ParquetFile(pa.BufferReader(data)).read(
        columns=None if columns is None else list(columns), use_threads=threads_for(data)
    )


def write_parquet(table: pa.Table, compression: str) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=compression)
    return bytes(sink.getvalue())
