"""Each console page's data, from the library functions the CLI's `--json` output comes from.

The feed pages show what `feedlog info|cat|history --json` print for a local feed (`Feed.info`,
`entries.record_json`), a proof as `feedlog prove` writes it (`proofs.proof_json`), the activity
and recent events of `feedlog activity|recent` (`lake.insight`) drawn by `lake.plots`; the table
pages what `feedlog table history|info --json` and `feedlog audit --json` print
(`HistoryEntry.to_json`, `DeltaTable.info`, `audit.audit_table`), with each commit's provenance
(`audit.provenance_of`). So a page and the CLI cannot disagree on what a feed or a table holds.

Every list is cut to a page with a hard cap (`MAX_PAGE`), every read is bounded in entries
(`MAX_SCAN`, `MAX_HISTORY`, `MAX_ACTIVITY`) and in bytes held (a peer's key history keeps only
the page it shows; the activity keeps no value, `MAX_ACTIVITY_BYTES`); and the heavy pages (a
feed's activity, a key's history, a table's audit) are computed a few at a time (`Gate`): one
more is a 503 with Retry-After, not another thread's worth of memory. Nothing here writes.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument, NotFound, ResourceExhausted
from ..log import entries, merkle
from ..log.crypto import Verifier
from ..log.feed import Feed
from ..log.proofs import proof_json
from ..log.timestamps import parse_duration
from .catalog import Catalog, FeedRef, TableRef

#: the most rows one page lists, whatever the query asks
MAX_PAGE = 100
#: entries per page by default
PAGE = 25
#: commits a table page or a commit page reads back from the newest (`feedlog table history` for more)
MAX_HISTORY = 10_000
#: entries a peer's feed is scanned for a key's history (a local feed has an index)
MAX_SCAN = 200_000
#: entries read for a feed's activity picture (beyond: `feedlog activity` on the ingested table)
MAX_ACTIVITY = 1_000_000
#: bytes of rows (values left out) the activity of one feed may hold
MAX_ACTIVITY_BYTES = 64 << 20
#: the columns `insight.activity` and `insight.recent` read: no value
ACTIVITY_COLUMNS = ("feed", "seq", "key", "deleted", "timestamp", "cleared", "stat")
#: seconds a refused heavy page tells the browser to wait (Retry-After)
RETRY_AFTER_S = 2.0
#: recent events listed on a feed's page
RECENT = 20
#: the longest key a query may ask for (a hyperdb key is a path; longer is not a key of ours)
MAX_KEY = 4096


def page_size(asked: int | None, default: int = PAGE) -> int:
    """A page's size: what was asked, between 1 and MAX_PAGE."""
    return default if asked is None else max(1, min(asked, MAX_PAGE))


class Gate:
    """At most `room` computations of one heavy kind at once. One more is refused at once
    (ResourceExhausted: the page is a 503 with Retry-After) rather than queued: Starlette runs
    pages in up to 40 threads, and each heavy page holds its rows while it works."""

    def __init__(self, what: str, room: int) -> None:
        self.what = what
        self._room = threading.BoundedSemaphore(room)

    @contextmanager
    def __call__(self) -> Iterator[None]:
        if not self._room.acquire(blocking=False):
            raise ResourceExhausted(f"the console is busy with {self.what}: try again shortly", RETRY_AFTER_S)
        try:
            yield
        finally:
            self._room.release()


#: a feed's activity (its picture too) and a key's history: two at a time
HEAVY = Gate("other activity and history pages", 2)
#: a table's audit reads the whole table: one at a time
AUDIT = Gate("another audit", 1)


# ---- feeds ----------------------------------------------------------------------------------------


@contextmanager
def _local(ref: FeedRef) -> Iterator[Feed]:
    assert ref.source.path is not None
    feed = Feed.open(ref.source.path, writable=False)
    try:
        yield feed
    finally:
        feed.close()


def signed_state_ok(feed: Feed) -> bool:
    """Whether the stored roots hash to the signed tree hash and the feed key signed it (cheap: no
    block is re-hashed; `feedlog verify` re-hashes them all)."""
    core = feed.core
    state = core.state
    if state.length == 0:
        return True
    roots = merkle.nodes_for_roots(state.length, core.node)
    return merkle.roots_hash(roots) == state.tree_hash and Verifier(feed.key).verify(state.signature, state.signable())


