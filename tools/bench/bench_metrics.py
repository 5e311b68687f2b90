"""What `--metrics-listen` costs a peer: put throughput with metrics on vs off, and the time of a scrape.

Each figure comes with a reference measured in the same run:
  blocking puts   16 clients, one blocking unary put outstanding each (durable, group-committed), against
                  a `feedlog serve` process with and without `--metrics-listen`, alternating rounds
                  (medians); the ratio on/off is the overhead. Reference: a no-op gRPC server (its own
                  process, Put answered at once, no feedlog code) driven by the same clients
  pipelined puts  16 pipelined producers (PutStream, acked after the fsync), on vs off the same way
  scrape          ms per GET /metrics of that peer hosting `--feeds` feeds (each adds its own series),
                  vs prometheus_client rendering the same number of samples from one plain collector
                  in this process (the library's own limit: no HTTP, no feedlog code)

    python tools/bench/bench_metrics.py            # ~1 min here
    python tools/bench/bench_metrics.py --quick    # fewer rounds, shorter runs
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench_peers import NOOP_SERVER, TOKEN, VALUE, blocking_rate, free_port, peer_process  # a sibling script

from feedlog.log.feed import Write
from feedlog.replication.client import FeedClient


@contextmanager
def peer(data: Path, metrics: bool) -> Iterator[tuple[str, str | None]]:
    """A peer process taking the benchmark's token, with `/metrics` on a free loopback port if `metrics`."""
    args = ["--create-rate", "10000/s,10000", "--compact-every", "0"]
    url = None
    if metrics:
        port = free_port()
        args += ["--metrics-listen", f"127.0.0.1:{port}"]
        url = f"http://127.0.0.1:{port}/metrics"
    with peer_process(data, *args, env=dict(os.environ, FEEDLOG_PEER_TOKEN=TOKEN)) as (_proc, target):
        yield target, url


def pipelined_rate(target: str, key: bytes, clients: int, per_client: int) -> float:
    barrier = threading.Barrier(clients + 1)

    def run(n: int) -> None:
        with FeedClient(target, token=TOKEN) as c, c.producer(key) as p:
            barrier.wait()
            futs = [p.put(Write(f"/c{n}/{i}", VALUE)) for i in range(per_client)]
            for f in futs:
                f.result(120)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(clients)]
    for th in threads:
        th.start()
    barrier.wait()
    t = time.perf_counter()
    for th in threads:
        th.join()
    return clients * per_client / (time.perf_counter() - t)


def one_round(d: Path, metrics: bool, clients: int, seconds: float, per_client: int) -> tuple[float, float]:
    with peer(d, metrics) as (target, _url):
        with FeedClient(target, token=TOKEN) as c:
            key = c.create(timestamps="exact").key
        blocking = blocking_rate(target, key, clients, seconds)
        pipelined = pipelined_rate(target, key, clients, per_client)
    return blocking, pipelined


def puts(d: Path, rounds: int, clients: int, seconds: float, per_client: int) -> None:
    target = f"127.0.0.1:{free_port()}"
    noop = subprocess.Popen(
        [sys.executable, "-c", NOOP_SERVER, target], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert noop.stdout is not None and noop.stdout.readline().strip() == "ready"
        noop_rates = [blocking_rate(target, bytes(32), clients, seconds)]
        on: list[tuple[float, float]] = []
        off: list[tuple[float, float]] = []
        for r in range(rounds):  # alternating, so that the shared machine's drift hits both alike
            off.append(one_round(d / f"off{r}", False, clients, seconds, per_client))
            on.append(one_round(d / f"on{r}", True, clients, seconds, per_client))
        noop_rates.append(blocking_rate(target, bytes(32), clients, seconds))
    finally:
        noop.kill()
        noop.wait()
    b_on, b_off = statistics.median(x[0] for x in on), statistics.median(x[0] for x in off)
    p_on, p_off = statistics.median(x[1] for x in on), statistics.median(x[1] for x in off)
    ref = statistics.mean(noop_rates)
    print(f"blocking unary puts, {clients} clients, one outstanding each; medians of {rounds} alternating rounds")
    print(
        f"  metrics on {b_on:,.0f}/s, off {b_off:,.0f}/s: ratio on/off {b_on / b_off:.3f}"
        f" (overhead {100 * (1 - b_on / b_off):+.1f}%); no-op gRPC server {ref:,.0f}/s,"
        f" ratio on/no-op {b_on / ref:.2f}"
    )
    print(f"pipelined puts, {clients} producers x {per_client:,}")
    print(
        f"  metrics on {p_on:,.0f}/s, off {p_off:,.0f}/s: ratio on/off {p_on / p_off:.3f}"
        f" (overhead {100 * (1 - p_on / p_off):+.1f}%)"
    )


def library_render(samples: int, repeat: int) -> float:
    """ms per render of `samples` labelled counter samples by prometheus_client alone: one collector
    yielding one family built at scrape time (its cheapest path, and the one feedlog's collectors take)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily
    from prometheus_client.registry import Collector

    class Plain(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            family = CounterMetricFamily("bench_reference", "reference", labels=["feed"])
            for i in range(samples):
                family.add_metric([f"{i:064x}"], i)
            yield family

    registry = CollectorRegistry()
    registry.register(Plain())
    generate_latest(registry)
    t = time.perf_counter()
    for _ in range(repeat):
        generate_latest(registry)
    return (time.perf_counter() - t) / repeat * 1000


def scrape(d: Path, feeds: int, repeat: int) -> None:
    with peer(d / "scrape", True) as (target, url):
        assert url is not None
        with FeedClient(target, token=TOKEN) as c:
            for _ in range(feeds):
                key = c.create(timestamps="exact").key
                c.put(key, [Write("/k", VALUE)])
        body = urllib.request.urlopen(url, timeout=30).read()
        samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        t = time.perf_counter()
        for _ in range(repeat):
            urllib.request.urlopen(url, timeout=30).read()
        ms = (time.perf_counter() - t) / repeat * 1000
    ref = library_render(samples, repeat)
    print(f"scrape of a peer hosting {feeds} feeds: {samples:,} samples, {len(body) / 1024:,.0f} KiB")
    print(
        f"  GET /metrics {ms:.2f} ms; prometheus_client rendering {samples:,} plain samples in process"
        f" {ref:.2f} ms; ratio {ms / ref:.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="one round, shorter runs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--feeds", type=int, default=200, help="feeds hosted by the scraped peer")
    ap.add_argument("--dir", help="where to write (default: a temp dir)")
    ns = ap.parse_args()
    rounds, seconds, per_client, repeat = (1, 1.0, 500, 10) if ns.quick else (ns.rounds, 3.0, 2000, 50)
    with tempfile.TemporaryDirectory(dir=ns.dir) as tmp:
        d = Path(tmp)
        puts(d, rounds, ns.clients, seconds, per_client)
        scrape(d, 20 if ns.quick else ns.feeds, repeat)
    print("(a machine shared with other work: compare the ratios, not the absolute figures)")


if __name__ == "__main__":
    main()
