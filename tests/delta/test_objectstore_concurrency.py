"""Concurrent writer processes on one Delta table on S3 (moto's server on loopback, tests/delta/s3.py).

Eight processes, each with its own `DeltaTable.open` on the s3:// URL, append K small batches
through the public transaction API, each batch with the writer's own txn appId and the next of
its versions (`tx.set_txn(app, v)`), all released at once. The filesystem committer decides
every race by conditional put (`If-None-Match: *`) on `_delta_log/<v>.json`. Afterwards: the log
holds versions 0..8K with no gap and nothing after; every writer's commits carry its txn
versions 1..K in order, once each, with exactly that batch's rows; every row is in the table once;
and feedlog, deltalake and DuckDB read the same rows at every version.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import urllib.parse
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from feedlog.delta import DeltaTable
from feedlog.delta.committer import commit_path

from .s3 import S3Server
from .test_objectstore import deltalake_rows, duckdb_rows

WRITERS = 8
BATCHES = 4  # K: batches per writer
ROWS = 3  # rows per batch
DEADLINE_S = 90.0  # for the whole run: start, race, exit

SCHEMA = pa.schema([("writer", pa.string()), ("batch", pa.int64()), ("seq", pa.int64())])

#: one writer process: open the table, say "ready", wait for "go" on stdin, then append its
#: batches through the transaction API and print [[txn version, committed version, attempts], ...]
WORKER = """
import json, sys
import pyarrow as pa
import pyarrow.parquet as pq
from feedlog.delta import DeltaTable, Snapshot

