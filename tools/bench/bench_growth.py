"""How cost grows: per-operation cost at growing sizes, its fitted exponent, and a verdict per row.

Rows (issue 38, "How cost grows"), each beside a reference with none of feedlog's code,
measured in the same run and printed as a ratio:
  feed       durable `Feed.append` of one entry, `Feed.get(key)`, `Core.get(seq)` and reopen +
             first `get`, at feed lengths 10k, 100k, 1M, 10M (reference: os.write + fdatasync
             of the same bytes to a plain file; os.pread of the same block; open + pread + close)
  snapshot   `DeltaTable.open(path).snapshot()`, cold (the process's state cache emptied) and warm
             (the table read before in this process), on tables of 1k, 10k, 100k commits
             (checkpoint every 10, as the sink writes them; 5 commits after the last one) and of
             10k, 100k, 1M live files (reference: `deltalake.DeltaTable(path)` on the same table)
  ingest     `feedlog ingest --engine local`'s job (`ingest_batch(None, ...)`) of 1, 10, 100, 1,000
             small feeds (100 entries each) into a new table (reference: reading every feed's log
             file + `deltalake.write_deltalake` of as many rows)
  owner      one commit through `feedlog owner serve` (SQLite, loopback) to one of N managed
             tables, N = 1, 10, 100, 1,000 (reference: a raw sqlite3 read-and-update transaction,
             WAL + synchronous=FULL, on a table of N rows)

The exponent is the slope of log(cost) on log(size); a row fails when it exceeds what its
stated growth allows (growth.py), and then the bench exits 1.

Fixtures (feeds up to 10M entries, ~1.5 GB; logs of 100k commits; checkpoints of 1M files) are
built once with feedlog's own writer and checkpoint code and kept in /tmp/feedlog-growth
(`--cache DIR`, ~2.6 GB); the first full run builds them (~12 min on 2 busy cores), later runs
reuse them (a full run ~6 min, --quick ~30 s).
The live-file tables name data files that are not there: a snapshot load reads the log only.

    nice -n 10 python tools/bench/bench_growth.py --quick            # every size /10; 3 sizes a row
    nice -n 10 python tools/bench/bench_growth.py                    # the issue's sizes
    nice -n 10 python tools/bench/bench_growth.py --only feed,owner  # some parts
    nice -n 10 python tools/bench/bench_growth.py --markdown out.md  # the table as Markdown too
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import deltalake
import pyarrow as pa
from bench_owner import start_owner  # a sibling script (tools/bench is on sys.path when run)
from growth import Row, cache_dir, table

from feedlog.clock import SystemClock
from feedlog.delta import DeltaTable, LocalStorage
from feedlog.delta.actions import Add
from feedlog.delta.checkpoint import checkpoint_path
from feedlog.delta.committer import commit_path
from feedlog.delta.log import Checkpoint, Listing, forget_states
from feedlog.delta.maintenance import write_checkpoint
from feedlog.delta.managed import Binding
from feedlog.delta.storage import FileInfo
from feedlog.lake.ingest import ingest_batch
from feedlog.log.feed import Feed, Write

VALUE = b"v" * 16
#: marks a fixture as complete (written last): a build interrupted half way is built again
DONE = "growth-fixture.json"


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def medians(fns: list[Callable[[], object]], least: int = 5, most: int = 25, budget: float = 3.0) -> list[float]:
    """The median time of each of `fns`, run in turn (a busy machine's load hits them alike) at least
    `least` and at most `most` rounds, stopping after `budget` seconds past `least`."""
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    for r in range(most):
        for fn, ts in zip(fns, times, strict=True):
            ts.append(timed(fn))
        if r + 1 >= least and time.perf_counter() - start > budget:
            break
    return [statistics.median(ts) for ts in times]


def cached(path: Path, build: Callable[[Path], None], what: str) -> Path:
    """`path` as `build` makes it, built in a scratch directory beside it and renamed into place."""
    if (path / DONE).exists():
        return path
    scratch = path.with_name(path.name + ".building")
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(path, ignore_errors=True)
    scratch.mkdir(parents=True)
    print(f"  building {what} in {path} (once; kept for later runs)...", flush=True)
    t = timed(lambda: build(scratch))
    (scratch / DONE).write_text(json.dumps({"what": what, "seconds": round(t, 1)}))
    scratch.rename(path)
    print(f"  built in {t:.1f} s", flush=True)
    return path


# ---- feed: append and get at growing lengths -----------------------------------------------------


def build_feed(n: int) -> Callable[[Path], None]:
    def build(d: Path) -> None:
        # durable by its settings (fsync on), written without fsync while it is built
        with Feed.create(d / "feed", timestamps="exact") as feed:
            feed.core.fsync = False
            for lo in range(0, n, 1000):
                feed.append([Write(f"/k/{i}", VALUE) for i in range(lo, min(lo + 1000, n))])
        _sync_all(d / "feed")  # no dirty pages left for the first measured fsync to write out

    return build


def _read_all(directory: Path) -> None:
    for p in directory.iterdir():
        with open(p, "rb") as f:
            while f.read(8 << 20):
                pass


def _sync_all(directory: Path) -> None:
    for p in directory.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def feed_rows(cache: Path, sizes: list[int], rows: dict[str, Row]) -> None:
    append = rows.setdefault("append", Row("durable append, one entry", "entries", "O(log n)", "write+fdatasync"))
    get = rows.setdefault("get", Row("get(key), random key", "entries", "O(log n)", "pread"))
    seq = rows.setdefault("seq", Row("get(seq), random seq", "entries", "O(1)", "pread"))
    reopen = rows.setdefault("reopen", Row("open + first get(key)", "entries", "O(log n)", "open+pread+close"))
    rng = random.Random(38)
    for n in sizes:
        path = cached(cache / f"feed-{n}", build_feed(n), f"a feed of {n:,} entries") / "feed"
        # Every file read once first: what is measured is the feed's work, not this shared machine's
        # page cache (a 10M-entry feed is ~1.5 GB; a cold 64 KiB chunk costs a disk read per lookup)
        _read_all(path)
        raw = path.parent / "raw-append"
        block = None
        with Feed.open(path) as feed:
            assert feed.core.fsync, "the measured appends are durable"
            length = feed.length
            fd = os.open(raw, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                ours, ref = [], []
                for i in range(8):  # warm-up, then alternating pairs of rounds
                    feed.append([Write(f"/a/{length}-{i}", VALUE)])
                block = feed.core.get(feed.length - 1)
                assert block is not None
                for _ in range(10):
                    t = time.perf_counter()
                    for _ in range(20):
                        feed.append([Write(f"/a/{feed.length}", VALUE)])
                    ours.append((time.perf_counter() - t) / 20)
                    t = time.perf_counter()
                    for _ in range(20):
                        os.write(fd, block)
                        os.fdatasync(fd)
                    ref.append((time.perf_counter() - t) / 20)
            finally:
                os.close(fd)
                raw.unlink()
            append.add(n, statistics.median(ours), statistics.median(ref))

            # Steady state first: each 64 KiB chunk of the key index is CRC-checked the first time a
            # lookup touches it, once per open; a long-running reader has checked them all.
            warm = min(4 * n, 40_000)
            for _ in range(warm):
                feed.get(f"/k/{rng.randrange(n)}")
            log = os.open(path / "log", os.O_RDONLY)
            try:
                g_ours, g_ref, s_ours, s_ref = [], [], [], []
                for _ in range(12):
                    keys = [rng.randrange(n) for _ in range(200)]
                    where = [feed.core._entry(k + 1) for k in keys]  # key /k/i is at seq i + 1
                    t = time.perf_counter()
                    for k in keys:
                        feed.get(f"/k/{k}")
                    g_ours.append((time.perf_counter() - t) / len(keys))
                    t = time.perf_counter()
                    for k in keys:
                        feed.core.get(k + 1)
                    s_ours.append((time.perf_counter() - t) / len(keys))
                    t = time.perf_counter()
                    for off, size, _ in where:
                        os.pread(log, size, off)
                    g_ref.append((time.perf_counter() - t) / len(keys))
                    s_ref.append(g_ref[-1])
                r = feed.get(f"/k/{keys[0]}")
                assert r is not None and r.value == VALUE
                # the first round only warms the page cache up
                get.add(n, statistics.median(g_ours[1:]), statistics.median(g_ref[1:]))
                seq.add(n, statistics.median(s_ours[1:]), statistics.median(s_ref[1:]))
                where_of = {k: feed.core._entry(k + 1) for k in (rng.randrange(n) for _ in range(25))}
            finally:
                os.close(log)
        # a new key each round (an open reads only what its first lookup touches), the two in turn
        o_ours, o_ref = [], []
        start = time.perf_counter()
        for k, (off, size, _) in where_of.items():
            # the reference first: it pays for reading the block from disk, ours for its index
            o_ref.append(timed(partial(_open_pread, path / "log", off, size)))
            o_ours.append(timed(partial(_open_get, path, f"/k/{k}")))
            if len(o_ours) >= 9 and time.perf_counter() - start > 2.0:
                break
        reopen.add(n, statistics.median(o_ours), statistics.median(o_ref))


def _open_get(path: Path, key: str) -> None:
    with Feed.open(path) as feed:
        assert feed.get(key) is not None


def _open_pread(path: Path, off: int, size: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, size, off)
    finally:
        os.close(fd)


# ---- snapshot load: many commits, many live files -------------------------------------------------

SCHEMA = pa.schema([("id", pa.int64())])
#: commits after the newest checkpoint in every snapshot fixture (a reader replays them)
TAIL = 5


def _checkpoint(storage: LocalStorage, last: int | None, version: int) -> None:
    """A checkpoint of `version` by the writer's code (`write_checkpoint`, as the sink calls it every
    10 commits), given the log from the previous checkpoint on: the listing a writer would get from
    `_delta_log` is built here, since listing 100k files 10k times would make the build O(n^2)."""
    start = 0 if last is None else last
    commits = {v: FileInfo(commit_path(v), None, None) for v in range(start, version + 1)}
    cps = {} if last is None else {last: Checkpoint(last, "classic", (FileInfo(checkpoint_path(last), None, None),))}
    write_checkpoint(storage, Listing(commits, cps, {}), SystemClock().now_ms(), version)


def build_commits(n: int) -> Callable[[Path], None]:
    """`n` commits of a stream's shape without its data (commitInfo + its txn marker), a checkpoint
    every 10, then TAIL more: the log's length grows, the table's state does not."""

    def build(d: Path) -> None:
        storage = LocalStorage(d / "table", fsync=False)
        t = DeltaTable.create(storage, SCHEMA)
        last = None
        for v in range(1, n + TAIL + 1):
            tx = t.transaction("STREAMING UPDATE", refresh=False)
            tx.set_txn("feedlog:growth", v)
            assert t.commit(tx).version == v
            if v % 10 == 0 and v <= n:
                _checkpoint(storage, last, v)
                last = v
            if v % 10_000 == 0:
                print(f"    {v:,} commits", flush=True)

    return build


def build_files(n: int) -> Callable[[Path], None]:
    """A table of `n` live files: 10 commits of n/10 adds each (with stats, as feedlog writes them),
    the writer's checkpoint at version 10, then TAIL txn-only commits."""

    def build(d: Path) -> None:
        storage = LocalStorage(d / "table", fsync=False)
        t = DeltaTable.create(storage, SCHEMA)
        now = SystemClock().now_ms()
        per = n // 10
        for c in range(10):
            tx = t.transaction("WRITE", refresh=False)
            tx.add_files(
                Add(
                    f"part-{i:08d}-growth.snappy.parquet",
                    {},
                    1024,
                    now,
                    stats=f'{{"numRecords":100,"minValues":{{"id":{i * 100}}},"maxValues":{{"id":{i * 100 + 99}}},'
                    f'"nullCount":{{"id":0}}}}',
                )
                for i in range(c * per, (c + 1) * per)
            )
            assert t.commit(tx).version == c + 1
        _checkpoint(storage, None, 10)
        for v in range(11, 11 + TAIL):
            tx = t.transaction("WRITE", refresh=False)
            tx.set_txn("feedlog:growth", v)
            assert t.commit(tx).version == v

    return build


