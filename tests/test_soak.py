"""tools/soak.py, two minutes of it (issue 38): every process killed under load, nothing lost or doubled,
files and log bounded, the readers we did not write agreeing. The 30-minute run is the closing note's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TOOLS, load_tool


def test_soak_arguments_are_checked() -> None:
    soak = load_tool("soak")
    with pytest.raises(SystemExit):
        soak.parse(["--out", "x", "--minutes", "0"])
    ns = soak.parse(["--out", "x", "--minutes", "2"])
    assert ns.producers == 8 and ns.rate == 200.0


def test_percentiles() -> None:
    soak = load_tool("soak")
    xs = [float(i) for i in range(1, 101)]
    assert soak.pct(xs, 0.5) == 51.0 and soak.pct(xs, 0.99) == 100.0
    assert soak.pct([], 0.5) != soak.pct([], 0.5)  # nan: no sample is not a zero latency


@pytest.mark.slow
def test_two_minute_soak(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    picture = tmp_path / "soak.png"
    r = subprocess.run(
        [
            sys.executable,
            str(TOOLS / "soak.py"),
            "--minutes",
            "2",
            "--out",
            str(out),
            "--plot",
            str(picture),
            "--rate",
            "100",
            "--kill-every",
            "20",
            "--down-seconds",
            "1",
            "--maintain-every",
            "20s",
            "--retain-seconds",
            "20",
            "--report-every",
            "30",
            "--sample-every",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((out / "soak.json").read_text())["summary"]
    assert summary["acked"] > 5_000 and summary["lost"] == 0 and summary["duplicated"] == 0
    killed = {k["proc"] for k in summary["kills"] if not k.get("self")}
    assert {"ingest", "peerA", "owner"} <= killed, summary["kills"]
    # ~120 one-second commits: auto-compaction keeps the live files well below one per commit
    assert summary["final"]["live_files"] <= 60, summary["final"]
    assert picture.stat().st_size > 10_000
