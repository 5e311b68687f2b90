import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pytest

from feedlog import __version__
from feedlog.clock import ManualClock
from feedlog.delta import DeltaTable
from feedlog.delta.actions import (
    Action,
    Add,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    Remove,
    Txn,
    decode_commit,
    encode_commit,
)
from feedlog.delta.managed import staged_actions
from feedlog.errors import Corruption, InvalidArgument

GOLDEN = Path(__file__).parent / "golden"


def _load_generator() -> ModuleType:
    """tests/delta/golden/generate.py, the script that wrote the goldens, as a module."""
    spec = importlib.util.spec_from_file_location("delta_golden_generate", GOLDEN / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_generator()


def stored(directory: Path) -> dict[str, dict[str, bytes]]:
    """table -> {path under the table: bytes} of the commit files in a golden directory."""
    return {
        table.name: {f"_delta_log/{f.name}": f.read_bytes() for f in sorted((table / "_delta_log").glob("*.json"))}
        for table in sorted(directory.iterdir())
    }


def test_commit_files_match_the_golden_of_this_version() -> None:
    """What feedlog writes today, byte for byte, against what this version wrote when the golden was made."""
    golden = generate.feedlog_dir()
    assert golden.is_dir(), (
        f"no golden commits for feedlog {__version__} ({golden.name}): run python tests/delta/golden/generate.py "
        "and review the diff against the previous version's"
    )
    written = generate.feedlog_golden()
    assert sorted(written) == sorted(p.name for p in golden.iterdir())
    for table, files in stored(golden).items():
        assert sorted(written[table]) == sorted(files), table
        for path, data in files.items():
            assert written[table][path] == data, f"{golden.name}/{table}/{path} differs from what feedlog writes now"


FEEDLOG_GOLDENS = sorted(GOLDEN.glob("feedlog-*"))
DELTALAKE_GOLDENS = sorted(GOLDEN.glob("deltalake-*"))


def test_the_goldens_are_there() -> None:
    # guards the parametrized tests below against running over nothing
    assert FEEDLOG_GOLDENS and DELTALAKE_GOLDENS


@pytest.mark.parametrize("golden", FEEDLOG_GOLDENS, ids=lambda p: p.name)
def test_every_feedlog_golden_reads_in_feedlog_and_delta_rs(golden: Path, tmp_path: Path) -> None:
    """Commits of every feedlog version stay readable, and delta-rs reads them as feedlog does."""
    deltalake = pytest.importorskip("deltalake")
    for table in sorted(golden.iterdir()):
        path = tmp_path / golden.name / table.name
        shutil.copytree(table, path)
        ours = DeltaTable.open(path, clock=ManualClock(0))  # at the epoch: no version is past the horizon
        theirs = deltalake.DeltaTable(str(path))
        latest = ours.version()
        assert int(theirs.version()) == latest, table.name
        ours_history = {h.version: h for h in ours.history()}
        theirs_history = {h["version"]: h for h in theirs.history()}
        assert sorted(ours_history) == sorted(theirs_history) == list(range(latest + 1)), table.name
        for v in range(latest + 1):
            mine, other = ours_history[v], theirs_history[v]
            assert (mine.operation, mine.in_commit_timestamp) == (other["operation"], other.get("inCommitTimestamp"))
            snap = ours.snapshot(v)
            at_v = deltalake.DeltaTable(str(path), version=v)
            adds = pa.table(at_v.get_add_actions(flatten=True)).to_pylist()
            assert sorted((a.path, a.size) for a in snap.files()) == sorted((a["path"], a["size_bytes"]) for a in adds)
            assert snap.num_records() == sum(a["num_records"] for a in adds), (table.name, v)
            assert snap.properties == at_v.metadata().configuration, (table.name, v)
            assert list(snap.partition_columns) == at_v.metadata().partition_columns
        assert ours.txn_version("ingest-1") == theirs.transaction_version("ingest-1")


@pytest.mark.parametrize("golden", DELTALAKE_GOLDENS, ids=lambda p: p.name)
def test_delta_rs_goldens_read_in_feedlog(golden: Path, tmp_path: Path) -> None:
    """A table delta-rs wrote (commits, a checkpoint, escaped partition paths) reads as the steps wrote it."""
    path = tmp_path / "t"
    shutil.copytree(golden / "partitioned", path)
    ours = DeltaTable.open(path)
    expected = generate.deltalake_expected()
    assert ours.version() == max(expected)
    for v, want in expected.items():
        got = ours.to_arrow(v)
        columns = [got.column(c).to_pylist() for c in ("seq", "key", "value", "p")]
        assert sorted(zip(*columns, strict=True)) == want, v
        ts = got.column("ts").cast(pa.int64()).to_pylist()
        assert sorted(ts) == sorted(generate.T0 * 1000 + seq for seq, *_ in want), v
    assert ours.snapshot().partition_columns == ("p",)


def test_every_action_round_trips():
    actions: list[Action] = [
        CommitInfo(5, 4, "WRITE", {"mode": "Append"}, {"engineInfo": "x", "custom": [1, 2]}),
        Protocol(3, 7, (), ("inCommitTimestamp",)),
        Metadata("id", '{"type":"struct","fields":[]}', ("p",), {"k": "v"}, 1, "name", "desc"),
        Txn("app", 9, 3),
        Remove("a.parquet", 10, True, True, {"p": None}, 12, '{"numRecords":1}'),
        Add("b.parquet", {"p": "x"}, 3, 4, False, None, {"tag": "v"}, {"baseRowId": 7}),
        Remove("c.parquet", 10, True, None, None, None, None, {"t": "1"}, {"baseRowId": 3, "deletionVector": {}}),
        DomainMetadata("delta.rowTracking", '{"rowIdHighWaterMark":4}', False),
        DomainMetadata("com.example", "", True),
    ]
    assert decode_commit(encode_commit(actions), 0) == actions


def test_unknown_actions_and_fields_are_tolerated():
    data = (
        b'{"commitInfo":{"inCommitTimestamp":1,"whatever":{"a":1}}}\n'
        b'{"cdc":{"path":"c.parquet","partitionValues":{},"size":1,"dataChange":false}}\n'
        b'{"domainMetadata":{"domain":"d","configuration":"{}","removed":false}}\n'
        b'{"add":{"path":"a","partitionValues":{},"size":1,"modificationTime":2,"dataChange":true,"newField":3}}\n'
    )
    info, domain, add = decode_commit(data, 4)  # cdc is skipped; domainMetadata is kept (issue 13 item 11)
    assert isinstance(info, CommitInfo) and info.in_commit_timestamp == 1 and info.extra == {"whatever": {"a": 1}}
    assert domain == DomainMetadata("d", "{}", False)
    assert isinstance(add, Add) and add.extra == {"newField": 3}
    assert json.loads(encode_commit([add]))["add"]["newField"] == 3


@pytest.mark.parametrize(
    "data, message",
    [
        (b"not json\n", "commit 12 line 1 is not JSON"),
        (b'{"add":{"path":"a"}}\n', "commit 12 line 1: bad add action"),
        (b'{"add":1}\n', "commit 12 line 1: add is not an object"),
        (b"[1,2]\n", "commit 12 line 1 is not a single action object"),
        (b"\xff\xfe\n", "commit 12 is not UTF-8"),
    ],
)
def test_corrupt_commit_names_the_version(data, message):
    with pytest.raises(Corruption, match=message):
        decode_commit(data, 12)


def test_protocol_upgrade_lists_features_implied_by_older_writer_versions():
    assert Protocol(1, 2).with_writer_feature("inCommitTimestamp") == Protocol(
        1, 7, None, ("appendOnly", "invariants", "inCommitTimestamp")
    )
    assert Protocol(1, 1).with_writer_feature("inCommitTimestamp") == Protocol(1, 7, None, ("inCommitTimestamp",))
    p = Protocol(3, 7, (), ("appendOnly",))
    assert p.with_writer_feature("inCommitTimestamp") == Protocol(3, 7, (), ("appendOnly", "inCommitTimestamp"))
    assert p.with_writer_feature("appendOnly") is p


def test_a_line_nested_beyond_the_parser_is_corruption_not_a_crash() -> None:
    deep = b'{"commitInfo": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n"
    with pytest.raises(Corruption, match="nests too deeply"):
        decode_commit(deep, 1)
    with pytest.raises(InvalidArgument, match="nested too deeply"):
        staged_actions(deep)


def test_staged_actions_scan_a_file_of_many_short_lines_without_a_list_of_them() -> None:
    import tracemalloc

    data = b'{"commitInfo": {"timestamp": 1, "inCommitTimestamp": 5}}\n' + b"ab\n" * 2_000_000
    tracemalloc.start()
    info, protocol, metadata = staged_actions(data)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert info is not None and info.in_commit_timestamp == 5 and protocol is None and metadata is None
    assert peak < 1 << 20, peak  # splitting into lines cost ~100 MB here
