"""A feed's key index, persisted: which seqs hold entries for a key, without scanning the log.

A reopened feed answers `get` from these files at once instead of decoding
every entry (issue 17: 11-25 s at 1M entries). Files in the feed directory:

    keys.json     the manifest, replaced atomically: the salt, the length L the
                  runs cover (entries 1 .. L-1), the tree hash at L, and the
                  runs with a CRC-32 per `CHUNK` bytes; its own `check` field is
                  the CRC of the rest
    keys-N.run    an immutable run: sorted 16-byte records, u64be keyed hash of
                  the key (BLAKE2b, the manifest's salt) then u64be seq

Entries past L live in memory (`tail`, exact keys), filled by `Feed.append`
as it writes and by scanning the log for what anyone else appended. A writer
writes the tail out as a new run when it reaches `FLUSH_ENTRIES` and at close;
runs of similar size are merged, so a feed has O(log n) runs.

Nothing here is trusted blindly. A run file is fsynced before the manifest
names it; a manifest that does not parse, fails its check, covers more than
the log holds or names a tree hash the log does not have at L (another log,
a lost tail) is discarded; a chunk is CRC-checked the first time a lookup
touches it, and a failing one discards the whole index. A discarded index is
rebuilt by one full scan, the answer the index stands in for. The index only
ever proposes candidate seqs (a hash may collide, compaction may have cleared
a block since): the caller decodes each candidate and keeps the ones that
really are live entries for the key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import secrets
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import failpoints
from . import merkle, storage
from .core import Core

MANIFEST = "keys.json"
RUN_PREFIX = "keys-"
RUN_SUFFIX = ".run"
FORMAT = 1
REC = 16
#: bytes per CRC-checked chunk of a run
CHUNK = 64 << 10
#: a writer writes its in-memory tail out as a run once it holds this many entries
FLUSH_ENTRIES = 1 << 16
#: records a merge takes from each run per step (what bounds a merge's memory)
MERGE_RECORDS = 1 << 16

#: (seq, key) of every valid, uncleared entry in [start, end)
Scanner = Callable[[int, int], Iterable[tuple[int, str]]]


class _Discard(Exception):
    """The persisted index cannot be trusted: drop it and rebuild."""


def _hasher(salt: bytes) -> Callable[[str], bytes]:
    """The keyed hash of a key under `salt` (a prepared hasher, copied per key: cheaper than a keyed constructor)."""
    copy = hashlib.blake2b(digest_size=8, key=salt).copy

    def h(key: str) -> bytes:
        m = copy()
        m.update(key.encode("utf-8", "surrogatepass"))
        return m.digest()

    return h


@dataclass(eq=False)
class _Run:
    name: str
    count: int
    crcs: list[int]
    fd: int = -1
    mm: mmap.mmap | None = None
    checked: bytearray | None = None

    def open(self, directory: Path) -> None:
        self.fd = os.open(directory / self.name, os.O_RDONLY)
        if os.fstat(self.fd).st_size != self.count * REC or len(self.crcs) != -(-self.count * REC // CHUNK):
            raise _Discard(f"{self.name}: wrong size")
        self.mm = mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ)
        self.checked = bytearray(len(self.crcs))

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _hash_at(self, i: int) -> bytes:
        assert self.mm is not None and self.checked is not None
        c = i * REC // CHUNK
        if not self.checked[c]:
            if zlib.crc32(self.mm[c * CHUNK : (c + 1) * CHUNK]) != self.crcs[c]:
                raise _Discard(f"{self.name}: chunk {c} fails its CRC")
            self.checked[c] = 1
        return self.mm[i * REC : i * REC + 8]

    def seqs(self, h: bytes) -> list[int]:
        """Seqs recorded under hash `h`, ascending."""
        lo, hi = 0, self.count
        while lo < hi:
            mid = (lo + hi) // 2
            if self._hash_at(mid) < h:
                lo = mid + 1
            else:
                hi = mid
        out = []
        assert self.mm is not None
        while lo < self.count and self._hash_at(lo) == h:
            out.append(int.from_bytes(self.mm[lo * REC + 8 : lo * REC + 16], "big"))
            lo += 1
        return out

    def records(self, lo: int, hi: int) -> bytes:
        """Records [lo, hi), CRC-checked."""
        assert self.mm is not None
        if hi > lo:
            for c in range(lo * REC // CHUNK, ((hi * REC) - 1) // CHUNK + 1):
                self._hash_at(c * CHUNK // REC)
        return self.mm[lo * REC : hi * REC]

    def after(self, lo: int, hi: int, bound: bytes) -> int:
        """The first index in [lo, hi) whose record is greater than `bound` (hi if none)."""
        while lo < hi:
            mid = (lo + hi) // 2
            if self.records(mid, mid + 1) <= bound:
                lo = mid + 1
            else:
                hi = mid
        return lo


def _merge(a: _Run, b: _Run) -> Iterator[bytes]:
    """The records of two runs in order, at most about 2 * `MERGE_RECORDS` of them in memory at once.

    Each step takes the next `MERGE_RECORDS` of each run, up to the smaller of the two
    chunks' last records (so nothing later in either run sorts before what is emitted).
    """
    ia = ib = 0
    while ia < a.count or ib < b.count:
        ea, eb = min(a.count, ia + MERGE_RECORDS), min(b.count, ib + MERGE_RECORDS)
        ends = [r.records(e - 1, e) for r, e in ((a, ea), (b, eb)) if e < r.count]
        if ends:
            bound = min(ends)
            ea, eb = a.after(ia, ea, bound), b.after(ib, eb, bound)
        chunk = a.records(ia, ea) + b.records(ib, eb)
        yield b"".join(sorted([chunk[i : i + REC] for i in range(0, len(chunk), REC)]))
        ia, ib = ea, eb


def _crcs(body: bytes) -> list[int]:
    return [zlib.crc32(body[i : i + CHUNK]) for i in range(0, len(body), CHUNK)]


def _tree_hash(core: Core, length: int) -> bytes:
    return merkle.roots_hash(merkle.nodes_for_roots(length, core.node))


class KeyIndex:
    """key -> candidate seqs for one feed; loaded on first use, kept current as the feed grows."""

    def __init__(self, core: Core, scan: Scanner) -> None:
        self.core = core
        self.dir = core.path
        self._scan = scan
        self._loaded = False
        self._salt = b""
        self._runs: list[_Run] = []
        self._covered = 1  # the runs cover seqs [1, _covered)
        self._new_tail()
        self._tail_end = 1  # the tail covers seqs [_covered, _tail_end)
        self._gen = 0  # the next run's number
        self.rebuilt = False  # the persisted index was discarded at load (for tests and benchmarks)

    # ---- loading ----------------------------------------------------------------------

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        try:
            self._read_manifest()
        except (_Discard, OSError, ValueError, KeyError, TypeError):
            self._reset()
            self.rebuilt = True
            if self.core.writable:
                self._remove_files(keep=())
        else:
            if self.core.writable:
                self._remove_files(keep={r.name for r in self._runs})

    def _read_manifest(self) -> None:
        try:
            raw = json.loads((self.dir / MANIFEST).read_bytes())
        except FileNotFoundError:
            self._reset()
            return
        body = {k: v for k, v in raw.items() if k != "check"}
        if raw.get("format") != FORMAT or raw.get("check") != zlib.crc32(json.dumps(body, sort_keys=True).encode()):
            raise _Discard("manifest check")
        length = int(raw["length"])
        if length > self.core.length and not self.core.writable:
            self.core.refresh()  # a writer flushed past what this reader has seen
        if not 1 <= length <= self.core.length or _tree_hash(self.core, length).hex() != raw["tree_hash"]:
            raise _Discard("the manifest does not describe this log")
        runs = [_Run(str(r["name"]), int(r["count"]), [int(c) for c in r["crcs"]]) for r in raw["runs"]]
        try:
            for r in runs:
                r.open(self.dir)
        except BaseException:
            for r in runs:
                r.close()
            raise
        self._salt = bytes.fromhex(raw["salt"])
        self._runs = runs
        self._covered = self._tail_end = length
        self._gen = int(raw["gen"])

    def _reset(self) -> None:
        for r in self._runs:
            r.close()
        self._runs = []
        self._salt = secrets.token_bytes(16)
        self._covered = self._tail_end = 1
        self._new_tail()

    def _remove_files(self, keep: Iterable[str]) -> None:
        keep = set(keep)
        for n in os.listdir(self.dir):
            if n.startswith(RUN_PREFIX) and n.endswith(RUN_SUFFIX) and n not in keep:
                os.unlink(self.dir / n)
        if not keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.dir / MANIFEST)

    def close(self) -> None:
        """Write the tail out (a writer) and release the runs."""
        try:
            if self._loaded and self.core.writable and self._tail_count:
                self.flush()
        finally:
            for r in self._runs:
                r.close()
            self._runs = []
            self._loaded = False
            self._new_tail()

    # ---- keeping current ------------------------------------------------------------------

    def _new_tail(self) -> None:
        # the tail: parallel lists in seq order, and each key's newest position in them
        self._tail_seqs: list[int] = []
        self._tail_keys: list[str] = []
        self._latest: dict[str, int] = {}

    @property
    def _tail_count(self) -> int:
        return len(self._tail_seqs)

    def _extend(self, seqs: Sequence[int], keys: Sequence[str]) -> None:
        base = len(self._tail_keys)
        self._tail_seqs += seqs
        self._tail_keys += keys
        self._latest.update(zip(keys, range(base, base + len(keys)), strict=True))

    def added(self, seq: int, keys: Sequence[str]) -> None:
        """Entries `keys` were appended at seqs seq, seq+1, ... (by `Feed.append`)."""
        if not self._loaded:
            self._load()
        if seq != self._tail_end:
            return  # a gap: the next lookup scans it
        self._extend(range(seq, seq + len(keys)), keys)
        self._tail_end = seq + len(keys)
        self._maybe_flush()

    def _catch_up(self) -> None:
        end = self.core.length
        if self._tail_end >= end:
            return
        while self._tail_end < end:  # a writer in steps, each written out once it is big enough
            stop = min(end, self._tail_end + FLUSH_ENTRIES) if self.core.writable else end
            found = list(self._scan(self._tail_end, stop))
            self._extend([seq for seq, _ in found], [key for _, key in found])
            self._tail_end = stop
            self._maybe_flush()

    def _maybe_flush(self) -> None:
        if self.core.writable and self._tail_count >= FLUSH_ENTRIES:
            self.flush()

    # ---- lookups ---------------------------------------------------------------------------

    def candidates(self, key: str) -> Iterator[int]:
        """Seqs that may hold entries for `key`, newest first (the caller checks each, and usually
        stops at the first: the tail's older entries for the key are looked for only if it asks)."""
        with self.core.lock:
            self._load()
            self._catch_up()
            older: list[int] = []
            try:
                if self._runs:
                    h = _hasher(self._salt)(key)
                    for r in reversed(self._runs):
                        older.extend(reversed(r.seqs(h)))
            except _Discard:
                self._discard()
                return self.candidates(key)
            # the tail's lists only grow until a flush replaces them: positions below `p` stay as they are
            keys, seqs, p = self._tail_keys, self._tail_seqs, self._latest.get(key)
        return self._from_tail(key, keys, seqs, p, older)

    @staticmethod
    def _from_tail(key: str, keys: list[str], seqs: list[int], p: int | None, older: list[int]) -> Iterator[int]:
        if p is not None:
            yield seqs[p]
            for q in range(p - 1, -1, -1):
                if keys[q] == key:
                    yield seqs[q]
        yield from older

    def rebuild(self) -> None:
        """Forget what the index holds; the next lookup scans the log again. For entries that appear
        below the covered length (a replica's hole filled, issue 37): rare, and runs are immutable."""
        with self.core.lock:
            self._loaded = True
            self._reset()
            if self.core.writable:
                self._remove_files(keep=())

    def _discard(self) -> None:
        self._reset()
        self.rebuilt = True
        if self.core.writable:
            self._remove_files(keep=())
        self._catch_up()

    # ---- writing runs -------------------------------------------------------------------------

    def flush(self) -> None:
        """Write the tail out as a run (merging runs of similar size) and name it in a new manifest."""
        with self.core.lock:
            if not self._tail_count:
                return
            h = _hasher(self._salt)
            records = [
                kh + s.to_bytes(8, "big") for kh, s in zip(map(h, self._tail_keys), self._tail_seqs, strict=True)
            ]
            records.sort()
            runs = [*self._runs]
            new = self._write_run([b"".join(records)])
            del records
            runs.append(new)
            while len(runs) >= 2 and runs[-2].count <= 2 * runs[-1].count:
                b, a = runs.pop(), runs.pop()
                runs.append(self._write_run(_merge(a, b)))
                failpoints.point("keyindex.merged")
            length = self._tail_end
            self._write_manifest(runs, length)
            kept = {id(r) for r in runs}
            old = [r for r in [*self._runs, new] if id(r) not in kept]
            self._runs = runs
            self._covered = length
            self._new_tail()
            for r in old:
                r.close()
            self._remove_files(keep={r.name for r in runs})

    def _write_run(self, pieces: Iterable[bytes]) -> _Run:
        """A run of the sorted records in `pieces`, fsynced, with a CRC per `CHUNK` computed as it is written."""
        name = f"{RUN_PREFIX}{self._gen}{RUN_SUFFIX}"
        self._gen += 1
        crcs: list[int] = []
        carry = b""  # written bytes past the last whole chunk
        size = 0
        fd = os.open(self.dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for piece in pieces:
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view) :]
                size += len(piece)
                data = carry + piece
                whole = len(data) // CHUNK * CHUNK
                crcs += _crcs(data[:whole])
                carry = data[whole:]
            crcs += _crcs(carry)
            failpoints.point("keyindex.run_written")
            os.fsync(fd)
        finally:
            os.close(fd)
        run = _Run(name, size // REC, crcs)
        run.open(self.dir)
        return run

    def _write_manifest(self, runs: list[_Run], length: int) -> None:
        storage.fsync_dir(self.dir)  # the runs' names are durable before a manifest names them
        body = {
            "format": FORMAT,
            "salt": self._salt.hex(),
            "length": length,
            "tree_hash": _tree_hash(self.core, length).hex(),
            "gen": self._gen,
            "runs": [{"name": r.name, "count": r.count, "crcs": r.crcs} for r in runs],
        }
        body["check"] = zlib.crc32(json.dumps(body, sort_keys=True).encode())
        failpoints.point("keyindex.before_manifest")
        storage.atomic_write(self.dir / MANIFEST, json.dumps(body).encode())
        failpoints.point("keyindex.manifest")
