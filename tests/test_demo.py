"""The README's first command runs the whole chain end to end."""

from pathlib import Path
from typing import Any

import pytest

from feedlog.cli.demo import run_demo

from .delta.conftest import deltalake_read, duckdb_read


@pytest.mark.slow
def test_demo_runs_end_to_end(spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_demo(str(tmp_path), spark=spark)
    out = capsys.readouterr().out
    assert "seq 4242 proven" in out and "peer 2 at" in out
    assert "20002 entries" in out and ": 5000 entries" in out and "ingest once more: 0 entries" in out
    assert out.count("-> verified") == 2 and "FAILED" not in out and "DIFFERS" not in out
    assert "5001 rows cleared" in out  # the 10-minute ones and the 5-minute session token
    table = tmp_path / "table"
    assert deltalake_read(table).num_rows == duckdb_read(table).num_rows == 25_002
