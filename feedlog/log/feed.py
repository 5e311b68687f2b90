"""A feed: the signed log of `core.Core` seen as timestamped entries, with a key/value view.

    feed = Feed.create("data/feed", timestamps="fuzz:30s", ttl="7d")
    feed.put("/a", b"hello")              # one durable, signed batch
    feed.append([Write("/b", b"x"), Write("/c", deleted=True)])   # one batch
    feed.get("/a").value                  # latest live value (None once deleted or expired)

Like hyperdb on a single writer: seq 0 is the `Header`, every later block one
entry. Timestamps follow the feed's privacy policy (`timestamps`), TTLs
SlateDB's design (a default per feed, one per write; expired entries are hidden
from `get` and their payloads cleared by `compact`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import failpoints
from ..clock import Clock, MonotonicClock, SystemClock
from ..errors import Corruption, InvalidArgument, NotFound
from . import entries, forgets, retention, storage
from .core import (
    BLOCK_COST,
    FEED_FILES,
    KEY_FILE,
    MAX_BLOCK_BYTES,
    SECRET_FILE,
    Core,
    VerifyReport,
    check_batch,
    is_tmp,
)
from .crypto import KeyPair, discovery_key, leaf_hash
from .entries import ENTRY, Record
from .keyindex import KeyIndex
from .merkle import Node, TreeState
from .timestamps import TimestampPolicy, format_duration, parse_duration

SETTINGS_FILE = "feed.json"
DEFAULT_TIMESTAMPS = "truncate:1s"  # the DEP: seconds are "a good design trade-off"
_DEFAULT_POLICY = TimestampPolicy.parse(DEFAULT_TIMESTAMPS)
#: bounds for `Write.weight`: an entry's tags, lengths, flags, timestamp and expiry; a drive event's Stat
WRITE_FRAMING = 64
WRITE_STAT_BYTES = 256


@dataclass(frozen=True, slots=True)
class FeedSettings:
    """Plain, serialisable per-feed settings (components such as the clock are passed separately)."""

    content_type: str = ENTRY
    timestamps: TimestampPolicy = _DEFAULT_POLICY
    ttl_ms: int | None = None
    fsync: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "format": 1,
            "type": self.content_type,
            "timestamps": str(self.timestamps),
            "ttl": format_duration(self.ttl_ms) if self.ttl_ms else None,
            "fsync": "always" if self.fsync else "never",
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> FeedSettings:
        try:
            return cls(
                content_type=str(raw["type"]),
                timestamps=TimestampPolicy.parse_stored(str(raw["timestamps"])),
                ttl_ms=parse_duration(raw["ttl"]) if raw.get("ttl") else None,
                fsync=raw.get("fsync", "always") != "never",
            )
        except (KeyError, TypeError, InvalidArgument) as e:
            raise Corruption(f"unreadable feed settings: {e}") from None


@dataclass(frozen=True, slots=True)
class Write:
    """One entry to append. `ttl_ms`/`timestamps` of None take the feed's defaults."""

    key: str
    value: bytes | Mapping[str, Any] | None = None
    deleted: bool = False
    ttl_ms: int | None = None
    timestamps: TimestampPolicy | None = None
    #: expire at exactly write time + TTL, even where the policy hides the write time (it then pins it)
    exact_expiry: bool = False
    #: withdraw `key` (issue 37): a deletion that clears every earlier entry of the key on every copy
    forget: bool = False

    def weight(self) -> int:
        """An upper bound on what this entry adds to a batch's weight (`core.MAX_BATCH_BYTES`):
        key and value, the encoding's tags, lengths and timestamps, and the per-block cost."""
        value = self.value if isinstance(self.value, bytes) else b""
        extra = 0 if self.value is None or isinstance(self.value, bytes) else WRITE_STAT_BYTES
        return len(self.key.encode("utf-8", "surrogatepass")) + len(value) + extra + WRITE_FRAMING + BLOCK_COST


@dataclass(frozen=True, slots=True)
class Appended:
    seq: int
    timestamp: int | None
    expires_at: int | None


@dataclass(frozen=True, slots=True)
class CompactReport:
    cleared: int
    bytes_cleared: int