def feed_summary(ref: FeedRef) -> dict[str, Any]:
    """One row of the feeds page: `feedlog info --json`'s fields and how the feed was checked."""
    if ref.local:
        with _local(ref) as feed:
            info = feed.info()
            ok = signed_state_ok(feed)
        verified = "signed root verifies with the key" if ok else "SIGNED ROOT DOES NOT VERIFY"
        return {**info, "index": ref.index, "name": ref.name, "where": "local", "verified": verified, "ok": ok}
    src = ref.source
    length, size = src.signed_size()  # the signature over `length` is checked with the key
    ctype = entries.decode_header(src.header()) if length else None
    last = _peer_records(ref, length - 1, length)[0] if length > 1 else None
    return {
        "index": ref.index,
        "name": ref.name,
        "where": "peer",
        "key": src.key_hex,
        "type": ctype,
        "length": length,
        "byte_length": size,
        "writable": False,
        "timestamps": None,  # a peer's word on the writer's policy is not shown as fact
        "ttl": None,
        "last_timestamp": None if last is None or last.cleared else last.timestamp,
        "verified": "signed length verified with the key",
        "ok": True,
    }


def _peer_records(ref: FeedRef, start: int, end: int) -> list[entries.Record]:
    """Entries [start, end) of a peer's feed, each block verified against a signed tree as read."""
    return list(_peer_iter(ref, start, end))


def _peer_iter(ref: FeedRef, start: int, end: int) -> Iterator[entries.Record]:
    """`_peer_records` a batch at a time: a long range is never held whole."""
    src = ref.source
    ctype = entries.decode_header(src.header())
    for batch in src.read(max(start, 1), end):
        for n, block in enumerate(batch.blocks):
            seq = batch.start + n
            yield entries.cleared_record(seq) if block is None else entries.decode_record(ctype, seq, block)


@dataclass(frozen=True)
class EntryPage:
    length: int
    rows: list[dict[str, Any]]  # record_json of each entry, newest first
    newer: int | None  # the `before` of the page above this one (None: this is the newest)
    older: int | None  # the `before` of the next page down (None: seq 1 is on this page)


def entries_page(ref: FeedRef, before: int | None, size: int, now_ms: int) -> EntryPage:
    """Entries with seq < `before` (default: all), newest first, `size` of them: as `cat --json`."""
    if ref.local:
        with _local(ref) as feed:
            length = feed.length
            end = length if before is None else max(1, min(before, length))
            start = max(1, end - size)
            records = list(feed.records(start, end))
    else:
        length = ref.source.signed_length()
        end = length if before is None else max(1, min(before, length))
        start = max(1, end - size)
        records = _peer_records(ref, start, end) if end > start else []
    rows = [entries.record_json(r, now_ms) for r in reversed(records)]
    newer = None if end >= length else min(end + size, length)
    return EntryPage(length, rows, newer, start if start > 1 else None)


def entry(ref: FeedRef, seq: int, now_ms: int) -> dict[str, Any]:
    """One entry as `cat --json --raw` prints it (its block too)."""
    if seq < 1:
        raise InvalidArgument("seq 0 is the feed header; entries start at 1")
    if ref.local:
        with _local(ref) as feed:
            if seq >= feed.length:
                raise NotFound(f"no seq {seq}: the feed has entries 1..{feed.length - 1}")
            r = feed.record(seq)
    else:
        length = ref.source.signed_length()
        if seq >= length:
            raise NotFound(f"no seq {seq}: the feed has entries 1..{length - 1}")
        r = _peer_records(ref, seq, seq + 1)[0]
    return entries.record_json(r, now_ms, raw=True)


def key_history(ref: FeedRef, key: str, now_ms: int) -> dict[str, Any]:
    """Every entry of `key`, newest first (as `feedlog history --json`, reversed), and the forget
    entry that withdrew it, if one did (its earlier payloads are cleared: not listed)."""
    if len(key) > MAX_KEY:
        raise InvalidArgument(f"a key of {len(key):,} characters: keys here are at most {MAX_KEY:,}")
    with HEAVY():
        if ref.local:
            with _local(ref) as feed:  # the feed's key index: only this key's entries are read
                rows = feed.history(key)
                forgotten = feed.forgotten(key)
            total = len(rows)
            scanned = None
        else:
            # a peer has no index: scan its newest MAX_SCAN entries a batch at a time, keeping only the
            # page shown (with their values) and a count, not every record read
            length = ref.source.signed_length()
            start = max(1, length - MAX_SCAN)
            last: deque[entries.Record] = deque(maxlen=MAX_PAGE)
            total = 0
            for r in _peer_iter(ref, start, length) if length > 1 else ():
                if not r.cleared and r.invalid is None and r.key == key:
                    last.append(r)
                    total += 1
            rows = list(last)
            forgotten = rows[-1].seq if rows and rows[-1].forget else None
            scanned = (start, length)
    shown = [entries.record_json(r, now_ms) for r in reversed(rows[-MAX_PAGE:])]
    return {"key": key, "rows": shown, "total": total, "forgotten": forgotten, "scanned": scanned}


