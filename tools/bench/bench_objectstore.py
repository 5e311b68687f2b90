"""Bulk append to s3:// on a loopback S3 server (moto), feedlog vs delta-rs (`write_deltalake`), one run.

Both write the same Arrow table into a new table on the same server with the same
storage_options; the figure is rows/s for each and feedlog's ratio (target >= 0.8x). The
server is moto's S3 server on 127.0.0.1 in a process of its own (in this process its Python
request handling would compete with the writers for the GIL), so the numbers measure the client
side plus moto's own (slow, Python) request handling, equal for both.

    python tools/bench/bench_objectstore.py                 # 1,000,000 rows
    python tools/bench/bench_objectstore.py --rows 200000   # smaller, for a smoke run
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import boto3
import deltalake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_delta import data

from feedlog.delta import DeltaTable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each; the best one counts")
    args = ap.parse_args()
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_up(endpoint)
        options = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
            region_name="us-east-1",
        ).create_bucket(Bucket="bench")
        table = data(args.rows)
        ours, theirs = [], []
        for _ in range(args.repeat):
            url = f"s3://bench/feedlog-{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            t = DeltaTable.create(url, table.schema, storage_options=options)
            t.append(table)
            ours.append(time.perf_counter() - t0)
            url = f"s3://bench/deltalake-{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            deltalake.write_deltalake(url, table, storage_options=options)
            theirs.append(time.perf_counter() - t0)
        a, b = args.rows / min(ours), args.rows / min(theirs)
        print(f"bulk append {args.rows:,} rows to s3:// (moto on loopback)")
        print(f"  feedlog          {a:12,.0f} rows/s  ({min(ours):.2f} s)")
        print(f"  write_deltalake  {b:12,.0f} rows/s  ({min(theirs):.2f} s)")
        print(f"  ratio            {a / b:.2f}x  (target >= 0.8x)")
    finally:
        server.terminate()
        server.wait(10)


def wait_until_up(endpoint: str, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(endpoint + "/moto-api/", timeout=2):
                return
        except urllib.error.HTTPError:
            return  # an answer, even an error status, means it is serving
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise SystemExit(f"moto's server did not answer on {endpoint} within {limit_s:.0f} s")


if __name__ == "__main__":
    main()
