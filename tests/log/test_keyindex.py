"""The persisted key index answers like a full scan of the log, also after crashes and corruption."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedlog import failpoints
from feedlog.clock import ManualClock
from feedlog.log import keyindex
from feedlog.log.entries import Record
from feedlog.log.feed import Feed, Write

ROOT = Path(__file__).resolve().parents[2]


def full_scan(feed: Feed) -> dict[str, list[int]]:
    """What the index stands in for: every valid, uncleared entry's seq per key."""
    keys: dict[str, list[int]] = {}
    for r in feed.records():
        if not r.cleared and r.invalid is None:
            keys.setdefault(r.key, []).append(r.seq)
    return keys


def assert_answers_like_a_scan(feed: Feed, extra: tuple[str, ...] = ("never written",)) -> None:
    keys = full_scan(feed)
    now = feed.clock.now_ms()
    for key in [*keys, *extra]:
        seqs = keys.get(key, [])
        expected: Record | None = feed.record(seqs[-1]) if seqs else None
        if expected is not None and (expected.deleted or expected.expired(now)):
            expected = None
        assert feed.get(key) == expected, key
        assert [r.seq for r in feed.history(key)] == seqs, key


@pytest.fixture
def small_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyindex, "FLUSH_ENTRIES", 8)
    monkeypatch.setattr(keyindex, "MERGE_RECORDS", 3)  # merges in many bounded steps


def fill(feed: Feed, n: int, keys: int = 13) -> None:
    for b in range(n):
        feed.append([Write(f"/k/{(b * 5 + i) % keys}", f"v{b}.{i}".encode()) for i in range(3)])
        if b % 4 == 3:
            feed.delete(f"/k/{b % keys}")


def run_files(p: Path) -> list[str]:
    return sorted(n for n in os.listdir(p) if n.startswith(keyindex.RUN_PREFIX))


def test_a_reopened_feed_answers_from_the_index_without_a_scan(tmp_path: Path, small_runs: None) -> None:
    p = tmp_path / "f"
    with Feed.create(p) as f:
        fill(f, 40)
        assert_answers_like_a_scan(f)
    runs = run_files(p)
    assert runs and len(runs) <= 6  # merged: O(log n) runs
    with Feed.open(p) as f:
        f.core.get_range = None  # type: ignore[method-assign,assignment]  # a scan would fail here
        assert f.get("/k/3") is not None and f.history("/k/3")
        assert not f._keys.rebuilt and f._keys._tail_count == 0
    with Feed.open(p) as f:
        assert_answers_like_a_scan(f)
        fill(f, 9)  # the tail past the runs, in memory until it is written out
        assert_answers_like_a_scan(f)
    with Feed.open(p, writable=False) as f:
        assert_answers_like_a_scan(f)
        assert not f._keys.rebuilt


def test_entries_appended_behind_the_index_are_found(tmp_path: Path, small_runs: None) -> None:
    p = tmp_path / "f"
    with Feed.create(p) as f:
        fill(f, 10)
    with Feed.open(p) as f:
        # appended through the core, as an older version or a raw writer would: not in the index
        f.core.append([_entry(f, "/late", b"x")])
    with Feed.open(p) as f:
        assert f.get("/late") is not None and f.get("/late").value == b"x"  # type: ignore[union-attr]
        assert_answers_like_a_scan(f)


def _entry(f: Feed, key: str, value: bytes) -> bytes:
    from feedlog.log import entries

    return entries.encode_entry(f.content_type, key, value, deleted=False, timestamp=None, expires_at=None)


