"""tools/fuzz_peer.py, scaled down: mutated requests on every RPC, no crash, no INTERNAL/UNKNOWN, feeds verify."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "fuzz_peer.py"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_peer", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_peer"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_mutated_requests_on_every_rpc_get_clear_statuses_and_leave_every_feed_verifying(tmp_path: Path) -> None:
    fuzz = load_tool()
    report = fuzz.run(300, seed=7, seconds=60, workers=4, keep=tmp_path)
    summary = report.summary()
    assert report.requests == 300, summary
    assert {rpc for rpc, _code in report.codes} == {m.name for m in fuzz.SERVICE.methods}, summary
    assert report.crashed is None, summary
    assert not report.bad, summary  # INTERNAL / UNKNOWN: an unhandled error in the peer
    assert report.feeds_verified >= 3 and not report.unverified, summary
    assert report.ok
