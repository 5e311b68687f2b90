"""`feedlog audit TABLE`: prove that a table's rows are exactly the signed feed prefixes.

With nothing but the table and the feed keys the user trusts: for each feed,
re-derive every row's Merkle leaf from what the table stores (the exact block
bytes, or the leaf hash + size a TTL tombstone keeps), rebuild the tree in seq
order and check it against every signed state found, in the rows' `signed`
column and in the commits' provenance (`commitInfo.feedlog`), each signature
verified with the trusted key. Decoded columns are compared with the block
they came from. Reports missing seqs, extra rows (duplicates, rows past the
last signature, feeds with no trusted key) and altered rows (a column that
disagrees with its block, or a signed batch whose rows no longer hash to its
signature: the block bytes were changed).

Streaming, in bounded memory (issue 17): no Spark and no whole-table copy.
Two passes over the data files, a record batch at a time, reading only the
columns each pass needs:
  1. `feed`, `seq` and `signed`: each feed's seqs (8 bytes a row, in numpy)
     and its signed states (one per signed batch). From these alone come the
     signed length, missing seqs, duplicates, rows past the last signature and
     the order in which to read the files.
  2. the rest, file by file in seq order: each row's leaf (hashed a batch at a
     time), its decoded columns compared with its block (vectorised for entry
     feeds), the leaves folded into the tree a level at a time and the tree
     hash checked at every signed length. Rows that arrive out of seq order
     (files whose ranges overlap) wait in a buffer until their turn.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from google.protobuf.message import DecodeError

from ..delta import DeltaTable
from ..delta.actions import Add
from ..delta.scan import ScanContext, conform_array, read_file, read_uri
from ..errors import Corruption, FeedlogError, InvalidArgument
from ..log import forks
from ..log.crypto import Verifier, leaf_hash
from ..log.entries import ENTRY, decode_entry, decode_header
from ..log.merkle import Node, TreeState, fold_roots, leaf_hashes, roots_hash
from ..pb import hyperdb_pb2
from . import entry_check
from .rows import COLUMNS, MAX_TS_MS, SCHEMA, ts_us

#: problems listed per kind before the rest are only counted
SHOW = 10
#: rows per record batch read (memory is bounded by one batch per pass, plus 8 bytes a row of seqs)
BATCH_ROWS = 8192
_PASS1 = ("feed", "seq", "signed")
_PASS2 = (
    "feed",
    "seq",
    "cleared",
    "block",
    "leaf_hash",
    "size",
    "key",
    "value",
    "deleted",
    "timestamp",
    "expires_at",
    "stat",
)


@dataclass
class FeedAudit:
    """One feed's findings. `missing`, `extra` and `altered` list the first `SHOW` problems; the
    `*_count` fields count them all (extra and altered in rows)."""

    key: str
    rows: int = 0
    signed_length: int = 0  # the prefix the signatures cover (seqs 1 .. signed_length-1)
    signatures: int = 0  # signed states checked
    missing: list[int] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    altered: list[str] = field(default_factory=list)
    trusted: bool = True
    missing_count: int = 0
    extra_count: int = 0
    altered_count: int = 0
    #: why nothing of the feed could be checked (untrusted key, no rows, no verifiable signature)
    problem: str | None = None
    #: rows in the signed prefix no signature could check: the tree cannot be rebuilt from `breaks_at` on
    unchecked: int = 0
    unchecked_from: int | None = None
    breaks_at: int | None = None
    missing_ranges: list[tuple[int, int]] = field(default_factory=list)
    #: issue 40: two signed states found in the table that the key signed and that cannot both hold
    #: (a table built from two histories of one key), each as its fork proof's description
    forks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            not (self.missing_count or self.extra_count or self.altered_count or self.problem or self.forks)
            and self.trusted
            and self.signed_length > 0
        )

    def add_extra(self, line: str, rows: int = 1) -> None:
        self.extra_count += rows
        if len(self.extra) < SHOW:
            self.extra.append(line)

    def add_altered(self, line: str, rows: int = 1) -> None:
        self.altered_count += rows
        if len(self.altered) < SHOW:
            self.altered.append(line)

    def summary(self) -> str:
        """One line saying whether the feed verified and, if not, what is wrong with it."""
        head = f"feed {self.key[:16]}...  {'ok' if self.ok else 'FAILED'}: "
        if self.problem is not None:
            return head + self.problem
        if self.forks:
            head += f"FORKED, the table holds two histories of the key ({self.forks[0]}); "
        checked = (
            f"{_rows(self.rows)}, signed prefix seqs 1..{self.signed_length - 1} ({self.signatures} signatures checked)"
        )
        if self.ok:
            return head + checked
        return (
            head + checked + f": {self.missing_count} missing, {_rows(self.extra_count)} extra, "
            f"{_rows(self.altered_count)} altered"
        )

    def details(self) -> list[str]:
        """The problems behind a failed summary, one per line (the first `SHOW` of each kind)."""
        out = [f"fork: {f}" for f in self.forks]
        if self.missing_ranges:
            shown = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in self.missing_ranges)
            more = " ..." if sum(b - a + 1 for a, b in self.missing_ranges) < self.missing_count else ""
            out.append(f"missing seqs: {shown}{more}")
        out += self.extra + self.altered
        if self.unchecked:
            out.append(
                f"{_rows(self.unchecked)} of seqs {self.unchecked_from}..{self.signed_length - 1} not checked against "
                f"a signature (the tree breaks at seq {self.breaks_at})"
            )
        hidden = (self.extra_count - len(self.extra) if self.extra_count > len(self.extra) else 0) + (
            self.altered_count - len(self.altered) if self.altered_count > len(self.altered) else 0
        )
        if hidden and (len(self.extra) == SHOW or len(self.altered) == SHOW):
            out.append("... (the first 10 problems of each kind are shown; --json counts them all)")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "feed": self.key,
            "ok": self.ok,
            "problem": self.problem,
            "rows": self.rows,
            "signed_length": self.signed_length,
            "signatures_checked": self.signatures,
            "key_trusted": self.trusted,
            "missing": self.missing_count,
            "missing_seqs": self.missing[:SHOW],
            "extra": self.extra_count,
            "extra_rows": self.extra[:SHOW],
            "altered": self.altered_count,
            "altered_rows": self.altered[:SHOW],
            "unchecked": self.unchecked,
            "unchecked_from": self.unchecked_from,
            "breaks_at": self.breaks_at,
            "forks": self.forks,
        }


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


@dataclass
class AuditReport:
    table: str
    version: int
    feeds: list[FeedAudit]

    @property
    def ok(self) -> bool:
        return bool(self.feeds) and all(f.ok for f in self.feeds)

    def summary(self) -> str:
        """The last line: the verdict and the totals over every feed."""
        head = f"table {self.table} version {self.version}: "
        if not self.feeds:
            return head + "AUDIT FAILED: no rows and no trusted key to check"
        rows = sum(f.rows for f in self.feeds)
        if self.ok:
            return head + f"verified ({len(self.feeds)} feed{'s' if len(self.feeds) != 1 else ''}, {_rows(rows)})"
        bad = sum(not f.ok for f in self.feeds)
        return head + (
            f"AUDIT FAILED: {bad} of {len(self.feeds)} feed{'s' if len(self.feeds) != 1 else ''} "
            f"({_rows(rows)}; {sum(f.missing_count for f in self.feeds)} missing, "
            f"{_rows(sum(f.extra_count for f in self.feeds))} extra, "
            f"{_rows(sum(f.altered_count for f in self.feeds))} altered)"
        )

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "version": self.version, "ok": self.ok, "feeds": [f.to_json() for f in self.feeds]}


def provenance_of(info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The per-feed provenance a commitInfo carries (empty if none)."""
    block = info.get("feedlog")
    feeds = block.get("feeds") if isinstance(block, dict) else None
    return [f for f in feeds if isinstance(f, dict)] if isinstance(feeds, list) else []


