"""Writer timestamps put to use: activity, freshness and recent events across feeds.

The hyperdb timestamps proposal gives writer timestamps three uses: "surfacing recent events
to users, calculating activity metrics over large numbers of archives, and comparing freshness
between multiple archives with similar or overlapping content". It also says they are
self-reported and may be "inaccurate, out of order, or entirely bogus (eg ... the year 1970)",
and that writers may fuzz, truncate or omit them for privacy. So every computation here:

- classifies each entry once, in this order: `cleared` (its block was cleared: no timestamp
  left), `missing` (no timestamp), `epoch` (before 1971: an unset clock), `future` (after `now`
  plus one hour plus the feed's fuzz bound), `skew` (earlier than an earlier entry of the same
  feed by more than the feed's own uncertainty: a clock that went back), else `ok`. Only `ok`
  entries are placed in time; the rest are counted apart, never dropped;
- never shows time finer than a feed's policy: buckets are widened to the coarsest granularity
  among the feeds (a truncation unit, a fuzz bound), and the result says why. A feed whose policy
  is not known here (a replica, a table's rows) gets the granularity its data shows (the largest
  unit all its timestamps are multiples of) and is reported as `unknown`.

Input is a table of feedlog rows (`rows.SCHEMA`: feed, seq, key, value, deleted, timestamp,
cleared, stat...), read from feeds (`read_feeds`) or from an ingested Delta table; the Spark
versions in `insight_spark.py` compute the same results over a DataFrame of the same rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidArgument, NotFound
from ..log.entries import decode_header
from ..log.timestamps import UNITS_MS, TimestampPolicy, format_duration
from .feeds import FeedSource
from .rows import RowBuilder

#: before this (1971-01-01) a timestamp is an unset clock, not a time
EPOCH_LIMIT_MS = 365 * UNITS_MS["d"]
#: how far past `now` a timestamp may be before it is "in the future" (plus the feed's fuzz bound)
FUTURE_SLACK_MS = UNITS_MS["h"]
#: bucket widths output is rounded up to, so a widened bucket is still a familiar one
STANDARD_BUCKETS_MS = (
    UNITS_MS["m"],
    5 * UNITS_MS["m"],
    15 * UNITS_MS["m"],
    UNITS_MS["h"],
    6 * UNITS_MS["h"],
    UNITS_MS["d"],
    7 * UNITS_MS["d"],
)
#: weeks start on Monday (1970-01-05 was one)
_WEEK_ORIGIN_MS = 4 * UNITS_MS["d"]
CLASSES = ("ok", "skew", "future", "epoch", "missing", "cleared")


@dataclass(frozen=True)
class FeedPolicy:
    """What is known of a feed's timestamp policy, and the finest time its timestamps can show."""

    policy: TimestampPolicy | None  # None: not known here
    granularity_ms: int  # never show time finer than this
    fuzz_ms: int = 0  # the most a timestamp may be off either way (fuzz)

    @classmethod
    def known(cls, policy: TimestampPolicy) -> FeedPolicy:
        if policy.kind == "truncate":
            return cls(policy, policy.amount_ms)
        if policy.kind == "fuzz":
            return cls(policy, policy.amount_ms, policy.amount_ms)
        return cls(policy, 1)

    @property
    def late_ms(self) -> int:
        """How much later than its timestamp a write may really have been: the fuzz, or the rest of
        a truncation unit (a time truncated to 10:00 was made before 10:01)."""
        return self.fuzz_ms if self.fuzz_ms else self.granularity_ms - 1

    @property
    def early_ms(self) -> int:
        """How much earlier than its timestamp a write may really have been (fuzz only)."""
        return self.fuzz_ms

    @classmethod
    def inferred(cls, timestamps_ms: Iterable[int]) -> FeedPolicy:
        """The largest unit (1 ms .. 1 w) that every timestamp is a multiple of; 1 ms (no evidence)
        unless at least two distinct timestamps show it (one reading of 18:00 says nothing of 6 h)."""
        values = {t for t in timestamps_ms if t > 0}
        unit = 1
        if len(values) < 2:
            return cls(None, unit)
        for u in sorted(set(UNITS_MS.values()) | set(STANDARD_BUCKETS_MS)):
            if all(t % u == 0 for t in values):
                unit = max(unit, u)
        return cls(None, unit)

    def describe(self) -> str:
        if self.policy is None:
            grain = "" if self.granularity_ms == 1 else f", timestamps in whole {format_duration(self.granularity_ms)}"
            return f"unknown{grain}"
        return str(self.policy)


