"""Commit-owner benchmark: the PostgreSQL state engine vs the SQLite engine, in the same run.

8 writer processes (by default), each committing small commits (commitInfo + one
`txn` action) to its own managed table for a fixed time, through `feedlog owner
serve` on SQLite (WAL, fsync on every commit: the reference) and through
`feedlog owner serve --db postgresql://...` (a schema of its own, dropped at the
end). Both owners backfill each commit (batch size 1). The two engines take
turns, round after round (SQLite first in odd rounds, PostgreSQL first in even
ones), so that a machine whose load drifts weighs on both alike; the ratio is
the median of the rounds' ratios. p50/p99 are per commit over every round, from
the start of its transaction to its acknowledgement. Every round is checked as
in bench_owner.py: every version once, every writer's txn sequence complete.
Target: PostgreSQL >= 0.8x SQLite's commits/s.

    python tools/bench/bench_owner_pg.py                     # 3 rounds of 5 s per engine, local PostgreSQL
    python tools/bench/bench_owner_pg.py --quick --dsn postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import grpc
import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_owner import SCHEMA, free_port, pct, start_writers

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


@dataclass
class Engine:
    name: str
    owner: subprocess.Popen[bytes]
    endpoint: str
    tables: list[tuple[Path, str]]  # (path, token), one per writer
    rates: list[float] = field(default_factory=list)
    lat: list[float] = field(default_factory=list)
    count: int = 0
    owner_cpu: float = 0.0  # seconds of the owner process's CPU during the rounds


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_engine(name: str, db: str, root: Path, writers: int, batch_size: int) -> Engine:
    owner, endpoint = start_owner(db, root)
    binding = Binding.parse(endpoint, batch_size)
    os.environ[OWNER_ENV] = endpoint  # the checks here trust the owner the tables name
    paths = [root / f"t{i}" for i in range(writers)]
    tables = [(p, DeltaTable.create(p, SCHEMA, owner=binding).owner_token or "") for p in paths]
    return Engine(name, owner, endpoint, tables)


def run_round(engine: Engine, tag: str, seconds: float) -> float:
    """One writer process per table for `seconds`; the commits/s, after checking every table."""
    env = {**os.environ, OWNER_ENV: engine.endpoint}  # the writer processes trust this owner
    jobs = [(path, token, f"{tag}w{i}") for i, (path, token) in enumerate(engine.tables)]
    procs = start_writers(jobs, seconds, env)
    cpu0 = cpu_seconds(engine.owner.pid)
    results = [json.loads(p.communicate(timeout=seconds + 120)[0]) for p in procs]
    engine.owner_cpu += cpu_seconds(engine.owner.pid) - cpu0
    if any(p.returncode for p in procs):
        raise SystemExit(f"{engine.name}: a writer failed")
    os.environ[OWNER_ENV] = engine.endpoint
    total = 0
    for (path, token), r in zip(engine.tables, results, strict=True):
        total += check(path, token, r)
        engine.lat.extend(r["lat"])
    engine.count += total
    rate = total / seconds
    engine.rates.append(rate)
    return rate


def check(path: Path, token: str, r: dict[str, object]) -> int:
    """This round's versions of one table: contiguous, the latest, and its writer's txn sequence complete."""
    versions: list[int] = r["versions"]  # type: ignore[assignment]
    if not versions:
        return 0  # a writer that started too late to commit (a very busy machine): nothing to check
    table = DeltaTable.open(path, owner_token=token)
    if versions != list(range(versions[0], versions[0] + len(versions))) or table.version() != versions[-1]:
        raise SystemExit(f"{path}: LOST OR DUPLICATE VERSIONS: {len(versions)} acknowledged, latest {table.version()}")
    if table.snapshot().txn_version(str(r["who"])) != len(versions) - 1:
        raise SystemExit(f"{path}: writer {r['who']}: txn versions lost")
    return len(versions)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 round of 1.5 s per engine")
    ap.add_argument("--seconds", type=float, help="per engine and round (default 5)")
    ap.add_argument("--rounds", type=int, help="rounds of both engines (default 3)")
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=1, help="the owners' backfill batch size (default 1)")
    ap.add_argument("--dsn", default=os.environ.get("FEEDLOG_TEST_POSTGRES") or DEFAULT_DSN)
    args = ap.parse_args()
    seconds = args.seconds or (1.5 if args.quick else 5.0)
    rounds = args.rounds or (1 if args.quick else 3)
    schema = f"feedlog_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in args.dsn else "?"
    pg_url = f"{args.dsn}{sep}options={quote(f'-csearch_path={schema}')}"
    engines: list[Engine] = []
    ratios = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-owner-pg-") as d:
            tmp = Path(d)
            (tmp / "sqlite").mkdir()
            (tmp / "pg").mkdir()
            engines.append(open_engine("sqlite", str(tmp / "owner.db"), tmp / "sqlite", args.writers, args.batch_size))
            engines.append(open_engine("postgresql", pg_url, tmp / "pg", args.writers, args.batch_size))
            lite, pg = engines
            for n in range(rounds):
                order = (lite, pg) if n % 2 == 0 else (pg, lite)
                rate = {e.name: run_round(e, f"r{n}", seconds) for e in order}
                ratios.append(rate["postgresql"] / rate["sqlite"] if rate["sqlite"] else float("nan"))
                print(
                    f"round {n + 1}: sqlite {rate['sqlite']:.0f}/s, postgresql {rate['postgresql']:.0f}/s, "
                    f"ratio {ratios[-1]:.2f}x",
                    flush=True,
                )
    finally:
        for e in engines:
            e.owner.send_signal(signal.SIGTERM)
            e.owner.wait(30)
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    print(
        f"{args.writers} writers, each on its own table, {rounds} x {seconds:g} s per engine (alternating), "
        f"backfill batch {args.batch_size}"
    )
    print(f"{'engine':>10}  {'commits/s':>9}  {'p50 ms':>7}  {'p99 ms':>7}  {'owner cpu/commit':>16}  checked")
    for e in engines:
        cpu = f"{e.owner_cpu / e.count * 1000:.2f} ms" if e.count else "-"
        print(
            f"{e.name:>10}  {statistics.mean(e.rates):>9.0f}  {pct(e.lat, 50):>7.2f}  {pct(e.lat, 99):>7.2f}  "
            f"{cpu:>16}  {e.count} versions, none lost or duplicated"
        )
    print(
        f"postgresql / sqlite commits/s: {statistics.median(ratios):.2f}x median of {rounds} rounds "
        f"({', '.join(f'{r:.2f}' for r in ratios)}) (target >= 0.8x)"
    )


if __name__ == "__main__":
    main()
