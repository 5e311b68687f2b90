"""The msgspec fast path for commit files against the reference decoder (`actions.decode_commit`).

The fast path may decline any commit (None: the reference decodes it), but a commit it decodes must
come out exactly as the reference's actions, and it must never accept a commit the reference
refuses. Generated commits mix what writers put in real logs (every action kind, the protocol's
optional fields, unknown siblings and kinds) with what they must not (nulls, wrong types, blank and
split lines, several actions on one line, bytes that are not UTF-8).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedlog.delta import fast_commit
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
from feedlog.errors import Corruption

GOLDEN = Path(__file__).parent / "golden"

_text = st.text(max_size=12)
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)
_json = st.recursive(
    _scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3), max_leaves=8
)


#: a value usually of the type the field should have, sometimes anything at all
def _field(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(good, good, good, _json)


_add_fields = {
    "path": _field(_text),
    "partitionValues": _field(st.dictionaries(_text, st.none() | _text, max_size=3)),
    "size": _field(st.integers(min_value=0, max_value=2**40)),
    "modificationTime": _field(st.integers(min_value=0, max_value=2**45)),
    "dataChange": _field(st.booleans()),
    "stats": _field(st.none() | _text),
    "tags": _field(st.none() | st.dictionaries(_text, _text, max_size=2)),
    "deletionVector": _json,
    "baseRowId": _field(st.integers(min_value=0, max_value=2**40)),
    "defaultRowCommitVersion": _field(st.integers(min_value=0, max_value=2**40)),
    "clusteringProvider": _field(_text),
    "somethingNew": _json,
}
_remove_fields = {
    "path": _field(_text),
    "deletionTimestamp": _field(st.integers(min_value=0, max_value=2**45)),
    "dataChange": _field(st.booleans()),
    "extendedFileMetadata": _field(st.booleans()),
    "partitionValues": _field(st.dictionaries(_text, st.none() | _text, max_size=3)),
    "size": _field(st.integers(min_value=0, max_value=2**40)),
    "stats": _field(_text),
    "deletionVector": _json,
    "baseRowId": _field(st.integers(min_value=0, max_value=2**40)),
    "somethingNew": _json,
}
_info_fields = {
    "inCommitTimestamp": _field(st.integers(min_value=0, max_value=2**45)),
    "timestamp": _field(st.integers(min_value=0, max_value=2**45)),
    "operation": _field(_text),
    "operationParameters": _field(st.dictionaries(_text, _text, max_size=2)),
    "engineInfo": _json,
}


@st.composite
def _object(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[Any]], required: tuple[str, ...]) -> dict[str, Any]:
    """Some of `fields` (the required ones almost always), in a drawn order."""
    keys = [k for k in fields if (k in required and draw(st.integers(0, 20)) > 0) or draw(st.booleans())]
    keys = draw(st.permutations(keys))
    return {k: draw(fields[k]) for k in keys}


_bodies = {
    "add": _object(_add_fields, ("path", "size", "modificationTime", "partitionValues", "dataChange")),
    "remove": _object(_remove_fields, ("path", "deletionTimestamp", "dataChange")),
    "commitInfo": _object(_info_fields, ("inCommitTimestamp",)),
    "txn": st.fixed_dictionaries({"appId": _field(_text), "version": _field(st.integers(0, 9))}),
    "protocol": st.fixed_dictionaries(
        {"minReaderVersion": _field(st.integers(1, 3)), "minWriterVersion": _field(st.integers(1, 7))}
    ),
    "metaData": st.fixed_dictionaries({"id": _text, "schemaString": _text, "format": _field(st.just({}))}),
    "domainMetadata": st.fixed_dictionaries(
        {"domain": _field(_text), "configuration": _field(_text), "removed": _field(st.booleans())}
    ),
    "cdc": _json,
    "futureAction": _json,
}


@st.composite
def _line(draw: st.DrawFn) -> str:
    kinds = draw(st.lists(st.sampled_from(sorted(_bodies)), min_size=1, max_size=2, unique=True))
    obj = {k: draw(_bodies[k]) if draw(st.integers(0, 15)) else draw(_json) for k in kinds}
    text = json.dumps(
        obj, ensure_ascii=draw(st.booleans()), separators=draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    )
    match draw(st.integers(0, 30)):
        case 0:
            return ""  # a blank line
        case 1:
            return "  " + text + " "  # padded
        case 2:
            return text.replace(",", ",\n", 1)  # one object over two lines
        case 3:
            return text[: len(text) // 2]  # cut short
        case 4:
            return "[" + text + "]"
        case 5:
            return text + "," + text  # two values on one line
        case 6:
            return text.replace('"', '"\xff', 1)  # bad UTF-8 (encoded below with surrogateescape)
        case _:
            return text


@st.composite
def commits(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(_line(), min_size=0, max_size=6))
    text = "\n".join(lines) + draw(st.sampled_from(["\n", "", "\r\n", "\n\n"]))
    data = text.replace("\xff", "\udcff").encode("utf-8", "surrogateescape")
    if draw(st.integers(0, 40)) == 0:
        data += b"\xff"  # not UTF-8
    return data


def _reference(data: bytes, ict_only: bool) -> list[Any] | Corruption:
    try:
        return decode_commit(data, 7, ict_only)
    except Corruption as e:
        return e


def _agrees(data: bytes) -> bool:
    """Whether the fast path decoded `data` (in both modes), asserting it agrees with the reference."""
    taken = True
    for ict_only in (False, True):
        fast = fast_commit.decode(data, ict_only)
        ref = _reference(data, ict_only)
        if fast is None:
            taken = False
            continue
        assert not isinstance(ref, Corruption), f"the fast path accepted what the reference refuses: {ref}"
        assert fast == ref
        assert [type(a) for a in fast] == [type(a) for a in ref]
    return taken


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commits())
def test_the_fast_path_decodes_as_the_reference_or_declines(data: bytes) -> None:
    _agrees(data)


ACTIONS: list[Action] = [
    CommitInfo(5, 4, "WRITE", {"mode": "Append"}, {"engineInfo": "x", "custom": [1, 2], "readVersion": 3}),
    Protocol(3, 7, (), ("inCommitTimestamp",)),
    Metadata("id", '{"type":"struct","fields":[]}', ("p",), {"k": "v"}, 1, "name", "desc"),
    Txn("app", 9, 3),
    Remove("a.parquet", 10, True, True, {"p": None}, 12, '{"numRecords":1}'),
    Add("b.parquet", {"p": "x"}, 3, 4, False, None, {"tag": "v"}, {"baseRowId": 7}),
    Add("c.parquet", {}, 3, 4, True, '{"numRecords":1}', None, {"clusteringProvider": "liquid"}),
    Remove("c.parquet", 10, True, None, None, None, None, {"t": "1"}, {"baseRowId": 3, "deletionVector": {}}),
    DomainMetadata("delta.rowTracking", '{"rowIdHighWaterMark":4}', False),
    DomainMetadata("com.example", "", True),
]


def test_the_fast_path_takes_every_action_feedlog_writes() -> None:
    data = encode_commit(ACTIONS)
    assert fast_commit.decode(data) == ACTIONS
    ict_only = fast_commit.decode(data, ict_only=True)
    assert ict_only == [CommitInfo(5, None), *ACTIONS[1:]]
    assert _agrees(data)


@pytest.mark.parametrize(
    "data",
    [
        b'{"add":{"path":"a","partitionValues":{},"size":1,"modificationTime":2,"dataChange":true,"newField":3}}\n',
        b'{"add":{"path":"a","partitionValues":{},"size":1.0,"modificationTime":2,"dataChange":true}}\n',
        b'{"add":{"path":"a","partitionValues":{},"size":1,"modificationTime":2,"dataChange":null}}\n',
        b'{"add":{"path":"a","partitionValues":{"p":1},"size":1,"modificationTime":2}}\n',
        b'{"add":{"path":"a","partitionValues":null,"size":1,"modificationTime":2}}\n',
        b'{"add":{"path":"a","size":1,"modificationTime":2},"remove":{"path":"a"}}\n',
        b'{"add":{"path":"a","size":1,"modificationTime":2},"cdc":{"path":"c"}}\n',
        b'{"add":null}\n',
        b'{"cdc":{"path":"c"}}\n',
        b"{}\n",
        b'{"txn":{"appId":"a","version":1}}\n\n{"txn":{"appId":"b","version":2}}\n',
        b'{"txn":{"appId":"a",\n"version":1}}\n',
        b'{"commitInfo":{"inCommitTimestamp":true}}\n',
        b'{"commitInfo":{"inCommitTimestamp":1e400}}\n',
        b'{"commitInfo":{"x":"\\ud800"}}\n',
        b'{"commitInfo":{"x":"\xe2\x80\xa8"}}\n',  # U+2028 unescaped: valid JSON, a line break to str.splitlines
        b'{"commitInfo":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
        b'{"commitInfo":{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}}\n",
        b'{"protocol":{"minReaderVersion":"x","minWriterVersion":2}}\n',
        b'{"domainMetadata":{"domain":1,"configuration":"","removed":false}}\n',
        b"\xff\n",
        b"",
        b"\n",
        # two values on one line, one value over two lines: as many values as lines when joined
        b'{"cdc":0},{"cdc":0}\n{"txn":{"appId":"a"\n"version":1}}\n',
        b'{"cdc":0},{"cdc":0}\n{"cdc":"\n"}\n{"add":{"path":"evil","size":1,"modificationTime":2}}\n',
        # bad UTF-8 where msgspec only skips: an unknown key, its value, a commitInfo field before the last
        b'{"txn":{"appId":"a","version":1},"x":"\xff"}\n',
        b'{"\xff":1,"txn":{"appId":"a","version":1}}\n',
        b'{"txn":{"appId":"a","version":1},"x":"\xed\xa0\x80"}\n',
        b'{"commitInfo":{"x":"\xff"}}\n',
        # integers longer than int() reads from a string, read or skipped
        b'{"txn":{"appId":"a","version":1},"x":' + b"1" * 4301 + b"}\n",
        b'{"commitInfo":{"inCommitTimestamp":1,"x":' + b"1" * 4301 + b"}}\n",
        b'{"cdc":' + b"1" * 5000 + b"}\n",
        b'{"txn":{"appId":"a","version":' + b"1" * 5000 + b"}}\n",
        # numbers beyond a float where an integer belongs
        b'{"add":{"path":"a","size":1e400,"modificationTime":2}}\n',
        b'{"txn":{"appId":"a","version":1e400}}\n',
        b'{"protocol":{"minReaderVersion":1e400,"minWriterVersion":2}}\n',
    ],
)
def test_odd_commits_decode_as_the_reference_or_are_declined(data: bytes) -> None:
    _agrees(data)
    for ict_only in (False, True):  # and the reference answers a corrupt commit with Corruption alone
        with contextlib.suppress(Corruption):
            decode_commit(data, 7, ict_only)


def test_an_integer_longer_than_python_converts_is_corruption_at_once() -> None:
    """Python converts at most `sys.get_int_max_str_digits()` digits (beyond, conversion is quadratic):
    a longer integer anywhere in a commit, even where nobody reads it, is Corruption, found at once."""
    for where in (b'{"commitInfo":{"inCommitTimestamp":5,"x":%s}}\n', b'{"cdc":%s}\n', b'{"x":%s,"cdc":0}\n'):
        data = where % (b"7" * 1_000_000)
        start = time.perf_counter()
        for ict_only in (False, True):
            assert fast_commit.decode(data, ict_only) is None
            with pytest.raises(Corruption, match="digits"):
                decode_commit(data, 3, ict_only)
        assert time.perf_counter() - start < 2.0


def test_the_fast_path_takes_the_real_logs_of_other_engines() -> None:
    """Commit files written by delta-spark, Databricks and delta-rs (the golden logs): every one decodes
    through the fast path as the reference does (V2 checkpoints' JSON files are no commits)."""
    files = [f for f in sorted(GOLDEN.rglob("_delta_log/*.json")) if len(f.name) == 25]
    assert len(files) > 20
    declined = [f for f in files if not _agrees(f.read_bytes())]
    assert not declined, f"the fast path declined {declined}"