url, options = sys.argv[1], json.loads(sys.argv[2])
writer, batches, rows = (int(a) for a in sys.argv[3:6])
table = DeltaTable.open(url, storage_options=options)
app = f"writer-{writer}"
print("ready", flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit("no go")
out = []
for v in range(1, batches + 1):
    tx = table.transaction("WRITE")
    held = tx.base.txns.get(app)
    assert (held.version if held else 0) == v - 1, (app, held, v)
    tx.set_txn(app, v)
    seqs = [(writer * 1000 + v) * 100 + r for r in range(rows)]
    batch = pa.table({"writer": [app] * rows, "batch": [v] * rows, "seq": seqs})
    tx.add_files(table.write_files(batch, Snapshot(table.storage, tx.base)))
    result = table.commit(tx)
    assert not result.skipped and result.version is not None, result
    out.append([v, result.version, result.attempts])
print(json.dumps(out), flush=True)
"""


def expected_batch(writer: int, v: int) -> list[tuple[str, int, int]]:
    return [(f"writer-{writer}", v, (writer * 1000 + v) * 100 + r) for r in range(ROWS)]


def table_rows(table: Any) -> list[tuple[Any, ...]]:
    t = pa.table(table)
    return sorted(zip(*(t.column(c).to_pylist() for c in SCHEMA.names), strict=True))


def read_parquet(table: DeltaTable, path: str) -> pa.Table:
    """A data file of the table, read from its store through an Arrow buffer (pyarrow 25/26 can abort at exit after
    `pq.read_table` on a Python file object; an Arrow buffer does not)."""
    return pq.ParquetFile(pa.BufferReader(table.storage.read(urllib.parse.unquote(path)))).read()


def readline_by(process: subprocess.Popen[str], deadline: float) -> str:
    """The process's next stdout line, or a failure once `deadline` (monotonic) passes."""
    assert process.stdout is not None
    remaining = deadline - time.monotonic()
    ready, _, _ = select.select([process.stdout], [], [], max(remaining, 0))
    assert ready, f"writer process {process.pid} said nothing before the deadline"
    return process.stdout.readline()


def run_writers(url: str, options: dict[str, str]) -> dict[int, list[list[int]]]:
    """Start the writers, release them at once, and return each one's [[txn v, version, attempts]]."""
    deadline = time.monotonic() + DEADLINE_S
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, json.dumps(options), str(i), str(BATCHES), str(ROWS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(WRITERS)
    ]
    try:
        for p in procs:
            line = readline_by(p, deadline)
            if line.strip() != "ready":
                p.wait(timeout=max(deadline - time.monotonic(), 1))
                assert p.stderr is not None
                raise AssertionError(f"writer {p.pid} did not start: {line!r} {p.stderr.read()[-2000:]}")
        for p in procs:  # all at once: every writer has its table open and waits on this line
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = {}
        for i, p in enumerate(procs):
            out, err = p.communicate(timeout=max(deadline - time.monotonic(), 1))
            assert p.returncode == 0, f"writer {i} exited with {p.returncode}: {err[-3000:]}"
            results[i] = json.loads(out.strip().splitlines()[-1])
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


@pytest.mark.slow  # ~15 s on two busy cores: eight interpreters start and race for 32 versions
def test_eight_writer_processes_race_on_one_s3_table_and_lose_nothing(s3_server: S3Server) -> None:
    t = DeltaTable.create(s3_server.url("race"), SCHEMA, storage_options=s3_server.options)
    url, total = t.storage.location, WRITERS * BATCHES

    results = run_writers(url, s3_server.options)

    # 0 lost, 0 duplicate versions: the writers were told 1..N, each once, and the log holds 0..N
    told = sorted(version for out in results.values() for _v, version, _a in out)
    assert told == list(range(1, total + 1))
    prefix = url.removeprefix(f"s3://{s3_server.bucket}/") + "/_delta_log/"
    log = sorted(k.removeprefix(prefix) for k in s3_server.keys(prefix) if k.removeprefix(prefix).endswith(".json"))
    assert log == [commit_path(v).removeprefix("_delta_log/") for v in range(total + 1)]
    assert not [k for k in s3_server.keys(prefix) if ".feedlog-probe-" in k]  # probes cleaned up
    # each writer committed its txn versions in order, and the race was real
    for i, out in results.items():
        assert [v for v, _version, _a in out] == list(range(1, BATCHES + 1))
        assert [version for _v, version, _a in out] == sorted(version for _v, version, _a in out), (i, out)
    assert sum(a for out in results.values() for _v, _version, a in out) > total, "no writer ever lost a race"

    # every commit carries one writer's next txn version and exactly that batch's rows
    fresh = DeltaTable.open(url, storage_options=s3_server.options)
    assert fresh.version() == total
    seen: dict[str, list[int]] = {}
    for version in range(1, total + 1):
        actions = [json.loads(line) for line in fresh.storage.read(commit_path(version)).decode().splitlines()]
        assert {k for a in actions for k in a} == {"commitInfo", "txn", "add"}, (version, actions)
        txns = [a["txn"] for a in actions if "txn" in a]
        assert len(txns) == 1, (version, txns)
        app, v = txns[0]["appId"], txns[0]["version"]
        seen.setdefault(app, []).append(v)
        added = [r for a in actions if "add" in a for r in table_rows(read_parquet(fresh, a["add"]["path"]))]
        assert sorted(added) == expected_batch(int(app.removeprefix("writer-")), v), version
    assert seen == {f"writer-{i}": list(range(1, BATCHES + 1)) for i in range(WRITERS)}  # every sequence complete

    # every row once; every appId's txn version is K, as feedlog and deltalake see it
    want = sorted(r for i in range(WRITERS) for v in range(1, BATCHES + 1) for r in expected_batch(i, v))
    assert table_rows(fresh.to_arrow()) == want
    import deltalake

    theirs = deltalake.DeltaTable(url, storage_options=s3_server.options)
    for i in range(WRITERS):
        assert fresh.txn_version(f"writer-{i}") == BATCHES
        assert theirs.transaction_version(f"writer-{i}") == BATCHES

    # a writer restarted after the race resumes from its txn version: its last batch again is a no-op
    again = DeltaTable.open(url, storage_options=s3_server.options)
    batch = pa.table(dict(zip(SCHEMA.names, map(list, zip(*expected_batch(0, BATCHES), strict=True)), strict=True)))
    assert again.append(batch, txn=("writer-0", BATCHES)).skipped
    assert again.version() == total

    # deltalake and DuckDB read the table as feedlog does: the end, and a version mid-race (every
    # version of a race is read three ways in test_objectstore.py's thread race)
    assert theirs.version() == total
    for version in (total // 2, total):
        mine = table_rows(fresh.to_arrow(version))
        assert table_rows(deltalake_rows(url, s3_server.options, version)) == mine, f"deltalake, version {version}"
        assert table_rows(duckdb_rows(s3_server, url, version)) == mine, f"DuckDB, version {version}"