def proof(ref: FeedRef, seq: int) -> dict[str, Any]:
    """`feedlog prove FEED SEQ`'s document (checked with the key before it is offered)."""
    if seq < 1:
        raise InvalidArgument("seq 0 is the feed header; prove an entry (seq 1 or more)")
    return proof_json(ref.source.proof(seq), ref.source.key)


# ---- activity and recent events (feedlog activity / recent) ----------------------------------------


class _Rows:
    """The rows and policies `insight.read_feeds` gave for a feed at a length: the page and its
    picture are two requests, and a feed that did not grow need not be read twice. The rows have
    no values (`ACTIVITY_COLUMNS`), and the kept ones hold `max_bytes` at most, all feeds together."""

    def __init__(self, keep: int = 4, max_bytes: int = 2 * MAX_ACTIVITY_BYTES) -> None:
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[bytes, int], Any] = OrderedDict()
        self.keep = keep
        self.max_bytes = max_bytes

    def get(self, ref: FeedRef) -> Any:
        from ..lake.insight import read_feeds

        length = ref.source.signed_length()
        at = (ref.source.key, length)
        with self._lock:
            if at in self._kept:
                self._kept.move_to_end(at)
                return self._kept[at]
        if length <= 1:
            raise NotFound("the feed has no entries yet")
        got = read_feeds([ref.source], limit=MAX_ACTIVITY, columns=ACTIVITY_COLUMNS, max_bytes=MAX_ACTIVITY_BYTES)
        with self._lock:
            self._kept[at] = got
            while len(self._kept) > self.keep or (
                len(self._kept) > 1 and sum(rows.nbytes for rows, _ in self._kept.values()) > self.max_bytes
            ):
                self._kept.popitem(last=False)
        return got


ROWS = _Rows()
#: matplotlib's pyplot is not thread-safe: one picture at a time
_PLOT = threading.Lock()


def activity(ref: FeedRef, every: str, now_ms: int) -> dict[str, Any]:
    """`feedlog activity FEED --every EVERY --json` for the feed, and its recent events
    (`feedlog recent FEED --json`): buckets never finer than the feed's timestamp policy."""
    from ..lake import insight

    every_ms = parse_duration(every)
    with HEAVY():
        rows, policies = ROWS.get(ref)
        a = insight.activity(rows, every_ms, policies, now_ms)
        events, unplaced = insight.recent(rows, policies, now_ms, None, RECENT)
    return {
        "activity": a.to_json(),
        "buckets": len(a.buckets),
        "recent": [
            {"timestamp": e.ts_ms, "seq": e.seq, "kind": e.kind, "key": e.key, "flags": list(e.flags)} for e in events
        ],
        "unplaced": unplaced,
    }


def activity_svg(ref: FeedRef, every: str, now_ms: int) -> bytes:
    """The picture `feedlog activity FEED --every EVERY --plot FILE.svg` draws, as bytes."""
    from ..lake import insight
    from ..lake.plots import draw_activity

    every_ms = parse_duration(every)
    with HEAVY():
        rows, policies = ROWS.get(ref)
        a = insight.activity(rows, every_ms, policies, now_ms)
    out = io.BytesIO()
    with _PLOT:
        draw_activity(a, out, "svg")
    return out.getvalue()


# ---- tables ---------------------------------------------------------------------------------------


def open_table(catalog: Catalog, ref: TableRef) -> Any:
    from ..delta import DeltaTable

    return DeltaTable.open(
        ref.location, owner=list(catalog.owners) or None, storage_options=dict(catalog.storage_options) or None
    )


