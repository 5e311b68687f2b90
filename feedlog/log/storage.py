"""On-disk formats of one feed directory.

    log         the source of truth: one record per appended batch (blocks +
                the signed tree state), CRC-protected; a batch is acknowledged
                once its record is durable.
    tree        flat-tree nodes, 40 bytes at offset 40*index (hash, u64le size)
    index       per seq, 16 bytes: u64le log offset of the block, u32le
                length, u32le flags (bit 0: payload cleared by compaction,
                or never received: a replica's hole)
    checkpoint  JSON: tree and index are durable up to `length`, the log is
                valid up to `log_offset`; replaced atomically

`tree` and `index` are caches of the log past the checkpoint: a writer
rebuilds them from the log records after the checkpoint when it opens the
feed, so they need no fsync per append. Only one fsync (the log's) makes a
batch durable.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import zlib
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import cast

from ..errors import Corruption

LOG = "log"
TREE = "tree"
INDEX = "index"
CHECKPOINT = "checkpoint"

MAGIC = b"FLB1"
# magic, body length, start seq, count, fork, length, min ts, max ts, tree hash, signature
_HEAD = struct.Struct("<4sIQIQQQQ32s64s")
_CRC = struct.Struct("<I")
NODE = struct.Struct("<32sQ")
INDEX_ENTRY = struct.Struct("<QII")
CLEARED = 1
#: with CLEARED: the payload never reached this copy (a peer sent the block cleared, and a cleared block
#: does not say why), so another peer may still fill it (`Core.fill`); without: cleared by our own rule
HOLE = 2
#: in a record's length word: the block came cleared (a replica stored its leaf node only, issue 37). Its
#: `size` bytes in the payload are zeros, reserved so a later fill writes the block in place; its 32-byte
#: leaf hash follows the payload, one per cleared block in order, before the CRC. Blocks are at most
#: 8 MiB, so the bit was never set by a record without cleared blocks (an older reader refuses such a
#: record as torn, as it must: it cannot know the leaf hash stands in for the block).
LEAF_ONLY = 1 << 31
#: with LEAF_ONLY: the block came cleared (a hole, index flag HOLE), rather than dropped here as expired
LEAF_HOLE = 1 << 30
_LENGTH_MASK = LEAF_HOLE - 1


@dataclass(frozen=True, slots=True)
class BatchRecord:
    offset: int  # where the record starts in the log
    start: int
    fork: int
    length: int
    min_ts: int  # 0: no timestamped block in the batch
    max_ts: int
    tree_hash: bytes
    signature: bytes
    block_offsets: tuple[int, ...]  # absolute log offsets of the blocks
    block_lengths: tuple[int, ...]
    end: int  # offset just past the record
    #: the leaf hashes of the blocks stored cleared, by position in the batch
    leaves: dict[int, bytes] = field(default_factory=dict)
    #: positions among `leaves` that came cleared (holes)
    holes: frozenset[int] = frozenset()


def encode_batch(
    start: int, blocks: list[bytes], fork: int, tree_hash: bytes, signature: bytes, min_ts: int, max_ts: int
) -> tuple[bytes, int]:
    """Return the record bytes and the offset of the first block within them."""
    count = len(blocks)
    lengths = struct.pack(f"<{count}I", *map(len, blocks))
    payload = b"".join(blocks)
    body_len = _HEAD.size - 8 + len(lengths) + len(payload)
    head = _HEAD.pack(MAGIC, body_len, start, count, fork, start + count, min_ts, max_ts, tree_hash, signature)
    rec = b"".join((head, lengths, payload))
    return rec + _CRC.pack(zlib.crc32(rec)), _HEAD.size + len(lengths)


def encode_batch_parts(
    start: int,
    blocks: Sequence[bytes | None],
    sizes: list[int],
    fork: int,
    tree_hash: bytes,
    signature: bytes,
    min_ts: int,
    max_ts: int,
    leaves: Sequence[tuple[int, bytes, bool]] = (),
) -> tuple[list[bytes], int, int]:
    """`encode_batch` as buffers for one `os.pwritev` (no copy of the whole record): (parts, first, total).

    `leaves`: (position, leaf hash, hole) of blocks stored cleared, in order (None in `blocks`; `sizes`
    their leaf sizes): flagged `LEAF_ONLY` (and `LEAF_HOLE`), their bytes reserved as zeros, their
    hashes after the payload.
    """
    count = len(blocks)
    if leaves:
        words = list(sizes)
        for k, _h, hole in leaves:
            words[k] |= LEAF_ONLY | (LEAF_HOLE if hole else 0)
        lengths = _u32le(words)
        payload = b"".join(bytes(n) if b is None else b for b, n in zip(blocks, sizes, strict=True))
        payload += b"".join(h for _k, h, _hole in leaves)
    else:
        lengths = _u32le(sizes)
        payload = b"".join(cast(Sequence[bytes], blocks))
    body_len = _HEAD.size - 8 + len(lengths) + len(payload)
    head = _HEAD.pack(MAGIC, body_len, start, count, fork, start + count, min_ts, max_ts, tree_hash, signature)
    crc = zlib.crc32(payload, zlib.crc32(lengths, zlib.crc32(head)))
    parts = [head, lengths, payload, _CRC.pack(crc)]
    return parts, _HEAD.size + len(lengths), 8 + body_len + _CRC.size


def _u32le(values: list[int]) -> bytes:
    words = array("I", values)
    if sys.byteorder != "little":
        words.byteswap()
    return words.tobytes()


def index_entries(first: int, sizes: list[int], cleared: Iterable[int] = (), holes: Iterable[int] = ()) -> bytes:
    """INDEX_ENTRY records for consecutive blocks of `sizes` bytes, the first at log offset `first`
    (`cleared`: positions flagged CLEARED; `holes`: those of them also flagged HOLE)."""
    n = len(sizes)
    words = array("Q", bytes(16 * n))
    words[0::2] = array("Q", accumulate(sizes[:-1], initial=first)) if n else array("Q")
    words[1::2] = array("Q", sizes)  # u32 length, then u32 flags 0: one little-endian u64
    for k in cleared:
        words[2 * k + 1] |= CLEARED << 32
    for k in holes:
        words[2 * k + 1] |= HOLE << 32
    if sys.byteorder != "little":
        words.byteswap()
    return words.tobytes()


@dataclass(frozen=True, slots=True)
class RecordHead:
    total: int  # bytes of the whole record
    start: int
    length: int
    fork: int
    tree_hash: bytes
    signature: bytes


def decode_head(buf: bytes) -> RecordHead | None:
    """The header of the record at `buf[0:]` (no CRC check: only for records already validated)."""
    if len(buf) < _HEAD.size:
        return None
    magic, body_len, start, count, fork, length, _min, _max, th, sig = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC or length != start + count:
        return None
    return RecordHead(8 + body_len + _CRC.size, start, length, fork, th, sig)


def decode_batch(buf: bytes | memoryview, offset: int) -> BatchRecord | None:
    """Decode the record at `buf[0:]` (which starts at log `offset`); None if torn or invalid."""
    if len(buf) < _HEAD.size + _CRC.size:
        return None
    magic, body_len, start, count, fork, length, min_ts, max_ts, th, sig = _HEAD.unpack_from(buf, 0)
    total = 8 + body_len + _CRC.size
    if magic != MAGIC or len(buf) < total or length != start + count:
        return None
    (crc,) = _CRC.unpack_from(buf, total - _CRC.size)
    if zlib.crc32(buf[: total - _CRC.size]) != crc:
        return None
    lengths = struct.unpack_from(f"<{count}I", buf, _HEAD.size)
    flagged = [k for k, n in enumerate(lengths) if n & LEAF_ONLY]
    holes = frozenset(k for k in flagged if lengths[k] & LEAF_HOLE)
    if flagged:
        lengths = tuple(n & _LENGTH_MASK for n in lengths)
    offsets = []
    pos = offset + _HEAD.size + 4 * count
    for n in lengths:
        offsets.append(pos)
        pos += n
    leaves: dict[int, bytes] = {}
    for k in flagged:
        at = pos - offset
        leaves[k] = bytes(buf[at : at + 32])
        pos += 32
    if pos != offset + total - _CRC.size:
        return None
    return BatchRecord(
        offset, start, fork, length, min_ts, max_ts, th, sig, tuple(offsets), lengths, offset + total, leaves, holes
    )


def record_size(buf: bytes) -> int | None:
    """Total size of the record starting at buf, from its header, or None."""
    if len(buf) < 8 or buf[:4] != MAGIC:
        return None
    return 8 + int.from_bytes(buf[4:8], "little") + _CRC.size


HEAD_SIZE = _HEAD.size


@dataclass(frozen=True, slots=True)
class Checkpoint:
    length: int = 0
    log_offset: int = 0
    last_record: int = -1  # offset of the newest record at or before log_offset; -1: none
    min_ts: int = 0
    max_ts: int = 0

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        try:
            raw = json.loads(path.read_text())
            return cls(**{k: int(raw[k]) for k in cls.__dataclass_fields__})
        except FileNotFoundError:
            return cls()
        except (ValueError, KeyError, TypeError) as e:
            raise Corruption(f"{path}: unreadable checkpoint ({e})") from None

    def store(self, path: Path) -> None:
        fields = {k: getattr(self, k) for k in Checkpoint.__dataclass_fields__}
        atomic_write(path, json.dumps(fields).encode())


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """Linux's sync_file_range(2), through the C library; None where there is none."""
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (ImportError, AttributeError, OSError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], fn)


_SYNC_FILE_RANGE = _sync_file_range() if sys.platform.startswith("linux") else None
#: start writeback, wait for nothing. Never the WAIT_* flags: waiting here would consume a writeback
#: error that the fsync after it must report (the fsync decides durability, not this)
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int) -> None:
    """Have the kernel start writing `fd`'s dirty pages to disk now, without waiting for them.

    A hint only (Linux: sync_file_range(SYNC_FILE_RANGE_WRITE); elsewhere nothing): durability is
    still the fsync that follows, which then finds most of the data written. A replica storing
    many messages before one fsync (replication.sync) lets the disk work while it verifies the next.
    """
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # an error (EBADF, EIO...) is the fsync's to report


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, mode: int = 0o644, *, sync_dir: bool = True) -> None:
    """Write a whole file or nothing: temp file, fsync, rename, fsync the directory (unless `sync_dir`
    is False: a caller building a directory that fsyncs it once at the end)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(path.parent)
