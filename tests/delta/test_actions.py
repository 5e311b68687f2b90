import json
from pathlib import Path

import pytest

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
from feedlog.delta.transaction import ENGINE_INFO
from feedlog.errors import Corruption, InvalidArgument

from .conftest import SCHEMA, T0, counter_ids

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str) -> bytes:
    # the engine version is the one field that changes with releases
    return (GOLDEN / name).read_bytes().replace(b"feedlog/VERSION", ENGINE_INFO.encode())


def test_commit_files_match_golden(tmp_path):
    clock = ManualClock(T0)
    table = DeltaTable.create(tmp_path / "t", SCHEMA, partition_by=["p"], clock=clock, new_id=counter_ids())
    assert (tmp_path / "t/_delta_log/00000000000000000000.json").read_bytes() == golden("create.json")

    clock.advance(1000)
    tx = table.transaction()
    tx.operation_parameters = {"mode": "Append", "partitionBy": ["p"]}
    tx.set_txn("ingest-1", 7)
    stats = '{"numRecords":2,"minValues":{"seq":1},"maxValues":{"seq":2},"nullCount":{"seq":0}}'
    tx.add_files([Add("p=a/part-00000-x-c000.zstd.parquet", {"p": "a"}, 1234, T0 + 500, True, stats)])
    result = tx.commit()
    assert (result.version, result.in_commit_timestamp) == (1, T0 + 1000)
    assert (tmp_path / "t/_delta_log/00000000000000000001.json").read_bytes() == golden("append.json")


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