def _signed_states(history: Iterable[Mapping[str, Any]], key: str) -> list[TreeState]:
    out = []
    for info in history:
        for p in provenance_of(info):
            s = p.get("signed")
            if p.get("key") == key and isinstance(s, dict):
                try:
                    out.append(
                        TreeState(
                            int(s["length"]),
                            int(s["fork"]),
                            bytes.fromhex(s["tree_hash"]),
                            bytes.fromhex(s["signature"]),
                        )
                    )
                except (KeyError, TypeError, ValueError):
                    continue
    return out


def audit_table(
    path: str,
    keys: Sequence[bytes] | None = None,
    version: int | None = None,
    owner: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    *,
    batch_rows: int = BATCH_ROWS,
) -> AuditReport:
    # owner: the commit owner to ask for un-backfilled commits (default $FEEDLOG_OWNER); else the
    # backfilled log is audited, with a warning
    table = DeltaTable.open(path, owner=owner, storage_options=storage_options)
    snap = table.snapshot(version)
    missing_cols = [c for c in COLUMNS if c not in snap.schema.names]
    if missing_cols:
        raise InvalidArgument(f"{path} is not a feedlog table: no column(s) {', '.join(missing_cols)}")
    ctx = ScanContext.of(snap.storage, snap.schema, snap.protocol, snap.metadata)
    files = snap.files()
    infos = [h.commit_info for h in table.history() if h.version <= snap.version]
    trusted = {k.hex() for k in keys} if keys else None

    index = _Index()
    for n, add in enumerate(files):
        for batch in _batches(ctx, add, _PASS1, batch_rows):
            index.add(n, batch)
    names = sorted(set(index.codes) | (trusted or set()))
    checks = {
        key: _FeedCheck(key, index, _signed_states(infos, key), trusted is None or key in trusted) for key in names
    }
    by_code = {code: checks[key] for key, code in index.codes.items()}
    if any(c.active for c in checks.values()):
        for n in index.file_order():
            for batch in _batches(ctx, files[n], _PASS2, batch_rows):
                for code, rows in _runs(batch, index):
                    by_code[code].take(rows)
    return AuditReport(table.storage.location, snap.version, [checks[k].finish() for k in names])


