"""Commit-owner benchmark: ratified commits/s through the gRPC owner vs the filesystem committer.

For 1, 4 and 8 writer processes committing small commits (commitInfo + one
`txn` action) for a fixed time, all to ONE table (contended: losers rebase and
retry) and each to its own table (the owner serving many jobs), each committer
measured in the same run:
  filesystem   put-if-absent of `_delta_log/<v>.json` (Delta's default; the reference)
  grpc owner   stage `_delta_log/_commits/<v>.<uuid>.json`, ratify through
               `feedlog owner serve` (its own process, SQLite WAL, fsync on every
               commit), the owner backfilling each commit (batch size 1)
Lost races rebase and retry, as in production (on the owner, writers that lost
take turns: feedlog/delta/managed/turns.py). p50/p99 are per successful commit,
from the start of its transaction to its acknowledgement; tries are attempts per
commit; cpu is the writers' CPU per commit, owner the owner process's. A
transaction that lost `max_attempts` races in a row is counted ("gave up") and
tried again. At the end
every version 1..N must exist exactly once and every writer's txn versions must
be all there (zero lost or duplicate commits), or the run fails.
Also: backfill throughput (commits copied to `_delta_log/` per second).

    python tools/bench/bench_owner.py            # 5 s per configuration
    python tools/bench/bench_owner.py --quick    # 1.5 s per configuration
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pyarrow as pa

from feedlog.delta import DeltaTable
from feedlog.delta.managed import Binding

WRITER = """
import json, sys, time
from feedlog.delta import DeltaTable
from feedlog.errors import Conflict
path, token, who, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
t = DeltaTable.open(path, owner_token=token or None)
t.version()
print("ready", flush=True)
start_at = float(sys.stdin.readline())  # every writer imported and connected before the clock starts
while time.time() < start_at:
    time.sleep(0.001)
versions, lat, attempts, gave_up, i = [], [], 0, 0, 0
end = start_at + seconds
cpu = time.process_time()
while time.time() < end:
    t0 = time.perf_counter()
    tx = t.transaction("WRITE", refresh=False)  # a writer that keeps its handle: no re-read before each commit
    tx.set_txn(who, i)
    try:
        r = t.commit(tx)
    except Conflict:  # lost max_attempts races in a row: counted, and txn i is tried again
        gave_up += 1
        continue
    lat.append(time.perf_counter() - t0)
    versions.append(r.version)
    attempts += r.attempts
    i += 1
cpu = time.process_time() - cpu
print(json.dumps({"who": who, "versions": versions, "lat": lat, "attempts": attempts, "gave_up": gave_up, "cpu": cpu}))
"""

SCHEMA = pa.schema([("id", pa.int64())])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_owner(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "feedlog", "owner", "serve", "--db", str(tmp / "owner.db")]
    proc = subprocess.Popen([*cmd, "--listen", f"127.0.0.1:{port}", "--root", str(tmp)], stderr=subprocess.DEVNULL)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
    return proc, f"grpc://127.0.0.1:{port}"


def start_writers(
    jobs: list[tuple[Path, str, str]], seconds: float, env: dict[str, str] | None = None
) -> list[subprocess.Popen[str]]:
    """One WRITER process per (path, token, who), all started on the same clock once every one of them
    has imported, opened its table and said so: on a loaded machine that can take many seconds, and
    a fixed head start left writers with no time at all."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), token, who, str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for path, token, who in jobs
    ]
    for p in procs:
        assert p.stdout is not None
        if p.stdout.readline().strip() != "ready":
            raise SystemExit("a writer failed before it was ready")
    start_at = time.time() + 0.2
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(f"{start_at}\n")
        p.stdin.flush()
    return procs


@dataclass
class Run:
    rate: float  # commits/s
    lat: list[float]
    count: int
    attempts: float  # per commit
    gave_up: int  # transactions that lost max_attempts races in a row
    cpu_ms: float  # the writers' CPU per commit
    owner_cpu_ms: float  # the owner process's CPU per commit (nan: no owner, or no /proc)


