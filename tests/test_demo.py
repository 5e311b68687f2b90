"""The README's first command: `feedlog demo` tells its story end to end and leaves nothing behind
unless asked to keep it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from feedlog.cli.demo import NEXT, leave

from .delta.conftest import deltalake_read, duckdb_read

FEEDLOG = Path(sys.executable).parent / "feedlog"


@pytest.mark.slow
def test_the_demo_command_tells_its_story_and_keeps_its_files_with_keep(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEEDLOG_")} | {"TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [str(FEEDLOG), "demo", "--keep"], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    # a guided tour: numbered steps in order, each saying why it matters
    steps = re.findall(r"^(\d+)\. ", out, re.MULTILINE)
    assert steps == [str(i) for i in range(1, len(steps) + 1)] and len(steps) >= 8
    assert out.count("   why: ") == len(steps)
    # the numbers add up, and every write the story counts is one it mentions
    assert "20,002 entries, seqs 1..20002 (seq 0 is the header block" in out
    assert "session token with a 5-minute TTL, a deletion" in out  # 20,000 readings + 2 = 20,002
    assert "holds all 20,003 blocks, verified: the header + every entry" in out
    assert "version 1: 20,002 entries" in out and "version 2: 5,000 entries; the second run: 0 entries" in out
    assert "5,001 rows cleared (the 5,000 readings and the session token)" in out
    assert "stay for delta.deletedFileRetentionDuration (7d)" in out  # and when they are gone
    assert out.count("-> verified") == 2 and "FAILED" not in out and "DIFFERS" not in out
    assert "peer 2 (127.0.0.1:" in out and "peer 1 127.0.0.1:" in out
    # --keep: where the files are, and they are the demo's
    kept = Path(re.findall(r"files kept in (\S+)", out)[-1])
    assert kept.parent == tmp_path and kept.name.startswith("feedlog-demo-")
    assert deltalake_read(kept / "table").num_rows == duckdb_read(kept / "table").num_rows == 25_002
    assert (kept / "activity.png").stat().st_size > 0 and (kept / "feed" / "log").exists()
    # the last line: the console command that shows the demo's feed and table
    assert out.splitlines()[-1] == (
        f"look at them: feedlog console --data {kept / 'feed'} --table {kept / 'table'} "
        f"--owner {kept / 'owner.db'} --listen 127.0.0.1:8080"
    )
    assert len(out.splitlines()) <= 60  # one screen
    assert NEXT in out  # and where to read on


def test_the_demo_removes_its_directory_unless_kept(tmp_path: Path) -> None:
    """The demo's last step (the whole run is the test above, once: it takes a minute)."""
    base = tmp_path / "feedlog-demo-x"
    (base / "table" / "_delta_log").mkdir(parents=True)
    (base / "table" / "_delta_log" / "0.json").write_bytes(b"x" * 2_000_000)
    assert leave(base, keep=True) == f"files kept in {base}" and base.exists()
    assert leave(base, keep=False) == f"removed {base} (2 MB; --keep keeps it)"
    assert list(tmp_path.iterdir()) == []