@pytest.mark.parametrize("damage", ["flip a run byte", "truncate a run", "garbage manifest", "manifest check"])
def test_a_damaged_index_is_rebuilt_never_trusted(tmp_path: Path, small_runs: None, damage: str) -> None:
    p = tmp_path / "f"
    with Feed.create(p) as f:
        fill(f, 40)
    run = p / run_files(p)[0]
    if damage == "flip a run byte":
        data = bytearray(run.read_bytes())
        data[len(data) // 2] ^= 0x40
        run.write_bytes(bytes(data))
    elif damage == "truncate a run":
        os.truncate(run, run.stat().st_size - 16)
    elif damage == "garbage manifest":
        (p / keyindex.MANIFEST).write_bytes(b'{"format": 1, "len')
    else:
        m = json.loads((p / keyindex.MANIFEST).read_text())
        m["length"] -= 1
        (p / keyindex.MANIFEST).write_text(json.dumps(m))
    with Feed.open(p) as f:
        assert_answers_like_a_scan(f)
        assert f._keys.rebuilt
    with Feed.open(p) as f:  # the rebuilt index was written out and is trusted again
        assert_answers_like_a_scan(f)
        assert not f._keys.rebuilt


def test_another_feeds_index_is_not_trusted(tmp_path: Path, small_runs: None) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    with Feed.create(a) as f:
        fill(f, 20)
    with Feed.create(b) as f:
        fill(f, 20, keys=7)
    for n in run_files(b):
        (b / n).unlink()
    for n in [*run_files(a), keyindex.MANIFEST]:
        (b / n).write_bytes((a / n).read_bytes())
    with Feed.open(b) as f:
        assert_answers_like_a_scan(f, extra=("/k/12",))
        assert f._keys.rebuilt


def test_compaction_and_index_agree(tmp_path: Path, small_runs: None) -> None:
    p = tmp_path / "f"
    clock = ManualClock(1_000_000)
    with Feed.create(p, timestamps="exact", clock=clock) as f:
        fill(f, 12)
        f.put("/ttl", b"old")
        f.put("/ttl", b"short", ttl=10)
        f.put("/ttl2", b"short", ttl=10)
    clock.advance(1000)
    with Feed.open(p, clock=clock) as f:
        assert f.get("/ttl") is None
        f.compact(overwritten=True)
        assert_answers_like_a_scan(f, extra=("/ttl", "/ttl2"))
    with Feed.open(p, clock=clock) as f:
        assert_answers_like_a_scan(f, extra=("/ttl", "/ttl2"))


CHILD = """
import sys
from feedlog.log import keyindex
from feedlog.log.feed import Feed, Write
keyindex.FLUSH_ENTRIES = 8
keyindex.MERGE_RECORDS = 5
with Feed.open(sys.argv[1]) as f:
    for b in range(int(sys.argv[2])):
        f.append([Write(f"/k/{(f.length + i) % 11}", f"v{f.length}.{i}".encode()) for i in range(3)])
        if b % 3 == 2:
            f.delete(f"/k/{b % 11}")
        f.get("/k/1")
"""

POINTS = [
    "keyindex.run_written",
    "keyindex.before_manifest",
    "keyindex.manifest",
    "keyindex.merged",
    "core.replayed_batch",
]


@pytest.mark.slow
@pytest.mark.parametrize("nth", [1, 2, 5])
def test_kill_at_every_index_step_then_reopen_answers_like_a_scan(tmp_path: Path, nth: int) -> None:
    p = tmp_path / "f"
    Feed.create(p).close()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    deadline = time.monotonic() + 120
    killed = 0
    for point in POINTS:
        assert time.monotonic() < deadline
        spec = f"{point}=exit@{nth}"
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, str(p), "12"],
            env={**env, failpoints.ENV: spec},
            timeout=60,
            capture_output=True,
        )
        assert proc.returncode in (0, failpoints.EXIT_CODE), proc.stderr.decode()
        killed += proc.returncode == failpoints.EXIT_CODE
        with Feed.open(p, writable=False) as f:  # first as a reader, which writes nothing
            assert_answers_like_a_scan(f)
        with Feed.open(p) as f:
            assert_answers_like_a_scan(f)
    assert killed >= 3  # the index steps were really reached and died there
    with Feed.open(p) as f:
        assert f.length > 40
        assert_answers_like_a_scan(f)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.binary(min_size=16, max_size=16), max_size=80, unique=True),
    st.integers(0, 80),
    st.integers(1, 9),
    st.integers(1, 4),
)
def test_a_bounded_merge_of_two_runs_is_their_sorted_union(
    records: list[bytes], split: int, step: int, chunk_kib: int
) -> None:
    import tempfile

    left, right = sorted(records[:split]), sorted(records[split:])
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        mp.setattr(keyindex, "MERGE_RECORDS", step)
        mp.setattr(keyindex, "CHUNK", 16 * chunk_kib)  # runs of several CRC chunks
        runs = []
        for n, recs in enumerate((left, right)):
            body = b"".join(recs)
            (Path(d) / f"r{n}").write_bytes(body)
            r = keyindex._Run(f"r{n}", len(recs), keyindex._crcs(body))
            if recs:
                r.open(Path(d))
            runs.append(r)
        if left and right:
            pieces = list(keyindex._merge(runs[0], runs[1]))
            assert b"".join(pieces) == b"".join(sorted(records))
            assert all(len(p) <= 2 * step * 16 for p in pieces)
        for r in runs:
            r.close()