@dataclass(frozen=True, slots=True)
class CompactStep:
    """What one `Feed.compact_step` did: where the next starts, what it cleared, and when (ms) the
    earliest entry it kept expires (None: none of them does), before which the range needs no step."""

    end: int
    cleared: int
    bytes_cleared: int
    next_expiry: int | None
    #: with `clear=False`: the seqs the step would have cleared (bytes_cleared counts them)
    victims: tuple[int, ...] = ()


_INTERRUPTED = "an interrupted create left a key here but no header block"


def _discard_interrupted(p: Path) -> None:
    """Remove what an older version's killed `create` left at `p`, so creating there again works.

    Only a directory holding nothing but feed files, with a secret key and no
    signed block: no entry was ever acknowledged, nor the key ever printed.
    """
    if not (p / SECRET_FILE).is_file():
        return
    names = {d.name for d in p.iterdir()}
    if any(n not in FEED_FILES and not is_tmp(n) for n in names):
        return
    if KEY_FILE in names:
        try:
            with Core.open(p) as core:
                if core.length:
                    return
        except NotFound:
            pass
    for n in names:
        (p / n).unlink()
    storage.fsync_dir(p)


def _policy(p: TimestampPolicy | str | None) -> TimestampPolicy | None:
    return TimestampPolicy.parse(p) if isinstance(p, str) else p


#: the longest TTL: check() encodes at clock reading 0, so an expiry must fit uint64 at any real reading too
MAX_TTL_MS = 1000 * 365 * 86_400_000


def _ttl(t: int | str | None) -> int | None:
    if t is None:
        return None
    ms = parse_duration(t) if isinstance(t, str) else t
    if ms <= 0:
        raise InvalidArgument("a TTL must be greater than zero")
    if ms > MAX_TTL_MS:  # so that any clock reading plus the TTL fits the entry's uint64 expires_at
        raise InvalidArgument(f"a TTL is at most {MAX_TTL_MS} ms (1000 years), got {ms}")
    return ms