def _cold_open(path: Path) -> None:
    forget_states()
    DeltaTable.open(path).snapshot()


def _warm_open(path: Path) -> None:
    DeltaTable.open(path).snapshot()


def snapshot_rows(cache: Path, commits: list[int], files: list[int], rows: dict[str, Row]) -> None:
    for kind, sizes, unit, builder, growth in (
        ("commits", commits, "commits", build_commits, "O(1)"),
        ("files", files, "live files", build_files, "O(n)"),
    ):
        cold = rows.setdefault(
            f"snapshot-{kind}-cold",
            Row("snapshot load, cold", unit, growth, "deltalake.DeltaTable"),
        )
        warm = rows.setdefault(
            f"snapshot-{kind}-warm",
            Row("snapshot load, warm", unit, growth, "deltalake.DeltaTable"),
        )
        ckpt = rows.setdefault(
            f"checkpoint-{kind}",
            Row("checkpoint, the sink's step every 10 commits", unit, growth, "deltalake.DeltaTable (load)"),
        )
        for n in sizes:
            path = cached(cache / f"{kind}-{n}", builder(n), f"a table of {n:,} {unit}") / "table"
            big = n >= 1_000_000
            deltalake.DeltaTable(str(path))  # (its first load reads the files into the page cache)
            r, c, w = medians(
                [partial(deltalake.DeltaTable, str(path)), partial(_cold_open, path), partial(_warm_open, path)],
                least=5 if big else 7,
            )
            cold.add(n, c, r)
            warm.add(n, w, r)
            # the sink's `table.checkpoint(v)` on a handle it keeps, of the fixture's own newest
            # checkpointed version: the same state rewritten in place, so the fixture stays as built
            handle = DeltaTable.open(path)
            version = n if kind == "commits" else 10
            (cp,) = medians([partial(handle.checkpoint, version)], least=1 if big else 3, budget=1.0)
            ckpt.add(n, cp, r)
            del handle
            forget_states()
            gc.collect()


