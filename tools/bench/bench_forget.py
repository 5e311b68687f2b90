"""What honouring forget entries costs a copy that stores signed batches (issue 37).

Every batch a feed stores (a local append, a key holder's Append, a follower, pull, clone) is
searched for forget entries before it is stored (`entries.forgets_in`, run by `Feed._before_commit`).
Measured in one run, on the same batches of ordinary entries (no forget among them, the usual case):
  forgets_in   feedlog's search (the C writer-shape scan; only odd blocks parsed)
  upb          parsing every block with upb (`InflatedEntry.ParseFromString`, the reference: no
               feedlog code in it), what finding the field by decoding each block would cost
  store        `Feed.store_signed_many` of the same batches into a replica (fsync off), which
               includes the search: the search's share of a replica's storing is reported too
The ratio is upb time / forgets_in time (higher is better).

    python tools/bench/bench_forget.py                    # 200,000 entries in batches of 1,000
    python tools/bench/bench_forget.py --entries 1000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from feedlog.log import entries
from feedlog.log.crypto import KeyPair
from feedlog.log.feed import Feed, Write
from feedlog.pb import hyperdb_pb2


def best(fn: Callable[[], None], reps: int) -> float:
    out = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1_000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    n, size = args.entries, args.batch
    work = Path(tempfile.mkdtemp(prefix="bench-forget-"))
    try:
        kp = KeyPair.from_seed(bytes([9]) * 32)
        src = Feed.create(work / "src", key_pair=kp, timestamps="exact", fsync=False)
        for lo in range(0, n, size):
            src.append([Write(f"/k{i}", os.urandom(100)) for i in range(lo, min(lo + size, n))])
        segs = src.core.segments(0, src.length, 1 << 30)
        batches = [([b for b in s.blocks if b is not None], s.state) for s in segs if s.state is not None]
        assert sum(len(b) for b, _ in batches) == n + 1  # whole signed batches, the header included
        src.close()
        starts = [s.start for s in segs]

        def search() -> None:
            for start, (blocks, _state) in zip(starts, batches, strict=True):
                assert not entries.forgets_in(entries.ENTRY, start, blocks)

        def upb() -> None:
            e = hyperdb_pb2.InflatedEntry()
            for start, (blocks, _state) in zip(starts, batches, strict=True):
                for b in blocks[1 if start == 0 else 0 :]:
                    e.ParseFromString(b)

        def store() -> None:
            shutil.rmtree(work / "copy", ignore_errors=True)
            with Feed.create_replica(work / "copy", kp.public_key, fsync=False) as copy:
                for i in range(0, len(batches), 10):
                    copy.store_signed_many(batches[i : i + 10], sync=False)

        t_search, t_upb, t_store = best(search, args.reps), best(upb, args.reps), best(store, args.reps)
        print(f"forgets_in      {n / t_search:>14,.0f} entries/s  ({t_search / n * 1e9:.0f} ns an entry)")
        print(f"upb parse (ref) {n / t_upb:>14,.0f} entries/s  ({t_upb / n * 1e9:.0f} ns an entry)")
        print(f"store_signed    {n / t_store:>14,.0f} entries/s  (the search: {100 * t_search / t_store:.1f}% of it)")
        print(f"ratio upb / forgets_in: {t_upb / t_search:.1f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
