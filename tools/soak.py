#!/usr/bin/env python3
"""Soak: the whole pipeline for N minutes, with processes killed under it (issue 38).

What runs, every process a real one on loopback (each killed with SIGKILL and restarted in turn):

- peer A (`feedlog serve`) hosting half of the producers' feeds;
- peer B (`feedlog serve --follow`) hosting the other half and following A's feeds;
- a commit owner (`feedlog owner serve`) that ratifies every commit of the table;
- a streaming ingest (`feedlog ingest --stream --trigger --maintain-every`) of all the feeds, A's
  read through B (multi-hop), into a managed table with short retentions, so that checkpoints,
  log cleanup and vacuum all happen during the run;
- here: the producers (threads putting at a fixed total rate, each put acknowledged after its fsync)
  and a reader that polls the table and notes when each acknowledged entry becomes visible.

Every `--report-every` it prints one line: entries acknowledged vs landed (lost, duplicated),
freshness p50/p99 (put acknowledged -> row visible to the reader), RSS of every process, live data
files, log files and checkpoint bytes, table bytes on disk vs live bytes. At the end it stops the
producers, lets the ingest catch up, and checks: nothing acknowledged is missing, no (feed, seq) is
in the table twice, `feedlog audit` passes, and deltalake and DuckDB read the same rows as we do. It
writes the series to `soak.json` and draws them as one PNG (`--plot`). Exit 0 when every check held.

    python tools/soak.py --minutes 30 --out /tmp/soak --plot /tmp/soak/soak.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from feedlog.errors import Conflict, FeedlogError
from feedlog.log.feed import Write
from feedlog.replication.client import FeedClient

DAY_MS = 86_400_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and every descendant (a Spark ingest's JVM included)."""
    total = 0
    todo = [pid]
    seen: set[int] = set()
    while todo and len(seen) < 256:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                kids = (task / "children").read_text().split()
                todo.extend(int(k) for k in kids)
        except (OSError, ValueError):
            continue
    return total


@dataclass
class Proc:
    """One of the pipeline's processes: started, killed with SIGKILL, restarted, stopped."""

    name: str
    argv: list[str]
    log: Path
    ready: str | None = None  # a log line that says it is up
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self, timeout: float = 60.0) -> None:
        with self.log.open("ab") as out:
            out.write(f"\n--- start {self.starts + 1}: {' '.join(self.argv)}\n".encode())
            out.flush()
            size = self.log.stat().st_size
            self.popen = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        self.starts += 1
        if self.ready is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.log.open("rb") as f:
                f.seek(size)
                if self.ready.encode() in f.read():
                    return
            if self.popen.poll() is not None:
                raise SystemExit(f"soak: {self.name} exited with {self.popen.returncode} at start; see {self.log}")
            time.sleep(0.1)
        raise SystemExit(f"soak: {self.name} did not say {self.ready!r} within {timeout:.0f} s; see {self.log}")

    def kill9(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()  # SIGKILL: no clean-up of any kind
            self.popen.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT if self.name == "ingest" else signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=30)
        return self.popen.returncode

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def rss(self) -> int:
        return rss_bytes(self.popen.pid) if self.alive() and self.popen is not None else 0