# ---- ingest: many small feeds --------------------------------------------------------------------

FEED_ENTRIES = 100


def build_small_feeds(count: int) -> Callable[[Path], None]:
    def build(d: Path) -> None:
        for f in range(count):
            with Feed.create(d / f"f{f:04d}", timestamps="exact", fsync=False) as feed:
                feed.append([Write(f"/sensor/{i % 10}", VALUE) for i in range(FEED_ENTRIES)])

    return build


def _reference_ingest(feeds: list[Path], where: Path) -> None:
    """None of our code: read every feed's log file, then delta-rs writes as many rows as we land."""
    for f in feeds:
        (f / "log").read_bytes()
    n = len(feeds) * FEED_ENTRIES
    rows = pa.table(
        {
            "feed": pa.array([f.name for f in feeds for _ in range(FEED_ENTRIES)]),
            "seq": pa.array([i for _ in feeds for i in range(1, FEED_ENTRIES + 1)], pa.int64()),
            "key": pa.array([f"/sensor/{i % 10}" for i in range(n)]),
            "value": pa.array([VALUE] * n, pa.binary()),
        }
    )
    deltalake.write_deltalake(str(where), rows)


def ingest_rows(cache: Path, sizes: list[int], rows: dict[str, Row]) -> None:
    row = rows.setdefault(
        "ingest",
        Row(
            f"ingest --engine local, feeds of {FEED_ENTRIES} entries",
            "feeds",
            "O(n)",
            "read logs + write_deltalake",
        ),
    )
    root = cached(cache / f"small-feeds-{max(sizes)}", build_small_feeds(max(sizes)), f"{max(sizes):,} small feeds")
    every = sorted(p for p in root.iterdir() if p.is_dir())
    with tempfile.TemporaryDirectory(prefix="growth-ingest-", dir=cache) as tmp:
        for n in sizes:
            feeds = every[:n]
            ours, ref = [], []
            for i in range(3 if n < 1000 else 1):
                where = Path(tmp) / f"t-{n}-{i}"
                ours.append(timed(partial(_ingest, feeds, where)))
                ref.append(timed(partial(_reference_ingest, feeds, Path(tmp) / f"r-{n}-{i}")))
            row.add(n, statistics.median(ours), statistics.median(ref))


