"""Commit-owner benchmark: the PostgreSQL state engine vs the SQLite engine, in the same run.

8 writer processes (by default), each committing small commits (commitInfo + one
`txn` action) to its own managed table for a fixed time, through `feedlog owner
serve` on SQLite (WAL, fsync on every commit: the reference) and then through
`feedlog owner serve --db postgresql://...` (a schema of its own, dropped at the
end). Both owners backfill each commit (batch size 1). p50/p99 are per commit,
from the start of its transaction to its acknowledgement. Every run is checked
as in bench_owner.py: every version once, every writer's txn sequence complete.
Target: PostgreSQL >= 0.8x SQLite's commits/s.

    python tools/bench/bench_owner_pg.py                     # 5 s per engine, local PostgreSQL
    python tools/bench/bench_owner_pg.py --quick --dsn postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from urllib.parse import quote

import grpc
import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_owner import SCHEMA, free_port, pct, run_writers

from feedlog.delta import DeltaTable
from feedlog.delta.managed import OWNER_ENV, Binding

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"


def start_owner(db: str, root: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "feedlog", "owner", "serve", "--db", db]
    proc = subprocess.Popen([*cmd, "--listen", f"127.0.0.1:{port}", "--root", str(root)], stderr=subprocess.DEVNULL)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
    return proc, f"grpc://127.0.0.1:{port}"


def measure(db: str, root: Path, writers: int, seconds: float, batch_size: int) -> tuple[float, list[float], int]:
    owner, endpoint = start_owner(db, root)
    try:
        paths = [root / f"t{i}" for i in range(writers)]
        binding = Binding.parse(endpoint, batch_size)
        tokens = [DeltaTable.create(p, SCHEMA, owner=binding).owner_token or "" for p in paths]
        os.environ[OWNER_ENV] = endpoint  # the writer processes trust this owner
        return run_writers(paths, tokens, seconds)
    finally:
        owner.send_signal(signal.SIGTERM)
        owner.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=1, help="the owners' backfill batch size (default 1)")
    ap.add_argument("--dsn", default=os.environ.get("FEEDLOG_TEST_POSTGRES") or DEFAULT_DSN)
    args = ap.parse_args()
    seconds = args.seconds or (1.5 if args.quick else 5.0)
    schema = f"feedlog_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in args.dsn else "?"
    pg_url = f"{args.dsn}{sep}options={quote(f'-csearch_path={schema}')}"
    try:
        with tempfile.TemporaryDirectory(prefix="bench-owner-pg-") as d:
            tmp = Path(d)
            (tmp / "sqlite").mkdir()
            (tmp / "pg").mkdir()
            lite = measure(str(tmp / "owner.db"), tmp / "sqlite", args.writers, seconds, args.batch_size)
            pg = measure(pg_url, tmp / "pg", args.writers, seconds, args.batch_size)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    print(f"{args.writers} writers, each on its own table, {seconds:g} s per engine, backfill batch {args.batch_size}")
    print(f"{'engine':>10}  {'commits/s':>9}  {'p50 ms':>7}  {'p99 ms':>7}  checked")
    for name, (rate, lat, count) in (("sqlite", lite), ("postgresql", pg)):
        print(
            f"{name:>10}  {rate:>9.0f}  {pct(lat, 50):>7.2f}  {pct(lat, 99):>7.2f}  "
            f"{count} versions, none lost or duplicated"
        )
    print(f"postgresql / sqlite commits/s: {pg[0] / lite[0]:.2f}x (target >= 0.8x)")


if __name__ == "__main__":
    main()
