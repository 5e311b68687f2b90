"""kill -9 a real appending process at random points: no acknowledged entry is ever lost."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from feedlog.log.feed import Feed

WRITER = Path(__file__).with_name("crash_writer.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_kill_minus_nine_loses_no_acknowledged_entry(tmp_path: Path) -> None:
    rng = random.Random(1234)
    path = tmp_path / "f"
    Feed.create(path, timestamps="exact").close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    acked = 0  # every seq below this was acknowledged by some run
    trials = 12
    for _trial in range(trials):
        batch = rng.choice([1, 7, 100])
        proc = subprocess.Popen([sys.executable, str(WRITER), str(path), str(batch)], stdout=subprocess.PIPE, env=env)
        assert proc.stdout is not None
        first = proc.stdout.readline()  # wait until it is appending
        assert first, "writer did not start"
        time.sleep(rng.uniform(0.0, 0.15))
        proc.send_signal(signal.SIGKILL)
        out = first + proc.stdout.read()
        proc.wait(timeout=10)
        lines = [ln for ln in out.decode().splitlines() if ln.strip()]
        last_full = [ln for ln in lines if len(ln.split()) == 2]
        if last_full:
            acked = max(acked, int(last_full[-1].split()[1]) + 1)
        with Feed.open(path) as f:
            assert f.length >= acked, f"lost acknowledged entries: length {f.length} < {acked}"
            f.verify()
            for r in f.records(max(1, acked - 50), acked):
                assert r.value == f"value {r.seq}".encode() * 3 and r.key == f"k{r.seq}"
            acked = f.length  # whatever survived is now the base for the next trial
    assert acked > trials
