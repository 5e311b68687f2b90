"""Writer-timestamp insight (feedlog/lake/insight.py, plots.py, `feedlog activity|freshness|recent`).

Property tests over random rows: every entry is counted exactly once (placed in a bucket or
counted apart, by class), buckets never show time finer than any feed's policy, recent events
come newest first; and the commands on real feeds, with the pictures read back.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedlog.cli import main
from feedlog.lake import insight
from feedlog.lake.insight import EPOCH_LIMIT_MS, FeedPolicy, activity, bucket_of, bucket_width, classify, freshness
from feedlog.lake.plots import plot_activity, plot_freshness
from feedlog.lake.rows import TIMESTAMP
from feedlog.log.feed import Feed, Write
from feedlog.log.timestamps import UNITS_MS, TimestampPolicy

NOW = 1_795_000_000_000  # 2026-11-17
H, D = UNITS_MS["h"], UNITS_MS["d"]


def rows_of(entries: list[tuple[str, int, str | None, int | None, bool, bytes | None]]) -> pa.Table:
    """(feed, seq, key, ts_ms, deleted, value) -> feedlog rows (the columns insight reads)."""
    return pa.table(
        {
            "feed": pa.array([e[0] for e in entries], pa.string()),
            "seq": pa.array([e[1] for e in entries], pa.int64()),
            "key": pa.array([e[2] for e in entries], pa.string()),
            "value": pa.array([e[5] for e in entries], pa.binary()),
            "deleted": pa.array([e[4] for e in entries], pa.bool_()),
            "timestamp": pa.array([None if e[3] is None else e[3] * 1000 for e in entries], TIMESTAMP),
            "cleared": pa.array([e[2] is None for e in entries], pa.bool_()),
        }
    )


timestamps = st.one_of(
    st.none(),
    st.integers(0, EPOCH_LIMIT_MS * 2),  # around 1970
    st.integers(NOW - 30 * D, NOW + 2 * D),  # recent, some in the future
)
policy_st = st.sampled_from(
    [
        FeedPolicy.known(TimestampPolicy.parse(p))
        for p in ("exact", "truncate:1s", "truncate:1h", "fuzz:30s", "fuzz:10m", "truncate:1d")
    ]
    + [FeedPolicy(None, 1), FeedPolicy(None, 60_000)]
)


@st.composite
def feeds(draw: Any) -> tuple[pa.Table, dict[str, FeedPolicy]]:
    n_feeds = draw(st.integers(1, 5))
    entries = []
    policies = {}
    for f in range(n_feeds):
        name = f"{f:064x}"
        policies[name] = draw(policy_st)
        for seq in range(1, draw(st.integers(0, 25)) + 1):
            key = draw(st.sampled_from([None, "/a", "/b", "/c", "/d"]))
            entries.append((name, seq, key, draw(timestamps), draw(st.booleans()), draw(st.sampled_from([b"x", b"y"]))))
    return rows_of(entries), policies


@settings(max_examples=150, deadline=None)
@given(feeds(), st.sampled_from([UNITS_MS["s"], UNITS_MS["m"], H, D, 7 * D]))
def test_every_entry_is_counted_exactly_once_and_never_finer_than_its_policy(
    data: tuple[pa.Table, dict[str, FeedPolicy]], every: int
) -> None:
    rows, policies = data
    a = activity(rows, every, policies, NOW)
    assert a.every_ms >= every
    assert all(a.every_ms >= p.granularity_ms for p in policies.values())  # never finer than a policy
    assert (a.every_ms > every) == bool(a.widened_by)
    placed = sum(a.totals)
    apart = sum(sum(c.values()) for c in a.apart.values())
    assert placed + apart == rows.num_rows  # counted exactly once
    assert sum(a.entries.values()) == rows.num_rows
    for f, counts in a.per_feed.items():
        assert sum(counts) + sum(a.apart[f].values()) == a.entries[f]
    assert all(b == bucket_of(b, a.every_ms) for b in a.buckets)  # aligned bucket starts
    assert a.writers == [sum(1 for c in a.per_feed.values() if c[i]) for i in range(len(a.buckets))]
    kinds = [e.kind for e in classify(rows, policies, NOW)]
    assert kinds.count("ok") == placed


@settings(max_examples=100, deadline=None)
@given(feeds(), st.integers(1, 30), st.sampled_from([None, H, D]))
def test_recent_is_newest_first_and_flags_what_it_cannot_trust(
    data: tuple[pa.Table, dict[str, FeedPolicy]], limit: int, since: int | None
) -> None:
    rows, policies = data
    events, unplaced = insight.recent(rows, policies, NOW, since, limit)
    assert len(events) <= limit
    keys = [(-e.ts_ms, -e.seq, e.feed) for e in events]
    assert keys == sorted(keys)
    assert all(since is None or e.ts_ms >= NOW - since for e in events)
    by_class = {c: sum(1 for e in classify(rows, policies, NOW) if e.kind == c) for c in unplaced}
    assert unplaced == by_class
    for e in events:  # "future": past now + slack + the feed's fuzz (at most 10m among these policies)
        if "future" in e.flags:
            assert e.ts_ms > NOW + insight.FUTURE_SLACK_MS
        if e.ts_ms > NOW + insight.FUTURE_SLACK_MS + 10 * 60_000:
            assert "future" in e.flags


@settings(max_examples=100, deadline=None)
@given(feeds())
def test_freshness_credits_each_shared_key_once(data: tuple[pa.Table, dict[str, FeedPolicy]]) -> None:
    rows, policies = data
    f = freshness(rows, policies, NOW)
    assert sum(x.newest for x in f.feeds) == sum(1 for k in f.keys if k.newest is not None)
    assert sum(1 for k in f.keys if k.disagree) == f.disagreeing
    assert len(f.keys) == f.shared_keys
    for x in f.feeds:
        assert x.newest + x.ties <= x.shared


def test_bucket_width_widens_to_a_standard_width_and_says_why() -> None:
    fuzzed = {"a" * 64: FeedPolicy.known(TimestampPolicy.parse("fuzz:10m")), "b" * 64: FeedPolicy(None, 1)}
    width, why = bucket_width(UNITS_MS["m"], fuzzed)
    assert width == 15 * UNITS_MS["m"] and len(why) == 1 and "fuzz:10m" in why[0]
    assert bucket_width(D, fuzzed) == (D, [])
    assert bucket_of(NOW, 7 * D) % (7 * D) == 4 * D  # weeks start on Mondays (1970-01-05)


def test_inferred_policy_is_the_largest_unit_all_timestamps_share() -> None:
    assert FeedPolicy.inferred([NOW - NOW % H, NOW - NOW % H + H]).granularity_ms == H
    assert FeedPolicy.inferred([NOW - NOW % H + 1]).granularity_ms == 1
    assert FeedPolicy.inferred([NOW - NOW % (7 * D)] * 3).granularity_ms == 1  # one reading: no evidence
    assert FeedPolicy.inferred([]).granularity_ms == 1


def test_classes_in_order() -> None:
    f = "f" * 64
    rows = rows_of(
        [
            (f, 1, "/a", NOW - 10 * H, False, b"1"),
            (f, 2, "/a", None, False, b"1"),
            (f, 3, "/a", 5, False, b"1"),  # an unset clock
            (f, 4, "/a", NOW + 3 * H, False, b"1"),  # the future
            (f, 5, "/a", NOW - 20 * H, False, b"1"),  # the clock went back
            (f, 6, None, None, False, None),  # cleared
            (f, 7, "/a", NOW - 9 * H, False, b"1"),
        ]
    )
    kinds = [e.kind for e in classify(rows, {f: FeedPolicy(None, 1)}, NOW)]
    assert kinds == ["ok", "missing", "epoch", "future", "skew", "cleared", "ok"]
    # within a fuzzed feed's own uncertainty an earlier time is not skew
    fuzz = {f: FeedPolicy.known(TimestampPolicy.parse("fuzz:12h"))}
    assert [e.kind for e in classify(rows, fuzz, NOW)][4] == "ok"


def test_freshness_ties_writes_whose_true_times_may_overlap() -> None:
    a, b = "a" * 64, "b" * 64
    rows = rows_of([(a, 1, "/k", NOW - 30_000, False, b"x"), (b, 1, "/k", NOW - 60_000, False, b"y")])
    exact = {a: FeedPolicy.known(TimestampPolicy.parse("exact")), b: FeedPolicy.known(TimestampPolicy.parse("exact"))}
    assert freshness(rows, exact, NOW).keys[0].newest == a
    truncated = {**exact, b: FeedPolicy.known(TimestampPolicy.parse("truncate:1m"))}  # b's write: [-60s, 0s)
    assert freshness(rows, truncated, NOW).keys[0].newest is None
    f = freshness(rows, exact, NOW)
    assert f.disagreeing == 1 and "newest for 1 of 1 shared keys" in f.feeds[0].summary()


# ---- the pictures ---------------------------------------------------------------------------------


def test_plots_are_images_with_the_expected_axes(tmp_path: Path) -> None:
    f1, f2 = "1" * 64, "2" * 64
    rows = rows_of([(f, s, f"/k{s % 3}", NOW - s * H, False, b"v") for f in (f1, f2) for s in range(1, 40)])
    pol = {f1: FeedPolicy(None, 1), f2: FeedPolicy(None, 1)}
    png = plot_activity(activity(rows, H, pol, NOW), str(tmp_path / "a.png"))
    import matplotlib.image

    img = matplotlib.image.imread(png)
    assert img.shape[0] > 200 and img.shape[1] > 600 and img.std() > 0.01  # a real, non-blank picture
    svg = plot_activity(activity(rows, H, pol, NOW), str(tmp_path / "a.svg"))
    text = " ".join(t for t in ET.parse(svg).getroot().itertext())
    assert "time (UTC)" in text and "feed" in text and "untrusted" in text
    fr = plot_freshness(freshness(rows, pol, NOW), str(tmp_path / "f.svg"))
    assert "shared keys" in " ".join(ET.parse(fr).getroot().itertext())
    with pytest.raises(Exception, match=r"png or \.svg"):
        plot_activity(activity(rows, H, pol, NOW), str(tmp_path / "a.jpg"))


# ---- the commands, on real feeds ----------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_commands_on_real_feeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Feed.create(tmp_path / "a", timestamps="fuzz:10m") as a, Feed.create(tmp_path / "b", timestamps="exact") as b:
        a.append([Write(f"/k{i}", b"a") for i in range(5)])
        b.append([Write(f"/k{i}", b"b") for i in range(3)])
        b.append([Write("/gone", None, True)])
    feeds = [str(tmp_path / "a"), str(tmp_path / "b")]
    code, out, err = run(capsys, "activity", *feeds, "--every", "1m", "--json", "--plot", str(tmp_path / "p.png"))
    assert code == 0, err
    got = json.loads(out)
    assert got["every"] == "15m" and got["requested"] == "1m"  # a's fuzz bound widens the buckets
    assert sum(x["total"] for x in got["buckets"]) == 9 and Path(got["plot"]).stat().st_size > 1000
    assert {p for p in got["policies"].values()} == {"fuzz:10m", "exact"}
    code, out, _ = run(capsys, "activity", *feeds, "--every", "1m")
    assert "widened for" in out and "picture" not in out
    code, out, _ = run(capsys, "freshness", *feeds, "--json")
    assert code == 0 and json.loads(out)["shared_keys"] == 3 and json.loads(out)["disagreeing"] == 3
    code, out, _ = run(capsys, "recent", *feeds, "--limit", "3", "--json")
    events = json.loads(out)["events"]
    assert code == 0 and len(events) == 3
    assert events == sorted(events, key=lambda e: (-e["timestamp"], -e["seq"]))
    code, out, _ = run(capsys, "recent", *feeds, "--since", "1h")
    assert code == 0 and "delete" in out


@pytest.mark.parametrize(
    "args, code",
    [
        (["activity", "{d}/nope"], 3),
        (["activity", "{d}/a", "--every", "soon"], 2),
        (["activity", "{d}/a", "--plot", "{d}/x.gif"], 2),
        (["activity", "{d}/a", "--now", "yesterday"], 2),
        (["freshness", "{d}/a"], 2),
        (["recent", "{d}/a", "--limit", "0"], 2),
    ],
)
def test_mistakes_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int) -> None:
    with Feed.create(tmp_path / "a") as a:
        a.put("/k", b"v")
    got, _, err = run(capsys, *(x.format(d=tmp_path) for x in args))
    assert got == code, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "x.gif").exists()
