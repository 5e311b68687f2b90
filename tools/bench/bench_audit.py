"""`feedlog audit` benchmark: seconds and peak RSS to audit a 1M-row feedlog table.

The table holds the rows of one real signed feed (signed batches of 1,000, ~100-byte blocks), written
as the ingest writes them: one commit per 200k-entry partition. Each figure comes with a reference
measured in the same run on the same files, with none of feedlog's code in it:

  audit      `feedlog audit TABLE --key K` as a subprocess (the CLI users run): wall seconds, peak RSS
  reference  pyarrow alone, in a subprocess: read the same columns of the same data files a row group
             at a time and BLAKE2b-hash every block (what any audit must at least do: read the rows
             and hash the signed bytes); DuckDB scanning the same columns is shown too

    python tools/bench/bench_audit.py                  # 1M rows (the issue's size)
    python tools/bench/bench_audit.py --quick          # 10x smaller
    python tools/bench/bench_audit.py --dir D --keep   # build the table in D once, reuse it next time
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from feedlog.delta import DeltaTable
from feedlog.lake.feeds import FeedSource
from feedlog.lake.rows import SCHEMA
from feedlog.lake.sink import app_id
from feedlog.lake.source import FeedPartition, SourceFeed, read_partition
from feedlog.log.crypto import KeyPair
from feedlog.log.entries import decode_header
from feedlog.log.feed import Feed, Write

KEY = KeyPair.from_seed(bytes([7]) * 32)
VALUE = b"v" * 80  # with key and framing, ~100-byte blocks
PARTITION = 200_000  # entries per ingest partition (feedlog.lake.source.DEFAULT_ENTRIES_PER_PARTITION)

# the references: run in a fresh interpreter, so their peak RSS is theirs alone
PYARROW_REF = """
import hashlib, sys, pyarrow.parquet as pq
cols = ["feed", "seq", "key", "value", "deleted", "timestamp", "expires_at", "stat", "cleared", "block",
        "leaf_hash", "size", "signed"]
n = 0
for path in sys.argv[1:]:
    f = pq.ParquetFile(path)
    for batch in f.iter_batches(batch_size=65536, columns=cols):
        for b in batch.column("block").to_pylist():
            if b is not None:
                hashlib.blake2b(b, digest_size=32).digest()
        n += batch.num_rows
print(n)
"""
DUCKDB_REF = """
import sys, duckdb
files = sys.argv[1:]
q = ("SELECT count(*), sum(octet_length(block)), sum(length(key)), count(signed) "
     "FROM read_parquet(?)")
print(duckdb.connect().execute(q, [files]).fetchone()[0])
"""


def build(table: Path, feed_dir: Path, n: int) -> None:
    """The feed (1,000-entry signed batches) and its table, one commit per ingest-sized partition."""
    with Feed.create(feed_dir, key_pair=KEY, timestamps="exact", fsync=False) as f:
        for lo in range(0, n, 1000):
            f.append([Write(f"/k{i:07d}", VALUE) for i in range(lo, min(lo + 1000, n))])
    src = FeedSource.parse(str(feed_dir))
    header = src.header()
    feed = SourceFeed(src, header, decode_header(header))
    t = DeltaTable.create(table, SCHEMA)
    for lo in range(1, n + 1, PARTITION):
        hi = min(lo + PARTITION, n + 1)
        rows = list(read_partition([feed], FeedPartition(0, lo, hi)))
        t.append(pa.Table.from_batches(rows, schema=SCHEMA), txn=(app_id(KEY.public_key.hex()), hi))


def run(cmd: list[str]) -> tuple[float, float, str]:
    """Run in a wrapper that reports its child's own peak RSS (RUSAGE_CHILDREN is a running maximum)."""
    wrapper = (
        "import json, os, resource, subprocess, sys, time\n"
        "t = time.perf_counter()\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True)\n"
        "wall = time.perf_counter() - t\n"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
        "print(json.dumps({'wall': wall, 'rss': rss, 'rc': p.returncode, 'out': p.stdout.decode()[-4000:],"
        " 'err': p.stderr.decode()[-2000:]}))\n"
    )
    res = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, check=True)
    r = json.loads(res.stdout)
    if r["rc"] not in (0,):
        sys.exit(f"{' '.join(cmd[:4])} failed ({r['rc']}): {r['err']}{r['out']}")
    return float(r["wall"]), float(r["rss"]), str(r["out"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="10x smaller")
    ap.add_argument("--dir", help="where to build the feed and table (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep (and reuse) the table in --dir")
    ap.add_argument("--repeat", type=int, default=1, help="A/B pairs to run (medians reported)")
    ns = ap.parse_args()
    n = 100_000 if ns.quick else 1_000_000
    with tempfile.TemporaryDirectory(dir=ns.dir) as tmp:
        base = Path(ns.dir) / f"audit-{n}" if ns.keep and ns.dir else Path(tmp)
        table = base / "table"
        if not (table / "_delta_log").exists():
            t = time.perf_counter()
            build(table, base / "feed", n)
            print(f"(built a {n:,}-row table in {time.perf_counter() - t:.0f} s)", file=sys.stderr)
        files = [str(table / a.path) for a in DeltaTable.open(table).snapshot().files()]
        feedlog = str(Path(sys.executable).with_name("feedlog"))
        audit_cmd = [feedlog, "audit", str(table), "--key", KEY.public_key.hex()]
        audits, refs, ducks = [], [], []
        for _ in range(max(1, ns.repeat)):
            audits.append(run(audit_cmd))
            refs.append(run([sys.executable, "-c", PYARROW_REF, *files]))
            ducks.append(run([sys.executable, "-c", DUCKDB_REF, *files]))
        if "verified" not in audits[0][2]:
            sys.exit(f"the audit did not verify the table:\n{audits[0][2]}")

    def med(xs: list[tuple[float, float, str]], i: int) -> float:
        return float(sorted(float(x[i]) for x in xs)[len(xs) // 2])

    aw, ar, rw, rr = med(audits, 0), med(audits, 1), med(refs, 0), med(refs, 1)
    print(f"feedlog audit, {n:,} rows of one feed ({len(files)} data files), medians of {len(audits)}")
    print(f"  feedlog audit {aw:.1f} s, peak RSS {ar:.0f} MB; target <= 10 s, <= 300 MB")
    print(f"  pyarrow read of the same columns + BLAKE2b of every block: {rw:.1f} s, peak RSS {rr:.0f} MB;")
    print(f"  ratio (reference s / audit s) {rw / aw:.2f}")
    print(f"  (DuckDB scanning the same columns: {med(ducks, 0):.1f} s, peak RSS {med(ducks, 1):.0f} MB)")


if __name__ == "__main__":
    main()
