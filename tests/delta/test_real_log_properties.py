"""Property: random histories of appends, overwrites, checkpoints of every kind and cleanups.

Hypothesis draws a table kind (plain, or upgraded to `v2Checkpoint` by a hand-written commit as
delta-spark does) and a sequence of operations: appends, overwrites, checkpoints (classic and
multi-part on a plain table; V2 with a sidecar or inline on a V2 table) and metadata cleanups
(everything before the newest checkpoint, sidecars no retained checkpoint names). After the history,
every retained version read by feedlog equals the model (the rows each commit left), and so does
delta-rs's read of it; versions before the retained log are reported as such.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedlog.clock import ManualClock, SystemClock
from feedlog.delta import DeltaTable
from feedlog.delta import checkpoint as cp
from feedlog.delta.log import list_log
from feedlog.errors import NotFound

from .conftest import SCHEMA, counter_ids, deltalake_read, rows, sorted_rows
from .test_real_log_items import LOG, write_multi_part

DAY_MS = 86_400_000

operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 3)),
        st.tuples(st.just("overwrite"), st.integers(1, 3)),
        st.tuples(st.just("checkpoint"), st.sampled_from(["default", "multi-part", "inline"])),
        st.tuples(st.just("cleanup"), st.just(0)),
    ),
    min_size=1,
    max_size=9,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(v2=st.booleans(), ops=operations)
def test_every_retained_version_equals_the_model_and_delta_rs(v2: bool, ops: list[tuple[str, int | str]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "t"
        # file times are real; "now" is well after them, so cleanup may take everything it can
        clock = ManualClock(SystemClock().now_ms() + 10 * DAY_MS)
        t = DeltaTable.create(root, SCHEMA, clock=clock, new_id=counter_ids(), in_commit_timestamps=False)
        model: dict[int, list[tuple[int]]] = {0: []}
        if v2:
            upgrade = [
                {"commitInfo": {"timestamp": clock.now_ms(), "operation": "UPGRADE PROTOCOL"}},
                {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["v2Checkpoint"],
                              "writerFeatures": ["v2Checkpoint", "appendOnly", "invariants"]}},
            ]  # fmt: skip
            (root / LOG / f"{1:020d}.json").write_text("\n".join(json.dumps(a) for a in upgrade) + "\n")
            t = DeltaTable.open(root, clock=clock, new_id=counter_ids())
            model[1] = []
        seq = 0
        for op, arg in ops:
            latest = max(model)
            if op in ("append", "overwrite"):
                assert isinstance(arg, int)
                t.append(rows(seq, arg, "ab"[seq % 2]), mode=op)
                before = [] if op == "overwrite" else model[latest]
                model[latest + 1] = sorted(before + [(s,) for s in range(seq, seq + arg)])
                seq += arg
            elif op == "checkpoint":
                if arg == "multi-part" and not v2:  # forbidden on V2 tables
                    write_multi_part(root, latest, 2)
                else:
                    t.checkpoint(sidecars=arg != "inline")
            else:
                t.cleanup(retain_ms=0)
            clock.advance(1000)
        listing = list_log(t.storage)
        assert listing.latest == max(model)
        fresh = DeltaTable.open(root)
        for v in sorted(model):
            if v < listing.earliest:
                with pytest.raises(NotFound, match="older than the retained log"):
                    fresh.snapshot(v)
                continue
            assert sorted_rows(fresh.to_arrow(v), "seq") == model[v], v
            assert sorted_rows(deltalake_read(root, v), "seq") == model[v], (v, "deltalake")
        # a cleanup keeps every sidecar a retained checkpoint names
        sidecars = root / LOG / "_sidecars"
        if sidecars.exists():
            named: set[str] = set()
            for name in os.listdir(root / LOG):
                if ".checkpoint." in name and name.endswith(".parquet"):
                    data = (root / LOG / name).read_bytes()
                    named.update(s.path for s in cp.decode_parquet(data, 0, ("checkpointMetadata",)).sidecars)
            assert named <= set(os.listdir(sidecars))
