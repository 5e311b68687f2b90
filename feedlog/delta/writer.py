"""Data files: Arrow in, Parquet files plus their `add` actions out.

This is the part that runs wherever the data is (a Spark executor, say); it
needs only the storage and the table's schema and partition columns, never the
log. Files are named uniquely and written put-if-absent, so they are never
overwritten (PROTOCOL.md "Data Files"); a file is invisible until a commit adds it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import FeedlogError, InvalidArgument, Unavailable, Unsupported
from .actions import COMPRESSION, NUM_INDEXED_COLS, Add
from .parquet import write_parquet
from .scan import COLUMN_MAPPING_MODE, encode_binary_partition, physical_name, to_physical
from .schema import conform
from .stats import DEFAULT_INDEXED_COLS, file_stats
from .storage import Storage

_CODECS = {"uncompressed": "none", "none": "none", "snappy": "snappy", "gzip": "gzip", "zstd": "zstd", "lz4_raw": "lz4"}


@dataclass(frozen=True)
class WriteOptions:
    #: Parquet codec; the protocol's default for new files is zstd
    compression: str = "zstd"
    #: split files at this many rows (None: one file per partition per call)
    max_rows_per_file: int | None = None
    indexed_cols: int = DEFAULT_INDEXED_COLS
    #: the table's column mapping mode (`none`, `name`, `id`): files get physical names and field ids
    column_mapping: str = "none"

    @classmethod
    def from_properties(cls, conf: Mapping[str, str], **overrides: Any) -> WriteOptions:
        mode = conf.get(COLUMN_MAPPING_MODE, "none").lower()
        if mode not in ("none", "name", "id"):
            raise Unsupported(f"writing refused: column mapping mode {mode!r} is not one feedlog writes")
        codec = conf.get(COMPRESSION, "zstd").lower()
        if codec not in _CODECS:
            raise InvalidArgument(f"{COMPRESSION}={codec!r} is not a codec feedlog writes ({sorted(_CODECS)})")
        try:
            indexed = int(conf.get(NUM_INDEXED_COLS, DEFAULT_INDEXED_COLS))
        except ValueError:
            raise InvalidArgument(f"{NUM_INDEXED_COLS} must be an integer") from None
        return cls(**{"compression": codec, "indexed_cols": indexed, "column_mapping": mode, **overrides})


def partition_value(value: Any) -> str | None:
    """PROTOCOL.md "Partition Value Serialization" (timestamps as UTC ISO 8601)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return encode_binary_partition(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:  # timestamp_ntz: the protocol's zone-less form
            v, sep, zone = value, " ", ""
        else:
            v, sep, zone = value.astimezone(dt.UTC), "T", "Z"
        return (
            f"{v.year:04d}-{v.month:02d}-{v.day:02d}{sep}{v.hour:02d}:{v.minute:02d}:{v.second:02d}."
            f"{v.microsecond:06d}{zone}"
        )
    if isinstance(value, dt.date):
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    return str(value)


#: the longest partition directory name written (file systems allow 255 bytes per name, and a
#: quoted non-ASCII character takes 9); a longer one and its file go to the table's root instead
MAX_PARTITION_DIR_NAME = 200
MAX_PARTITION_DIRS = 1000


def _partition_dir(values: Mapping[str, str | None]) -> str:
    """The Hive-style directories of a file with these partition values, or "" where one would be
    too long to create: readers take partition values from the log, never from the path (PROTOCOL.md
    "Add File and Remove File"), so the directories are a convention, not a requirement."""
    parts = []
    for k, v in values.items():
        shown = "__HIVE_DEFAULT_PARTITION__" if v is None else urllib.parse.quote(v, safe="")
        parts.append(f"{urllib.parse.quote(k, safe='')}={shown}")
    if any(len(p) > MAX_PARTITION_DIR_NAME for p in parts) or sum(len(p) + 1 for p in parts) > MAX_PARTITION_DIRS:
        return ""
    return "/".join(parts)


def _split(data: pa.Table, partition_columns: Sequence[str]) -> Iterable[tuple[dict[str, str | None], pa.Table]]:
    if not partition_columns:
        yield {}, data
        return
    keys = data.select(list(partition_columns)).group_by(list(partition_columns)).aggregate([])
    for row in keys.to_pylist():
        mask = None
        for col in partition_columns:
            v = row[col]
            cond = pc.is_null(data.column(col)) if v is None else pc.equal(data.column(col), v)
            mask = cond if mask is None else pc.and_(mask, cond)
        part = data.filter(mask).drop_columns(list(partition_columns))
        yield {c: partition_value(row[c]) for c in partition_columns}, part


def write_files(
    storage: Storage,
    schema: pa.Schema,
    partition_columns: Sequence[str],
    data: pa.Table | pa.RecordBatch,
    now_ms: int,
    new_id: Callable[[], str],
    options: WriteOptions | None = None,
) -> list[Add]:
    """Write `data` (checked against `schema`) as Parquet files; return their `add` actions.

    Partition columns are not stored in the files but in each add's
    partitionValues, as Delta readers expect.
    """
    opts = options or WriteOptions()
    table = conform(pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data, schema)
    if table.num_rows == 0:
        return []
    codec = _CODECS[opts.compression]
    jobs: list[tuple[dict[str, str | None], pa.Table]] = []
    for values, part in _split(table, partition_columns):
        step = opts.max_rows_per_file or _rows_per_file(part.num_rows)
        jobs.extend((values, part.slice(offset, step)) for offset in range(0, part.num_rows, step))

    def write_one(job: tuple[int, tuple[dict[str, str | None], pa.Table]]) -> Add:
        i, (values, chunk) = job
        if opts.column_mapping != "none":  # PROTOCOL.md "Writer Requirements for Column Mapping"
            values = {physical_name(schema.field(k), opts.column_mapping): v for k, v in values.items()}
            chunk = to_physical(chunk, opts.column_mapping)
        # void columns are never materialized in data files (PROTOCOL.md "Void Type")
        voids = [f.name for f in chunk.schema if pa.types.is_null(f.type)]
        if voids:
            chunk = chunk.drop_columns(voids)
        body = write_parquet(chunk, codec)
        prefix = _partition_dir(values)
        name = f"part-{i:05d}-{new_id()}-c000.{opts.compression}.parquet"
        path = f"{prefix}/{name}" if prefix else name
        if not storage.put_if_absent(path, body):
            raise Unavailable(f"data file name {path} is already taken (id generator not unique?)")
        stats = file_stats(chunk, opts.indexed_cols)
        return Add(urllib.parse.quote(path, safe="/=-_.~"), values, len(body), now_ms, True, stats)

    if len(jobs) == 1:
        return [write_one((0, jobs[0]))]
    # Parquet encoding and fsync release the GIL: big writes use every core, as delta-rs does.
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        futures = [pool.submit(write_one, job) for job in enumerate(jobs)]
    written, failed = [], None
    for f in futures:
        try:
            written.append(f.result())
        except BaseException as e:  # re-raised below, once the others are removed
            failed = failed or e
    if failed is not None:
        # the files that did get written belong to nothing: a failed write leaves none behind
        for a in written:
            with contextlib.suppress(OSError, FeedlogError):
                storage.delete(urllib.parse.unquote(a.path))
        raise failed
    return written


#: below this many rows a file is not split for parallelism
PARALLEL_SPLIT_ROWS = 250_000


def _rows_per_file(rows: int) -> int:
    ways = max(1, min(os.cpu_count() or 1, rows // PARALLEL_SPLIT_ROWS))
    return max(1, -(-rows // ways))
