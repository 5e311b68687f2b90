"""Issue 16, the log side: logs as delta-spark, Databricks and delta-rs write them.

Each test builds a table whose log has one trait real tables have (an unknown sibling key, an old
incomplete metaData, a (2,5) protocol, multi-part and V2 checkpoints with sidecars, a checkpoint-only
log, a gap, a bad ICT, features feedlog only reads, a catalog-owned table) and reads every version
with feedlog, deltalake and DuckDB: feedlog's rows must equal the reference readers' wherever they
read the version and agree (`assert_like_references`).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from feedlog.clock import ManualClock, SystemClock
from feedlog.delta import DeltaTable
from feedlog.delta import checkpoint as cp
from feedlog.delta.log import list_log, load_state
from feedlog.delta.managed.protocol import OwnerNotConsulted
from feedlog.delta.parquet import write_parquet
from feedlog.delta.replay import check_writable
from feedlog.errors import Corruption, NotFound, Unsupported

from .conftest import SCHEMA, T0, counter_ids, deltalake_read, duckdb_read, rows, sorted_rows

GOLDEN = Path(__file__).parent / "golden" / "real" / "log"
DAY_MS = 86_400_000
LOG = "_delta_log"


def write_commit(root: Path, version: int, *actions: dict[str, Any], raw: str | None = None) -> None:
    body = raw if raw is not None else "\n".join(json.dumps(a) for a in actions) + "\n"
    path = root / LOG / f"{version:020d}.json"
    assert not path.exists()
    path.write_text(body)


def reference_rows(root: Path, version: int, column: str) -> dict[str, list[tuple[Any, ...]] | None]:
    out: dict[str, list[tuple[Any, ...]] | None] = {}
    for name, read in (("deltalake", deltalake_read), ("duckdb", duckdb_read)):
        try:
            out[name] = sorted_rows(read(root, version), column)
        except Exception:  # a reference reader that cannot read this version: no vote
            out[name] = None
    return out


def assert_like_references(root: Path, versions: list[int], column: str = "seq", *, need: int = 1) -> int:
    """feedlog's rows at each version equal every reference reader's that reads it; returns how many
    (version, reader) pairs voted, and fails unless at least `need` did (no vacuous pass). Read with
    a clock at the epoch, so that no version is past the time-travel horizon (vacuum.check_horizon)."""
    table = DeltaTable.open(root, clock=ManualClock(0))
    votes = 0
    for v in versions:
        ours = sorted_rows(table.to_arrow(v), column)
        refs = reference_rows(root, v, column)
        readable = {k: r for k, r in refs.items() if r is not None}
        if len(readable) == 2 and readable["deltalake"] != readable["duckdb"]:
            continue  # the references disagree: no verdict at this version
        for name, theirs in readable.items():
            assert ours == theirs, (v, name)
            votes += 1
    assert votes >= need, f"only {votes} reference reads agreed to compare against"
    return votes


@pytest.fixture
def table(tmp_path: Path, clock: ManualClock) -> DeltaTable:
    return DeltaTable.create(tmp_path / "t", SCHEMA, clock=clock, new_id=counter_ids(), in_commit_timestamps=False)


def adds_for(t: DeltaTable, data: pa.Table) -> list[dict[str, Any]]:
    return [a.to_json() for a in t.write_files(data)]


# item 3: unknown sibling keys and fields


def test_unknown_sibling_keys_and_fields_inside_actions_are_ignored(table: DeltaTable, tmp_path: Path) -> None:
    root = tmp_path / "t"
    table.append(rows(0, 3))
    (add,) = adds_for(table, rows(3, 2))
    add["someFutureField"] = {"nested": [1, 2]}
    lines = [
        json.dumps({"commitInfo": {"timestamp": T0 + 1, "operation": "WRITE", "futureInfo": 1}}),
        json.dumps({"add": add, "someFutureKey": {"x": 1}}),  # a sibling key next to the action
        json.dumps({"someFutureAction": {"path": "nothing"}}),
        json.dumps({"txn": {"appId": "app", "version": 7, "lastUpdated": T0, "extraTxnField": True}}),
    ]
    write_commit(root, 2, raw="\n".join(lines) + "\n")
    fresh = DeltaTable.open(root)
    assert fresh.version() == 2 and fresh.txn_version("app") == 7
    assert sorted_rows(fresh.to_arrow(), "seq") == [(i,) for i in range(5)]
    # a line with two actions is still corruption: which one it means is unknowable
    write_commit(root, 3, raw=json.dumps({"add": add, "remove": {"path": add["path"], "dataChange": True}}) + "\n")
    with pytest.raises(Corruption, match="commit 3 line 1 holds more than one action"):
        DeltaTable.open(root).snapshot(3)
    (root / LOG / f"{3:020d}.json").unlink()
    assert_like_references(root, [0, 1, 2])


# item 10: an old metaData without schemaString


def test_a_superseded_metadata_without_schema_string_is_not_corruption(table: DeltaTable, tmp_path: Path) -> None:
    src = tmp_path / "t"
    (add,) = adds_for(table, rows(0, 4))
    root = tmp_path / "old"
    (root / LOG).mkdir(parents=True)
    shutil.copy(src / add["path"], root / add["path"])
    meta0 = json.loads((src / LOG / f"{0:020d}.json").read_text().splitlines()[2])["metaData"]
    incomplete = {k: v for k, v in meta0.items() if k != "schemaString"}
    legacy = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}
    write_commit(root, 0, {"commitInfo": {"timestamp": T0}}, legacy, {"metaData": incomplete})
    write_commit(root, 1, {"commitInfo": {"timestamp": T0 + 1}}, {"metaData": meta0})
    write_commit(root, 2, {"commitInfo": {"timestamp": T0 + 2}}, {"add": add})
    t = DeltaTable.open(root)
    assert sorted_rows(t.to_arrow(), "seq") == [(i,) for i in range(4)]
    assert t.to_arrow(1).num_rows == 0
    with pytest.raises(Corruption, match="metaData in effect at version 0 has no schemaString"):
        t.snapshot(0)
    t.checkpoint()  # the checkpoint holds the complete metaData
    assert sorted_rows(DeltaTable.open(root).to_arrow(), "seq") == [(i,) for i in range(4)]
    assert_like_references(root, [1, 2])


# item 9: protocol (2,5) without a column mapping mode


@pytest.mark.parametrize("mode", [None, "none"])
def test_protocol_2_5_without_a_mapping_mode_is_read(table: DeltaTable, tmp_path: Path, mode: str | None) -> None:
    src = tmp_path / "t"
    (add,) = adds_for(table, rows(0, 3))
    root = tmp_path / "dlt"
    (root / LOG).mkdir(parents=True)
    shutil.copy(src / add["path"], root / add["path"])
    meta = json.loads((src / LOG / f"{0:020d}.json").read_text().splitlines()[2])["metaData"]
    meta["configuration"] = {} if mode is None else {"delta.columnMapping.mode": mode}
    dlt = {"protocol": {"minReaderVersion": 2, "minWriterVersion": 5}}
    write_commit(root, 0, {"commitInfo": {"timestamp": T0}}, dlt, {"metaData": meta})
    write_commit(root, 1, {"commitInfo": {"timestamp": T0 + 1}}, {"add": add})
    t = DeltaTable.open(root)
    assert sorted_rows(t.to_arrow(), "seq") == [(0,), (1,), (2,)]
    s = t.snapshot()
    check_writable(s.protocol, metadata=s.metadata)  # nothing (2,5) implies is in use
    assert t.append(rows(10, 2)).version == 2  # and a transaction may write it (it refused: no metadata given)
    assert sorted_rows(DeltaTable.open(root).to_arrow(), "seq") == [(0,), (1,), (2,), (10,), (11,)]
    assert_like_references(root, [0, 1, 2])


def test_legacy_writer_versions_refuse_only_features_in_use() -> None:
    from feedlog.delta.actions import Metadata, Protocol

    plain = Metadata("id", '{"type":"struct","fields":[]}')
    check_writable(Protocol(1, 4), metadata=plain)
    constrained = Metadata("id", plain.schema_string, configuration={"delta.constraints.pos": "x > 0"})
    with pytest.raises(Unsupported, match=r"writing refused: .*'checkConstraints'.*writer version 3"):
        check_writable(Protocol(1, 3), metadata=constrained)
    generated = Metadata(
        "id",
        json.dumps({"type": "struct", "fields": [{"name": "g", "type": "long", "nullable": True,
                                                  "metadata": {"delta.generationExpression": "1"}}]}),
    )  # fmt: skip
    with pytest.raises(Unsupported, match="generatedColumns"):
        check_writable(Protocol(1, 4), metadata=generated)


# item 4: multi-part checkpoints


def write_multi_part(root: Path, version: int, parts: int, *, drop_part: int | None = None) -> list[Path]:
    """A multi-part V1 checkpoint of `version` as delta-spark writes one: rows spread over the parts by a
    hash of the file path (PROTOCOL.md "Multi-part checkpoint"), protocol and metaData in some part."""
    state = load_state(DeltaTable.open(root).storage, list_log(DeltaTable.open(root).storage), version)
    all_rows = list(cp._rows(state))
    schema = cp._schema_for(all_rows)
    buckets: list[list[dict[str, Any]]] = [[] for _ in range(parts)]
    for i, row in enumerate(all_rows):
        body = row.get("add") or row.get("remove")
        key = body["path"] if body else str(i)
        buckets[zlib.crc32(key.encode()) % parts].append(row)
    written = []
    for i, bucket in enumerate(buckets, 1):
        if i == drop_part:
            continue
        path = root / LOG / f"{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet"
        path.write_bytes(write_parquet(pa.Table.from_pylist(bucket, schema=schema), "snappy"))
        written.append(path)
    (root / LOG / "_last_checkpoint").write_text(
        json.dumps({"version": version, "size": len(all_rows), "parts": parts})
    )
    return written


def history_of(t: DeltaTable) -> None:
    t.append(rows(0, 3, "a"))
    t.append(rows(3, 2, "b"))
    t.append(rows(5, 4, "a"), mode="overwrite")
    t.append(rows(9, 1, "c"))
    t.append(rows(10, 2, "a"))


def test_multi_part_checkpoints_are_used_and_survive_cleanup(table: DeltaTable, tmp_path: Path) -> None:
    root = tmp_path / "t"
    history_of(table)  # versions 0..5
    write_multi_part(root, 3, 3)
    table.append(rows(12, 1))  # 6
    write_multi_part(root, 6, 2, drop_part=2)  # incomplete: must be ignored
    listing = list_log(table.storage)
    assert listing.checkpoints[3].kind == "multi-part" and 6 not in listing.checkpoints
    for v in range(3):
        (root / LOG / f"{v:020d}.json").unlink()
    t = DeltaTable.open(root)
    assert sorted_rows(t.to_arrow(3), "seq") == [(i,) for i in range(5, 9)]
    assert sorted_rows(t.to_arrow(), "seq") == [(i,) for i in range(5, 13)]
    with pytest.raises(NotFound, match="version 2 is older than the retained log"):
        t.snapshot(2)
    assert_like_references(root, list(range(3, 7)), need=4)
    # feedlog's own cleanup keeps the multi-part set it needs and deletes commits before it
    clock = ManualClock(T0 + 30 * DAY_MS)
    t = DeltaTable.open(root, clock=clock)
    t.cleanup(retain_ms=0)
    assert sorted_rows(DeltaTable.open(root).to_arrow(), "seq") == [(i,) for i in range(5, 13)]


# item 4: V2 checkpoints


def v2_table(tmp_path: Path, clock: ManualClock, name: str = "v2") -> DeltaTable:
    """A table upgraded to (3,7) with v2Checkpoint by a hand-written commit, as delta-spark does it."""
    t = DeltaTable.create(tmp_path / name, SCHEMA, clock=clock, new_id=counter_ids(), in_commit_timestamps=False)
    t.append(rows(0, 3))
    write_commit(tmp_path / name, 2, {"commitInfo": {"timestamp": T0 + 2, "operation": "UPGRADE PROTOCOL"}},
                 {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["v2Checkpoint"],
                               "writerFeatures": ["v2Checkpoint", "appendOnly", "invariants"]}})  # fmt: skip
    return DeltaTable.open(tmp_path / name, clock=clock, new_id=counter_ids())


@pytest.mark.parametrize("sidecars", [True, False])
def test_feedlog_writes_v2_checkpoints_others_read(tmp_path: Path, clock: ManualClock, sidecars: bool) -> None:
    t = v2_table(tmp_path, clock)
    root = tmp_path / "v2"
    t.append(rows(3, 2, "b"))
    t.checkpoint(sidecars=sidecars)  # version 3
    t.append(rows(5, 1))
    names = sorted(os.listdir(root / LOG))
    (uuid_cp,) = [n for n in names if ".checkpoint." in n]
    assert uuid_cp.startswith(f"{3:020d}.checkpoint.") and uuid_cp.endswith(".parquet") and len(uuid_cp) == 76
    side = sorted(os.listdir(root / LOG / "_sidecars")) if (root / LOG / "_sidecars").exists() else []
    assert len(side) == (1 if sidecars else 0)
    last = json.loads((root / LOG / "_last_checkpoint").read_text())
    assert last["version"] == 3 and last["v2Checkpoint"]["path"] == uuid_cp
    assert last["checksum"] == cp.checksum(last)
    assert [s["path"] for s in last["v2Checkpoint"]["sidecarFiles"]] == side
    for v in range(3):
        (root / LOG / f"{v:020d}.json").unlink()
    assert sorted_rows(DeltaTable.open(root).to_arrow(), "seq") == [(i,) for i in range(6)]
    assert_like_references(root, [3, 4], need=4)


def build_golden_v2_json(tmp_path: Path) -> Path:
    """delta-spark's v2-checkpoint-json golden table: its real JSON checkpoint and _last_checkpoint,
    with the two sidecars it names and four data files built here (Parquet is not in the index)."""
    root = tmp_path / "v2-checkpoint-json"
    shutil.copytree(GOLDEN / "v2-checkpoint-json", root)
    (root / LOG / "_sidecars").mkdir()
    text = (root / LOG / f"{2:020d}.checkpoint.6374b053-df23-479b-b2cf-c9c550132b49.json").read_text()
    sidecars = [
        (json.loads(line)["sidecar"]["path"], json.loads(line)["sidecar"]["sizeInBytes"])
        for line in text.splitlines()
        if '"sidecar"' in line
    ]
    schema = pa.schema([("id", pa.int64())])
    adds = []
    for i in range(4):
        name = f"part-0000{i}-0000000{i}-aaaa-bbbb-cccc-dddddddddddd-c000.snappy.parquet"
        data = write_parquet(pa.table({"id": list(range(i * 10, i * 10 + 5))}, schema=schema), "snappy")
        (root / name).write_bytes(data)
        stats = json.dumps({"numRecords": 5, "minValues": {"id": i * 10}, "maxValues": {"id": i * 10 + 4},
                            "nullCount": {"id": 0}})  # fmt: skip
        adds.append({"add": {"path": name, "partitionValues": [], "size": len(data), "modificationTime": 1714496115000,
                             "dataChange": False, "stats": stats, "tags": None}})  # fmt: skip
    side_schema = pa.schema([cp.SCHEMA.field("add"), cp.SCHEMA.field("remove")])
    for j, (name, size) in enumerate(sidecars):
        part = pa.Table.from_pylist(adds[j * 2 : j * 2 + 2], schema=side_schema)
        (root / LOG / "_sidecars" / name).write_bytes(parquet_of_size(part, size))
    return root


def parquet_of_size(table: pa.Table, size: int) -> bytes:
    """`table` as Parquet of exactly `size` bytes (padded in the footer's key-value metadata): kernels
    read a sidecar by the sizeInBytes its checkpoint records."""
    import pyarrow.parquet as pq

    pad = 0
    for _ in range(64):
        sink = pa.BufferOutputStream()
        with pq.ParquetWriter(sink, table.schema) as writer:
            writer.write_table(table)
            writer.add_key_value_metadata({"pad": "x" * pad})
        data = bytes(sink.getvalue())
        if len(data) == size:
            return data
        pad = max(0, pad + size - len(data))
    raise AssertionError(f"cannot pad a sidecar to {size} bytes")


def test_delta_spark_v2_json_checkpoint_with_sidecars_on_a_checkpoint_only_log(tmp_path: Path) -> None:
    root = build_golden_v2_json(tmp_path)
    t = DeltaTable.open(root)
    assert t.version() == 2
    assert sorted(r for (r,) in sorted_rows(t.to_arrow(), "id")) == sorted(
        i * 10 + k for i in range(4) for k in range(5)
    )
    with pytest.raises(NotFound, match="older than the retained log"):
        t.snapshot(1)
    info = t.info()
    assert info["version"] == info["backfilled_version"] == 2 and info["rows"] == 20
    assert "v2Checkpoint" in info["features"] and t.history() == []
    with pytest.raises(NotFound, match="no retained version"):
        t.version_at(1714496115810)  # no commit file is left to give a time
    assert_like_references(root, [2], column="id")
    # writable: appendOnly, invariants and v2Checkpoint are honoured; the next checkpoint is V2 too
    clock = ManualClock(SystemClock().now_ms())  # sidecar ages are file times
    w = DeltaTable.open(root, clock=clock, new_id=counter_ids())
    w.append(pa.table({"id": pa.array([100, 101], pa.int64())}))
    w.checkpoint()
    assert len([n for n in os.listdir(root / LOG) if ".checkpoint." in n]) == 2
    assert sorted(os.listdir(root / LOG / "_sidecars")) != []
    assert_like_references(root, [2, 3], column="id", need=2)
    # cleanup far in the future: the old checkpoint and its sidecars go, the new ones stay
    clock.set(clock.now_ms() + 40 * DAY_MS)
    deleted = {p.rsplit("/", 1)[-1] for p in DeltaTable.open(root, clock=clock).cleanup(retain_ms=0)}
    assert {f"{2:020d}.checkpoint.6374b053-df23-479b-b2cf-c9c550132b49.json", *[
        n for n in deleted if n.startswith("00000000000000000002.checkpoint.000")]} <= deleted  # fmt: skip
    remaining = os.listdir(root / LOG / "_sidecars")
    assert len(remaining) == 1 and not remaining[0].startswith("00000000000000000002")
    assert sorted_rows(DeltaTable.open(root).to_arrow(), "id")[-2:] == [(100,), (101,)]
    assert_like_references(root, [3], column="id")


def test_a_v2_checkpoint_naming_a_missing_sidecar_is_corruption_not_missing_data(tmp_path: Path) -> None:
    root = build_golden_v2_json(tmp_path)
    victim = sorted(os.listdir(root / LOG / "_sidecars"))[0]
    (root / LOG / "_sidecars" / victim).unlink()
    with pytest.raises(Corruption, match=f"names sidecar {victim}, which is not in"):
        DeltaTable.open(root).to_arrow()


# item 11: checkpoint-only logs, checkpoints without their commit, gaps


def test_a_checkpoint_without_its_commit_file_is_still_that_version(table: DeltaTable, tmp_path: Path) -> None:
    root = tmp_path / "t"
    history_of(table)
    table.checkpoint()  # 5
    (root / LOG / f"{5:020d}.json").unlink()
    t = DeltaTable.open(root)
    assert t.version() == 5
    assert sorted_rows(t.to_arrow(), "seq") == [(i,) for i in range(5, 12)]
    assert sorted_rows(t.to_arrow(4), "seq") == [(i,) for i in range(5, 10)]
    assert_like_references(root, [4, 5])


def test_a_missing_old_commit_is_named_and_does_not_break_time_travel_in_the_tail(
    table: DeltaTable, tmp_path: Path
) -> None:
    root = tmp_path / "t"
    history_of(table)  # 0..5
    table.checkpoint(3)
    (root / LOG / f"{1:020d}.json").unlink()
    t = DeltaTable.open(root)
    with pytest.raises(Corruption, match=r"commit 1 is missing .* the log has a gap"):
        t.snapshot(2)
    assert sorted_rows(t.to_arrow(3), "seq") == [(i,) for i in range(5, 9)]
    tail = [e for e in t.history() if e.version >= 2]
    for e in tail:
        assert t.version_at(e.timestamp) == e.version
    with pytest.raises(Corruption, match="commit 1 is missing from the log"):
        t.version_at(t.history()[-1].timestamp)  # version 0's time: before the gap
    assert_like_references(root, [3, 4, 5])


# features read but not written; catalog-owned tables


def upgrade(root: Path, version: int, reader: list[str], writer: list[str], conf: dict[str, str] | None = None) -> None:
    actions: list[dict[str, Any]] = [
        {"commitInfo": {"timestamp": T0 + version}},
        {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": reader,
                "writerFeatures": writer,
            }
        },
    ]
    if conf is not None:
        meta = json.loads((root / LOG / f"{0:020d}.json").read_text().splitlines()[2])["metaData"]
        meta["configuration"] = {**meta["configuration"], **conf}
        actions.append({"metaData": meta})
    write_commit(root, version, *actions)


@pytest.mark.parametrize(
    "writer_only",
    ["rowTracking", "clustering", "icebergCompatV1", "icebergCompatV2", "allowColumnDefaults",
     "checkConstraints", "generatedColumns", "identityColumns", "changeDataFeed"],
)  # fmt: skip
def test_writer_features_are_read_and_writing_is_refused_by_name(
    table: DeltaTable, tmp_path: Path, writer_only: str
) -> None:
    root = tmp_path / "t"
    table.append(rows(0, 2))
    reader = ["timestampNtz", "v2Checkpoint"]
    upgrade(root, 2, reader, [*reader, "domainMetadata", "inCommitTimestamp", writer_only])
    t = DeltaTable.open(root)
    assert sorted_rows(t.to_arrow(), "seq") == [(0,), (1,)]
    with pytest.raises(Unsupported, match=rf"writing refused: .*'{writer_only}'"):
        t.append(rows(2, 1))
    with pytest.raises(Unsupported, match=rf"no checkpoint: writing refused: .*'{writer_only}'"):
        t.checkpoint()
    assert DeltaTable.open(root).version() == 2


def test_an_unknown_reader_feature_is_refused_for_reading_by_name(table: DeltaTable, tmp_path: Path) -> None:
    root = tmp_path / "t"
    table.append(rows(0, 2))
    upgrade(root, 2, ["someFutureFeature"], ["someFutureFeature"])
    with pytest.raises(Unsupported, match=r"reading refused: .*\['someFutureFeature'\]"):
        DeltaTable.open(root).to_arrow()


@pytest.mark.parametrize(
    "reader, writer, conf",
    [
        (["catalogManaged"], ["catalogManaged", "inCommitTimestamp"], {"delta.enableInCommitTimestamps": "true"}),
        (["catalogOwned-preview"], ["catalogOwned-preview", "inCommitTimestamp"], None),
        ([], ["coordinatedCommits-preview", "inCommitTimestamp"],
         {"delta.coordinatedCommits.commitCoordinator-preview": "dynamodb",
          "delta.coordinatedCommits.commitCoordinatorConf-preview": "{}"}),
    ],
)  # fmt: skip
def test_catalog_owned_tables_read_their_backfilled_log_with_a_warning_and_refuse_writes(
    table: DeltaTable, tmp_path: Path, reader: list[str], writer: list[str], conf: dict[str, str] | None
) -> None:
    root = tmp_path / "t"
    table.append(rows(0, 2))
    # a staged commit the catalog ratified but has not published: invisible in the backfilled log
    (root / LOG / "_staged_commits").mkdir()
    (root / LOG / "_staged_commits" / f"{3:020d}.00000000-0000-0000-0000-000000000009.json").write_text("{}\n")
    upgrade(root, 2, reader, writer, {"delta.enableInCommitTimestamps": "false", **(conf or {})})
    with pytest.warns(OwnerNotConsulted, match="newer"):
        t = DeltaTable.open(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OwnerNotConsulted)
        assert t.version() == 2
        assert sorted_rows(t.to_arrow(), "seq") == [(0,), (1,)]
        name = (reader or writer)[0]
        with pytest.raises(Unsupported, match=rf"writing refused: .*'{name}'"):
            t.append(rows(2, 1))


def test_checkpoint_protection_keeps_the_sidecars_of_the_v2_checkpoints_it_keeps(tmp_path: Path) -> None:
    """checkpointProtection before version 7 on a V2 table: a partial cleanup keeps V2 checkpoint 2 and
    so its sidecar, while sidecars of no retained checkpoint (a day old) go."""
    clock = ManualClock(SystemClock().now_ms())  # sidecar ages are file times
    root = tmp_path / "p"
    t = DeltaTable.create(root, SCHEMA, clock=clock, new_id=counter_ids(),
                          properties={"delta.requireCheckpointProtectionBeforeVersion": "7"})  # fmt: skip
    s = t.snapshot()
    assert s.in_commit_timestamp is not None
    writer = [*(s.protocol.writer_features or ()), "v2Checkpoint"]
    clock.advance(DAY_MS)
    write_commit(root, 1, {"commitInfo": {"inCommitTimestamp": clock.now_ms(), "timestamp": clock.now_ms()}},
                 {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["v2Checkpoint"],
                               "writerFeatures": writer}})  # fmt: skip
    t = DeltaTable.open(root, clock=clock, new_id=counter_ids())
    sidecar_of: dict[int, str] = {}
    for v in range(2, 8):
        clock.advance(DAY_MS)
        t.append(rows(v, 1))
        if v in (2, 4, 6):
            before = set(os.listdir(root / LOG / "_sidecars")) if (root / LOG / "_sidecars").exists() else set()
            t.checkpoint()
            (sidecar_of[v],) = set(os.listdir(root / LOG / "_sidecars")) - before
    # an orphan: a sidecar of a checkpoint that was never written (a crashed writer)
    orphan = root / LOG / "_sidecars" / "orphan.parquet"
    orphan.write_bytes((root / LOG / "_sidecars" / sidecar_of[2]).read_bytes())
    os.utime(orphan, (0, 0))
    clock.advance(DAY_MS // 2)
    deleted = {p.rsplit("/", 1)[-1] for p in t.cleanup(retain_ms=3 * DAY_MS)}  # cutoff checkpoint 4 < 7
    assert {f"{v:020d}.json" for v in range(4)} <= deleted and "orphan.parquet" in deleted
    assert set(sidecar_of.values()) <= set(os.listdir(root / LOG / "_sidecars"))  # 2's kept with it
    fresh = DeltaTable.open(root)
    assert sorted_rows(fresh.to_arrow(2), "seq") == [(2,)]
    assert sorted_rows(fresh.to_arrow(), "seq") == [(v,) for v in range(2, 8)]
    assert_like_references(root, [4, 5, 6, 7], need=4)


def test_a_classic_named_checkpoint_in_the_v2_spec_is_read_with_its_sidecars(
    tmp_path: Path, clock: ManualClock
) -> None:
    """PROTOCOL.md: a classic checkpoint may follow the V2 spec (checkpointMetadata, sidecars) on a V2 table."""
    t = v2_table(tmp_path, clock)
    root = tmp_path / "v2"
    t.append(rows(3, 4, "b"))
    t.checkpoint()  # 3
    (uuid_cp,) = [n for n in os.listdir(root / LOG) if ".checkpoint." in n]
    os.rename(root / LOG / uuid_cp, root / LOG / f"{3:020d}.checkpoint.parquet")
    for v in range(3):
        (root / LOG / f"{v:020d}.json").unlink()
    listing = list_log(DeltaTable.open(root).storage)
    assert listing.checkpoints[3].kind == "classic"
    assert sorted_rows(DeltaTable.open(root).to_arrow(), "seq") == [(i,) for i in range(7)]
    assert_like_references(root, [3])


def test_cleanup_deletes_log_compactions_starting_at_or_before_the_cutoff_checkpoint() -> None:
    from feedlog.delta.maintenance import cleanup_plan

    def log(name: str) -> str:
        return f"{LOG}/{name}"

    paths = [log(f"{2:020d}.{4:020d}.compacted.json"), log(f"{5:020d}.{7:020d}.compacted.json"),
             log(f"{6:020d}.{8:020d}.compacted.json"), log(f"{1:020d}.json"), log(f"{1:020d}.checkpoint.parquet"),
             log(f"{5:020d}.json"), log(f"{5:020d}.checkpoint.parquet")]  # fmt: skip
    assert cleanup_plan(paths, 5) == [
        log(f"{2:020d}.{4:020d}.compacted.json"),
        log(f"{5:020d}.{7:020d}.compacted.json"),
        log(f"{1:020d}.json"),
        log(f"{1:020d}.checkpoint.parquet"),
    ]