def process_cpu(pid: int | None) -> float:
    """Seconds of CPU (user + system) process `pid` has used so far; nan where /proc cannot tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def run_writers(paths: list[Path], tokens: list[str], seconds: float, owner_pid: int | None = None) -> Run:
    """One writer process per entry of `paths` (the same path repeated: writers share that table)."""
    jobs = [(path, token, f"w{i}") for i, (path, token) in enumerate(zip(paths, tokens, strict=True))]
    procs = start_writers(jobs, seconds)
    owner_cpu = process_cpu(owner_pid)
    results = [json.loads(p.communicate(timeout=seconds + 120)[0]) for p in procs]
    owner_cpu = process_cpu(owner_pid) - owner_cpu
    if any(p.returncode for p in procs):
        raise SystemExit("a writer failed")
    total = 0
    lat = [x for r in results for x in r["lat"]]
    for path in sorted(set(paths)):
        mine = [r for r, p in zip(results, paths, strict=True) if p == path]
        total += check(path, tokens[paths.index(path)], mine)
    per = 1000 / total
    return Run(
        total / seconds,
        lat,
        total,
        sum(r["attempts"] for r in results) / total,
        sum(r["gave_up"] for r in results),
        sum(r["cpu"] for r in results) * per,
        owner_cpu * per if owner_pid else float("nan"),
    )


def check(path: Path, token: str, results: list[dict[str, Any]]) -> int:
    """Every acknowledged version exactly once, no gaps, every writer's txn sequence complete."""
    versions = sorted(v for r in results for v in r["versions"])
    if not versions:
        raise SystemExit(f"no writer on {path.name} committed anything in the time given (machine too loaded?)")
    table = DeltaTable.open(path, owner_token=token or None)
    latest = table.version()
    # zero lost or duplicate versions, every writer's txn sequence complete
    if versions != list(range(versions[0], versions[0] + len(versions))) or latest != versions[-1]:
        raise SystemExit(f"LOST OR DUPLICATE VERSIONS: {len(versions)} acknowledged, latest {latest}")
    snapshot = table.snapshot()
    for r in results:
        if r["versions"] and snapshot.txn_version(r["who"]) != len(r["versions"]) - 1:
            raise SystemExit(f"writer {r['who']}: txn versions lost")
    return len(versions)


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[int(q) - 1] * 1000 if len(xs) > 1 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--batch-size", type=int, default=1, help="the owner's backfill batch size (default 1)")
    args = ap.parse_args()
    seconds = args.seconds or (1.5 if args.quick else 5.0)
    with tempfile.TemporaryDirectory(prefix="bench-owner-") as d:
        tmp = Path(d)
        owner, endpoint = start_owner(tmp)
        # the writer processes (and the checks here) must trust the owner the tables name
        os.environ["FEEDLOG_OWNER"] = endpoint
        try:
            print(
                f"{'tables':>8} {'writers':>7}  {'fs commits/s':>12}  {'owner commits/s':>15}  {'ratio':>5}  "
                f"{'p50 ms':>7}  {'p99 ms':>7}  {'fs p50':>7}  {'fs p99':>7}  {'tries':>5}  {'fs tries':>8}  "
                f"{'cpu ms':>6}  {'owner':>5}  {'fs cpu':>6}  checked"
            )
            for shared in (True, False):
                for n in (1, 4, 8) if shared else (4, 8):
                    names = [f"{n}{'s' if shared else 'p'}{0 if shared else i}" for i in range(n)]
                    fs_paths = [tmp / f"fs-{x}" for x in names]
                    for p in set(fs_paths):
                        DeltaTable.create(p, SCHEMA)
                    fs = run_writers(fs_paths, [""] * n, seconds)
                    m_paths = [tmp / f"managed-{x}" for x in names]
                    tokens = {}
                    for p in sorted(set(m_paths)):
                        t = DeltaTable.create(p, SCHEMA, owner=Binding.parse(endpoint, args.batch_size))
                        tokens[p] = t.owner_token or ""
                    m = run_writers(m_paths, [tokens[p] for p in m_paths], seconds, owner.pid)
                    gave_up = [f"{r.gave_up} gave up ({what})" for r, what in ((fs, "fs"), (m, "owner")) if r.gave_up]
                    print(
                        f"{'one' if shared else 'one each':>8} {n:>7}  {fs.rate:>12.0f}  {m.rate:>15.0f}  "
                        f"{m.rate / fs.rate:>5.2f}  {pct(m.lat, 50):>7.2f}  {pct(m.lat, 99):>7.2f}  "
                        f"{pct(fs.lat, 50):>7.2f}  {pct(fs.lat, 99):>7.2f}  {m.attempts:>5.2f}  {fs.attempts:>8.2f}  "
                        f"{m.cpu_ms:>6.2f}  {m.owner_cpu_ms:>5.2f}  {fs.cpu_ms:>6.2f}  "
                        f"{m.count} versions, none lost or duplicated{'; ' if gave_up else ''}{', '.join(gave_up)}"
                    )
            # backfill throughput: commits ratified with backfill deferred, then one backfill call
            bf_path = tmp / "backfill"
            t = DeltaTable.create(bf_path, SCHEMA, owner=Binding.parse(endpoint, batch_size=1_000_000))
            n_bf = 300 if args.quick else 1000
            for i in range(n_bf):
                tx = t.transaction("WRITE")
                tx.set_txn("bf", i)
                tx.commit()
            t0 = time.perf_counter()
            done = t.backfill()
            elapsed = time.perf_counter() - t0
            copied = len([p for p in os.listdir(bf_path / "_delta_log") if p.endswith(".json")])
            assert done == n_bf and copied == n_bf + 1, (done, copied)
            print(f"backfill: {n_bf} commits in {elapsed:.2f} s = {n_bf / elapsed:.0f} commits/s (fsync per file)")
        finally:
            owner.send_signal(signal.SIGTERM)
            owner.wait(30)


if __name__ == "__main__":
    main()
