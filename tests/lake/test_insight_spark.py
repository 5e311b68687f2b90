"""The Spark versions of activity, freshness and recent (feedlog/lake/insight_spark.py) give the same
answers as the local ones (insight.py) on the same rows: 1,000 feeds with every kind of timestamp
(fuzzed, truncated, missing, 1970, future, going backwards), overlapping keys and cleared blocks."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from feedlog.lake import insight, insight_spark
from feedlog.lake.insight import FeedPolicy
from feedlog.lake.rows import TIMESTAMP
from feedlog.log.timestamps import UNITS_MS, TimestampPolicy

pytestmark = pytest.mark.slow

NOW = 1_795_000_000_000
H, D = UNITS_MS["h"], UNITS_MS["d"]
FEEDS = 1_000


def corpus(seed: int = 7) -> tuple[pa.Table, dict[str, FeedPolicy]]:
    rnd = random.Random(seed)
    kinds = ["exact", "truncate:1m", "truncate:1h", "fuzz:30s", "fuzz:10m", None]
    cols: dict[str, list] = {c: [] for c in ("feed", "seq", "key", "value", "deleted", "timestamp", "cleared")}  # type: ignore[type-arg]
    policies: dict[str, FeedPolicy] = {}
    for f in range(FEEDS):
        feed = f"{f:064x}"
        kind = kinds[f % len(kinds)]
        policy = FeedPolicy.known(TimestampPolicy.parse(kind)) if kind else FeedPolicy(None, 1)
        policies[feed] = policy
        t = NOW - rnd.randrange(60 * D)
        for seq in range(1, rnd.randrange(3, 14)):
            t += rnd.randrange(-2 * H, 6 * H)  # mostly forward, sometimes back
            roll = rnd.random()
            ts = None if roll < 0.05 else 10 if roll < 0.07 else NOW + 3 * D if roll < 0.09 else t
            if ts is not None and policy.policy is not None and policy.policy.kind == "truncate":
                ts -= ts % policy.policy.amount_ms
            cleared = rnd.random() < 0.03
            cols["feed"].append(feed)
            cols["seq"].append(seq)
            cols["key"].append(None if cleared else f"/k{rnd.randrange(400)}")
            cols["value"].append(None if cleared else rnd.choice([b"a", b"b"]))
            cols["deleted"].append(None if cleared else rnd.random() < 0.1)
            cols["timestamp"].append(None if cleared or ts is None else ts * 1000)
            cols["cleared"].append(cleared)
    table = pa.table(
        {
            "feed": pa.array(cols["feed"], pa.string()),
            "seq": pa.array(cols["seq"], pa.int64()),
            "key": pa.array(cols["key"], pa.string()),
            "value": pa.array(cols["value"], pa.binary()),
            "deleted": pa.array(cols["deleted"], pa.bool_()),
            "timestamp": pa.array(cols["timestamp"], TIMESTAMP),
            "cleared": pa.array(cols["cleared"], pa.bool_()),
        }
    )
    return table, policies


@pytest.fixture(scope="module")
def rows_and_frame(spark):
    rows, policies = corpus()
    df = spark.createDataFrame(rows.to_pandas()).repartition(4).cache()
    assert df.count() == rows.num_rows
    yield rows, policies, df
    df.unpersist()


def test_activity_matches(rows_and_frame) -> None:
    rows, policies, df = rows_and_frame
    for every in (H, D, 7 * D):
        local = insight.activity(rows, every, policies, NOW)
        remote = insight_spark.activity(df, every, NOW, policies)
        assert remote.to_json() == local.to_json()
    assert len(local.entries) == FEEDS
    apart = {c: sum(x[c] for x in local.apart.values()) for c in ("missing", "epoch", "future", "skew", "cleared")}
    assert all(apart.values()), apart  # the corpus exercises every class


def test_recent_matches(rows_and_frame) -> None:
    rows, policies, df = rows_and_frame
    for since, limit in ((None, 50), (7 * D, 200), (H, 5)):
        assert insight_spark.recent(df, NOW, since, limit, policies) == insight.recent(
            rows, policies, NOW, since, limit
        )


def test_freshness_matches(rows_and_frame) -> None:
    rows, policies, df = rows_and_frame
    local = insight.freshness(rows, policies, NOW)
    remote = insight_spark.freshness(df, NOW, policies, keys=50)
    assert (remote.shared_keys, remote.disagreeing) == (local.shared_keys, local.disagreeing)
    assert remote.shared_keys > 300 and remote.disagreeing > 0
    assert [vars(f) for f in remote.feeds] == [vars(f) for f in local.feeds]
    disagreeing = [k for k in local.keys if k.disagree][:50]
    assert [(k.key, k.newest) for k in remote.keys] == [
        (k.key, k.newest) for k in sorted(disagreeing, key=lambda k: k.key)
    ]


def test_policies_inferred_on_the_executors_match(rows_and_frame) -> None:
    rows, _policies, df = rows_and_frame
    assert insight_spark.infer_policies(df) == insight.table_policies(rows)


def test_the_cli_on_an_ingested_table_matches_the_feeds(spark, tmp_path, capsys):
    """`feedlog activity|recent|freshness TABLE` reads the table with Spark
    and says what the same commands say over the feeds the table was ingested from."""
    import json

    from feedlog.cli import main
    from feedlog.lake.ingest import ingest_batch
    from feedlog.log.feed import Feed, Write

    from .conftest import KEY_A, KEY_B

    for name, kp in (("a", KEY_A), ("b", KEY_B)):
        with Feed.create(tmp_path / name, key_pair=kp, timestamps="truncate:1h") as f:
            f.append([Write(f"/k{i % 7}", f"{name}{i}".encode()) for i in range(40)])
            f.delete("/k1")
    feeds = [str(tmp_path / "a"), str(tmp_path / "b")]
    table = str(tmp_path / "table")
    ingest_batch(spark, feeds, table, progress=lambda _m: None)

    def run(*args: str) -> dict[str, Any]:
        assert main([*args, "--json", "--now", str(NOW + 400 * D)]) == 0
        got: dict[str, Any] = json.loads(capsys.readouterr().out)
        return got

    for cmd in (["activity", "--every", "1h"], ["recent", "--limit", "7"], ["freshness"]):
        on_feeds, on_table = run(cmd[0], *feeds, *cmd[1:]), run(cmd[0], table, *cmd[1:])
        on_feeds.pop("policies", None), on_table.pop("policies", None)
        for f in on_feeds.get("feeds", []) if cmd[0] == "freshness" else []:
            f.pop("policy")
        for f in on_table.get("feeds", []) if cmd[0] == "freshness" else []:
            f.pop("policy")
        assert on_table == on_feeds, cmd[0]
