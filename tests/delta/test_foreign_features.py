"""Tables written by other engines with features feedlog does not interpret (issue 13, item 11).

The tables are built by hand from PROTOCOL.md ("Domain Metadata", "Row Tracking", "Clustered
Table", the `add` schema) because no writer available here produces them. Maintenance must either
refuse outright (writer features feedlog does not support) or carry every action and field through
the checkpoint (features it does support), never silently drop them.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from feedlog.cli import main
from feedlog.clock import ManualClock
from feedlog.delta import DeltaTable
from feedlog.delta.actions import Add, DomainMetadata, Remove, decode_commit
from feedlog.delta.log import list_log, load_state, read_commit
from feedlog.delta.replay import TableState
from feedlog.errors import Unsupported

from .conftest import T0, deltalake_read, duckdb_read, sorted_rows

SCHEMA_STRING = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "name", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
)
ROW_TRACKING_CONF = {
    "delta.enableRowTracking": "true",
    "delta.rowTracking.materializedRowIdColumnName": "_row-id-col-1",
    "delta.rowTracking.materializedRowCommitVersionColumnName": "_row-commit-version-col-1",
}


def _data_file(root: Path, name: str, ids: list[int]) -> dict[str, Any]:
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]}), buf)
    (root / name).write_bytes(buf.getvalue())
    stats = {"numRecords": len(ids), "minValues": {"id": min(ids)}, "maxValues": {"id": max(ids)}, "nullCount": {}}
    return {
        "path": name,
        "partitionValues": {},
        "size": len(buf.getvalue()),
        "modificationTime": T0,
        "dataChange": True,
        "stats": json.dumps(stats),
    }


def _write_commit(root: Path, version: int, actions: list[dict[str, Any]]) -> None:
    log = root / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    text = "\n".join(json.dumps(a) for a in actions) + "\n"
    (log / f"{version:020d}.json").write_text(text)


def foreign_table(root: Path, writer_features: list[str], conf: dict[str, str]) -> None:
    """Three commits as a row-tracking, clustering engine writes them: domains set, replaced, removed."""
    root.mkdir(parents=True)
    info = {"commitInfo": {"timestamp": T0, "operation": "WRITE"}}
    _write_commit(
        root,
        0,
        [
            info,
            {"protocol": {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": writer_features}},
            {
                "metaData": {
                    "id": "11111111-2222-3333-4444-555555555555",
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": SCHEMA_STRING,
                    "partitionColumns": [],
                    "configuration": conf,
                    "createdTime": T0,
                    "futureMetaField": {"kept": True, "n": 2},  # no protocol version defines it (yet)
                }
            },
            {
                "domainMetadata": {
                    "domain": "delta.clustering",
                    "configuration": '{"clusteringColumns":["id"]}',
                    "removed": False,
                }
            },
            {"domainMetadata": {"domain": "com.example.doomed", "configuration": "{}", "removed": False}},
        ],
    )
    a = _data_file(root, "part-a.parquet", [1, 2, 3])
    a.update(baseRowId=0, defaultRowCommitVersion=1, clusteringProvider="liquid", tags={"INSERTION_TIME": "1"})
    a["futureField"] = "kept"  # an add field no version of the protocol defines (yet)
    _write_commit(
        root,
        1,
        [
            info,
            {"add": a},
            {
                "domainMetadata": {
                    "domain": "delta.rowTracking",
                    "configuration": '{"rowIdHighWaterMark":2}',
                    "removed": False,
                }
            },
        ],
    )
    b = _data_file(root, "part-b.parquet", [4, 5])
    b.update(baseRowId=3, defaultRowCommitVersion=2)
    gone = _data_file(root, "part-gone.parquet", [9])
    removed = {
        "path": "part-gone.parquet",
        "deletionTimestamp": T0,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": {},
        "size": gone["size"],
        "baseRowId": 7,
        "defaultRowCommitVersion": 1,
    }
    _write_commit(
        root,
        2,
        [
            info,
            {"add": b},
            {"remove": removed},
            {
                "domainMetadata": {
                    "domain": "delta.rowTracking",
                    "configuration": '{"rowIdHighWaterMark":4}',
                    "removed": False,
                }
            },
            {"domainMetadata": {"domain": "com.example.doomed", "configuration": "{}", "removed": True}},
        ],
    )


def _log_snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted((root / "_delta_log").rglob("*")) if p.is_file()
    }


def _json_replay(root: Path) -> TableState:
    """The table by replaying its JSON commits alone, never a checkpoint."""
    t = DeltaTable.open(root)
    listing = list_log(t.storage)
    state = TableState()
    for v in sorted(listing.commits):
        state.apply(v, read_commit(t.storage, listing, v))
    return state


# ---- writer features feedlog does not support: refuse, write nothing -----------------------------


@pytest.fixture
def row_tracking_table(tmp_path: Path) -> Path:
    root = tmp_path / "rt"
    foreign_table(root, ["domainMetadata", "rowTracking", "clustering"], ROW_TRACKING_CONF)
    return root


def test_checkpoint_and_cleanup_refuse_unsupported_writer_features(row_tracking_table: Path) -> None:
    before = _log_snapshot(row_tracking_table)
    t = DeltaTable.open(row_tracking_table, clock=ManualClock(T0 + 10**10))
    with pytest.raises(Unsupported, match=r"no checkpoint: .*'rowTracking'.*refuses to write it"):
        t.checkpoint()
    with pytest.raises(Unsupported, match=r"no cleanup: .*'rowTracking'.*refuses to write it"):
        t.cleanup(retain_ms=0)
    assert _log_snapshot(row_tracking_table) == before  # nothing written, nothing deleted
    assert t.to_arrow().num_rows == 5  # reading is still fine


def test_every_other_write_path_refuses_unsupported_writer_features(row_tracking_table: Path) -> None:
    before = _log_snapshot(row_tracking_table)
    t = DeltaTable.open(row_tracking_table)
    for write in (
        t.transaction,  # what TTL compaction and the Spark sink start from, before writing data files
        t.enable_ict,
        lambda: t.set_properties({"x": "y"}),
        lambda: t.convert_to_managed(str(row_tracking_table / "owner.db")),
    ):
        with pytest.raises(Unsupported, match=r"rowTracking.*refuses to write it"):
            write()
    assert _log_snapshot(row_tracking_table) == before
    assert not (row_tracking_table / "owner.db").exists()


def test_enable_ict_refuses_writer_version_3(tmp_path: Path) -> None:
    """Upgrading a CHECK-constraint table (writer 3) to 7 would silently drop the constraints' feature."""
    root = tmp_path / "v3"
    root.mkdir()
    meta = {
        "id": "x",
        "format": {"provider": "parquet", "options": {}},
        "schemaString": SCHEMA_STRING,
        "partitionColumns": [],
        "configuration": {"delta.constraints.positive": "id > 0"},
        "createdTime": T0,
    }
    _write_commit(root, 0, [{"protocol": {"minReaderVersion": 1, "minWriterVersion": 3}}, {"metaData": meta}])
    with pytest.raises(Unsupported, match="writer version 3"):
        DeltaTable.open(root).enable_ict()
    assert sorted(p.name for p in (root / "_delta_log").iterdir()) == [f"{0:020d}.json"]


