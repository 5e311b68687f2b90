"""tools/fuzz_owner.py, scaled down: mutated requests on every RPC, no crash, no INTERNAL/UNKNOWN, tables unchanged."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "fuzz_owner.py"


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_owner", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_owner"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_mutated_requests_on_every_rpc_get_clear_statuses_and_leave_every_table_unchanged(tmp_path: Path) -> None:
    fuzz = load_tool()
    report = fuzz.run(300, seed=7, seconds=60, workers=4, keep=tmp_path)
    summary = report.summary()
    assert report.requests == 300, summary
    assert {rpc for rpc, _code in report.codes} == {m.name for m in fuzz.SERVICE.methods}, summary
    assert report.crashed is None, summary
    assert not report.bad, summary  # INTERNAL / UNKNOWN / DEADLINE_EXCEEDED: an unhandled error or a stall
    assert report.tables_checked == 2 and not report.changed, summary
    assert sum(n for (_rpc, code), n in report.codes.items() if code == "OK") > 0, summary  # not all refused
    assert report.ok