def _maintenance(history: list[Any], info: dict[str, Any], listing: Any) -> dict[str, Any]:
    """Last checkpoint, the vacuum horizon and the newest maintenance commits (from the history read)."""
    last: dict[str, Any] = {}
    for e in history:  # newest first
        op = (e.operation or "").upper()
        for kind in ("VACUUM END", "OPTIMIZE", "VACUUM START"):
            if op == kind and kind not in last:
                last[kind] = {"version": e.version, "timestamp": e.timestamp}
    checkpoints = sorted(listing.checkpoints)
    r = info["retention"]
    return {
        "last_checkpoint": checkpoints[-1] if checkpoints else None,
        "checkpoints": len(checkpoints),
        "vacuum_horizon_ms": r["time_travel_horizon_ms"],
        "deleted_file_retention_ms": r["deleted_file_retention_ms"],
        "log_retention_ms": r["log_retention_ms"],
        "oldest_version": r["oldest_version"],
        "last_vacuum": last.get("VACUUM END"),
        "last_optimize": last.get("OPTIMIZE"),
    }


def commit_json(e: Any, backfilled: int) -> dict[str, Any]:
    """A history row (`table history --json`) with the feed ranges it landed and whether the owner
    has backfilled it into `_delta_log` yet."""
    from ..lake.audit import provenance_of

    return {
        **e.to_json(),
        "provenance": [_range(p) for p in provenance_of(e.commit_info)],
        "backfilled": e.version <= backfilled,
    }


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _range(p: dict[str, Any]) -> dict[str, Any]:
    """One feed range of a commit's provenance (`lake.sink`: `to` is exclusive), as the page lists it;
    the table is data like any other, so each field is checked, not assumed."""
    first, to = _int_or_none(p.get("from")), _int_or_none(p.get("to"))
    signed = p.get("signed")
    return {
        "key": str(p.get("key", "")),
        "first": first,
        "last": None if to is None else to - 1,
        "rows": _int_or_none(p.get("rows")),
        "signed_length": _int_or_none(signed.get("length")) if isinstance(signed, dict) else None,
    }


def table_page(catalog: Catalog, ref: TableRef, offset: int, size: int) -> dict[str, Any]:
    """The table's history (newest first, `size` from `offset`), `table info --json`, maintenance
    state and the owner's ratified commits not yet backfilled."""
    from ..delta.log import list_log

    if offset < 0 or offset + size > MAX_HISTORY:
        raise InvalidArgument(f"the console shows the newest {MAX_HISTORY:,} commits; use `feedlog table history`")
    t = open_table(catalog, ref)
    info = t.info()
    history = t.history(min(MAX_HISTORY, max(offset + size, 200)))
    backfilled = info["backfilled_version"]
    rows = [commit_json(e, backfilled) for e in history[offset : offset + size]]
    unbackfilled = [commit_json(e, backfilled) for e in history if e.version > backfilled][:MAX_PAGE]
    return {
        "info": info,
        "rows": rows,
        "offset": offset,
        "more": len(history) > offset + size,
        "unbackfilled": unbackfilled,
        "maintenance": _maintenance(history, info, list_log(t.storage)),
    }


def commit(catalog: Catalog, ref: TableRef, version: int) -> dict[str, Any]:
    """One commit: its history row, provenance and whole commitInfo."""
    t = open_table(catalog, ref)
    info = t.info()
    latest = info["version"]
    if not 0 <= version <= latest:
        raise NotFound(f"no version {version}: the table is at version {latest}")
    if latest - version >= MAX_HISTORY:
        raise InvalidArgument(f"the console reads the newest {MAX_HISTORY:,} commits; use `feedlog table history`")
    for e in t.history(latest - version + 1):
        if e.version == version:
            return {**commit_json(e, info["backfilled_version"]), "commit_info": e.commit_info}
    raise NotFound(f"version {version} is no longer in the log (cleaned up)")


def audit(catalog: Catalog, ref: TableRef) -> dict[str, Any]:
    """`feedlog audit TABLE --json` with the lines it prints: a read of the table, nothing written."""
    from ..lake.audit import audit_table

    owner = catalog.owners[0] if catalog.owners else None
    with AUDIT():  # every file of the table is read: one audit at a time
        report = audit_table(
            ref.location, None, None, owner=owner, storage_options=dict(catalog.storage_options) or None
        )
    return {
        **report.to_json(),
        "summary": report.summary(),
        "feed_lines": [{"summary": f.summary(), "details": f.details()} for f in report.feeds],
    }