def _ingest(feeds: list[Path], where: Path) -> None:
    r = ingest_batch(None, [str(f) for f in feeds], str(where), progress=lambda _m: None)
    assert r.rows == len(feeds) * FEED_ENTRIES, r  # (block 0, the header, is no row)


# ---- the commit owner: many tables ---------------------------------------------------------------


class RawSqlite:
    """The reference: what one ratification is at its core, in sqlite3 alone (no feedlog code)."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("CREATE TABLE IF NOT EXISTS tables (id TEXT PRIMARY KEY, version INTEGER)")
        self.db.execute("CREATE TABLE IF NOT EXISTS commits (id TEXT, version INTEGER, PRIMARY KEY (id, version))")
        self.count = 0

    def grow(self, n: int) -> None:
        while self.count < n:
            self.db.execute("INSERT INTO tables VALUES (?, 0)", (f"t{self.count}",))
            self.count += 1

    def commit(self, i: int) -> None:
        tid = f"t{i}"
        self.db.execute("BEGIN IMMEDIATE")
        (v,) = self.db.execute("SELECT version FROM tables WHERE id = ?", (tid,)).fetchone()
        self.db.execute("INSERT INTO commits VALUES (?, ?)", (tid, v + 1))
        self.db.execute("UPDATE tables SET version = ? WHERE id = ?", (v + 1, tid))
        self.db.execute("COMMIT")


def owner_rows(sizes: list[int], rows: dict[str, Row]) -> None:
    row = rows.setdefault(
        "owner",
        Row("commit through `feedlog owner serve`", "tables", "O(1)", "raw sqlite3 transaction"),
    )
    create = rows.setdefault(
        "owner-create",
        Row("create a managed table", "tables", "O(1)", "raw sqlite3 transaction"),
    )
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="growth-owner-", dir="/tmp") as d:
        tmp = Path(d)
        owner, endpoint = start_owner(tmp)
        old = os.environ.get("FEEDLOG_OWNER")
        os.environ["FEEDLOG_OWNER"] = endpoint  # the tables trust the owner they name
        raw = RawSqlite(tmp / "raw.db")
        paths: list[Path] = []
        tokens: dict[Path, str] = {}
        try:
            for n in sizes:
                made = []
                while len(paths) < n:
                    p = tmp / "tables" / f"t{len(paths):05d}"
                    t0 = time.perf_counter()
                    t = DeltaTable.create(p, SCHEMA, owner=Binding.parse(endpoint))
                    made.append(time.perf_counter() - t0)
                    tokens[p] = t.owner_token or ""
                    paths.append(p)
                raw.grow(n)
                sample = rng.sample(paths, min(len(paths), 20))
                handles = [DeltaTable.open(p, owner_token=tokens[p]) for p in sample]
                for h in handles:
                    h.version()
                ours, ref, made_ref = [], [], []
                for r in range(8):
                    lat = []
                    for j, h in enumerate(handles * max(1, 10 // len(handles))):
                        tx = h.transaction("WRITE", refresh=False)
                        tx.set_txn("growth", r * 1000 + j)
                        t0 = time.perf_counter()
                        h.commit(tx)
                        lat.append(time.perf_counter() - t0)
                    ours.append(statistics.median(lat))
                    t0 = time.perf_counter()
                    for _ in range(10):
                        raw.commit(rng.randrange(n))
                    ref.append((time.perf_counter() - t0) / 10)
                    t0 = time.perf_counter()
                    raw.db.execute("INSERT INTO tables VALUES (?, 0)", (f"x{n}-{r}",))
                    made_ref.append(time.perf_counter() - t0)
                row.add(n, statistics.median(ours[1:]), statistics.median(ref[1:]))
                if made:
                    create.add(n, statistics.median(made[-20:]), statistics.median(made_ref))
        finally:
            if old is None:
                os.environ.pop("FEEDLOG_OWNER", None)
            else:
                os.environ["FEEDLOG_OWNER"] = old
            raw.db.close()
            owner.send_signal(signal.SIGTERM)
            owner.wait(30)


# ---- main ----------------------------------------------------------------------------------------

PARTS = ("feed", "snapshot", "ingest", "owner")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run: ~1-2 min once built)")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts, of {','.join(PARTS)}")
    ap.add_argument("--cache", help="where built fixtures are kept (default /tmp/feedlog-growth)")
    ap.add_argument("--markdown", type=Path, help="also write the table as Markdown to this file")
    args = ap.parse_args()
    only = set(args.only.split(","))
    if only - set(PARTS):
        ap.error(f"unknown part(s) {sorted(only - set(PARTS))}; choose among {','.join(PARTS)}")
    cache = cache_dir(args.cache)
    q = args.quick
    feed_sizes = [1_000, 10_000, 100_000] if q else [10_000, 100_000, 1_000_000, 10_000_000]
    commit_sizes = [100, 1_000, 10_000] if q else [1_000, 10_000, 100_000]
    file_sizes = [1_000, 10_000, 100_000] if q else [10_000, 100_000, 1_000_000]
    feed_counts = [1, 10, 100] if q else [1, 10, 100, 1_000]
    table_counts = [1, 10, 100] if q else [1, 10, 100, 1_000]
    print(
        f"deltalake {deltalake.__version__}, pyarrow {pa.__version__}, {os.cpu_count()} cpus, "
        f"load {os.getloadavg()[0]:.1f}; fixtures in {cache}",
        flush=True,
    )
    rows: dict[str, Row] = {}
    if "feed" in only:
        print("feed", flush=True)
        feed_rows(cache, feed_sizes, rows)
    if "snapshot" in only:
        print("snapshot load", flush=True)
        snapshot_rows(cache, commit_sizes, file_sizes, rows)
    if "ingest" in only:
        print("ingest", flush=True)
        ingest_rows(cache, feed_counts, rows)
    if "owner" in only:
        print("owner", flush=True)
        owner_rows(table_counts, rows)
    out = table(list(rows.values()))
    print()
    print(out)
    if args.markdown:
        args.markdown.write_text(out + "\n")
    worse = [r.what for r in rows.values() if len(r.sizes) >= 2 and not r.verdict().ok]
    if worse:
        print(f"\ngrows worse than expected: {'; '.join(worse)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
