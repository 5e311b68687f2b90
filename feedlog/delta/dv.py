"""Deletion vectors (PROTOCOL.md "Deletion Vectors", appendix "Deletion Vector Format"). Pure except `load`.

A DV is the set of row indexes (0-based positions in one Parquet file) that a logical file no
longer has. Its descriptor in an `add` says where the bitmap is:

- `i`: inline, Z85 of the serialized bitmap;
- `u`: in `<table>/<random prefix>/deletion_vector_<uuid>.bin`, the uuid Z85-encoded in the
  descriptor's last 20 characters;
- `p`: in the file at an absolute path (a URI, like an `add` path).

On-disk DV files are a version byte (1) then, per DV at its `offset`, a big-endian 4-byte size,
the bitmap, and a big-endian CRC-32 of the bitmap. A bitmap is a little-endian magic number then
a 64-bit RoaringBitmap: 1681511377 is the portable 64-bit format of the RoaringFormatSpec (what
delta-spark, Databricks and the kernels write; decoded by pyroaring's `BitMap64`), 1681511376
delta-spark's older "native" array of 32-bit bitmaps, big-endian (the protocol's inline example).
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyroaring import BitMap, BitMap64

from ..errors import Corruption

PORTABLE_MAGIC = 1681511377
NATIVE_MAGIC = 1681511376
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}


def z85_decode(text: str) -> bytes:
    """Z85 (ZeroMQ RFC 32) text -> bytes; the length must be a multiple of 5."""
    if len(text) % 5:
        raise Corruption(f"Z85 text of length {len(text)} is not a multiple of 5")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i : i + 5]:
            digit = _Z85_VALUE.get(c)
            if digit is None:
                raise Corruption(f"character {c!r} is not Z85")
            value = value * 85 + digit
        if value > 0xFFFFFFFF:
            raise Corruption("Z85 group out of range")
        out += value.to_bytes(4, "big")
    return bytes(out)


def z85_encode(data: bytes) -> str:
    """bytes (length a multiple of 4) -> Z85 text."""
    if len(data) % 4:
        raise ValueError("Z85 encodes whole 4-byte groups")
    chars: list[str] = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        group = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            group.append(_Z85[digit])
        chars.extend(reversed(group))
    return "".join(chars)


@dataclass(frozen=True)
class Descriptor:
    """An `add`'s `deletionVector` (PROTOCOL.md "Deletion Vector Descriptor Schema")."""

    storage_type: str
    path_or_inline_dv: str
    offset: int | None
    size_in_bytes: int
    cardinality: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Descriptor:
        try:
            kind = str(d["storageType"])
            if kind not in ("i", "u", "p"):
                raise Corruption(f"deletion vector storageType {kind!r} is not one of 'i', 'u', 'p'")
            offset = d.get("offset")
            return cls(
                kind,
                str(d["pathOrInlineDv"]),
                None if offset is None else int(offset),
                int(d["sizeInBytes"]),
                int(d["cardinality"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise Corruption(f"bad deletionVector descriptor {dict(d)!r}: {e!r}") from None

    @property
    def unique_id(self) -> str:
        base = f"{self.storage_type}{self.path_or_inline_dv}"
        return base if self.offset is None else f"{base}@{self.offset}"

    def relative_path(self) -> str:
        """For storageType `u`: the DV file's path relative to the table root."""
        assert self.storage_type == "u"
        text = self.path_or_inline_dv
        if len(text) < 20:
            raise Corruption(f"deletion vector pathOrInlineDv {text!r} is shorter than a Z85 uuid")
        prefix, encoded = text[:-20], text[-20:]
        name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
        return f"{prefix}/{name}" if prefix else name


def decode_bitmap(data: bytes) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """A serialized Delta bitmap (magic + 64-bit RoaringBitmap) -> the sorted deleted row indexes."""
    if len(data) < 4:
        raise Corruption("deletion vector shorter than its magic number")
    (magic,) = struct.unpack_from("<I", data, 0)
    body = data[4:]
    try:
        if magic == PORTABLE_MAGIC:
            return np.fromiter(BitMap64.deserialize(body), dtype=np.uint64)
        if struct.unpack_from(">I", data, 0)[0] == NATIVE_MAGIC:  # the native format is big-endian throughout
            return _decode_native(body)
    except ValueError as e:
        raise Corruption(f"deletion vector bitmap does not decode: {e}") from None
    raise Corruption(f"deletion vector magic number {magic} is not {PORTABLE_MAGIC} (or {NATIVE_MAGIC})")


def _decode_native(body: bytes) -> np.ndarray[Any, np.dtype[np.uint64]]:
    # an array of 32-bit bitmaps, the i-th holding the values whose high 32 bits are i
    if len(body) < 4:
        raise Corruption("native deletion vector lacks its bitmap count")
    (count,) = struct.unpack_from(">I", body, 0)
    pos, parts = 4, []
    for high in range(count):
        if pos + 4 > len(body):
            raise Corruption("native deletion vector is truncated")
        (size,) = struct.unpack_from(">I", body, pos)
        chunk = body[pos + 4 : pos + 4 + size]
        if len(chunk) != size:
            raise Corruption("native deletion vector is truncated")
        low = np.fromiter(BitMap.deserialize(chunk), dtype=np.uint64)
        parts.append(low + np.uint64(high << 32))
        pos += 4 + size
    return np.concatenate(parts) if parts else np.empty(0, np.uint64)


def encode_bitmap(rows: list[int]) -> bytes:
    """Row indexes -> the portable serialized form (magic + 64-bit RoaringBitmap)."""
    return struct.pack("<I", PORTABLE_MAGIC) + BitMap64(rows).serialize()


def dv_file(bitmaps: list[bytes]) -> tuple[bytes, list[int]]:
    """An on-disk DV file holding `bitmaps` (each as `encode_bitmap` gives), and each one's offset."""
    out, offsets = bytearray(b"\x01"), []
    for b in bitmaps:
        offsets.append(len(out))
        out += struct.pack(">I", len(b)) + b + struct.pack(">I", zlib.crc32(b))
    return bytes(out), offsets


def load(descriptor: Descriptor, read: Callable[[str], bytes]) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """The deleted row indexes of `descriptor`; `read(path_or_uri)` reads a DV file ('u': relative
    to the table root, 'p': the absolute path as the descriptor has it)."""
    if descriptor.storage_type == "i":
        raw = z85_decode(descriptor.path_or_inline_dv)
        if len(raw) < descriptor.size_in_bytes:
            raise Corruption("inline deletion vector is shorter than its sizeInBytes")
        rows = decode_bitmap(raw[: descriptor.size_in_bytes])
    else:
        where = descriptor.relative_path() if descriptor.storage_type == "u" else descriptor.path_or_inline_dv
        data = read(where)
        offset = descriptor.offset or 0
        if len(data) < 1 or data[0] != 1:
            raise Corruption(f"deletion vector file {where} is not format version 1")
        if offset < 1 or offset + 4 > len(data):
            raise Corruption(f"deletion vector offset {offset} is outside {where} ({len(data)} bytes)")
        (size,) = struct.unpack_from(">I", data, offset)
        if size != descriptor.size_in_bytes:
            raise Corruption(
                f"deletion vector in {where}@{offset} is {size} bytes, its descriptor says {descriptor.size_in_bytes}"
            )
        body = data[offset + 4 : offset + 4 + size]
        tail = data[offset + 4 + size : offset + 8 + size]
        if len(body) != size or len(tail) != 4:
            raise Corruption(f"deletion vector in {where}@{offset} is truncated")
        if zlib.crc32(body) != struct.unpack(">I", tail)[0]:
            raise Corruption(f"deletion vector in {where}@{offset} fails its CRC-32 checksum")
        rows = decode_bitmap(body)
    if len(rows) != descriptor.cardinality:
        raise Corruption(
            f"deletion vector {descriptor.unique_id[:40]} holds {len(rows)} rows, its cardinality says "
            f"{descriptor.cardinality}"
        )
    return rows
