"""tools/fuzz_peer.py, scaled down: mutated requests on every RPC, no crash, no INTERNAL/UNKNOWN, feeds verify."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import load_tool


@pytest.mark.slow
def test_mutated_requests_on_every_rpc_get_clear_statuses_and_leave_every_feed_verifying(tmp_path: Path) -> None:
    fuzz = load_tool("fuzz_peer")
    report = fuzz.run(300, seed=7, seconds=60, workers=4, keep=tmp_path)
    summary = report.summary()
    assert report.requests == 300, summary
    assert {rpc for rpc, _code in report.codes} == {m.name for m in fuzz.SERVICE.methods}, summary
    assert report.crashed is None, summary
    assert not report.bad, summary  # INTERNAL / UNKNOWN: an unhandled error in the peer
    assert report.feeds_verified >= 3 and not report.unverified, summary
    assert report.ok
