"""The signed Merkle log of raw blocks in one directory (hypercore's "core").

Knows blocks, tree nodes and signatures; nothing about entries, timestamps or
keys (that is `feedlog.log.feed`). File formats: `feedlog.log.storage`.

Append protocol (one batch): hash the blocks into the tree, sign the new tree
state once, write the tree nodes and index entries (page cache), then append
one log record holding blocks + signed state and fsync the log. The log record
is the commit point; everything else is rebuilt from it after a crash.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import mmap
import os
import secrets
import shutil
import sys
import threading
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .. import failpoints
from ..errors import (
    AlreadyExists,
    Conflict,
    Corruption,
    Fork,
    InvalidArgument,
    NotFound,
    ReadOnly,
    SignatureError,
    Unavailable,
)
from . import merkle, storage
from .crypto import KeyPair, Signer, Verifier, leaf_hash, tree_signable
from .merkle import Node, Proof, TreeState

if TYPE_CHECKING:
    import numpy as np

KEY_FILE = "key"
#: marks the directory a create builds a feed in, beside its final path: `.NAME.creating-RANDOM`
CREATING = ".creating-"
#: marks a directory a create is moving a built feed into (when it existed, empty, beforehand)
MOVING = ".feedlog-creating"
SECRET_FILE = "secret_key"
#: write a checkpoint (fsync tree+index) after this many log bytes, bounding recovery work
CHECKPOINT_BYTES = 32 << 20
#: the largest block an append accepts (so one block always fits a 16 MiB message with room to spare)
MAX_BLOCK_BYTES = 8 << 20
#: what holding one block costs a reader beyond its bytes (the bytes object, its leaf hash and node)
BLOCK_COST = 256
#: the heaviest signed batch an append accepts, as bytes + `BLOCK_COST` per block. A batch travels to
#: a peer in one AppendRequest (its signature covers it whole), which a peer takes up to 16 MiB by
#: default, and a reader holds a batch's blocks until its signature arrives (replication/verify.py:
#: four messages of its budget plus one block, at least 33 MiB). A heavier batch could be neither
#: pushed nor read back (issue 13 items 1 and 6): it is refused here rather than stored unservable.
#: The 64 KiB left of 16 MiB hold the request's key, signature and lengths (each block's framing is
#: within its `BLOCK_COST`).
MAX_BATCH_BYTES = (16 << 20) - (64 << 10)
#: how much of the log `get_range` reads at once (at least one block)
READ_BYTES = 1 << 20
#: encoded size bounds for `segment_cost`: a block's tag and length prefix; a cleared block's leaf node;
#: a segment's start, signed state (hash, signature, length, fork) and its own framing in the message
BLOCK_FRAMING = 8
CLEARED_NODE_BYTES = 64
SEGMENT_FRAMING = 192
_EMPTY_HASH = merkle.roots_hash([])
_ENTRY_SIZE = storage.INDEX_ENTRY.size
_NODE_SIZE = storage.NODE.size
#: `get` from the maps in C where setup.py built it (merkle._native); its answers other than the block's bytes
_mapped_block = merkle._native.mapped_block if merkle._native is not None and storage.CLEARED == 1 else None
_MAPPED_CLEARED, _MAPPED_CORRUPT = 0, 2
#: index entries `segments` counts its budget over at a time
SEGMENT_ROWS = 4096
#: an index entry as numpy reads it (storage.INDEX_ENTRY)
_INDEX_ROW = [("offset", "<u8"), ("length", "<u4"), ("flags", "<u4")]


def segment_cost(block: bytes | None, *, first: bool) -> int:
    """An upper bound on what `block` adds to an encoded ReadResponse (the segment's own framing if `first`)."""
    cost = BLOCK_FRAMING + (CLEARED_NODE_BYTES if block is None else len(block))
    return cost + SEGMENT_FRAMING if first else cost


#: the files of a feed directory, the settings file `feed.Feed` adds included: all a create ever removes
FEED_FILES = frozenset(
    {KEY_FILE, SECRET_FILE, storage.LOG, storage.TREE, storage.INDEX, storage.CHECKPOINT, "feed.json"}
)


def is_tmp(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")  # storage.atomic_write's temporary files


def _move_into(build: Path, p: Path, given: Path) -> None:
    """Move a built feed's files into the empty directory `p`, the key file last.

    The MOVING marker, there until the key is, tells the next create that
    files without a key here are its own remnants, safe to delete.
    """
    os.close(os.open(p / MOVING, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    storage.fsync_dir(p)
    for n in sorted(os.listdir(build), key=lambda n: n == KEY_FILE):
        if n == KEY_FILE:
            storage.fsync_dir(p)  # everything else is in place before the key makes it a feed
            failpoints.point("create.moved")
        os.rename(build / n, p / n)
    storage.fsync_dir(p)
    (p / MOVING).unlink()
    os.rmdir(build)


def _remove_abandoned_builds(path: Path) -> None:
    """Delete build directories of `path` that a killed create left (an unlocked one is abandoned)."""
    prefix = f".{path.name}{CREATING}"
    for d in path.parent.iterdir():
        if not d.name.startswith(prefix):
            continue
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue  # gone meanwhile, or not a directory
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a create in progress
        else:
            shutil.rmtree(d, ignore_errors=True)
        finally:
            os.close(fd)


def check_batch(start: int, blocks: Sequence[bytes | None]) -> list[int]:
    """Refuse a batch no reader could take back (issue 13 item 6): a block over `MAX_BLOCK_BYTES`,
    or a batch heavier than `MAX_BATCH_BYTES`. Returns the blocks' sizes (a cleared block's as 0)."""
    try:
        sizes = list(map(len, cast(Sequence[bytes], blocks)))
    except TypeError:  # a cleared block (None) among them
        sizes = [0 if b is None else len(b) for b in blocks]
    if not sizes:
        return sizes
    total = sum(sizes)
    # no block can be over the limit when all of them together are not: the usual batch skips `max`
    if total > MAX_BLOCK_BYTES and max(sizes) > MAX_BLOCK_BYTES:
        n, size = next((n, size) for n, size in enumerate(sizes) if size > MAX_BLOCK_BYTES)
        raise InvalidArgument(f"block {start + n} is {size} bytes; the limit is {MAX_BLOCK_BYTES}")
    weight = total + BLOCK_COST * len(sizes)
    if weight > MAX_BATCH_BYTES:
        raise InvalidArgument(
            f"a batch of {len(blocks)} blocks weighs {weight} bytes ({BLOCK_COST} per block included); "
            f"the limit is {MAX_BATCH_BYTES}: append it in smaller batches"
        )
    return sizes


@dataclass(frozen=True, slots=True)
class Segment:
    """Consecutive blocks of one signed append batch, as replication sends them.

    `state` is the batch's signed state; None when the batch continues past
    these blocks (a reader verifies once the rest arrives). A cleared block is
    None in `blocks` and its leaf node is in `cleared`.
    """

    start: int
    blocks: list[bytes | None]
    cleared: list[Node]
    state: TreeState | None

    @property
    def end(self) -> int:
        return self.start + len(self.blocks)


@dataclass(frozen=True, slots=True)
class VerifyReport:
    length: int
    byte_length: int
    cleared: int
    tree_hash: bytes
    #: of the cleared blocks, those that came cleared from a peer (their payload may exist elsewhere)
    holes: int = 0


class Core:
    def __init__(
        self,
        path: Path,
        public_key: bytes,
        seed: bytes | None,
        *,
        writable: bool,
        fsync: bool,
    ) -> None:
        self.path = path
        self.public_key = public_key
        self.verifier = Verifier(public_key)
        self._signer = Signer(seed) if seed is not None else None
        self.writable = writable
        self.fsync = fsync
        self.lock = threading.RLock()
        #: told the seconds of each fdatasync of the log by an append (a server's metrics); None: not timed
        self.on_fsync: Callable[[float], None] | None = None
        #: clears doing their slow part (fsyncs, zeroing) without `lock`; `close` waits for them (their fds)
        self._clearing = 0
        self._cleared = threading.Condition(self.lock)
        flags = os.O_RDWR | os.O_CREAT if writable else os.O_RDONLY
        self._fds: dict[str, int] = {}
        try:
            for name in (storage.LOG, storage.TREE, storage.INDEX):
                self._fds[name] = os.open(path / name, flags, 0o644)
        except FileNotFoundError:
            self._close_fds()
            raise NotFound(f"{path}: not a feed (missing {name})") from None
        self._log, self._tree, self._index = (self._fds[n] for n in (storage.LOG, storage.TREE, storage.INDEX))
        if writable:
            try:
                fcntl.flock(self._log, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._close_fds()
                raise Unavailable(f"{path}: feed is open for writing by another process") from None
        self._roots: list[Node] = []
        self._state = TreeState(0, 0, _EMPTY_HASH, b"")
        self._log_end = 0
        self._last_record = -1
        self.min_ts = 0
        self.max_ts = 0
        self._ckpt = storage.Checkpoint()
        self.recovered_batches = 0
        self.truncated_bytes = 0
        # record boundaries (end length, log offset), for serving whole signed batches; built on first use
        self._rec_ends: array[int] | None = None
        self._rec_offs: array[int] = array("q")
        # read-only maps of the index, tree and log files for `get` (see `_remap`)
        self._index_words = memoryview(b"").cast("Q")
        self._tree_map: mmap.mmap | bytes = b""
        self._log_map: mmap.mmap | bytes = b""
        self._mapped_at = -1  # the log's end when the maps were made
        #: `(start, blocks) -> seqs` run by `_commit` once a batch is verified, before it is stored: the
        #: seqs among the new blocks to store as cleared (a `Feed` honours forget entries here, issue 37)
        self.before_commit: Callable[[int, Sequence[bytes | None]], Sequence[int]] | None = None

    # ---- lifecycle -------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        key_pair: KeyPair,
        *,
        fsync: bool = True,
        init: Callable[[Core], None] | None = None,
    ) -> Core:
        """A new feed at `path`, built whole in a directory beside it, then moved into place.

        `init` runs on the new core before it appears at `path` (a `Feed` writes
        its settings and header block there); the build directory is fsynced after it, so
        what it writes needs its own fsync but not the directory's. A crash at any step leaves either
        no feed at `path` or a complete one, never a key without its header
        (issue 13 item 7). The build directory is renamed to `path`; onto an
        existing empty directory (a mount point, a shell's working directory)
        its files move in instead, the key file last, since the key is what
        makes a directory a feed. A build a crash left behind (`.NAME.creating-*`,
        ignored by hosts) is removed by the next create of NAME, as are feed
        files without a key at `path`.
        """
        given = Path(path)
        p = Path(os.path.abspath(given))  # "." has no name to build beside
        if (p / KEY_FILE).exists():
            raise AlreadyExists(f"{given}: a feed already exists there")
        if p.exists() and not p.is_dir():
            raise InvalidArgument(f"{given}: exists and is not a directory")
        existing = p.is_dir()
        if existing:
            names = os.listdir(p)
            if names and (MOVING not in names or any(n not in FEED_FILES | {MOVING} and not is_tmp(n) for n in names)):
                raise InvalidArgument(f"{given}: exists, is not empty and holds no feed")
            for n in names:  # what a create killed while moving files in left: no key, so never a feed
                (p / n).unlink()
        p.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned_builds(p)
        tmp = p.with_name(f".{p.name}{CREATING}{secrets.token_hex(4)}")
        tmp.mkdir()
        lock = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a live build: another create leaves it alone
            try:
                cls._build(tmp, key_pair, fsync, init)
                failpoints.point("create.built")
                if existing:
                    _move_into(tmp, p, given)
                else:
                    try:
                        os.rename(tmp, p)
                    except OSError as e:
                        raise AlreadyExists(f"{given}: created by someone else meanwhile ({e.strerror})") from None
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            storage.fsync_dir(p.parent)
        finally:
            os.close(lock)
        failpoints.point("create.renamed")
        return cls.open(given, fsync=fsync)

    @classmethod
    def _build(cls, d: Path, key_pair: KeyPair, fsync: bool, init: Callable[[Core], None] | None) -> None:
        """Write a whole feed into the build directory `d`, durably."""
        failpoints.point("create.dir")
        # each file fsynced as it is written; the directory once, at the end
        if key_pair.seed is not None:
            storage.atomic_write(d / SECRET_FILE, key_pair.seed, mode=0o600, sync_dir=False)
            failpoints.point("create.secret")
        storage.atomic_write(d / KEY_FILE, key_pair.public_key, sync_dir=False)
        failpoints.point("create.key")
        core = cls.open(d, fsync=fsync)
        try:
            failpoints.point("create.opened")
            if init is not None:
                init(core)
        finally:
            core.close()
        # durable before the rename makes it visible, whatever the feed's own fsync policy; an empty
        # file (a replica's, before its first batch) holds nothing but its name, which the
        # directory's fsync makes durable
        for name in (storage.LOG, storage.TREE, storage.INDEX):
            fd = os.open(d / name, os.O_RDONLY)
            try:
                if os.fstat(fd).st_size:
                    os.fsync(fd)
            finally:
                os.close(fd)
        storage.fsync_dir(d)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, writable: bool = True, fsync: bool = True) -> Core:
        p = Path(path)
        try:
            public_key = (p / KEY_FILE).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"{p}: no feed there") from None
        if len(public_key) != 32:
            raise Corruption(f"{p / KEY_FILE}: expected a 32-byte key, found {len(public_key)} bytes")
        seed: bytes | None = None
        with contextlib.suppress(FileNotFoundError):
            seed = (p / SECRET_FILE).read_bytes()
        if seed is not None and KeyPair.from_seed(seed).public_key != public_key:
            raise Corruption(f"{p / SECRET_FILE}: secret key does not match the feed key")
        core = cls(p, public_key, seed, writable=writable, fsync=fsync)
        try:
            core._load()
        except BaseException:
            core.close()
            raise
        return core

    def close(self) -> None:
        with self.lock:
            self._cleared.wait_for(lambda: not self._clearing)  # a running clear's fds stay open until it ends
            if self._fds and self.writable and self._log_end > self._ckpt.log_offset:
                self.checkpoint()
            self._close_fds()

    def _check_open(self) -> None:
        """Unavailable once closed: a file descriptor number of a closed feed may already name another
        file (a compaction pass that outlived a server's stop must not write through it)."""
        if not self._fds:
            raise Unavailable(f"{self.path}: the feed was closed")

    def _close_fds(self) -> None:
        # dropped, not closed (see `_remap`)
        self._index_words, self._tree_map, self._log_map = memoryview(b"").cast("Q"), b"", b""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> Core:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- state ----------------------------------------------------------------------

    @property
    def length(self) -> int:
        return self._state.length

    @property
    def state(self) -> TreeState:
        return self._state

    @property
    def byte_length(self) -> int:
        return sum(r.size for r in self._roots)

    @property
    def can_sign(self) -> bool:
        return self._signer is not None

    def roots(self) -> list[Node]:
        return list(self._roots)

    # ---- appends --------------------------------------------------------------------

    def append(self, blocks: Sequence[bytes], *, min_ts: int = 0, max_ts: int = 0) -> TreeState:
        """Append one batch signed with this feed's secret key; durable on return (fsync policy)."""
        if self._signer is None:
            raise ReadOnly(f"{self.path}: no secret key here, cannot append")
        if not self.writable:
            raise ReadOnly(f"{self.path}: opened read-only")
        with self.lock:
            start = self._state.length
            folded = merkle.fold(self._roots, start, blocks, check_batch(start, blocks))
            th = merkle.roots_hash(folded.roots)
            length = start + len(blocks)
            sig = self._signer.sign(tree_signable(th, length, self._state.fork))
            state = TreeState(length, self._state.fork, th, sig)
            self._commit(start, blocks, folded, state, min_ts, max_ts)
            return state

    def append_signed(
        self,
        blocks: Sequence[bytes | None],
        state: TreeState,
        *,
        min_ts: int = 0,
        max_ts: int = 0,
        sync: bool = True,
        leaves: Sequence[Node] = (),
        holes: Collection[int] = (),
    ) -> None:
        """Append a batch signed elsewhere (replication): stored only if it verifies.

        `sync=False` leaves the fsync to a later `sync()` (a follower storing many batches at once).
        `leaves`: the leaf nodes of the blocks that are None (a peer sent them cleared, or we do not
        keep them): their hashes stand in for the blocks in the tree the signature is checked over, and
        the blocks are stored CLEARED, with no payload (issue 37). `holes`: the seqs among them that
        came cleared (flagged HOLE: another peer may still serve them, `fill`), rather than expired here.
        """
        with self.lock:
            start = self._state.length
            if state.length != start + len(blocks):
                raise InvalidArgument(f"batch of {len(blocks)} at length {start} cannot reach length {state.length}")
            held = _leaves_of(start, blocks, leaves) if leaves or None in blocks else None
            if held is not None:
                sizes = [held[k].size if b is None else len(b) for k, b in enumerate(blocks)]
                check_batch(start, [b if b is not None else b"" for b in blocks])
                if max(sizes) > MAX_BLOCK_BYTES:  # a cleared leaf larger than any block: no writer signed it
                    raise InvalidArgument(f"a cleared block from {start} claims {max(sizes)} bytes")
            else:
                sizes = check_batch(start, cast(Sequence[bytes], blocks))
            if start and state.fork != self._state.fork:
                # a fork number changes only with a truncation, which replication cannot verify (issue 13 item 10)
                raise Fork(
                    f"a batch signed for fork {state.fork} cannot continue this copy at fork {self._state.fork}"
                    f" (length {start}, tree {self._state.tree_hash.hex()})"
                )
            if held is None:
                folded = merkle.fold(self._roots, start, cast(Sequence[bytes], blocks), sizes)
            else:
                hashes = {k: n.hash for k, n in held.items()}
                folded = merkle.fold_leaves(self._roots, start, blocks, sizes, hashes)
            if merkle.roots_hash(folded.roots) != state.tree_hash:
                raise Corruption(f"blocks {start}..{state.length - 1} do not hash to the signed tree hash")
            if not self.verifier.verify(state.signature, state.signable()):
                raise SignatureError(f"signature for length {state.length} does not verify with the feed key")
            self._commit(
                start,
                blocks,
                folded,
                state,
                min_ts,
                max_ts,
                sync=sync,
                leaves=None if held is None else [(k, h, start + k in holes) for k, h in sorted(hashes.items())],
            )

    def append_with_signature(
        self,
        expected_length: int,
        blocks: Sequence[bytes],
        signature: bytes,
        *,
        fork: int = 0,
        inspect: Callable[[], tuple[int, int]] | None = None,
    ) -> TreeState:
        """A key holder's remote append: recompute the tree here and check their signature over it.

        `expected_length` must be the current length, so a writer that missed
        appends cannot fork the feed (`Conflict` names the current length).
        `inspect` runs once the signature is known good (authentication before
        content checks) and returns the batch's (min, max) writer timestamps.
        """
        with self.lock:
            start = self._state.length
            if expected_length != start:
                raise Conflict(f"the feed has length {start}, the append expected {expected_length}")
            if fork != self._state.fork:
                raise Conflict(f"the feed is at fork {self._state.fork}, the append is for fork {fork}")
            if not blocks:
                raise InvalidArgument("cannot append an empty batch")
            folded = merkle.fold(self._roots, start, blocks, check_batch(start, blocks))
            state = TreeState(start + len(blocks), fork, merkle.roots_hash(folded.roots), signature)
            if not self.verifier.verify(signature, state.signable()):
                raise SignatureError(
                    f"signature over length {state.length} does not verify with the feed key"
                    " (only the key holder can append)"
                )
            min_ts, max_ts = inspect() if inspect is not None else (0, 0)
            self._commit(start, blocks, folded, state, min_ts, max_ts)
            return state

    def sync(self) -> None:
        """Make every stored batch durable (after `append_signed(..., sync=False)`)."""
        with self.lock:
            if self.writable and self._fds:
                self._sync_log()

    def _sync_log(self) -> None:
        if self.on_fsync is None:
            os.fdatasync(self._log)
            return
        began = time.perf_counter()
        os.fdatasync(self._log)
        self.on_fsync(time.perf_counter() - began)

    def start_writeback(self) -> None:
        """Start writing what was stored since the last sync to disk, without waiting (`storage.start_writeback`):
        a replica storing many batches before one `sync()` overlaps the disk's work with its own."""
        with self.lock:
            if self.writable and self.fsync and self._fds:
                for fd in (self._log, self._tree, self._index):
                    storage.start_writeback(fd)

    def _commit(
        self,
        start: int,
        blocks: Sequence[bytes | None],
        folded: merkle.Fold,
        state: TreeState,
        min_ts: int,
        max_ts: int,
        *,
        sync: bool = True,
        leaves: list[tuple[int, bytes, bool]] | None = None,
    ) -> None:
        """`leaves`: (position, leaf hash, hole) of the blocks stored cleared, in order."""
        if not self.writable:
            raise ReadOnly(f"{self.path}: opened read-only")
        if not blocks:
            raise InvalidArgument("cannot append an empty batch")
        sizes = folded.sizes
        held = leaves or []
        hidden = self.before_commit(start, blocks) if self.before_commit is not None else ()
        parts, first, total = storage.encode_batch_parts(
            start, blocks, sizes, state.fork, state.tree_hash, state.signature, min_ts, max_ts, held
        )
        off = self._log_end
        # caches first, the log record last: a reader that sees the record finds its nodes
        self._write_nodes(folded, newest=True)
        index = storage.index_entries(off + first, sizes, [k for k, *_ in held], [k for k, _h, hole in held if hole])
        if hidden:
            index = _flag_cleared(index, start, hidden)
        os.pwrite(self._index, index, start * storage.INDEX_ENTRY.size)
        if os.pwritev(self._log, parts, off) != total:
            raise OSError(f"{self.path}: short write to the log")
        if held:  # the reserved zeros of the blocks stored cleared take no disk (best effort)
            starts = list(accumulate(sizes, initial=off + first))
            for k, *_ in held:
                _punch_hole(self._log, starts[k], sizes[k])
        if self.fsync and sync:
            self._sync_log()
        self._note_record(state.length, off)
        self._log_end = off + total
        self._last_record = off
        self._roots = folded.roots
        self._state = state
        self._note_ts(min_ts, max_ts)
        if hidden:
            self._zero_hidden(hidden)  # checkpoints first
        elif self._log_end - self._ckpt.log_offset >= CHECKPOINT_BYTES:
            self.checkpoint()

    def _zero_hidden(self, seqs: Sequence[int]) -> None:
        """Zero the payloads of blocks the batch just stored flagged as cleared (`before_commit`).

        Checkpointed first, as `clear` does: the batch's log record is never replayed, since its
        zeroed blocks would no longer hash to its signature. A crash before the checkpoint replays
        the record with the blocks unflagged: the `Feed` clears them again on open.
        """
        failpoints.point("core.forget_hidden")
        self.checkpoint()
        ranges = [self._entry(seq)[:2] for seq in sorted(set(seqs))]
        for off, n in _coalesce(ranges):
            os.pwrite(self._log, bytes(n), off)
            _punch_hole(self._log, off, n)
        os.fsync(self._log)

    def _note_ts(self, min_ts: int, max_ts: int) -> None:
        if min_ts and (not self.min_ts or min_ts < self.min_ts):
            self.min_ts = min_ts
        self.max_ts = max(self.max_ts, max_ts)

    def _write_nodes(self, folded: merkle.Fold, *, newest: bool = False) -> None:
        """Write exactly the batch's nodes, with one pwrite per run of consecutive indices.

        Never a placeholder for an index the batch did not compute: while a writer
        replays the log after a crash, later batches' nodes are already in the file,
        and overwriting them with zeros (then dying) would leave a tree that
        readers cannot verify (issue 13 item 8). Within the batch's leaf range
        only the O(log n) parents reaching past its last block are missing, so
        the range goes out in a few runs. The `newest` batch (an append, not a
        replay) goes out in one write: the nodes it leaves zero span blocks no
        batch has written yet, so the file holds nothing there anyone may read.
        """
        size = storage.NODE.size
        for node in folded.outside:  # parents joining the batch to older roots
            os.pwrite(self._tree, storage.NODE.pack(node.hash, node.size), node.index * size)
        buf, lo = memoryview(folded.buf), folded.lo
        if newest:
            os.pwrite(self._tree, buf, lo * size)
            return
        have = folded.have  # derived on demand (merkle.Fold.have): only a replay asks
        i = 0
        while i < len(have):
            j = have.find(0, i)
            j = len(have) if j < 0 else j
            if j > i:
                os.pwrite(self._tree, buf[i * size : j * size], (lo + i) * size)
            i = j + 1

    def checkpoint(self) -> None:
        """Make tree and index durable up to the current length, so reopening replays nothing."""
        with self.lock:
            if not self.writable:
                return
            if self.fsync:
                os.fdatasync(self._log)
            os.fsync(self._tree)
            os.fsync(self._index)
            self._ckpt = storage.Checkpoint(self.length, self._log_end, self._last_record, self.min_ts, self.max_ts)
            self._ckpt.store(self.path / storage.CHECKPOINT)

    # ---- open / recovery ---------------------------------------------------------------

    def _load(self) -> None:
        ck = storage.Checkpoint.load(self.path / storage.CHECKPOINT)
        self._ckpt = ck
        if ck.length:
            self._roots = merkle.nodes_for_roots(ck.length, self.node)
            # the header only: compaction zeroes payloads, so a checkpointed record's CRC may no longer hold
            rec = self._read_head(ck.last_record)
            if rec is None or rec.length != ck.length:
                raise Corruption(f"{self.path}: checkpoint names a log record that is not there")
            if merkle.roots_hash(self._roots) != rec.tree_hash:
                raise Corruption(f"{self.path}: checkpointed tree does not match its signed root")
            self._state = TreeState(rec.length, rec.fork, rec.tree_hash, rec.signature)
        self._log_end = ck.log_offset
        self._last_record = ck.last_record
        self.min_ts, self.max_ts = ck.min_ts, ck.max_ts
        self._replay_tail()
        if self.writable:
            self._truncate_past_end()
            if self.recovered_batches:
                self.checkpoint()

    def refresh(self) -> int:
        """Pick up batches another process appended since this core was opened (read-only use)."""
        with self.lock:
            before = self.length
            self._replay_tail()
            return self.length - before

    def _replay_tail(self) -> None:
        """Re-derive state from log records past `_log_end`; stop at the first torn/invalid one."""
        size = os.fstat(self._log).st_size
        if size <= self._log_end:
            return
        buf = memoryview(os.pread(self._log, size - self._log_end, self._log_end))
        while buf:
            base = self._log_end  # log offset of buf[0]
            rec = storage.decode_batch(buf, base)
            if rec is None or rec.start != self.length:
                break  # a torn tail (or garbage): never served, truncated by a writer
            blocks: list[bytes | None] = [
                bytes(buf[o - base : o - base + n]) for o, n in zip(rec.block_offsets, rec.block_lengths, strict=True)
            ]
            if rec.leaves:  # holes: their leaf hashes stand in (storage.LEAF_ONLY)
                for k in rec.leaves:
                    blocks[k] = None
                folded = merkle.fold_leaves(self._roots, rec.start, blocks, list(rec.block_lengths), rec.leaves)
            else:
                folded = merkle.fold(self._roots, rec.start, cast(list[bytes], blocks))
            roots = folded.roots
            state = TreeState(rec.length, rec.fork, rec.tree_hash, rec.signature)
            if merkle.roots_hash(roots) != rec.tree_hash or not self.verifier.verify(rec.signature, state.signable()):
                raise Corruption(f"{self.path}: log record at offset {rec.offset} does not match its signature")
            if self.writable:
                self._write_nodes(folded)
                lengths = list(rec.block_lengths)
                entries = storage.index_entries(rec.block_offsets[0], lengths, rec.leaves, rec.holes) if blocks else b""
                os.pwrite(self._index, entries, rec.start * storage.INDEX_ENTRY.size)
            self._roots, self._state = roots, state
            self._note_record(rec.length, rec.offset)
            self._last_record = rec.offset
            self._note_ts(rec.min_ts, rec.max_ts)
            self.recovered_batches += 1
            self._log_end = rec.end
            buf = buf[rec.end - rec.offset :]
            if self.writable:
                failpoints.point("core.replayed_batch")

    def _truncate_past_end(self) -> None:
        size = os.fstat(self._log).st_size
        if size > self._log_end:
            self.truncated_bytes = size - self._log_end
            os.ftruncate(self._log, self._log_end)
            os.fsync(self._log)
        os.ftruncate(self._tree, 2 * self.length * storage.NODE.size)
        os.ftruncate(self._index, self.length * storage.INDEX_ENTRY.size)

    def _read_head(self, offset: int) -> storage.RecordHead | None:
        if offset < 0:
            return None
        return storage.decode_head(os.pread(self._log, storage.HEAD_SIZE, offset))

    # ---- signed batches (what replication serves) -------------------------------------

    def _note_record(self, end: int, offset: int) -> None:
        if self._rec_ends is not None:
            self._rec_ends.append(end)
            self._rec_offs.append(offset)

    def _records(self) -> array[int]:
        """End lengths of the log records, built by hopping record headers once, then kept current."""
        if self._rec_ends is None:
            ends, offs = array("q"), array("q")
            off = 0
            while off <= self._last_record:
                head = self._head(off)
                ends.append(head.length)
                offs.append(off)
                off += head.total
            self._rec_ends, self._rec_offs = ends, offs
        return self._rec_ends

    def _head(self, offset: int) -> storage.RecordHead:
        head = storage.decode_head(os.pread(self._log, storage.HEAD_SIZE, offset))
        if head is None:
            raise Corruption(f"{self.path}: unreadable log record header at offset {offset}")
        return head

    def _record_state(self, i: int) -> TreeState:
        head = self._head(self._rec_offs[i])
        return TreeState(head.length, head.fork, head.tree_hash, head.signature)

    def batch_end(self, seq: int) -> int:
        """The length at the end of the signed batch holding `seq`: where a reader of `seq` can verify."""
        with self.lock:
            self._check_seq(seq)
            ends = self._records()
            return ends[bisect_right(ends, seq)]

    def segments(self, start: int, end: int, max_bytes: int, *, check: bool = True) -> list[Segment]:
        """Blocks from `start` as signed batches, at most `max_bytes` of them once encoded.

        Ends at the first batch boundary at or after `end` (so the last segment
        carries its signature), or before the block that would outgrow the
        budget (counted with its framing, `segment_cost`): a batch that does
        not fit comes in parts, only the last with a state (a reader verifies
        once the rest arrives), and a block larger than the budget comes alone.
        Always returns at least one block if `start < min(end, length)`.

        Blocks are checked against their leaf hashes like `get` unless `check`
        is False: a peer serving a Read leaves that to the reader, which hashes
        every block into the tree its author signed before storing any (issue
        17: the peer re-hashed every block it served). The budget is counted
        over up to SEGMENT_ROWS index entries at a time (numpy), and the blocks
        taken are read with one pread where they lie together.
        """
        import numpy as np  # here, not at the top: numpy costs every command's start, and most read no segments

        with self.lock:
            end = min(end, self.length)
            if not 0 <= start < end:
                return []
            ends = self._records()
            stop = ends[bisect_right(ends, end - 1)]  # the batch boundary that covers end - 1
        out: list[Segment] = []
        size = 0  # encoded bytes of everything gathered so far
        blocks: list[bytes | None] = []
        cleared: list[Node] = []
        seg_start = pos = start
        while pos < stop:
            hi = min(pos + SEGMENT_ROWS, stop)
            rows = self._index_rows(pos, hi)
            gone = (rows["flags"] & storage.CLEARED) != 0
            cost = np.where(gone, CLEARED_NODE_BYTES, rows["length"].astype(np.int64)) + BLOCK_FRAMING
            first = np.zeros(hi - pos, bool)  # a segment's first block: the read's, and each batch's
            first[np.array(ends[bisect_left(ends, pos) : bisect_left(ends, hi)], np.int64) - pos] = True
            first[0] |= pos == start
            cost[first] += SEGMENT_FRAMING
            total = np.cumsum(cost) + size
            take = int(np.searchsorted(total, max_bytes, "right"))  # never over the budget...
            if not take and pos == start:
                take = 1  # ...but a block alone may be larger
            if not take:
                break
            size = int(total[take - 1])
            got = self._read_rows(pos, rows[:take], gone[:take], check)  # marks blocks cleared meanwhile in `gone`
            for seq in (pos + np.flatnonzero(gone[:take])).tolist():
                cleared.append(self.node(2 * seq))
            k = 0
            i = bisect_right(ends, pos)
            while i < len(ends) and ends[i] <= pos + take:  # batches that end among these blocks
                blocks += got[k : ends[i] - pos]
                k = ends[i] - pos
                seg_cleared = [n for n in cleared if n.index < 2 * ends[i]]
                out.append(Segment(seg_start, blocks, seg_cleared, self._record_state(i)))
                cleared = cleared[len(seg_cleared) :]
                blocks, seg_start = [], ends[i]
                i += 1
            blocks += got[k:]
            if pos + take < hi:
                break  # the budget ran out
            pos = hi
        if blocks:  # the budget ran out inside a batch: the rest comes next
            out.append(Segment(seg_start, blocks, cleared, None))
        return out

    def _index_rows(self, lo: int, hi: int) -> np.ndarray:
        """Index entries of seqs [lo, hi) as an array of (offset, length, flags), in one read."""
        import numpy as np

        raw = os.pread(self._index, (hi - lo) * _ENTRY_SIZE, lo * _ENTRY_SIZE)
        if len(raw) != (hi - lo) * _ENTRY_SIZE:
            raise Corruption(f"{self.path}: index entries {lo}..{hi - 1} are missing")
        return np.frombuffer(raw, _INDEX_ROW)

    def _read_rows(self, lo: int, rows: np.ndarray, gone: np.ndarray, check: bool) -> list[bytes | None]:
        """The blocks of index `rows` (seqs from `lo`), None where cleared; hash-checked if `check`."""
        import numpy as np

        live = np.flatnonzero(~gone)
        out: list[bytes | None] = [None] * len(rows)
        if not live.size:
            return out
        offs, lens = rows["offset"][live].astype(np.int64), rows["length"][live].astype(np.int64)
        first, last = int(offs.min()), int((offs + lens).max())
        if last - first <= max(READ_BYTES, 2 * int(lens.sum())):  # together in the log: one read
            data = os.pread(self._log, last - first, first)
            if len(data) != last - first:
                raise Corruption(f"{self.path}: the log ends inside blocks {lo}..{lo + len(rows) - 1}")
            for k, o, n in zip(live.tolist(), (offs - first).tolist(), lens.tolist(), strict=True):
                out[k] = data[o : o + n]
        else:  # far apart (cleared blocks' bytes between them): a read per block
            for k, o, n in zip(live.tolist(), offs.tolist(), lens.tolist(), strict=True):
                out[k] = os.pread(self._log, n, o)
        # A clear (compaction, a forget) may have run meanwhile: it marks the index before it zeroes the
        # log, so a block read as bytes is whole unless the index now says cleared. Such a block is cleared,
        # not served as the zeroes it may have become, nor reported as corrupt.
        now_gone = (self._index_rows(lo, lo + len(rows))["flags"] & storage.CLEARED) != 0
        for k in np.flatnonzero(now_gone & ~gone).tolist():
            out[k] = None
            gone[k] = True
        live = np.flatnonzero(~gone)
        if check:
            tree = os.pread(self._tree, (2 * len(rows) - 1) * _NODE_SIZE, 2 * lo * _NODE_SIZE)
            for k in live.tolist():
                block = out[k]
                h = 2 * k * _NODE_SIZE
                if block is None or len(block) != rows["length"][k] or leaf_hash(block) != tree[h : h + 32]:
                    raise Corruption(f"{self.path}: block {lo + k} fails its hash check")
        return out

    # ---- reads ----------------------------------------------------------------------

    def node(self, index: int) -> Node:
        raw = os.pread(self._tree, storage.NODE.size, index * storage.NODE.size)
        if len(raw) != storage.NODE.size:
            raise Corruption(f"{self.path}: tree node {index} is missing")
        h, size = storage.NODE.unpack(raw)
        return Node(index, h, size)

    def _entry(self, seq: int) -> tuple[int, int, int]:
        return self._entries(seq, seq + 1)[0]

    def _entries(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """Index entries (log offset, length, flags) of seqs [lo, hi), in one read."""
        size = storage.INDEX_ENTRY.size
        raw = os.pread(self._index, (hi - lo) * size, lo * size)
        if len(raw) != (hi - lo) * size:
            raise Corruption(f"{self.path}: index entries {lo}..{hi - 1} are missing")
        return [storage.INDEX_ENTRY.unpack_from(raw, k * size) for k in range(hi - lo)]

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.length:
            raise NotFound(f"seq {seq} is outside the feed (length {self.length})")

    def _remap(self) -> None:
        """Map the index (as u64 words), tree and log files whole, at their current sizes.

        An old map is dropped, never closed: a concurrent `get` may still read it.
        The files only shrink when a writer opens the feed (to the log's valid end,
        which no reader reads past), so a map never outlives its bytes. Without a
        map (an empty file, a big-endian host, no address space) `get` preads.
        """
        with self.lock:
            maps: list[Any] = []
            for fd in (self._index, self._tree, self._log):
                try:
                    maps.append(mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if os.fstat(fd).st_size else b"")
                except (OSError, ValueError, OverflowError):
                    maps.append(b"")
            im, self._tree_map, self._log_map = maps
            if sys.byteorder == "little" and len(im) >= _ENTRY_SIZE:
                self._index_words = memoryview(im)[: len(im) // _ENTRY_SIZE * _ENTRY_SIZE].cast("Q")
            else:
                self._index_words = memoryview(b"").cast("Q")
            self._mapped_at = self._log_end

    def get(self, seq: int) -> bytes | None:
        """Block `seq`, checked against its leaf hash; None if compaction cleared it.

        Read from maps of the index, tree and log files: no system call, where a
        pread alone costs about what the rest of a small block's get does. A block
        past the maps is preread; the maps are renewed once the log has grown by
        an eighth since they were made (so a writer reading what it just wrote
        does not remap per append).
        """
        if not 0 <= seq < self._state.length:
            raise NotFound(f"seq {seq} is outside the feed (length {self._state.length})")
        if _mapped_block is not None:  # the same read and check, in C (about half of a get's time here)
            got = _mapped_block(self._index_words, self._tree_map, self._log_map, seq)
            if type(got) is bytes:
                return got
            if got == _MAPPED_CLEARED:
                return None
            if got == _MAPPED_CORRUPT:
                return self._recheck(seq)
            # not in the maps: as below (remap, or pread)
        ix, tm, lm = self._index_words, self._tree_map, self._log_map
        h = seq * (2 * _NODE_SIZE)
        if 2 * seq + 1 >= len(ix) or h + _NODE_SIZE > len(tm):
            if (self._log_end - self._mapped_at) * 8 < self._mapped_at:
                return self._get_unmapped(seq)
            self._remap()
            ix, tm, lm = self._index_words, self._tree_map, self._log_map
            if 2 * seq + 1 >= len(ix) or h + _NODE_SIZE > len(tm):
                return self._get_unmapped(seq)
        word = ix[2 * seq + 1]  # u32 length, then u32 flags
        if word >> 32 & storage.CLEARED:
            return None
        n = word & 0xFFFFFFFF
        off = ix[2 * seq]
        block = lm[off : off + n] if off + n <= len(lm) else os.pread(self._log, n, off)
        if len(block) != n or leaf_hash(block) != tm[h : h + 32]:
            return self._recheck(seq)
        return block

    def _recheck(self, seq: int) -> bytes | None:
        """A block that failed its hash check: None if a clear marked it meanwhile (it marks the index
        before it zeroes the log), else Corruption."""
        if self._entry(seq)[2] & storage.CLEARED:
            return None
        raise Corruption(f"{self.path}: block {seq} fails its hash check")

    def _get_unmapped(self, seq: int) -> bytes | None:
        off, n, flags = self._entry(seq)
        if flags & storage.CLEARED:
            return None
        block = os.pread(self._log, n, off)
        if len(block) != n or leaf_hash(block) != self.node(2 * seq).hash:
            return self._recheck(seq)
        return block

    def get_range(self, start: int, end: int) -> Iterator[tuple[int, bytes | None]]:
        """Blocks [start, end) in order, each checked like `get`.

        Log reads are about READ_BYTES (one block if larger): a reader that
        stops early, like `segments` at its budget, never held much more than
        it kept (issue 13 item 2: reading 4096 blocks at once cost a peer up to
        256 MiB per stream).
        """
        end = min(end, self.length)
        chunk = 4096
        for lo in range(max(start, 0), end, chunk):
            hi = min(lo + chunk, end)
            entries = self._entries(lo, hi)
            tree = os.pread(self._tree, (2 * (hi - lo) - 1) * storage.NODE.size, 2 * lo * storage.NODE.size)
            k = 0
            while k < len(entries):
                first = last = entries[k][0]
                j = k
                while j < len(entries) and (j == k or entries[j][0] + entries[j][1] - first <= READ_BYTES):
                    last = max(last, entries[j][0] + entries[j][1])
                    j += 1
                data = os.pread(self._log, last - first, first)
                for m in range(k, j):
                    off, n, flags = entries[m]
                    seq = lo + m
                    if flags & storage.CLEARED:
                        yield seq, None
                        continue
                    block = data[off - first : off - first + n]
                    expected = tree[2 * m * storage.NODE.size : 2 * m * storage.NODE.size + 32]
                    if len(block) != n or leaf_hash(block) != expected:
                        raise Corruption(f"{self.path}: block {seq} fails its hash check")
                    yield seq, block
                k = j

    def blocks(self, start: int, end: int) -> list[bytes | None]:
        """Blocks [start, end) (None where cleared), read together and not hash-checked: for a
        compaction judging which payloads to clear (issue 37), where `get_range`'s hashing was most
        of the time a step holds the GIL (a reader that serves or keeps blocks checks them)."""

        end = min(end, self.length)
        if not 0 <= start < end:
            return []
        rows = self._index_rows(start, end)
        return self._read_rows(start, rows, (rows["flags"] & storage.CLEARED) != 0, False)

    def leaf(self, seq: int) -> Node:
        self._check_seq(seq)
        return self.node(2 * seq)

    def proof(self, seq: int) -> Proof:
        self._check_seq(seq)
        block = self.get(seq)
        if block is None:
            raise NotFound(
                f"block {seq} is cleared here (compacted, or a hole: it came cleared from a peer);"
                " its proof needs the block"
            )
        return merkle.build_proof(seq, block, self._state, self.node)

    # ---- maintenance ----------------------------------------------------------------

    def clear(self, seqs: Sequence[int]) -> int:
        """Drop the payloads of blocks (hypercore's `clear`); tree nodes stay, so proofs still verify.

        The blocks' records are checkpointed first, so recovery never re-reads them.
        The feed's lock is held only to mark the blocks cleared in the index (one
        write of the range); the fsyncs and the zeroing follow without it, so appends
        and reads go on meanwhile (issue 37: a peer compacts while it takes puts),
        and `close` waits for them. Nothing else writes those bytes meanwhile: a
        block marked here is no hole, so `fill` leaves it alone.
        """
        with self.lock:
            if not self.writable:
                raise ReadOnly(f"{self.path}: opened read-only")
            self._check_open()
            for seq in seqs:
                self._check_seq(seq)
            if not seqs:
                return 0
            if max(seqs) >= self._ckpt.length:
                self.checkpoint()
            lo, hi = min(seqs), max(seqs) + 1
            raw = bytearray(os.pread(self._index, (hi - lo) * _ENTRY_SIZE, lo * _ENTRY_SIZE))
            if len(raw) != (hi - lo) * _ENTRY_SIZE:
                raise Corruption(f"{self.path}: index entries {lo}..{hi - 1} are missing")
            todo = []
            for seq in sorted(set(seqs)):
                off, n, flags = storage.INDEX_ENTRY.unpack_from(raw, (seq - lo) * _ENTRY_SIZE)
                if not flags & storage.CLEARED:
                    todo.append((off, n))
                    storage.INDEX_ENTRY.pack_into(raw, (seq - lo) * _ENTRY_SIZE, off, n, flags | storage.CLEARED)
            if not todo:
                return 0
            # the range back in one write, under the lock (entries below the length change only under it)
            os.pwrite(self._index, raw, lo * _ENTRY_SIZE)
            self._clearing += 1
        try:
            # the cleared flags are durable before any payload is gone (data only: the sizes do not change)
            os.fdatasync(self._index)
            # adjacent payloads are zeroed as one range; record headers between batches stay intact
            for off, n in _coalesce(todo):
                os.pwrite(self._log, bytes(n), off)
                _punch_hole(self._log, off, n)
            os.fdatasync(self._log)
        finally:
            with self.lock:
                self._clearing -= 1
                self._cleared.notify_all()
        return len(todo)

    def fill(self, seq: int, block: bytes, *, keep: bool = True) -> bool:
        """Put back the payload of hole `seq` (a block that came cleared, which another peer still
        serves: issue 37). True if it was a hole and now holds `block`.

        Safe from any source: the block must hash to the leaf the signed tree
        already holds (Corruption otherwise: a peer can withhold a block, never
        forge one). Written in place (a cleared block's bytes stay reserved in
        the log), after a checkpoint so recovery never re-reads its record, and
        made durable before the index says it is there. With `keep` False (its
        payload is one this copy would not keep, e.g. expired) the block is
        only checked, and the hole becomes an ordinary cleared block: no
        reason left to fetch it again.
        """
        with self.lock:
            if not self.writable:
                raise ReadOnly(f"{self.path}: opened read-only")
            self._check_open()
            self._check_seq(seq)
            off, n, flags = self._entry(seq)
            if not flags & storage.HOLE:
                return False
            node = self.node(2 * seq)
            if len(block) != node.size or n != node.size or leaf_hash(block) != node.hash:
                raise Corruption(f"block {seq} offered to fill a hole is not the block its author signed")
            if seq >= self._ckpt.length:
                self.checkpoint()
            if keep:
                os.pwrite(self._log, block, off)
                os.fdatasync(self._log)
                flags &= ~storage.CLEARED
            flags &= ~storage.HOLE
            os.pwrite(self._index, storage.INDEX_ENTRY.pack(off, n, flags), seq * _ENTRY_SIZE)
            os.fsync(self._index)
            return keep

    def holes(self, start: int, end: int, limit: int) -> list[int]:
        """Up to `limit` seqs in [start, end) that came cleared and were not filled since, in order."""
        import numpy as np

        out: list[int] = []
        end = min(end, self.length)
        for lo in range(max(start, 0), end, 1 << 16):
            hi = min(lo + (1 << 16), end)
            rows = self._index_rows(lo, hi)
            out += (lo + np.flatnonzero(rows["flags"] & storage.HOLE)).tolist()[: limit - len(out)]
            if len(out) >= limit:
                break
        return out

    def hole_count(self, start: int, end: int) -> int:
        """How many seqs in [start, end) are holes (see `holes`), reading only the index."""
        import numpy as np

        n = 0
        end = min(end, self.length)
        for lo in range(max(start, 0), end, 1 << 16):
            rows = self._index_rows(lo, min(lo + (1 << 16), end))
            n += int(np.count_nonzero(rows["flags"] & storage.HOLE))
        return n

    def first_cleared(self, start: int, end: int) -> int | None:
        """The first seq in [start, end) whose payload compaction cleared, or None (reads only the index)."""
        chunk = 1 << 16
        for lo in range(max(start, 0), min(end, self.length), chunk):
            for k, (_off, _n, flags) in enumerate(self._entries(lo, min(lo + chunk, end, self.length))):
                if flags & storage.CLEARED:
                    return lo + k
        return None

    def verify(self, on_progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Re-hash every stored block, rebuild every tree node and check the latest signature.

        `on_progress(n)`: blocks 0..n-1 re-hashed and matching the stored tree so far.
        """
        roots: list[Node] = []
        cleared = holes = 0
        chunk = 4096
        length = self.length
        for lo in range(0, length, chunk):
            hi = min(lo + chunk, length)
            new: list[Node] = []
            for k, (off, n, flags) in enumerate(self._entries(lo, hi)):
                if flags & storage.CLEARED:
                    # no payload left to hash: the stored leaf stands in, its parents are still checked
                    cleared += 1
                    holes += bool(flags & storage.HOLE)
                    new.append(self.node(2 * (lo + k)))
                else:
                    new.append(Node(2 * (lo + k), leaf_hash(os.pread(self._log, n, off)), n))
            created, roots = merkle.append_nodes(roots, new)
            for node in created:
                if self.node(node.index) != node:
                    what = f"block {node.index // 2}" if node.index % 2 == 0 else f"tree node {node.index}"
                    raise Corruption(f"{self.path}: {what} does not match the stored tree")
            if on_progress is not None:
                on_progress(hi)
        th = merkle.roots_hash(roots)
        if th != self._state.tree_hash:
            raise Corruption(f"{self.path}: blocks do not hash to the signed tree hash")
        if length and not self.verifier.verify(self._state.signature, self._state.signable()):
            raise SignatureError(f"{self.path}: signature for length {length} does not verify")
        return VerifyReport(length, sum(r.size for r in roots), cleared, th, holes)


_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc: Any = None


def _punch_hole(fd: int, offset: int, length: int) -> None:
    """Give zeroed bytes back to the filesystem where Linux allows it (best effort)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        except OSError:
            _libc = False
    if _libc and hasattr(_libc, "fallocate"):
        _libc.fallocate(
            ctypes.c_int(fd),
            ctypes.c_int(_FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE),
            ctypes.c_long(offset),
            ctypes.c_long(length),
        )


def _leaves_of(start: int, blocks: Sequence[bytes | None], leaves: Sequence[Node]) -> dict[int, Node]:
    """The leaf node of each None block of a batch from `start`, by position: exactly one each, and
    none for a block that came with its bytes (a peer's cleared nodes are unauthenticated until the
    batch verifies, so they are held to the batch's shape first)."""
    held: dict[int, Node] = {}
    for node in leaves:
        k = node.index // 2 - start
        if node.index % 2 or not 0 <= k < len(blocks) or blocks[k] is not None or k in held:
            raise Corruption(f"cleared node {node.index} does not stand for a cleared block of {start}..")
        held[k] = node
    if len(held) != sum(b is None for b in blocks):
        missing = next(k for k, b in enumerate(blocks) if b is None and k not in held)
        raise Corruption(f"block {start + missing} has neither bytes nor a leaf node")
    return held


def _flag_cleared(index: bytes, start: int, seqs: Sequence[int]) -> bytes:
    """INDEX_ENTRY records of blocks `start...` with the CLEARED flag set on `seqs`."""
    out = bytearray(index)
    for seq in seqs:
        at = (seq - start) * _ENTRY_SIZE
        off, n, flags = storage.INDEX_ENTRY.unpack_from(out, at)
        storage.INDEX_ENTRY.pack_into(out, at, off, n, flags | storage.CLEARED)
    return bytes(out)


def _coalesce(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for off, n in sorted(ranges):
        if out and out[-1][0] + out[-1][1] >= off:
            start = out[-1][0]
            out[-1] = (start, max(out[-1][1], off + n - start))
        else:
            out.append((off, n))
    return out
