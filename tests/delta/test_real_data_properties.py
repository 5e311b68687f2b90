"""Random histories of a deletion-vector table (issue 16's property test, data side): appends,
deletes as deletion vectors (inline, relative path with and without prefix, absolute path; a DV
replacing the file's previous one), whole-file removes and overwrites, in a partitioned table.
Every version equals the model, deltalake and DuckDB. Logs are written by hand from PROTOCOL.md
(no available writer writes DVs); data files by pyarrow; bitmaps by pyroaring."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedlog.delta import DeltaTable
from feedlog.delta import dv as dvmod

from .conftest import deltalake_read, duckdb_read
from .test_real_data_scan import add, canon, field, metadata, parquet_file, protocol, write_commit

FIELDS = [field("x", "long"), field("p", "string")]

step = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 40), st.sampled_from(["a", "b c", None])),
    st.tuples(st.just("delete"), st.integers(0, 10_000), st.sampled_from(["i", "u", "uprefix", "p"])),
    st.tuples(st.just("remove"), st.integers(0, 10_000), st.just(None)),
    st.tuples(st.just("overwrite"), st.integers(1, 20), st.sampled_from(["a", None])),
)


class Model:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.files: dict[str, dict[str, Any]] = {}  # path -> {"rows": [...], "deleted": set, "action": add, "dv": ...}
        self.next_x = 0
        self.n = 0

    def _name(self) -> str:
        self.n += 1
        return f"f{self.n:04d}.parquet"

    def new_file(self, count: int, part: str | None) -> dict[str, Any]:
        name = self._name()
        xs = list(range(self.next_x, self.next_x + count))
        self.next_x += count
        size = parquet_file(self.root, name, pa.table({"x": pa.array(xs, pa.int64())}))
        action = add(name, size, count, {"p": part})
        self.files[name] = {"rows": xs, "deleted": set(), "action": action, "dv": None, "part": part}
        return action

    def remove_action(self, path: str) -> dict[str, Any]:
        f = self.files[path]
        body = {"path": path, "deletionTimestamp": 1, "dataChange": True, "extendedFileMetadata": True,
                "partitionValues": {"p": f["part"]}, "size": f["action"]["add"]["size"]}  # fmt: skip
        if f["dv"] is not None:
            body["deletionVector"] = f["dv"]
        return {"remove": body}

    def dv_for(self, rows: list[int], kind: str) -> dict[str, Any]:
        if kind == "i":
            raw = dvmod.encode_bitmap(rows)
            return {"storageType": "i", "pathOrInlineDv": dvmod.z85_encode(raw + b"\0" * (-len(raw) % 4)),
                    "sizeInBytes": len(raw), "cardinality": len(rows)}  # fmt: skip
        self.n += 1
        u = uuid.UUID(int=self.n)
        prefix = "zz" if kind == "uprefix" else ""
        encoded = dvmod.encode_bitmap(rows)
        body, (offset,) = dvmod.dv_file([encoded])
        rel = f"{prefix}/deletion_vector_{u}.bin" if prefix else f"deletion_vector_{u}.bin"
        (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (self.root / rel).write_bytes(body)
        d = {"storageType": "u", "pathOrInlineDv": prefix + dvmod.z85_encode(u.bytes), "offset": offset,
             "sizeInBytes": len(encoded), "cardinality": len(rows)}  # fmt: skip
        if kind == "p":
            d = dict(d, storageType="p", pathOrInlineDv=(self.root / rel).as_uri())
        return d

    def live(self) -> list[tuple[int, str | None]]:
        out = []
        for f in self.files.values():
            out += [(x, f["part"]) for i, x in enumerate(f["rows"]) if i not in f["deleted"]]
        return sorted(out, key=repr)


def run_history(root: Path, steps: list[tuple[str, int, Any]]) -> None:
    model = Model(root)
    dv_protocol = protocol(["deletionVectors"], ["deletionVectors"])
    write_commit(root, 0, [dv_protocol, metadata(FIELDS, ["p"], **{"delta.enableDeletionVectors": "true"})])
    expected = {0: model.live()}
    version = 0
    for kind, n, arg in steps:
        actions: list[dict[str, Any]] = []
        paths = sorted(model.files)
        if kind == "append":
            actions.append(model.new_file(n, arg))
        elif kind == "delete" and paths:
            path = paths[n % len(paths)]
            f = model.files[path]
            alive = [i for i in range(len(f["rows"])) if i not in f["deleted"]]
            if not alive:
                continue
            victims = set(alive[:: 1 + n % 3][: 1 + n % 5])
            rows = sorted(f["deleted"] | victims)
            dv = model.dv_for(rows, arg)
            actions.append(model.remove_action(path))  # the old logical file, with its old DV
            f["deleted"], f["dv"] = set(rows), dv
            actions.append({"add": {**f["action"]["add"], "deletionVector": dv}})
        elif kind == "remove" and paths:
            path = paths[n % len(paths)]
            actions.append(model.remove_action(path))
            del model.files[path]
        elif kind == "overwrite":
            actions += [model.remove_action(p) for p in paths]
            model.files.clear()
            actions.append(model.new_file(n, arg))
        if not actions:
            continue
        version += 1
        write_commit(root, version, actions)
        expected[version] = model.live()
    table = DeltaTable.open(root)
    for v, want in expected.items():
        ours = table.to_arrow(v)
        assert sorted(zip(ours.column("x").to_pylist(), ours.column("p").to_pylist(), strict=True), key=repr) == want
        assert table.snapshot(v).num_records() == len(want)
        assert canon(ours) == canon(deltalake_read(root, v)), f"version {v}: feedlog != deltalake"
        assert canon(ours) == canon(duckdb_read(root, v)), f"version {v}: feedlog != DuckDB"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=8))
def test_random_histories_with_deletion_vectors(steps: list[tuple[str, int, Any]]) -> None:
    with tempfile.TemporaryDirectory() as d:
        run_history(Path(d), steps)