@dataclass
class Ledger:
    """What the producers were told (acknowledged puts) and what the reader saw land, with times."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    acked: dict[tuple[str, int], float] = field(default_factory=dict)  # (feed hex, seq) -> monotonic ack
    landed: dict[tuple[str, int], float] = field(default_factory=dict)  # first seen by the reader
    duplicates: set[tuple[str, int]] = field(default_factory=set)  # seen in two live files at once
    freshness: list[tuple[float, float]] = field(default_factory=list)  # (when seen, seconds)
    put_errors: int = 0
    fatal: list[str] = field(default_factory=list)  # errors no kill explains: the run fails

    def ack(self, feed: str, seq: int, at: float) -> None:
        with self.lock:
            self.acked[(feed, seq)] = at
            seen = self.landed.get((feed, seq))
            if seen is not None:  # the row was visible before the ack reached us
                self.freshness.append((seen, max(seen - at, 0.0)))

    def see(self, rows: Sequence[tuple[str, int]], at: float) -> None:
        with self.lock:
            for r in rows:
                if r in self.landed:
                    continue
                self.landed[r] = at
                acked = self.acked.get(r)
                if acked is not None:
                    self.freshness.append((at, at - acked))


def produce(
    client_for: Callable[[], FeedClient], key: bytes, rate: float, ledger: Ledger, stop: threading.Event, who: str
) -> None:
    """Puts one entry at a time at `rate`/s; a put that fails (its peer killed) is retried on a new
    connection. Its ack may have been lost, so the entry may land unacknowledged: that is not a loss."""
    feed = key.hex()
    n = 0
    gap = 1.0 / rate
    nxt = time.monotonic()
    client: FeedClient | None = None
    while not stop.is_set():
        nxt += gap
        pause = nxt - time.monotonic()
        if pause > 0:
            stop.wait(pause)
        elif pause < -5:  # far behind (a peer was down): do not burst to catch up
            nxt = time.monotonic()
        try:
            if client is None:
                client = client_for()
            value = json.dumps({"n": n, "who": who}).encode()
            ack = client.put(key, [Write(f"/{who}/{n}", value)], timeout=5)[0]
            ledger.ack(feed, ack.seq, time.monotonic())
            n += 1
        except FeedlogError as e:
            with ledger.lock:
                ledger.put_errors += 1
                if not e.retryable and not isinstance(e, Conflict):  # our mistake, not the kills'
                    ledger.fatal.append(f"producer {who}: {e}")
                    break
            if client is not None:
                client.close()
                client = None
            stop.wait(0.5)
    if client is not None:
        client.close()


def read_table_rows(table: Path, path: str) -> list[tuple[str, int]]:
    f = pq.read_table(table / urllib.parse.unquote(path), columns=["feed", "seq"])
    return list(zip(f.column("feed").to_pylist(), f.column("seq").to_pylist(), strict=True))


def watch_table(table: Path, ledger: Ledger, stop: threading.Event, every: float = 0.1) -> None:
    """Polls the table as any reader would (its backfilled `_delta_log`) and notes each row's first sight."""
    from feedlog.delta import DeltaTable
    from feedlog.delta.managed.protocol import OwnerNotConsulted

    # (a reader that does not ask the owner is what we mean to be: deltalake and DuckDB are such readers)
    warnings.simplefilter("ignore", OwnerNotConsulted)

    seen_files: set[str] = set()
    t: Any = None
    while not stop.wait(every):
        try:
            if t is None:
                t = DeltaTable.open(table)
            files = t.snapshot().files()
        except FeedlogError:
            t = None
            continue
        now = time.monotonic()
        rows: list[tuple[str, int]] = []
        for a in files:
            if a.path in seen_files:
                continue
            seen_files.add(a.path)
            with contextlib.suppress(OSError):  # removed under us (vacuum): its rows are elsewhere
                rows.extend(read_table_rows(table, a.path))
        if rows:
            ledger.see(rows, now)


def table_figures(table: Path) -> dict[str, Any]:
    """Live data files and bytes, log files, the newest checkpoint's bytes, and data bytes on disk."""
    from feedlog.delta import DeltaTable

    out: dict[str, Any] = {}
    try:
        files = DeltaTable.open(table).snapshot().files()
    except FeedlogError as e:
        return {"error": str(e)}
    out["live_files"] = len(files)
    out["live_bytes"] = sum(a.size for a in files)
    log = table / "_delta_log"
    names = [p for p in log.iterdir() if p.is_file()] if log.is_dir() else []
    out["log_files"] = len(names)
    ckpts = [p for p in names if ".checkpoint" in p.name and p.name.endswith(".parquet")]
    if ckpts:
        newest = max(int(p.name.split(".")[0]) for p in ckpts)
        out["checkpoint_bytes"] = sum(p.stat().st_size for p in ckpts if int(p.name.split(".")[0]) == newest)
    else:
        out["checkpoint_bytes"] = 0
    disk = 0
    for root, dirs, fs in os.walk(table):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        disk += sum(os.path.getsize(os.path.join(root, f)) for f in fs if f.endswith(".parquet"))
    out["disk_bytes"] = disk
    return out


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def mib(n: int) -> str:
    return f"{n / (1 << 20):.0f}M"