class Feed:
    def __init__(
        self, core: Core, settings: FeedSettings, clock: Clock | None = None, *, settings_known: bool = True
    ) -> None:
        self.core = core
        self.settings = settings
        #: whether `settings` (timestamp policy, TTL) are the writer's: false for a replica never told
        #: them (they are the writer's choice, not part of the signed log), which then reports none
        self.settings_known = settings_known
        # seed from our own persisted timestamps only: a replica's were written by another clock
        floor = settings.timestamps.clock_floor(core.max_ts) if core.can_sign else 0
        self.clock = MonotonicClock(clock or SystemClock(), floor)
        self._keys = KeyIndex(core, self._scan_keys)
        #: holes filled since opened: a scheduler that skips ranges with nothing to expire looks again
        self.fills = 0
        self._pending = forgets.PendingMark(core.path)
        if core.writable:
            core.before_commit = self._before_commit
            try:
                self._finish_forgets()
            except BaseException:
                self.close()
                raise

    # ---- lifecycle ------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str],
        *,
        content_type: str = ENTRY,
        timestamps: TimestampPolicy | str = DEFAULT_TIMESTAMPS,
        ttl: int | str | None = None,
        fsync: bool = True,
        key_pair: KeyPair | None = None,
        clock: Clock | None = None,
    ) -> Feed:
        header = entries.encode_header(content_type)  # validates the type before touching disk
        policy = _policy(timestamps)
        assert policy is not None
        settings = FeedSettings(content_type, policy, _ttl(ttl), fsync)
        p = Path(path)

        def init(core: Core) -> None:  # in the build directory: the feed appears with its header or not at all
            storage.atomic_write(
                core.path / SETTINGS_FILE, json.dumps(settings.to_json(), indent=1).encode(), sync_dir=False
            )
            failpoints.point("create.settings")
            core.append([header])
            failpoints.point("create.header")

        _discard_interrupted(p)
        core = Core.create(p, key_pair or KeyPair.generate(), fsync=fsync, init=init)
        return cls(core, settings, clock)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, writable: bool = True, clock: Clock | None = None) -> Feed:
        p = Path(path)
        core = Core.open(p, writable=writable)
        known = True
        try:
            try:
                settings = FeedSettings.from_json(json.loads((p / SETTINGS_FILE).read_text()))
            except FileNotFoundError:
                settings, known = FeedSettings(), False
            except ValueError as e:
                raise Corruption(f"{p / SETTINGS_FILE}: {e}") from None
            if not core.length and core.can_sign:
                # a feed we sign always starts with its header (Feed.create writes both or neither); only an
                # older version's killed create left a key without one, and an entry must never become block 0
                raise NotFound(f"{p}: {_INTERRUPTED}; run create again")
            if core.length:
                header = core.get(0)
                if header is None:
                    raise Corruption(f"{p}: the header block was cleared")
                settings = FeedSettings(
                    entries.decode_header(header), settings.timestamps, settings.ttl_ms, settings.fsync
                )
            core.fsync = settings.fsync
        except BaseException:
            core.close()
            raise
        return cls(core, settings, clock, settings_known=known or core.can_sign)

    @classmethod
    def create_replica(
        cls,
        path: str | os.PathLike[str],
        key: bytes,
        *,
        fsync: bool = True,
        timestamps: TimestampPolicy | str | None = None,
        ttl: int | str | None = None,
        clock: Clock | None = None,
    ) -> Feed:
        """An empty copy of someone else's feed: no secret key, filled with batches they signed.

        `clock`: when entries expire here (a replica keeps no expired payload, issue 37).

        `timestamps`/`ttl`: the writer's settings as the source reported them (a clone keeps
        them to show in `info`); without `timestamps` the replica reports none.
        """
        if len(key) != 32:
            raise InvalidArgument(f"a feed key is 32 bytes, got {len(key)}")
        if timestamps is None:
            core = Core.create(path, KeyPair(key, None), fsync=fsync)
            return cls(core, FeedSettings(fsync=fsync), clock, settings_known=False)
        policy = _policy(timestamps)
        assert policy is not None
        settings = FeedSettings(timestamps=policy, ttl_ms=_ttl(ttl), fsync=fsync)

        def init(core: Core) -> None:
            storage.atomic_write(
                core.path / SETTINGS_FILE, json.dumps(settings.to_json(), indent=1).encode(), sync_dir=False
            )

        return cls(Core.create(path, KeyPair(key, None), fsync=fsync, init=init), settings, clock)

    def close(self) -> None:
        try:
            with self.core.lock:
                self._keys.close()
        finally:
            self.core.close()

    def __enter__(self) -> Feed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- identity -------------------------------------------------------------------

    @property
    def key(self) -> bytes:
        return self.core.public_key

    @property
    def discovery_key(self) -> bytes:
        return discovery_key(self.core.public_key)

    @property
    def length(self) -> int:
        """Blocks in the feed, the header included: entries are seqs 1 .. length-1."""
        return self.core.length

    @property
    def content_type(self) -> str:
        return self.settings.content_type

    # ---- writes ---------------------------------------------------------------------

    def _encode(self, writes: Sequence[Write], now: int) -> tuple[list[bytes], list[tuple[int | None, int | None]]]:
        """The blocks for `writes` at clock reading `now`, with each one's (timestamp, expires_at)."""
        if not writes:
            raise InvalidArgument("nothing to append")
        blocks: list[bytes] = []
        stamps: list[tuple[int | None, int | None]] = []
        for w in writes:
            if not isinstance(w.key, str) or not w.key:
                raise InvalidArgument("an entry needs a non-empty string key")
            if w.forget and (w.value is not None or w.ttl_ms is not None):
                raise InvalidArgument(f"a forget of key {w.key[:100]!r} takes no value and no TTL")
            deleted = w.deleted or w.forget
            policy = w.timestamps or self.settings.timestamps
            ts = policy.apply(now)
            ttl = self.settings.ttl_ms if w.ttl_ms is None else _ttl(w.ttl_ms)
            expires = policy.expiry(now, ts, ttl, exact=w.exact_expiry) if ttl and not deleted else None
            block = entries.encode_entry(
                self.content_type, w.key, w.value, deleted=deleted, timestamp=ts, expires_at=expires, forget=w.forget
            )
            if len(block) > MAX_BLOCK_BYTES:
                raise InvalidArgument(
                    f"the entry for key {w.key[:100]!r} is {len(block)} bytes encoded; the limit is {MAX_BLOCK_BYTES}"
                )
            blocks.append(block)
            stamps.append((ts, expires))
        check_batch(0, blocks)
        return blocks, stamps

    def append(self, writes: Sequence[Write]) -> list[Appended]:
        """Append entries as one signed batch; durable (per the fsync policy) when this returns."""
        with self.core.lock:
            blocks, stamps = self._encode(writes, self.clock.now_ms())
            start = self.core.length
            out = [Appended(start + n, ts, expires) for n, (ts, expires) in enumerate(stamps)]
            stamped = [ts for ts, _ in stamps if ts is not None]
            ok = False
            try:
                self.core.append(blocks, min_ts=min(stamped, default=0), max_ts=max(stamped, default=0))
                failpoints.point("forget.applied")
                ok = True
            finally:
                self._forgets_done(ok)
            self._keys.added(start, [w.key for w in writes])
            return out

    def check(self, writes: Sequence[Write]) -> None:
        """Raise `InvalidArgument` if `append(writes)` would refuse them (nothing is written).

        Encodes at reading 0: any reading encodes the same way, and the clock is left alone.
        """
        self._encode(writes, 0)

    def store_signed(
        self, blocks: Sequence[bytes | None], state: TreeState, *, sync: bool = True, leaves: Sequence[Node] = ()
    ) -> None:
        """Store a batch its author signed (replication); refused unless it verifies.

        `leaves`: the leaf nodes of blocks that came cleared (None in `blocks`), stored as holes."""
        self.store_signed_many([(blocks, state)], sync=sync, leaves=[leaves])

    def store_signed_many(
        self,
        batches: Sequence[tuple[Sequence[bytes | None], TreeState]],
        *,
        sync: bool = True,
        leaves: Sequence[Sequence[Node]] | None = None,
    ) -> int:
        """`store_signed` for consecutive batches, their timestamps scanned as one (a replica's
        message holds many). Each is verified and stored in turn: one that fails raises, the
        ones before it stay stored. Returns the blocks stored.

        `leaves[i]`: the leaf nodes of batch i's cleared blocks (None in its blocks). A block that
        came with its bytes but whose payload `retention.keeps` refuses by our clock (expired) is
        stored as a hole too: a replica never needs an expired payload (issue 37).
        """
        from .entry_scan import timestamp_ranges  # here: numpy and pyarrow cost every command's start

        if not batches:
            return 0
        start = self.core.length
        first = batches[0][0]
        if start == 0 and first:
            if first[0] is None:
                raise Corruption("block 0, the feed's header, came cleared: a copy cannot tell what the feed holds")
            content_type = entries.decode_header(first[0])
        else:
            content_type = self.content_type
        now = self.clock.now_ms()
        every: Sequence[bytes | None] = [b for blocks, _ in batches for b in blocks] if len(batches) > 1 else first
        # payloads we will not keep: out before anything is scanned or stored
        gone = retention.dropped(content_type, start, every, now)
        extra: dict[int, Node] = {}
        if gone:
            every = list(every)
            for k in gone:
                block = every[k]
                assert block is not None
                extra[k] = Node(2 * (start + k), leaf_hash(block), len(block))
                every[k] = None
        # scan_blocks(strict=False) of each batch, all at once
        ranges = timestamp_ranges(content_type, start, every, [len(blocks) for blocks, _ in batches])
        stored = 0
        at = 0  # position of the batch in `every`
        ok = False
        try:
            for i, ((blocks, state), (lo, hi)) in enumerate(zip(batches, ranges, strict=True)):
                held = list(leaves[i]) if leaves is not None else []
                if extra or held:
                    n = len(blocks)
                    mine = [extra[k] for k in range(at, at + n) if k in extra] if extra else []
                    blocks = every[at : at + n] if mine else blocks
                    self.core.append_signed(
                        blocks,
                        state,
                        min_ts=lo,
                        max_ts=hi,
                        sync=False,
                        leaves=sorted([*held, *mine]),
                        holes={n.index // 2 for n in held},
                    )
                else:
                    self.core.append_signed(blocks, state, min_ts=lo, max_ts=hi, sync=False)
                at += len(blocks)
                if not stored:
                    self._stored(start, content_type)
                stored += len(blocks)
            ok = True
        finally:
            if sync and stored and self.core.fsync:  # one fsync for them all; on an error too, for those stored
                self.core.sync()
            self._forgets_done(ok)
        return stored

    def append_with_signature(
        self, expected_length: int, blocks: Sequence[bytes], signature: bytes, *, fork: int = 0
    ) -> TreeState:
        """A key holder's remote append: blocks must be valid entries, the signature theirs."""
        start = self.core.length
        content_type = self.content_type

        def inspect() -> tuple[int, int]:
            nonlocal content_type
            if start == 0:
                try:
                    content_type = entries.decode_header(blocks[0])
                except Corruption as e:
                    raise InvalidArgument(f"a feed starts with its header block: {e}") from None
            return entries.scan_blocks(content_type, expected_length, blocks, strict=True)

        ok = False
        try:
            state = self.core.append_with_signature(expected_length, blocks, signature, fork=fork, inspect=inspect)
            ok = True
        finally:
            self._forgets_done(ok)
        self._stored(start, content_type)
        return state

    def _stored(self, start: int, content_type: str) -> None:
        if start == 0 and content_type != self.settings.content_type:
            self.settings = dataclasses.replace(self.settings, content_type=content_type)

    def put(
        self,
        key: str,
        value: bytes | Mapping[str, Any],
        *,
        ttl: int | str | None = None,
        timestamps: TimestampPolicy | str | None = None,
        exact_expiry: bool = False,
    ) -> Appended:
        return self.append([Write(key, value, False, _ttl(ttl), _policy(timestamps), exact_expiry)])[0]

    def delete(self, key: str, *, timestamps: TimestampPolicy | str | None = None) -> Appended:
        """Append a timestamped tombstone for `key`."""
        return self.append([Write(key, None, True, None, _policy(timestamps))])[0]

    def forget(self, key: str, *, timestamps: TimestampPolicy | str | None = None) -> Appended:
        """Withdraw `key` (issue 37): append one signed forget entry, a deletion that tells every copy
        to clear the payloads of all earlier entries of the key. Cleared here before this returns
        (Merkle nodes stay, so the feed still verifies); `ReadOnly` on a feed we cannot sign."""
        return self.append([Write(key, None, True, None, _policy(timestamps), forget=True)])[0]

    # ---- forgetting (forgets.py) -------------------------------------------------------

    def _before_commit(self, start: int, blocks: Sequence[bytes | None]) -> list[int]:
        """`Core.before_commit`: a verified batch is about to be stored. Clear what its forget entries
        withdraw among stored entries; return the seqs of the batch's own to store as cleared."""
        try:
            header = blocks[0] if start == 0 and blocks else None  # a cleared header is refused before
            content_type = entries.decode_header(header) if header is not None else self.content_type
        except Corruption:
            return []  # a replica of a feed without a valid header holds data, not entries
        found = entries.forgets_in(content_type, start, blocks)
        if not found:
            return []
        self._pending.mark(start)
        failpoints.point("forget.marked")

        def batch(seq: int) -> Record | None:
            block = blocks[seq - start]
            if seq == 0 or block is None:
                return None
            r = entries.decode_record(content_type, seq, block)
            return r if r.invalid is None else None

        stored, inside = forgets.victims(found, self._entries_for, batch, start)
        if stored:
            self.core.clear(stored)
        return inside

    def _forgets_done(self, ok: bool) -> None:
        """A path that stores batches is over (`ok`: every batch stored): its forgets were applied
        inside `Core._commit`, so the mark goes. Under the core's lock: another thread's batch may be
        between marking and clearing, and its mark must stay until that is done."""
        with self.core.lock:
            self._pending.done(ok)

    def _finish_forgets(self) -> None:
        """Apply the forget entries a killed process may have stored without clearing (forgets.py)."""
        start = self._pending.load()
        if start is None:
            return
        length = self.core.length
        found = forgets.forgets_in_feed(self.content_type, self.core.get_range(max(start, 1), length))
        stored, _ = forgets.victims(found, self._entries_for, lambda _seq: None, length)
        if stored:
            self.core.clear(stored)
        self._pending.cleared()

    # ---- reads ----------------------------------------------------------------------

    def record(self, seq: int) -> Record:
        if seq == 0:
            raise InvalidArgument("seq 0 is the feed header, not an entry")
        block = self.core.get(seq)
        if block is None:
            return entries.cleared_record(seq)
        return entries.decode_record(self.content_type, seq, block)

    def records(self, start: int = 1, end: int | None = None) -> Iterator[Record]:
        """Entries [start, end) in seq order; cleared blocks come back with `cleared=True`."""
        stop = self.length if end is None else min(end, self.length)
        for seq, block in self.core.get_range(max(start, 1), stop):
            if block is None:
                yield entries.cleared_record(seq)
            else:
                yield entries.decode_record(self.content_type, seq, block)

    def timestamp(self, seq: int) -> int | None:
        """The writer timestamp of `seq` (untrusted data: may be absent, out of order, 1970...)."""
        return self.record(seq).timestamp

    def _scan_keys(self, start: int, end: int) -> Iterator[tuple[int, str]]:
        """(seq, key) of the valid, uncleared entries in [start, end): what the key index holds."""
        for r in self.records(start, end):
            if not r.cleared and r.invalid is None:
                yield r.seq, r.key

    def _entries_for(self, key: str) -> Iterator[Record]:
        """The valid, uncleared entries for `key`, newest first (the key index's candidates, checked)."""
        for seq in self._keys.candidates(key):
            r = self.record(seq)
            if not r.cleared and r.invalid is None and r.key == key:
                yield r

    def get(self, key: str) -> Record | None:
        """The latest live entry for `key`: None if never written, deleted, or expired."""
        r = next(self._entries_for(key), None)
        if r is None or r.deleted or r.forget or r.expired(self.clock.now_ms()):
            return None
        return r

    def forgotten(self, key: str) -> int | None:
        """The seq of the forget entry that withdrew `key`, if its latest entry is one (else None)."""
        r = next(self._entries_for(key), None)
        return r.seq if r is not None and r.forget else None

    def history(self, key: str) -> list[Record]:
        """Every entry ever written for `key`, oldest first (deletions and expired ones too); entries
        whose payloads were cleared (compaction, a forget entry: `Record.forget`) are not among them."""
        return sorted(self._entries_for(key), key=lambda r: r.seq)

    # ---- maintenance ----------------------------------------------------------------

    def fill(self, start: int, blocks: Sequence[bytes | None]) -> int:
        """Fill this copy's holes among seqs start... with the blocks another peer served (None: it
        has none either); returns how many were filled.

        Each block must hash to the leaf our signed tree holds (`Core.fill`: a
        hostile peer can withhold a payload, never forge one; Corruption
        otherwise). A block `retention.keeps` refuses by our clock stays
        cleared (no longer a hole: we know now why it has no payload).
        """
        filled: list[int] = []
        now = self.clock.now_ms()
        gone = set(retention.dropped(self.content_type, start, blocks, now))
        gone |= self._withdrawn(start, blocks)
        # a forget entry among the fills withdraws its key's earlier entries: marked first (forgets.py), so
        # a process killed between storing it and clearing them finishes the job when the feed reopens
        found = entries.forgets_in(self.content_type, start, blocks)
        if found:
            with self.core.lock:
                self._pending.mark(start)
        ok = False
        try:
            for k, block in enumerate(blocks):
                seq = start + k
                if block is not None and seq < self.length and self.core.fill(seq, block, keep=k not in gone):
                    filled.append(k)
            if filled:  # entries appeared below what the key index covers (and a compactor's schedule)
                self._keys.rebuild()
                self.fills += len(filled)
            if found:
                failpoints.point("forget.fill_marked")
                stored, _ = forgets.victims(found, self._entries_for, lambda _seq: None, self.length)
                if stored:
                    self.core.clear(stored)
            ok = True
        finally:
            if found:
                self._forgets_done(ok)
        return len(filled)

    def _withdrawn(self, start: int, blocks: Sequence[bytes | None]) -> set[int]:
        """The offsets among `blocks` (seqs start...) whose key a later forget entry this copy holds
        withdrew: a peer that lags behind the forget still serves them, and a fill must not bring them
        back (a copy that forgot stores them cleared, not as holes; the key of a hole is not known)."""
        out: set[int] = set()
        for k, block in enumerate(blocks):
            if block is None or start + k == 0:
                continue
            r = entries.decode_record(self.content_type, start + k, block)
            if r.invalid is not None:
                continue
            if any(e.forget and e.seq > r.seq for e in self._entries_for(r.key)):
                out.add(k)
        return out

    def compact_step(self, start: int, count: int, *, clear: bool = True) -> CompactStep:
        """Clear the payloads `retention.keeps` refuses among seqs [start, start + count), by this feed's
        clock: one bounded step of a peer's scheduled compaction (issue 37).

        Reads without the feed's lock (blocks below the length never change but
        for clearing, which this step re-checks under it in `Core.clear`), decodes
        only blocks that may carry an expiry, and holds the lock only for the
        clear itself, so puts and reads interleave with a compaction of any size.
        With `clear` False the payloads are only found (`victims`), for a caller
        that clears several steps' at once (`Core.clear` costs two fsyncs a call).
        """
        end = min(start + count, self.length)
        first = max(start, 1)
        if first >= end:
            return CompactStep(max(end, start), 0, 0, None)
        now = self.clock.now_ms()
        blocks = self.core.blocks(first, end)
        gone, soonest = retention.scan(self.content_type, first, blocks, now)
        if not gone:
            return CompactStep(end, 0, 0, soonest)
        size = sum(len(blocks[k] or b"") for k in gone)
        victims = [first + k for k in gone]
        if not clear:
            return CompactStep(end, 0, size, soonest, tuple(victims))
        return CompactStep(end, self.core.clear(victims), size, soonest)

    def compact(self, *, overwritten: bool = False) -> CompactReport:
        """Clear payloads of expired entries (and of overwritten ones, if asked).

        Like SlateDB's TTL compaction filter, but the log is signed: the Merkle
        nodes stay, so the feed and every other block still verify.
        """
        now = self.clock.now_ms()
        latest: dict[str, int] = {}
        victims: set[int] = set()
        for r in self.records():
            if r.cleared or r.invalid is not None:
                continue  # an invalid block has no key or expiry to judge it by: it stays
            if r.forget:
                # a forget entry stays: a copy that has not stored it yet learns from it what to clear
                latest.pop(r.key, None)
                continue
            if not retention.keeps(r, now):
                victims.add(r.seq)
            elif overwritten and r.key in latest:
                victims.add(latest[r.key])
            latest[r.key] = r.seq
        if not victims:
            return CompactReport(0, 0)
        size = sum(self.core.leaf(s).size for s in victims)
        cleared = self.core.clear(sorted(victims))
        return CompactReport(cleared, size)

    def verify(self, on_progress: Callable[[int], None] | None = None) -> VerifyReport:
        """Re-hash every block and check the signed root; `on_progress(n)`: blocks 0..n-1 checked so far."""
        return self.core.verify(on_progress)

    def info(self) -> dict[str, Any]:
        state = self.core.state
        first = last = None
        if self.length > 1:
            first = self.record(1).timestamp
            last = self.record(self.length - 1).timestamp
        return {
            "key": self.key.hex(),
            "discovery_key": self.discovery_key.hex(),
            "type": self.content_type,
            "length": state.length,
            "byte_length": self.core.byte_length,
            "tree_hash": state.tree_hash.hex(),
            "fork": state.fork,
            "signature": state.signature.hex(),
            "writable": self.core.can_sign,
            "timestamps": str(self.settings.timestamps) if self.settings_known else None,
            "ttl": format_duration(self.settings.ttl_ms) if self.settings.ttl_ms and self.settings_known else None,
            "first_timestamp": first,
            "last_timestamp": last,
            "min_timestamp": self.core.min_ts or None,
            "max_timestamp": self.core.max_ts or None,
        }
