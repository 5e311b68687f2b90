"""tools/fuzz_owner.py, scaled down: mutated requests on every RPC, no crash, no INTERNAL/UNKNOWN, tables unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import load_tool


@pytest.mark.slow
def test_mutated_requests_on_every_rpc_get_clear_statuses_and_leave_every_table_unchanged(tmp_path: Path) -> None:
    fuzz = load_tool("fuzz_owner")
    report = fuzz.run(300, seed=7, seconds=60, workers=4, keep=tmp_path)
    summary = report.summary()
    assert report.requests == 300, summary
    assert {rpc for rpc, _code in report.codes} == {m.name for m in fuzz.SERVICE.methods}, summary
    assert report.crashed is None, summary
    assert not report.bad, summary  # INTERNAL / UNKNOWN / DEADLINE_EXCEEDED: an unhandled error or a stall
    assert report.tables_checked == 2 and not report.changed, summary
    assert sum(n for (_rpc, code), n in report.codes.items() if code == "OK") > 0, summary  # not all refused
    assert report.ok
