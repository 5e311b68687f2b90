"""Looking for secrets in every byte a test's processes left behind (the needle tests of issue 37).

A secret counts as found in raw, hex (either case) or base64 form (any of the three alignments a
value can take inside a longer base64 text), in the file's bytes as stored, and, for Parquet files,
in every value of every column once decoded: a compressed column (zstd's Huffman-coded literals)
would hide a secret from a search of the raw bytes alone.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq


def forms(secret: bytes) -> list[bytes]:
    """The byte strings whose presence means `secret` is there."""
    out = [secret, secret.hex().encode(), secret.hex().upper().encode()]
    for pad in range(3):
        # the characters of the 3-byte groups made of the secret's bytes alone, at each alignment
        enc = base64.b64encode(bytes(pad) + secret)
        start = 0 if pad == 0 else 4
        end = ((pad + len(secret)) // 3) * 4
        if end - start >= 8:
            out.append(enc[start:end])
    return out


def _values(x: Any) -> Iterator[bytes]:
    if x is None:
        return
    if isinstance(x, bytes):
        yield x
    elif isinstance(x, str):
        yield x.encode("utf-8", "surrogatepass")
    elif isinstance(x, dict):
        for v in x.values():
            yield from _values(v)
    elif isinstance(x, list | tuple):
        for v in x:
            yield from _values(v)


def _decoded(data: bytes) -> Iterator[bytes]:
    if not (data.startswith(b"PAR1") and data.endswith(b"PAR1")):
        return
    table = pq.ParquetFile(io.BytesIO(data)).read()
    for column in table.columns:
        for value in column.to_pylist():
            yield from _values(value)
    meta = pq.ParquetFile(io.BytesIO(data)).metadata  # footer statistics and key-value metadata
    yield str(meta.to_dict()).encode()
    for k, v in (meta.metadata or {}).items():
        yield k + b"=" + v


def find(blobs: Iterable[tuple[str, bytes]], secrets: Iterable[bytes]) -> list[tuple[str, bytes]]:
    """(where, secret) for each secret found in any blob (name, bytes)."""
    patterns = [(s, f) for s in secrets for f in forms(s)]
    found = []
    for name, data in blobs:
        pieces = [data, *_decoded(data)]
        for secret, form in patterns:
            if any(form in piece for piece in pieces):
                found.append((name, secret))
    return sorted(set(found))


def files_under(*roots: Path) -> Iterator[tuple[str, bytes]]:
    """Every regular file under `roots` (links not followed), as (path, bytes)."""
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_file() and not p.is_symlink():
                yield str(p), p.read_bytes()