def test_cli_checkpoint_and_cleanup_exit_9(row_tracking_table: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _log_snapshot(row_tracking_table)
    for args in (["checkpoint"], ["cleanup", "--retain", "1s"]):
        code = main(["table", args[0], str(row_tracking_table), *args[1:]])
        out, err = capsys.readouterr()
        assert code == 9, (args, out, err)
        assert "rowTracking" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert _log_snapshot(row_tracking_table) == before


# ---- domainMetadata alone, which feedlog writes (it preserves domains it never touches) -----------


@pytest.fixture
def domain_table(tmp_path: Path) -> Path:
    root = tmp_path / "dm"
    foreign_table(root, ["domainMetadata"], {})
    return root


def test_decode_commit_keeps_domain_metadata_and_every_file_field(domain_table: Path) -> None:
    actions = decode_commit((domain_table / "_delta_log" / f"{2:020d}.json").read_bytes(), 2)
    domains = [a for a in actions if isinstance(a, DomainMetadata)]
    assert [(d.domain, d.removed) for d in domains] == [("delta.rowTracking", False), ("com.example.doomed", True)]
    (remove,) = [a for a in actions if isinstance(a, Remove)]
    assert remove.to_json()["baseRowId"] == 7 and remove.to_json()["defaultRowCommitVersion"] == 1
    state = _json_replay(domain_table)
    assert {d: m.configuration for d, m in state.domains.items()} == {
        "delta.clustering": '{"clusteringColumns":["id"]}',
        "delta.rowTracking": '{"rowIdHighWaterMark":4}',
    }


def test_checkpoint_carries_domains_and_file_fields(domain_table: Path) -> None:
    expected = _json_replay(domain_table)
    t = DeltaTable.open(domain_table, clock=ManualClock(T0 + 1000))
    assert t.checkpoint() == 2

    cp = pq.read_table(domain_table / "_delta_log" / f"{2:020d}.checkpoint.parquet")
    add_type = cp.schema.field("add").type
    assert add_type.field("baseRowId").type == pa.int64()
    assert add_type.field("defaultRowCommitVersion").type == pa.int64()
    assert add_type.field("clusteringProvider").type == pa.string()
    assert cp.schema.field("remove").type.field("baseRowId").type == pa.int64()
    dm = [r for r in cp.column("domainMetadata").to_pylist() if r is not None]
    assert sorted((r["domain"], r["configuration"], r["removed"]) for r in dm) == [
        ("delta.clustering", '{"clusteringColumns":["id"]}', False),
        ("delta.rowTracking", '{"rowIdHighWaterMark":4}', False),
    ]

    # feedlog's own replay from the checkpoint alone reproduces every domain and file field
    listing = list_log(t.storage)
    from_cp = load_state(t.storage, listing)
    assert from_cp.domains == expected.domains
    assert from_cp.metadata == expected.metadata and from_cp.protocol == expected.protocol
    assert from_cp.metadata is not None and from_cp.metadata.extra == {"futureMetaField": {"kept": True, "n": 2}}
    assert from_cp.files == expected.files
    assert from_cp.files["part-a.parquet"].to_json()["futureField"] == "kept"
    assert from_cp.tombstones["part-gone.parquet"].to_json()["baseRowId"] == 7

    # cleanup then removes the JSON history; the checkpoint alone still holds every domain
    t.clock = ManualClock(T0 + 10**10)
    deleted = t.cleanup(retain_ms=0)
    assert any(p.endswith(f"{0:020d}.json") for p in deleted)
    again = DeltaTable.open(domain_table)
    assert again.snapshot().state.domains == expected.domains
    assert again.snapshot().domain_metadata() == {d: m.configuration for d, m in expected.domains.items()}


def test_outside_readers_read_the_checkpointed_domain_table(domain_table: Path) -> None:
    DeltaTable.open(domain_table, clock=ManualClock(T0 + 1000)).checkpoint()
    # leave the checkpoint as the only way to the state: outside readers must decode our columns
    for v in (0, 1):
        (domain_table / "_delta_log" / f"{v:020d}.json").unlink()
    want = [(i, f"n{i}") for i in (1, 2, 3, 4, 5)]
    assert sorted_rows(deltalake_read(domain_table), "id", "name") == want
    assert sorted_rows(duckdb_read(domain_table), "id", "name") == want
    import deltalake

    actions = pa.table(deltalake.DeltaTable(str(domain_table)).get_add_actions(flatten=True))
    assert sorted(actions.column("path").to_pylist()) == ["part-a.parquet", "part-b.parquet"]


def test_append_preserves_domains_and_fields(domain_table: Path) -> None:
    t = DeltaTable.open(domain_table, clock=ManualClock(T0 + 1000))
    t.checkpoint()
    t.append(pa.table({"id": pa.array([6], pa.int64()), "name": ["n6"]}))
    state = DeltaTable.open(domain_table).snapshot().state
    assert set(state.domains) == {"delta.clustering", "delta.rowTracking"}
    assert state.files["part-a.parquet"].to_json()["clusteringProvider"] == "liquid"
    assert isinstance(state.files["part-a.parquet"], Add)