def bucket_width(requested_ms: int, policies: Mapping[str, FeedPolicy]) -> tuple[int, list[str]]:
    """The bucket width to use (>= the request and every feed's granularity, rounded up to a
    standard width when widened) and why it was widened, one reason per feed that forced it."""
    if requested_ms <= 0:
        raise InvalidArgument("the bucket width must be positive")
    finest = max((p.granularity_ms for p in policies.values()), default=1)
    if finest <= requested_ms:
        return requested_ms, []
    width = next((b for b in STANDARD_BUCKETS_MS if b >= finest), finest)
    reasons = [
        f"{feed[:16]}... ({p.describe()})" for feed, p in sorted(policies.items()) if p.granularity_ms > requested_ms
    ]
    return width, reasons


def iso(ms: int) -> str:
    """`ms` as ISO-8601 UTC to the second ('2026-11-20T10:00:00Z')."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def bucket_of(ts_ms: int, width_ms: int) -> int:
    """The start of the bucket holding `ts_ms` (UTC; week buckets start on Mondays)."""
    origin = _WEEK_ORIGIN_MS if width_ms % (7 * UNITS_MS["d"]) == 0 else 0
    return ts_ms - (ts_ms - origin) % width_ms


# ---- reading ------------------------------------------------------------------------------------


def read_feeds(
    sources: Sequence[FeedSource],
    *,
    limit: int = 50_000_000,
    columns: Sequence[str] | None = None,
    max_bytes: int | None = None,
) -> tuple[pa.Table, dict[str, FeedPolicy]]:
    """Every entry of every feed (verified as it is read), and each feed's policy as known here.

    A local feed directory that holds its writer's key (we wrote it) has its policy in its
    settings; any other feed's policy is inferred from its timestamps (`FeedPolicy.inferred`).
    `columns`: keep only these (the rows are built a chunk at a time and the rest dropped, so the
    values of a long feed are never all in memory: `activity` and `recent` need no value);
    `max_bytes`: InvalidArgument once the rows kept would hold more than this.
    """
    from ..log.feed import Feed

    batches: list[pa.RecordBatch] = []
    policies: dict[str, FeedPolicy] = {}
    total = 0
    held = 0

    def kept(batch: pa.RecordBatch) -> pa.RecordBatch:
        nonlocal held
        if columns is not None:
            batch = batch.select([c for c in columns if c in batch.schema.names])
        held += batch.nbytes
        if max_bytes is not None and held > max_bytes:
            raise InvalidArgument(f"more than {max_bytes:,} bytes of rows: run this on the ingested table with Spark")
        return batch

    for src in sources:
        length = src.signed_length()
        if length <= 1:
            raise NotFound(f"{src.spec}: the feed has no entries")
        total += length - 1
        if total > limit:
            raise InvalidArgument(f"more than {limit:,} entries: run this on the ingested table with Spark")
        header = src.header()
        builder = RowBuilder(src.key_hex, decode_header(header), header)
        first = len(batches)
        for batch in src.read(1, length):
            builder.add(batch)
            if columns is not None and builder.nbytes >= CHUNK_BYTES:
                batches.append(kept(builder.flush()))
        if len(builder):
            batches.append(kept(builder.flush()))
        known: FeedPolicy | None = None
        if src.path is not None:
            with Feed.open(src.path, writable=False) as feed:
                if feed.core.can_sign:
                    known = FeedPolicy.known(feed.settings.timestamps)
        if known is None:
            stamps = [v for b in batches[first:] for v in _ms_values(b.column("timestamp"))]
            known = FeedPolicy.inferred(stamps)
        policies[src.key_hex] = known
    return pa.Table.from_batches(batches), policies


#: block bytes turned into rows at a time when only some columns are kept
CHUNK_BYTES = 8 << 20


def _ms_values(column: Any) -> list[int]:
    return [v // 1000 for v in pc.cast(column, pa.int64()).to_pylist() if v is not None]


def table_policies(rows: pa.Table) -> dict[str, FeedPolicy]:
    """Each feed's policy as its rows show it (a table does not record the writers' policies)."""
    by_feed: dict[str, list[int]] = defaultdict(list)
    ts = pc.cast(rows.column("timestamp"), pa.int64()).to_pylist()
    for feed, t in zip(rows.column("feed").to_pylist(), ts, strict=True):
        if t is not None:
            by_feed[feed].append(t // 1000)
        else:
            by_feed.setdefault(feed, [])
    return {feed: FeedPolicy.inferred(values) for feed, values in by_feed.items()}


# ---- classification -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    feed: str
    seq: int
    key: str | None
    deleted: bool
    ts_ms: int | None
    kind: str  # one of CLASSES
    value: bytes | None = None
    is_drive: bool = False


def classify(rows: pa.Table, policies: Mapping[str, FeedPolicy], now_ms: int) -> list[Entry]:
    """Every row as an `Entry` with its class (module docstring), in feed then seq order."""
    cols = ["feed", "seq", "key", "deleted", "timestamp", "cleared", "value", "stat"]
    data = rows.select([c for c in cols if c in rows.column_names]).sort_by(
        [("feed", "ascending"), ("seq", "ascending")]
    )
    get = {c: data.column(c).to_pylist() if c in data.column_names else [None] * data.num_rows for c in cols}
    ts = pc.cast(data.column("timestamp"), pa.int64()).to_pylist()
    out: list[Entry] = []
    high: int | None = None  # the latest `ok` timestamp seen earlier in this feed
    current: str | None = None
    for i in range(data.num_rows):
        feed = str(get["feed"][i])
        seq = int(get["seq"][i] or 0)
        if feed != current:
            current, high = feed, None
        p = policies.get(feed) or FeedPolicy(None, 1)
        t = None if ts[i] is None else ts[i] // 1000
        if get["cleared"][i]:
            kind = "cleared"
        elif t is None:
            kind = "missing"
        elif t < EPOCH_LIMIT_MS:
            kind = "epoch"
        elif t > now_ms + FUTURE_SLACK_MS + p.fuzz_ms:
            kind = "future"
        elif high is not None and t + 2 * p.fuzz_ms < high:
            kind = "skew"
        else:
            kind = "ok"
            high = t if high is None else max(high, t)
        out.append(
            Entry(
                feed,
                seq,
                get["key"][i],
                bool(get["deleted"][i]),
                t,
                kind,
                get["value"][i],
                get["stat"][i] is not None,
            )
        )
    return out


# ---- activity -------------------------------------------------------------------------------------


@dataclass
class Activity:
    requested_ms: int
    every_ms: int
    widened_by: list[str]
    buckets: list[int]  # starts of the non-empty buckets, ascending
    per_feed: dict[str, list[int]]  # feed -> entries per bucket (aligned with `buckets`)
    totals: list[int]
    writers: list[int]  # feeds with at least one entry in the bucket
    apart: dict[str, dict[str, int]]  # feed -> class -> count, for every class but ok
    entries: dict[str, int]
    policies: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {
            "every": format_duration(self.every_ms),
            "requested": format_duration(self.requested_ms),
            "widened_by": self.widened_by,
            "buckets": [
                {"start": b, "total": t, "writers": w, "feeds": {f: c[i] for f, c in self.per_feed.items() if c[i]}}
                for i, (b, t, w) in enumerate(zip(self.buckets, self.totals, self.writers, strict=True))
            ],
            "apart": self.apart,
            "entries": self.entries,
            "policies": self.policies,
        }


def activity(rows: pa.Table, requested_ms: int, policies: Mapping[str, FeedPolicy], now_ms: int) -> Activity:
    """Entries per time bucket, per feed and in total, and active writers per bucket."""
    every, widened = bucket_width(requested_ms, policies)
    entries = classify(rows, policies, now_ms)
    counts: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    apart: dict[str, dict[str, int]] = {}
    total: dict[str, int] = defaultdict(int)
    for e in entries:
        total[e.feed] += 1
        apart.setdefault(e.feed, {c: 0 for c in CLASSES if c != "ok"})
        if e.kind == "ok":
            assert e.ts_ms is not None
            counts[bucket_of(e.ts_ms, every)][e.feed] += 1
        else:
            apart[e.feed][e.kind] += 1
    feeds = sorted(total)
    buckets = sorted(counts)
    return Activity(
        requested_ms,
        every,
        widened,
        buckets,
        {f: [counts[b].get(f, 0) for b in buckets] for f in feeds},
        [sum(counts[b].values()) for b in buckets],
        [len(counts[b]) for b in buckets],
        apart,
        dict(total),
        {f: (policies.get(f) or FeedPolicy(None, 1)).describe() for f in feeds},
    )


# ---- recent ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    ts_ms: int
    feed: str
    seq: int
    kind: str  # put | delete | file | file-delete
    key: str | None
    flags: tuple[str, ...]  # skew (out of order in its feed), future


def recent(
    rows: pa.Table, policies: Mapping[str, FeedPolicy], now_ms: int, since_ms: int | None = None, limit: int = 20
) -> tuple[list[Event], dict[str, int]]:
    """The most recent events, newest first by writer timestamp (seq breaks ties), with untrusted
    ones flagged; and how many entries could not be placed in time at all (by class)."""
    if limit < 1:
        raise InvalidArgument("--limit must be >= 1")
    events: list[Event] = []
    unplaced: dict[str, int] = {c: 0 for c in ("missing", "epoch", "cleared")}
    for e in classify(rows, policies, now_ms):
        if e.kind in unplaced:
            unplaced[e.kind] += 1
            continue
        assert e.ts_ms is not None
        if since_ms is not None and e.ts_ms < now_ms - since_ms:
            continue
        kind = ("file-delete" if e.deleted else "file") if e.is_drive else ("delete" if e.deleted else "put")
        flags = tuple(k for k in ("skew", "future") if e.kind == k)
        events.append(Event(e.ts_ms, e.feed, e.seq, kind, e.key, flags))
    events.sort(key=lambda ev: (-ev.ts_ms, -ev.seq, ev.feed))
    return events[:limit], unplaced


# ---- freshness ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyState:
    feed: str
    seq: int
    ts_ms: int | None
    deleted: bool
    value: bytes | None


@dataclass
class FeedFreshness:
    feed: str
    shared: int  # shared keys this feed holds
    newest: int  # shared keys whose newest write (by timestamp) is this feed's
    ties: int  # shared keys where this feed ties for newest within the feeds' uncertainty
    last_write_ms: int | None
    policy: str
    fuzz_ms: int

    def summary(self) -> str:
        when = "no placed write" if self.last_write_ms is None else f"last write {iso(self.last_write_ms)}"
        fuzz = f" ± {format_duration(self.fuzz_ms)} fuzz" if self.fuzz_ms else ""
        tie = f" (tied on {self.ties:,} more)" if self.ties else ""
        return f"newest for {self.newest:,} of {self.shared:,} shared keys{tie}; {when}{fuzz} [{self.policy}]"


@dataclass
class KeyFreshness:
    key: str
    newest: str | None  # the feed whose latest write is newest; None: a tie or no timestamps
    states: list[KeyState]
    disagree: bool  # the feeds' latest writes differ (value or deletion)


@dataclass
class Freshness:
    feeds: list[FeedFreshness]
    shared_keys: int
    disagreeing: int
    keys: list[KeyFreshness] = field(default_factory=list)

    def to_json(self, limit: int = 100) -> dict[str, Any]:
        """The summary, and the first `limit` keys (by name) where the feeds' latest writes differ."""
        return {
            "shared_keys": self.shared_keys,
            "disagreeing": self.disagreeing,
            "feeds": [
                {
                    "feed": f.feed,
                    "shared": f.shared,
                    "newest": f.newest,
                    "ties": f.ties,
                    "last_write": f.last_write_ms,
                    "policy": f.policy,
                    "fuzz_ms": f.fuzz_ms,
                }
                for f in self.feeds
            ],
            "keys": [
                {
                    "key": k.key,
                    "newest": k.newest,
                    "disagree": k.disagree,
                    "feeds": {s.feed: {"seq": s.seq, "timestamp": s.ts_ms, "deleted": s.deleted} for s in k.states},
                }
                for k in [k for k in self.keys if k.disagree][:limit]
            ],
        }