# ---- reading ------------------------------------------------------------------------------


def _batches(ctx: ScanContext, add: Add, columns: Sequence[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The logical file's rows, only `columns` (as the table's types), `batch_rows` at a time.

    feedlog's own tables (no column mapping, partitions or deletion vectors) stream a batch at a
    time; any other file is read whole by the scan (correct for every table, one file in memory).
    """
    fields = [SCHEMA.field(c) for c in columns]
    out_schema = pa.schema([ctx.schema.field(c) for c in columns])
    if ctx.mode != "none" or set(columns) & set(ctx.partition_columns) or "deletionVector" in add.extra:
        yield from read_file(ctx, add).select(list(columns)).to_batches(max_chunksize=batch_rows)
        return
    try:
        f = pq.ParquetFile(pa.BufferReader(read_uri(ctx.storage, add.path)), coerce_int96_timestamp_unit="us")
        names = f.schema_arrow.names
        lower = {n.lower(): n for n in reversed(names)}
        found = [c if c in names else lower.get(c.lower()) for c in columns]
        read = [c for c in found if c is not None]
        for batch in f.iter_batches(batch_size=batch_rows, columns=read, use_threads=False):
            arrays = []
            for want, name in zip(fields, found, strict=True):
                if name is None:
                    arrays.append(pa.nulls(batch.num_rows, ctx.schema.field(want.name).type))
                else:
                    col = batch.column(name)
                    arrays.append(conform_array(col, ctx.schema.field(want.name), "none", want.name))
            yield pa.RecordBatch.from_arrays(arrays, schema=out_schema)
    except (pa.ArrowInvalid, OSError) as e:
        raise Corruption(f"data file {add.path} is not readable Parquet: {e}") from None


def _feed_codes(batch: pa.RecordBatch, index: _Index) -> np.ndarray[Any, np.dtype[np.int32]]:
    enc = pc.dictionary_encode(batch.column("feed"))
    codes = np.array([index.code(str(k)) for k in enc.dictionary.to_pylist()], dtype=np.int32)
    ids = enc.indices.to_numpy(zero_copy_only=False)
    return codes[ids] if len(codes) else np.zeros(0, np.int32)


class _Index:
    """Pass 1: each feed's seqs and signed rows, and each file's first seq (the read order)."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.seqs: list[list[np.ndarray[Any, np.dtype[np.int64]]]] = []
        self.signed: list[list[tuple[int, dict[str, Any]]]] = []
        self.first_seq: dict[int, int] = {}

    def code(self, feed: str) -> int:
        c = self.codes.get(feed)
        if c is None:
            c = self.codes[feed] = len(self.codes)
            self.seqs.append([])
            self.signed.append([])
        return c

    def add(self, file: int, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        if batch.column("feed").null_count or batch.column("seq").null_count:
            raise Corruption("a row has no feed or no seq (both columns are NOT NULL)")
        codes = _feed_codes(batch, self)
        seqs = batch.column("seq").to_numpy()
        low = int(seqs.min())
        self.first_seq[file] = min(low, self.first_seq.get(file, low))
        for c in np.unique(codes):
            self.seqs[int(c)].append(seqs[codes == c])
        signed = batch.column("signed")
        if signed.null_count < batch.num_rows:
            where = np.nonzero(signed.is_valid().to_numpy(zero_copy_only=False))[0]
            for i, s in zip(where, signed.take(pa.array(where)).to_pylist(), strict=True):
                self.signed[int(codes[i])].append((int(seqs[i]), s))

    def feed_seqs(self, key: str) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The feed's seqs, sorted; taken once (the chunks are let go: 8 bytes a row held, not 16)."""
        c = self.codes.get(key)
        if c is None or not self.seqs[c]:
            return np.zeros(0, np.int64)
        chunks, self.seqs[c] = self.seqs[c], []
        return np.sort(np.concatenate(chunks), kind="stable")  # timsort: linear on the usual sorted runs

    def file_order(self) -> list[int]:
        return sorted(self.first_seq, key=lambda n: (self.first_seq[n], n))


def _unique_sorted(a: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """`np.unique(a, return_counts=True)` of an already sorted array, without sorting it again."""
    if not len(a):
        return a, np.zeros(0, np.int64)
    first = np.empty(len(a), dtype=bool)
    first[0] = True
    np.not_equal(a[1:], a[:-1], out=first[1:])
    starts = np.nonzero(first)[0]
    return a[starts], np.diff(np.append(starts, len(a)))


def _runs(batch: pa.RecordBatch, index: _Index) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The batch's rows per feed, each run in ascending seq order."""
    codes = _feed_codes(batch, index)
    seqs = batch.column("seq").to_numpy()
    if len(codes) and (codes == codes[0]).all() and (len(seqs) < 2 or (np.diff(seqs) >= 0).all()):
        yield int(codes[0]), batch
        return
    order = np.lexsort((seqs, codes))
    batch, codes = batch.take(pa.array(order)), codes[order]
    cuts = [0, *(np.nonzero(np.diff(codes))[0] + 1).tolist(), len(codes)]
    for a, b in itertools.pairwise(cuts):
        yield int(codes[a]), batch.slice(a, b - a)


# ---- one feed ------------------------------------------------------------------------------


class _FeedCheck:
    """One feed: what pass 1 decides, then its rows from pass 2 folded into the tree in seq order."""

    def __init__(self, key: str, index: _Index, commits: list[TreeState], trusted: bool) -> None:
        seqs = index.feed_seqs(key)
        c = index.codes.get(key)
        signed_rows = sorted(index.signed[c], key=lambda r: r[0]) if c is not None else []
        self.a = a = FeedAudit(key, rows=len(seqs), trusted=trusted)
        self.active = False
        n = len(seqs)
        if not trusted:
            a.problem = f"{_rows(n)} signed by a key that is not among the trusted keys (not checked)"
            a.extra_count = n
            return
        try:
            verifier = Verifier(bytes.fromhex(key))
        except (ValueError, FeedlogError):
            a.problem = f"{_rows(n)} whose feed {key[:16]!r}... is not a feed key"
            a.extra_count = n
            return
        if n == 0:
            a.problem = "no rows in the table (a trusted key)"
            return

        # every signed state claimed, by length; a state that does not verify is an altered row
        checkpoints: dict[int, TreeState] = {}
        header: bytes | None = None
        for seq, s in signed_rows:
            state = TreeState(s["length"], s["fork"] or 0, s["tree_hash"] or b"", s["signature"] or b"")
            complete = s["fork"] is not None and len(state.tree_hash) == 32  # else no signable bytes exist
            if state.length != seq + 1 or not complete or not verifier.verify(state.signature, state.signable()):
                a.add_altered(f"seq {seq}: its signed state (length {state.length}) does not verify")
                continue
            self._fork_check(checkpoints.get(state.length), state)
            checkpoints[state.length] = state
            header = header or s["header"]
        for state in commits:
            if verifier.verify(state.signature, state.signable()):
                self._fork_check(checkpoints.get(state.length), state)
                checkpoints.setdefault(state.length, state)
            else:
                a.add_altered(f"commit provenance for length {state.length}: the signature does not verify")
        if not checkpoints or header is None:
            a.problem = (
                f"{_rows(n)}, none with a signed state that verifies with the key: nothing to check them against"
            )
            a.extra_count = n
            return
        a.signed_length = length = max(checkpoints)
        try:
            self.content_type = decode_header(header)
        except Corruption as e:
            a.add_altered(f"header: {e}")
            return

        below, past = seqs[seqs < 1], seqs[seqs >= length]
        for s in below[:SHOW].tolist():
            a.add_extra(f"seq {s}: below 1 (seq 0 is the feed's header, never a row)", 0)
        a.extra_count += len(below)
        for s in past[:SHOW].tolist():
            a.add_extra(f"seq {s}: past the last signed length {length}", 0)
        a.extra_count += len(past)
        inside = seqs[(seqs >= 1) & (seqs < length)]
        uniq, counts = _unique_sorted(inside)
        dups = np.nonzero(counts > 1)[0]
        for i in dups[:SHOW].tolist():
            for _ in range(min(int(counts[i]) - 1, SHOW)):
                a.add_extra(f"seq {int(uniq[i])}: a duplicate row", 0)
        a.extra_count += int((counts[dups] - 1).sum())

        # missing seqs as ranges between the present ones; the fold cannot pass the first
        bounds = np.concatenate(([0], uniq, [length]))
        gaps = np.nonzero(np.diff(bounds) > 1)[0]
        a.missing_count = int(length - 1 - len(uniq))
        for g in gaps[:SHOW].tolist():
            lo, hi = int(bounds[g]) + 1, int(bounds[g + 1]) - 1
            a.missing_ranges.append((lo, hi))
            room = SHOW - len(a.missing)
            if room > 0:
                a.missing.extend(range(lo, min(hi, lo + room - 1) + 1))
        self.stop = int(bounds[gaps[0]]) + 1 if len(gaps) else length
        self.uniq = uniq

        self.checkpoints = checkpoints
        self.lengths = sorted(k for k in checkpoints if k <= self.stop)
        self.li = 0
        self.next = 1
        self.good = 1
        self.roots = [Node(0, leaf_hash(header), len(header))]
        self.pending: dict[int, tuple[bytes, int] | None] = {}
        self.broken = self.mismatch = False
        self.active = True

    def _fork_check(self, prior: TreeState | None, state: TreeState) -> None:
        """Two verified states at one length with different trees: the key signed two histories and the
        table holds rows (or commits) of both (issue 40); named once per length, with a proof that verifies."""
        if prior is None or prior.tree_hash == state.tree_hash or prior.fork != state.fork:
            return
        proof = forks.of_states(bytes.fromhex(self.a.key), prior, state)
        if len(self.a.forks) < SHOW:
            self.a.forks.append(proof.describe())

    # -- pass 2 --

    def take(self, rows: pa.RecordBatch) -> None:
        """The feed's next rows (ascending seq within the batch; batches in any order)."""
        if not self.active or self.broken:
            return
        seqs = rows.column("seq").to_numpy()
        keep = (seqs >= 1) & (seqs < self.stop)
        if not keep.all():
            rows, seqs = rows.filter(pa.array(keep)), seqs[keep]
        if not len(seqs):
            return
        hashes, sizes = self._leaves(rows, seqs)
        if not self.pending and seqs[0] == self.next and int(seqs[-1]) - int(seqs[0]) == len(seqs) - 1:
            self._fold(hashes, sizes)  # the usual case: the next rows, contiguous
        else:
            for s, h, z in zip(seqs.tolist(), hashes, sizes, strict=True):
                if s >= self.next and s not in self.pending:  # else a duplicate, counted in pass 1
                    self.pending[s] = None if h is None else (h, z)
        while self.next in self.pending and not self.broken:
            run_h: list[bytes | None] = []
            run_s: list[int] = []
            s = self.next
            while s in self.pending:
                leaf = self.pending.pop(s)
                run_h.append(None if leaf is None else leaf[0])
                run_s.append(0 if leaf is None else leaf[1])
                s += 1
            self._fold(run_h, run_s)

    def _leaves(self, rows: pa.RecordBatch, seqs: np.ndarray[Any, Any]) -> tuple[list[bytes | None], list[int]]:
        """Each row's leaf (None: unusable, reported), checking sizes and decoded columns on the way."""
        a = self.a
        n = len(seqs)
        cleared = rows.column("cleared").to_numpy(zero_copy_only=False)
        block_col = rows.column("block")
        size_col = rows.column("size").to_numpy(zero_copy_only=False)
        plain = ~cleared.astype(bool)
        if block_col.null_count:
            plain &= block_col.is_valid().to_numpy(zero_copy_only=False)
        hashes: list[bytes | None] = [None] * n
        sizes = [0] * n
        where = np.nonzero(plain)[0]
        sub = rows if len(where) == n else rows.take(pa.array(where))
        blocks = sub.column("block").to_pylist()
        lens = np.fromiter(map(len, blocks), dtype=np.int64, count=len(blocks))
        block_sizes = lens.tolist()
        if len(where) == n:
            hashes = list(leaf_hashes(blocks, block_sizes))
            sizes = block_sizes
        else:
            for i, h, z in zip(where.tolist(), leaf_hashes(blocks, block_sizes), block_sizes, strict=True):
                hashes[i], sizes[i] = h, z
        wrong = np.nonzero(size_col[where] != lens)[0]
        for j in wrong.tolist():
            a.add_altered(
                f"seq {int(seqs[where[j]])}: size {int(size_col[where[j]])} but the block has {lens[j]} bytes"
            )
        sub_seqs = seqs[where]
        for j, column in _column_mismatches(self.content_type, sub_seqs, blocks, sub):
            a.add_altered(f"seq {int(sub_seqs[j])}: column {column} differs from its signed block")
        if len(where) < n:  # cleared rows (TTL tombstones) and rows without a block: one at a time
            other = np.nonzero(~plain)[0]
            lh = rows.column("leaf_hash").take(pa.array(other)).to_pylist()
            blk_null = block_col.is_null().to_numpy(zero_copy_only=False)
            for k, i in enumerate(other.tolist()):
                seq = int(seqs[i])
                if not cleared[i]:
                    a.add_altered(f"seq {seq}: no block bytes (and not marked cleared)")
                elif not blk_null[i] or lh[k] is None or len(lh[k]) != 32:
                    a.add_altered(f"seq {seq}: a cleared row needs a 32-byte leaf_hash and no block")
                else:
                    hashes[i], sizes[i] = lh[k], int(size_col[i])
        return hashes, sizes

    def _fold(self, hashes: list[bytes | None], sizes: list[int]) -> None:
        """Fold leaves self.next.. into the tree, checking the tree hash at each signed length."""
        pos = 0
        while pos < len(hashes) and not self.broken and self.next < self.stop:
            end = self.lengths[self.li] if self.li < len(self.lengths) else self.stop
            take = min(len(hashes) - pos, end - self.next)
            chunk = hashes[pos : pos + take]
            if None in chunk:  # an unusable row: nothing after it can be checked (already reported)
                self.broken = True
                self.next += chunk.index(None)
                return
            self.roots = fold_roots(self.roots, self.next, chunk, sizes[pos : pos + take])  # type: ignore[arg-type]
            self.next += take
            pos += take
            if self.li < len(self.lengths) and self.next == self.lengths[self.li]:
                self.li += 1
                self.a.signatures += 1
                if roots_hash(self.roots) != self.checkpoints[self.next].tree_hash:
                    self.a.add_altered(
                        f"seqs {self.good}..{self.next - 1}: do not hash to the signed tree at length "
                        f"{self.next} (block bytes were changed, or rows of two histories the key signed were "
                        "mixed: a fork)",
                        self.next - self.good,
                    )
                    self.broken = self.mismatch = True
                    return
                self.good = self.next

    def finish(self) -> FeedAudit:
        a = self.a
        if self.active and self.next < a.signed_length:
            # rows no verified signature covers (those of a batch that did not hash are altered already)
            a.breaks_at = self.next
            a.unchecked_from = self.next if self.mismatch else self.good
            a.unchecked = int(np.count_nonzero(self.uniq >= a.unchecked_from))
        return a


# ---- decoded columns -----------------------------------------------------------------------


class _Slow(Exception):
    """The vectorised comparison cannot decide this batch: compare it a row at a time."""


def _column_mismatches(
    content_type: str, seqs: np.ndarray[Any, Any], blocks: list[bytes], rows: pa.RecordBatch
) -> list[tuple[int, str]]:
    """(row, column) for each row whose decoded columns differ from its block."""
    if not blocks:
        return []
    candidates = list(range(len(blocks)))
    if content_type == ENTRY:
        # canonical blocks (feedlog's own) are proved by their bytes alone; the rest are parsed a batch
        # at a time; only rows still in doubt are decoded one by one, which names the column
        sus = entry_check.suspect_rows(rows)
        stat = rows.column("stat")
        if stat.null_count < len(stat):  # an entry feed has no stat
            sus |= np.asarray(stat.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        candidates = np.nonzero(sus)[0].tolist()
        if candidates:
            try:
                sub = rows.take(pa.array(candidates))
                bad = _entry_mismatch_mask([blocks[i] for i in candidates], sub)
                candidates = [candidates[i] for i in np.nonzero(bad)[0].tolist()]
            except (_Slow, DecodeError, pa.ArrowException, OverflowError, TypeError):
                pass  # every suspect is decoded one by one
    if not candidates:
        return []
    decoded = _decoded_columns(rows.take(pa.array(candidates)))
    out = []
    for k, i in enumerate(candidates):
        diff = _differs(content_type, int(seqs[i]), blocks[i], decoded, k)
        if diff:
            out.append((i, diff))
    return out


_PARSE = hyperdb_pb2.InflatedEntry.FromString


def _entry_mismatch_mask(blocks: list[bytes], rows: pa.RecordBatch) -> np.ndarray[Any, Any]:
    """Rows (of an entry feed) whose columns may differ from their block: the whole batch decoded at
    once and compared column by column; raises `_Slow` where only `decode_entry` can say."""
    msgs = [_PARSE(b) for b in blocks]
    if not all(m.IsInitialized() for m in msgs):
        raise _Slow
    keys = [m.key for m in msgs]
    if not all(type(k) is str for k in keys):
        raise _Slow
    values = [m.value if m.HasField("value") else None for m in msgs]
    stamps = [m.timestamp if m.HasField("timestamp") else None for m in msgs]
    expires = [m.expires_at if m.HasField("expires_at") else None for m in msgs]
    expect = {
        "key": pa.array(keys, pa.string()),
        "value": pa.array(values, pa.binary()),
        "deleted": pa.array([m.deleted for m in msgs], pa.bool_()),
        "timestamp": _ts_us(pa.array(stamps, pa.int64())),
        "expires_at": _ts_us(pa.array(expires, pa.int64())),
    }
    bad = np.zeros(len(blocks), dtype=bool)
    for name, want in expect.items():
        have = rows.column(name)
        if pa.types.is_timestamp(have.type):
            have = have.cast(pa.int64())
        bad |= ~_same(want, have)
    stat = rows.column("stat")
    if stat.null_count < len(stat):  # an entry feed has no stat
        bad |= stat.is_valid().to_numpy(zero_copy_only=False)
    return bad


def _ts_us(ms: pa.Array) -> pa.Array:
    """`ts_us` over an array: microseconds where 0 <= ms <= MAX_TS_MS, else null."""
    fits = pc.and_(pc.greater_equal(ms, 0), pc.less_equal(ms, MAX_TS_MS))
    return pc.if_else(fits, pc.multiply(pc.if_else(fits, ms, 0), 1000), pa.scalar(None, pa.int64()))


def _same(a: pa.Array, b: pa.Array) -> np.ndarray[Any, Any]:
    """Elementwise equality where null equals null."""
    eq = pc.fill_null(pc.equal(a, b), False)
    if a.null_count or b.null_count:
        eq = pc.or_(eq, pc.and_(a.is_null(), b.is_null()))
    return np.asarray(eq.to_numpy(zero_copy_only=False), dtype=bool)


def _decoded_columns(rows: pa.RecordBatch) -> dict[str, list[Any]]:
    out = {}
    for name in ("key", "value", "deleted", "stat"):
        out[name] = rows.column(name).to_pylist()
    for name in ("timestamp", "expires_at"):
        out[name] = rows.column(name).cast(pa.int64()).to_pylist()
    return out


def _differs(content_type: str, seq: int, block: bytes, decoded: Mapping[str, list[Any]], i: int) -> str | None:
    try:
        r = decode_entry(content_type, seq, block)
    except Corruption:
        return "block (not an entry)"
    expect = {
        "key": r.key,
        "value": r.value,
        "deleted": r.deleted,
        "timestamp": ts_us(r.timestamp),
        "expires_at": ts_us(r.expires_at),
    }
    for name, want in expect.items():
        if decoded[name][i] != want:
            return name
    stat = decoded["stat"][i]
    have = {k: v for k, v in stat.items() if v is not None} if stat is not None else None
    if have != r.stat:
        return "stat"
    return None
