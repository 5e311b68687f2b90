"""The README's first command runs end to end and lands the feed in a table outside readers accept."""

from pathlib import Path

import pytest

from feedlog.demo import run_demo

from .delta.conftest import deltalake_read, duckdb_read


def test_demo_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_demo(str(tmp_path))
    out = capsys.readouterr().out
    assert "seq 4242 verified" in out and "the retried batch was skipped: True" in out
    assert "commit owner: in process" in out and "backfilled through version 1" in out
    table = tmp_path / "table"
    assert deltalake_read(table).num_rows == duckdb_read(table).num_rows == 10_002