def freshness(rows: pa.Table, policies: Mapping[str, FeedPolicy], now_ms: int) -> Freshness:
    """For keys written by more than one feed: each feed's latest write of the key (by seq, the
    order within a feed), which feed's is newest by writer timestamp (two writes whose possible
    true times overlap, given fuzz and truncation, are a tie), and whether the feeds' latest
    writes disagree."""
    latest: dict[str, dict[str, KeyState]] = defaultdict(dict)
    last_write: dict[str, int | None] = {}
    for e in classify(rows, policies, now_ms):
        last_write.setdefault(e.feed, None)
        if e.kind == "ok":
            assert e.ts_ms is not None
            last_write[e.feed] = max(e.ts_ms, last_write[e.feed] or e.ts_ms)
        if e.key is None:  # a cleared block: its key is gone
            continue
        placed = e.ts_ms if e.kind in ("ok", "skew") else None  # a bogus time orders nothing
        latest[e.key][e.feed] = KeyState(e.feed, e.seq, placed, e.deleted, e.value)
    shared = {k: v for k, v in latest.items() if len(v) > 1}
    pol = {f: policies.get(f) or FeedPolicy(None, 1) for f in last_write}
    stats = {
        f: FeedFreshness(
            f,
            0,
            0,
            0,
            last_write[f],
            (policies.get(f) or FeedPolicy(None, 1)).describe(),
            (policies.get(f) or FeedPolicy(None, 1)).fuzz_ms,
        )
        for f in sorted(last_write)
    }
    keys: list[KeyFreshness] = []
    disagreeing = 0
    for key in sorted(shared):
        states = sorted(shared[key].values(), key=lambda s: s.feed)
        for s in states:
            stats[s.feed].shared += 1
        timed = sorted((s for s in states if s.ts_ms is not None), key=lambda s: -(s.ts_ms or 0))
        newest: str | None = None
        if timed:
            top = timed[0]
            top_ts = top.ts_ms or 0
            rivals = [s for s in timed[1:] if top_ts - (s.ts_ms or 0) <= pol[s.feed].late_ms + pol[top.feed].early_ms]
            if rivals:
                for s in (top, *rivals):
                    stats[s.feed].ties += 1
            else:
                newest = top.feed
                stats[top.feed].newest += 1
        disagree = len({(s.deleted, None if s.deleted else s.value) for s in states}) > 1
        disagreeing += disagree
        keys.append(KeyFreshness(key, newest, states, disagree))
    keys.sort(key=lambda k: (not k.disagree, k.key))
    return Freshness(list(stats.values()), len(shared), disagreeing, keys)