class Soak:
    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.out = Path(ns.out).resolve()
        self.table = self.out / "table"
        self.ledger = Ledger()
        self.stop_producers = threading.Event()
        self.stop_reader = threading.Event()
        self.series: list[dict[str, Any]] = []
        self.kills: list[dict[str, Any]] = []
        self.t0 = time.monotonic()
        self.procs: dict[str, Proc] = {}
        self.keys_a: list[bytes] = []
        self.keys_b: list[bytes] = []

    def feedlog(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "feedlog", *args]

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f}s] {text}", flush=True)

    # ---- set-up ----------------------------------------------------------------------------

    def setup(self) -> None:
        if self.out.exists() and any(self.out.iterdir()):
            raise SystemExit(f"soak: {self.out} is not empty; give an empty or new --out")
        self.out.mkdir(parents=True, exist_ok=True)
        port_a, port_b, port_o = free_port(), free_port(), free_port()
        self.addr_a, self.addr_b, self.addr_o = (f"127.0.0.1:{p}" for p in (port_a, port_b, port_o))
        peer = ["--compact-every", "1m"]
        self.procs["peerA"] = Proc(
            "peerA",
            self.feedlog("serve", "--data", str(self.out / "peerA"), "--listen", self.addr_a, *peer),
            self.out / "peerA.log",
            ready="serving",
        )
        self.procs["peerA"].start()
        self.token_a = (self.out / "peerA" / "_peer" / "write-token").read_text().strip()
        half = self.ns.producers // 2
        with FeedClient(self.addr_a, token=self.token_a) as c:
            self.keys_a = [c.create(timestamps="exact").key for _ in range(half)]
        follows = [a for k in self.keys_a for a in ("--follow", f"grpc://{self.addr_a}/{k.hex()}")]
        self.procs["peerB"] = Proc(
            "peerB",
            self.feedlog("serve", "--data", str(self.out / "peerB"), "--listen", self.addr_b, *peer, *follows),
            self.out / "peerB.log",
            ready="serving",
        )
        self.procs["peerB"].start()
        self.token_b = (self.out / "peerB" / "_peer" / "write-token").read_text().strip()
        with FeedClient(self.addr_b, token=self.token_b) as c:
            self.keys_b = [c.create(timestamps="exact").key for _ in range(self.ns.producers - half)]
        self.procs["owner"] = Proc(
            "owner",
            self.feedlog(
                "owner", "serve", "--db", str(self.out / "owner.db"), "--listen", self.addr_o, "--root", str(self.out)
            ),
            self.out / "owner.log",
            ready="owner_serving",
        )
        self.procs["owner"].start()
        self.create_table()
        sources = [f"grpc://{self.addr_b}/{k.hex()}" for k in self.keys_a + self.keys_b]
        ingest = self.feedlog(
            "ingest",
            *sources,
            str(self.table),
            "--owner",
            f"grpc://{self.addr_o}",
            "--stream",
            "--engine",
            self.ns.engine,
            *(["--trigger", self.ns.trigger] if self.ns.trigger else []),
            "--maintain-every",
            self.ns.maintain_every,
        )
        self.procs["ingest"] = Proc("ingest", ingest, self.out / "ingest.log", ready="streaming")
        self.procs["ingest"].start(timeout=180)

    def create_table(self) -> None:
        """The managed table, made before the stream with short retentions so that log cleanup and
        vacuum delete during the run (the stream would make it too, with the defaults)."""
        from feedlog.lake.rows import SCHEMA
        from feedlog.lake.sink import open_or_create

        t = open_or_create(str(self.table), SCHEMA, {"owner": f"grpc://{self.addr_o}"})  # keeps its token
        t.set_properties(self.properties())

    def properties(self) -> dict[str, str]:
        return {
            "delta.deletedFileRetentionDuration": f"interval {self.ns.retain_seconds} seconds",
            "delta.logRetentionDuration": f"interval {self.ns.retain_seconds * 2} seconds",
            "delta.enableExpiredLogCleanup": "true",
            "delta.autoOptimize.autoCompact": "true",
            "delta.checkpointInterval": "10",
        }

    # ---- the run ---------------------------------------------------------------------------

    def clients(self, addr: str, token: str) -> Callable[[], FeedClient]:
        return lambda: FeedClient(addr, token=token)

    def run(self) -> int:
        self.setup()
        rate = self.ns.rate / self.ns.producers
        threads = [
            threading.Thread(
                target=produce,
                args=(self.clients(addr, tok), key, rate, self.ledger, self.stop_producers, f"p{i}"),
                name=f"producer-{i}",
                daemon=True,
            )
            for i, (key, addr, tok) in enumerate(
                [(k, self.addr_a, self.token_a) for k in self.keys_a]
                + [(k, self.addr_b, self.token_b) for k in self.keys_b]
            )
        ]
        reader = threading.Thread(
            target=watch_table, args=(self.table, self.ledger, self.stop_reader), name="reader", daemon=True
        )
        for t in threads:
            t.start()
        reader.start()
        self.say(
            f"soak: {self.ns.producers} producers at {self.ns.rate}/s for {self.ns.minutes} min; "
            f"kill -9 every {self.ns.kill_every}s; output in {self.out}"
        )
        end = self.t0 + self.ns.minutes * 60
        next_report = time.monotonic() + self.ns.report_every
        next_sample = time.monotonic() + self.ns.sample_every
        next_kill = time.monotonic() + self.ns.kill_every
        victims = ["ingest", "peerA", "owner", "peerB"]
        k = 0
        while time.monotonic() < end:
            time.sleep(min(1.0, max(end - time.monotonic(), 0)))
            for p in self.procs.values():  # a process that died by itself is a finding: restart, count it
                if not p.alive():
                    self.say(f"{p.name} exited by itself ({p.popen.returncode if p.popen else '?'}); restarting")
                    self.kills.append({"t": time.monotonic() - self.t0, "proc": p.name, "self": True})
                    p.start(timeout=180)
            now = time.monotonic()
            if self.ns.kill_every and now >= next_kill:
                v = self.procs[victims[k % len(victims)]]
                k += 1
                self.say(f"kill -9 {v.name}")
                v.kill9()
                self.kills.append({"t": now - self.t0, "proc": v.name})
                time.sleep(self.ns.down_seconds)
                v.start(timeout=180)
                self.say(f"{v.name} restarted")
                next_kill = time.monotonic() + self.ns.kill_every
            if now >= next_sample:
                self.sample()
                next_sample = now + self.ns.sample_every
            if now >= next_report:
                self.report(self.series[-1] if self.series else self.sample())
                next_report = now + self.ns.report_every
        self.stop_producers.set()
        for t in threads:
            t.join(timeout=30)
        return self.finish()

    def sample(self) -> dict[str, Any]:
        now = time.monotonic()
        with self.ledger.lock:
            window = [f for at, f in self.ledger.freshness if at >= now - self.ns.sample_every]
            acked, landed = len(self.ledger.acked), len(self.ledger.landed)
            lost_so_far = sum(1 for r, at in self.ledger.acked.items() if r not in self.ledger.landed and now - at > 60)
        s: dict[str, Any] = {
            "t": now - self.t0,
            "acked": acked,
            "landed": landed,
            "late_60s": lost_so_far,
            "fresh_p50": pct(window, 0.5),
            "fresh_p99": pct(window, 0.99),
            "rss": {n: p.rss() for n, p in self.procs.items()},
            **table_figures(self.table),
        }
        self.series.append(s)
        return s

    def report(self, s: dict[str, Any]) -> None:
        rss = " ".join(f"{n}={mib(v)}" for n, v in s["rss"].items())
        self.say(
            f"acked {s['acked']} landed {s['landed']} (unlanded after 60 s: {s['late_60s']}) | freshness "
            f"p50 {s['fresh_p50'] * 1000:.0f} ms p99 {s['fresh_p99'] * 1000:.0f} ms | rss {rss} | "
            f"live files {s.get('live_files')} log files {s.get('log_files')} checkpoint "
            f"{s.get('checkpoint_bytes', 0) // 1024} KiB | data on disk {mib(s.get('disk_bytes', 0))} "
            f"live {mib(s.get('live_bytes', 0))}"
        )

    # ---- the end ---------------------------------------------------------------------------

    def finish(self) -> int:
        self.say("producers stopped; waiting for the ingest to land every acknowledged entry")
        deadline = time.monotonic() + self.ns.drain_seconds
        while time.monotonic() < deadline:
            with self.ledger.lock:
                missing = [r for r in self.ledger.acked if r not in self.ledger.landed]
            if not missing:
                break
            time.sleep(0.5)
        self.sample()
        self.stop_reader.set()
        code = self.procs["ingest"].stop()
        self.say(f"ingest stopped (exit {code})")
        failures: list[str] = []
        with self.ledger.lock:
            missing = sorted(r for r in self.ledger.acked if r not in self.ledger.landed)
        ours = self.read_ours()
        dups = len(ours) - len(set(ours))
        ours_set = set(ours)
        lost = [r for r in self.ledger.acked if r not in ours_set]
        extra = len(ours_set) - len(ours_set & set(self.ledger.acked))
        if lost or missing:
            failures.append(f"{len(lost)} acknowledged entries are not in the table (e.g. {lost[:3] or missing[:3]})")
        if not self.ledger.acked:
            failures.append("no put was acknowledged")
        if dups:
            failures.append(f"{dups} rows are in the table twice")
        audit = self.audit()
        if audit:
            failures.append(audit)
        failures += self.other_readers(ours_set)
        failures += self.ledger.fatal
        for name in ("peerA", "peerB", "owner"):
            self.procs[name].stop()
        everything = [f for _, f in self.ledger.freshness]
        summary = {
            "minutes": self.ns.minutes,
            "acked": len(self.ledger.acked),
            "rows": len(ours),
            "lost": len(lost),
            "duplicated": dups,
            "landed_unacknowledged": extra,
            "put_errors": self.ledger.put_errors,
            "kills": self.kills,
            "freshness_ms": {
                "p50": pct(everything, 0.5) * 1000,
                "p99": pct(everything, 0.99) * 1000,
                "max": max(everything, default=float("nan")) * 1000,
            },
            "final": self.series[-1] if self.series else {},
            "failures": failures,
        }
        (self.out / "soak.json").write_text(json.dumps({"summary": summary, "series": self.series}, indent=1))
        if self.ns.plot:
            draw(self.series, self.kills, Path(self.ns.plot), self.ns)
            self.say(f"picture: {self.ns.plot}")
        self.say(
            f"done: {summary['acked']} acknowledged, {summary['rows']} rows, {summary['lost']} lost, {dups} duplicated,"
            f" {extra} landed whose ack was lost; freshness p50 {summary['freshness_ms']['p50']:.0f} ms p99 "
            f"{summary['freshness_ms']['p99']:.0f} ms max {summary['freshness_ms']['max']:.0f} ms; "
            f"{len([k for k in self.kills if not k.get('self')])} kills, "
            f"{len([k for k in self.kills if k.get('self')])} unplanned exits"
        )
        for f in failures:
            self.say(f"FAILED: {f}")
        if any(k.get("self") for k in self.kills):
            self.say("FAILED: a process exited by itself during the run")
            return 1
        return 1 if failures else 0

    def read_ours(self) -> list[tuple[str, int]]:
        from feedlog.delta import DeltaTable

        data = DeltaTable.open(self.table).to_arrow().select(["feed", "seq"])
        return list(zip(data.column("feed").to_pylist(), data.column("seq").to_pylist(), strict=True))

    def audit(self) -> str | None:
        keys = [a for k in self.keys_a + self.keys_b for a in ("--key", k.hex())]
        r = subprocess.run(
            self.feedlog("audit", str(self.table), *keys, "--owner", f"grpc://{self.addr_o}", "--json"),
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.say(f"audit: exit {r.returncode}")
        return None if r.returncode == 0 else f"audit failed (exit {r.returncode}): {(r.stdout + r.stderr)[-400:]}"

    def other_readers(self, ours: set[tuple[str, int]]) -> list[str]:
        out = []
        try:
            import deltalake
            import pyarrow as pa

            # (QueryBuilder: to_pyarrow_table can abort the process at exit with pyarrow 25-26)
            query = deltalake.QueryBuilder().register("t", deltalake.DeltaTable(str(self.table)))
            d = pa.table(query.execute("SELECT feed, seq FROM t").read_all())
            theirs = set(zip(d.column("feed").to_pylist(), d.column("seq").to_pylist(), strict=True))
            self.say(f"deltalake: {len(theirs)} rows, {'agrees' if theirs == ours else 'DISAGREES'}")
            if theirs != ours or d.num_rows != len(ours):
                out.append(f"deltalake reads {d.num_rows} rows, we read {len(ours)}")
        except ImportError:
            out.append("deltalake is not installed (pip install 'feedlog[readers]')")
        try:
            import duckdb
            import duckdb_extension_delta

            ext = next(Path(duckdb_extension_delta.__file__).parent.glob("extensions/*/delta.duckdb_extension"))
            con = duckdb.connect()
            con.execute(f"LOAD '{ext}'")
            rows = con.execute(f"SELECT feed, seq FROM delta_scan('{self.table}')").fetchall()
            theirs = {(f, int(s)) for f, s in rows}
            self.say(f"duckdb: {len(rows)} rows, {'agrees' if theirs == ours else 'DISAGREES'}")
            if theirs != ours or len(rows) != len(ours):
                out.append(f"duckdb reads {len(rows)} rows, we read {len(ours)}")
        except ImportError:
            out.append("duckdb is not installed (pip install 'feedlog[readers]')")
        return out

    def close(self) -> None:
        self.stop_producers.set()
        self.stop_reader.set()
        for p in self.procs.values():
            with contextlib.suppress(Exception):
                p.stop(timeout=10)


def draw(series: list[dict[str, Any]], kills: list[dict[str, Any]], path: Path, ns: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] / 60 for s in series]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8), sharex=True)
    a = axes[0][0]
    a.plot(t, [s["fresh_p50"] * 1000 for s in series], label="p50")
    a.plot(t, [s["fresh_p99"] * 1000 for s in series], label="p99")
    a.set_ylabel("freshness, ms (put ack -> row visible)")
    a.set_yscale("log")
    a.legend()
    a = axes[0][1]
    for name in series[0]["rss"] if series else []:
        a.plot(t, [s["rss"].get(name, 0) / (1 << 20) for s in series], label=name)
    a.set_ylabel("RSS, MiB")
    a.legend()
    a = axes[1][0]
    a.plot(t, [s.get("live_files", 0) for s in series], label="live data files")
    a.plot(t, [s.get("log_files", 0) for s in series], label="_delta_log files")
    a.set_ylabel("files")
    b = a.twinx()
    b.plot(t, [s.get("checkpoint_bytes", 0) / 1024 for s in series], color="grey", ls=":", label="checkpoint KiB")
    b.set_ylabel("checkpoint KiB")
    lines = a.get_lines() + b.get_lines()
    a.legend(lines, [str(x.get_label()) for x in lines], loc="upper left")
    a = axes[1][1]
    a.plot(t, [s.get("disk_bytes", 0) / (1 << 20) for s in series], label="data on disk")
    a.plot(t, [s.get("live_bytes", 0) / (1 << 20) for s in series], label="live data")
    a.set_ylabel("MiB")
    a.legend()
    for row in axes:
        for a in row:
            a.set_xlabel("minutes")
            for k in kills:
                a.axvline(k["t"] / 60, color="red" if k.get("self") else "#ccc", lw=0.8)
    fig.suptitle(
        f"feedlog soak: {ns.producers} producers at {ns.rate}/s, {ns.engine} engine, "
        f"trigger {ns.trigger or 'default'}, maintain every {ns.maintain_every}; grey lines: kill -9"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--out", required=True, help="an empty or new directory for every process's data and logs")
    p.add_argument("--plot", help="draw the series into this PNG")
    p.add_argument("--producers", type=int, default=8)
    p.add_argument("--rate", type=float, default=200.0, help="puts/s across all producers")
    p.add_argument("--engine", default="local", choices=("local", "spark"))
    p.add_argument("--trigger", help="the stream's trigger interval (default: the engine's, 100ms local, 1s Spark)")
    p.add_argument("--maintain-every", default="1m")
    p.add_argument("--retain-seconds", type=int, default=60, help="the table's data-file retention (log: twice)")
    p.add_argument("--kill-every", type=float, default=180.0, help="seconds between kills (0: none)")
    p.add_argument("--down-seconds", type=float, default=2.0, help="how long a killed process stays down")
    p.add_argument("--report-every", type=float, default=300.0)
    p.add_argument("--sample-every", type=float, default=15.0)
    p.add_argument("--drain-seconds", type=float, default=120.0)
    ns = p.parse_args(argv)
    if not 0 < ns.minutes <= 24 * 60 or ns.producers < 2 or not 0 < ns.rate <= 100_000:
        p.error("--minutes must be in (0, 1440], --producers >= 2, --rate in (0, 100000]")
    return ns


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse(argv)
    # SIGTERM (and SIGINT, which a shell's background job ignores) stop the run and every process it started
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    soak = Soak(ns)
    try:
        return soak.run()
    except KeyboardInterrupt:
        return 130
    finally:
        soak.close()


if __name__ == "__main__":
    from feedlog.leave import leave

    leave(main())  # (every process it started is stopped by then; the interpreter's shutdown is skipped)
