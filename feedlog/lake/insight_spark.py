"""`activity`, `freshness` and `recent` (insight.py) as Spark jobs over a DataFrame of feedlog rows.

The same definitions, the same classes, the same results as the local versions, computed where
the rows are: an ingested table of millions of entries from thousands of feeds is grouped and
ranked on the executors, and only the small answers (bucket counts, the newest N events, per-feed
summaries, the first disagreeing keys) come back to the driver.

    df = spark.read.format("feedlog-delta").load("data/table")   # or table_frame(spark, "data/table")
    a = activity(df, every_ms=3_600_000, now_ms=now)            # insight.Activity

`policies` default to what each feed's timestamps show (a table does not record its writers'
policies: `insight.FeedPolicy.inferred`); pass the same mapping as the local version to compare.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidArgument
from ..log.timestamps import UNITS_MS
from .insight import (
    CLASSES,
    EPOCH_LIMIT_MS,
    FUTURE_SLACK_MS,
    STANDARD_BUCKETS_MS,
    Activity,
    Event,
    FeedFreshness,
    FeedPolicy,
    Freshness,
    KeyFreshness,
    KeyState,
    bucket_width,
)

_WEEK_MS = 7 * UNITS_MS["d"]
_WEEK_ORIGIN_MS = 4 * UNITS_MS["d"]


def table_frame(
    spark: Any, location: str, *, storage_options: Mapping[str, str] | None = None, owner: str | None = None
) -> Any:
    """The rows of a feedlog table (local directory or object-store URL) as a DataFrame.

    The table's files are those of its latest snapshot, as feedlog resolves it (the log, and a
    managed table's ratified commits from a trusted owner). Where Spark's own Parquet reader can
    read them as they are (a local table with no partition columns, column mapping or deletion
    vectors: what `feedlog ingest` writes), it does, ten times faster than a Python data source;
    otherwise the `feedlog-delta` reader does."""
    native = _native_frame(spark, location, owner)
    if native is not None:
        return _check_feedlog_table(native, location)
    reader = spark.read.format("feedlog-delta")
    for k, v in (storage_options or {}).items():
        reader = reader.option("storage." + k, v)
    if owner:
        reader = reader.option("owner", owner)
    return _check_feedlog_table(reader.load(location), location)


def _native_frame(spark: Any, location: str, owner: str | None) -> Any:
    """The latest snapshot read by Spark's Parquet reader, or None where it cannot read it as is."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from ..delta import DeltaTable
    from ..delta.objectstore import scheme_of
    from ..delta.scan import column_mapping_mode

    if scheme_of(location) is not None:  # Spark reaches object stores through Hadoop's connectors, not ours
        return None
    snap = DeltaTable.open(location, owner=owner).snapshot()
    files = snap.files()
    if (
        snap.partition_columns
        or column_mapping_mode(snap.protocol, snap.metadata) != "none"
        or any("deletionVector" in a.extra or "://" in a.path or a.path.startswith("/") for a in files)
    ):
        return None
    schema = from_arrow_schema(snap.schema)
    if not files:
        return spark.createDataFrame([], schema)
    root = os.path.abspath(location)
    return spark.read.schema(schema).parquet(*(os.path.join(root, urllib.parse.unquote(a.path)) for a in files))


def _check_feedlog_table(df: Any, location: str) -> Any:
    missing = [c for c in ("feed", "seq", "key", "deleted", "timestamp") if c not in df.columns]
    if missing:
        raise InvalidArgument(f"{location} is not a feedlog table: no column(s) {', '.join(missing)}")
    return df


def infer_policies(df: Any) -> dict[str, FeedPolicy]:
    """Each feed's granularity as its timestamps show it (`FeedPolicy.inferred`, on the executors)."""
    from pyspark.sql import functions as F

    units = sorted(set(UNITS_MS.values()) | set(STANDARD_BUCKETS_MS))
    ms = _ms(F.col("timestamp"))
    aggs = [F.min(F.when(ms > 0, (ms % u == 0).cast("int"))).alias(f"u{u}") for u in units]
    aggs.append(F.countDistinct(F.when(ms > 0, ms)).alias("distinct"))
    out: dict[str, FeedPolicy] = {}
    for row in df.groupBy("feed").agg(*aggs).collect():
        evidence = row["distinct"] >= 2  # as FeedPolicy.inferred: one reading shows no unit
        unit = max((u for u in units if evidence and row[f"u{u}"] == 1), default=1)
        out[row["feed"]] = FeedPolicy(None, unit)
    return out


def _ms(col: Any) -> Any:
    """A timestamp column as ms since the epoch (long)."""
    from pyspark.sql import functions as F

    return F.floor(F.unix_micros(col) / 1000).cast("long")


def classified(df: Any, policies: Mapping[str, FeedPolicy], now_ms: int) -> Any:
    """`df` with `ts_ms` and `kind` (insight.CLASSES, the same rules as `insight.classify`)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spark = df.sparkSession
    fuzz = spark.createDataFrame(
        [(f, p.fuzz_ms, p.late_ms) for f, p in policies.items()] or [("", 0, 0)],
        "feed string, fuzz_ms long, late_ms long",
    )
    cleared = F.col("cleared") if "cleared" in df.columns else F.lit(False)
    d = df.withColumn("ts_ms", _ms(F.col("timestamp"))).withColumn("_cleared", F.coalesce(cleared, F.lit(False)))
    d = d.join(F.broadcast(fuzz), "feed", "left")
    d = d.withColumn("fuzz_ms", F.coalesce(F.col("fuzz_ms"), F.lit(0)))
    d = d.withColumn("late_ms", F.coalesce(F.col("late_ms"), F.lit(0)))
    basic = (
        F.when(F.col("_cleared"), F.lit("cleared"))
        .when(F.col("ts_ms").isNull(), F.lit("missing"))
        .when(F.col("ts_ms") < EPOCH_LIMIT_MS, F.lit("epoch"))
        .when(F.col("ts_ms") > F.lit(now_ms + FUTURE_SLACK_MS) + F.col("fuzz_ms"), F.lit("future"))
    )
    d = d.withColumn("_basic", basic)
    # the latest timestamp of an earlier entry that is placed in time (skewed ones never raise it)
    earlier = Window.partitionBy("feed").orderBy("seq").rowsBetween(Window.unboundedPreceding, -1)
    d = d.withColumn("_high", F.max(F.when(F.col("_basic").isNull(), F.col("ts_ms"))).over(earlier))
    skew = F.col("_high").isNotNull() & (F.col("ts_ms") + 2 * F.col("fuzz_ms") < F.col("_high"))
    d = d.withColumn("kind", F.coalesce(F.col("_basic"), F.when(skew, F.lit("skew")), F.lit("ok")))
    return d.drop("_basic", "_high", "_cleared")


def _policies(df: Any, policies: Mapping[str, FeedPolicy] | None) -> Mapping[str, FeedPolicy]:
    return policies if policies is not None else infer_policies(df)


def _bucket(ts: Any, width_ms: int) -> Any:
    origin = _WEEK_ORIGIN_MS if width_ms % _WEEK_MS == 0 else 0
    return ts - ((ts - origin) % width_ms)


def activity(df: Any, requested_ms: int, now_ms: int, policies: Mapping[str, FeedPolicy] | None = None) -> Activity:
    from pyspark.sql import functions as F

    policies = _policies(df, policies)
    every, widened = bucket_width(requested_ms, policies)
    needed = [c for c in ("feed", "seq", "timestamp", "cleared") if c in df.columns]
    c = classified(df.select(*needed), policies, now_ms)
    ok = F.col("kind") == "ok"
    # one pass: placed entries by (bucket, feed), the rest by (class, feed)
    cells = c.groupBy("feed", "kind", F.when(ok, _bucket(F.col("ts_ms"), every)).alias("bucket")).count().collect()
    counts = [r for r in cells if r["kind"] == "ok"]
    entries: dict[str, int] = {}
    apart: dict[str, dict[str, int]] = {}
    for r in cells:
        entries[r["feed"]] = entries.get(r["feed"], 0) + r["count"]
        apart.setdefault(r["feed"], {k: 0 for k in CLASSES if k != "ok"})
        if r["kind"] != "ok":
            apart[r["feed"]][r["kind"]] += r["count"]
    buckets = sorted({r["bucket"] for r in counts})
    index = {b: i for i, b in enumerate(buckets)}
    feeds = sorted(entries)
    per_feed = {f: [0] * len(buckets) for f in feeds}
    writers = [0] * len(buckets)
    for r in counts:
        per_feed[r["feed"]][index[r["bucket"]]] += r["count"]
        writers[index[r["bucket"]]] += 1
    totals = [sum(per_feed[f][i] for f in feeds) for i in range(len(buckets))]
    described = {f: (policies.get(f) or FeedPolicy(None, 1)).describe() for f in feeds}
    return Activity(requested_ms, every, widened, buckets, per_feed, totals, writers, apart, entries, described)


def recent(
    df: Any,
    now_ms: int,
    since_ms: int | None = None,
    limit: int = 20,
    policies: Mapping[str, FeedPolicy] | None = None,
) -> tuple[list[Event], dict[str, int]]:
    from pyspark.sql import functions as F

    if limit < 1:
        raise InvalidArgument("--limit must be >= 1")
    policies = _policies(df, policies)
    c = classified(df, policies, now_ms).cache()
    try:
        unplaced = {k: 0 for k in ("missing", "epoch", "cleared")}
        for r in c.where(F.col("kind").isin(*unplaced)).groupBy("kind").count().collect():
            unplaced[r["kind"]] = r["count"]
        placed = c.where(~F.col("kind").isin(*unplaced))
        if since_ms is not None:
            placed = placed.where(F.col("ts_ms") >= now_ms - since_ms)
        drive = F.col("stat").isNotNull() if "stat" in df.columns else F.lit(False)
        rows = (
            placed.select("ts_ms", "feed", "seq", "key", "deleted", "kind", drive.alias("drive"))
            .orderBy(F.col("ts_ms").desc(), F.col("seq").desc(), F.col("feed").asc())
            .limit(limit)
            .collect()
        )
    finally:
        c.unpersist()
    events = []
    for r in rows:
        kind = ("file-delete" if r["deleted"] else "file") if r["drive"] else ("delete" if r["deleted"] else "put")
        flags = tuple(k for k in ("skew", "future") if r["kind"] == k)
        events.append(Event(r["ts_ms"], r["feed"], r["seq"], kind, r["key"], flags))
    return events, unplaced


def freshness(df: Any, now_ms: int, policies: Mapping[str, FeedPolicy] | None = None, keys: int = 100) -> Freshness:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    policies = _policies(df, policies)
    c = classified(df, policies, now_ms).cache()
    try:
        last = {
            r["feed"]: r["last"]
            for r in c.groupBy("feed").agg(F.max(F.when(F.col("kind") == "ok", F.col("ts_ms"))).alias("last")).collect()
        }
        newest_first = Window.partitionBy("key", "feed").orderBy(F.col("seq").desc())
        latest = (
            c.where(F.col("key").isNotNull())
            .withColumn("_n", F.row_number().over(newest_first))
            .where(F.col("_n") == 1)
            .withColumn("placed", F.when(F.col("kind").isin("ok", "skew"), F.col("ts_ms")))
            .withColumn("same", F.struct(F.col("deleted"), F.when(~F.col("deleted"), F.col("value"))))
            .select("key", "feed", "seq", "placed", "deleted", "same", "fuzz_ms", "late_ms")
        )
        per_key = Window.partitionBy("key")
        by_time = Window.partitionBy("key").orderBy(F.col("placed").desc_nulls_last(), F.col("feed"))
        shared = (
            latest.withColumn("feeds", F.count("*").over(per_key))
            .where(F.col("feeds") > 1)
            .withColumn("rank", F.row_number().over(by_time))
            .withColumn("top_ts", F.first("placed").over(by_time.rowsBetween(Window.unboundedPreceding, 0)))
            .withColumn("top_fuzz", F.first("fuzz_ms").over(by_time.rowsBetween(Window.unboundedPreceding, 0)))
            .withColumn(
                "rival",
                (F.col("rank") > 1)
                & F.col("placed").isNotNull()
                & (F.col("top_ts") - F.col("placed") <= F.col("late_ms") + F.col("top_fuzz")),
            )
            .withColumn("rivals", F.sum(F.col("rival").cast("int")).over(per_key))
            .withColumn("variants", F.size(F.collect_set("same").over(per_key)))
        )
        shared = shared.cache()
        try:
            summary = (
                shared.groupBy("feed")
                .agg(
                    F.count("*").alias("shared"),
                    F.sum(
                        ((F.col("rank") == 1) & F.col("placed").isNotNull() & (F.col("rivals") == 0)).cast("int")
                    ).alias("newest"),
                    F.sum(
                        (
                            (F.col("rivals") > 0)
                            & (F.col("rival") | ((F.col("rank") == 1) & F.col("placed").isNotNull()))
                        ).cast("int")
                    ).alias("ties"),
                )
                .collect()
            )
            totals = (
                shared.where(F.col("rank") == 1)
                .agg(F.count("*").alias("keys"), F.sum((F.col("variants") > 1).cast("int")).alias("disagreeing"))
                .collect()[0]
            )
            listed = (
                shared.where(F.col("variants") > 1)
                .select("key")
                .distinct()
                .orderBy("key")
                .limit(keys)
                .join(shared, "key")
                .select("key", "feed", "seq", "placed", "deleted", "rank", "rivals", "variants")
                .collect()
            )
        finally:
            shared.unpersist()
    finally:
        c.unpersist()
    stats = {r["feed"]: r for r in summary}
    feeds = []
    for f in sorted(last):
        p = policies.get(f) or FeedPolicy(None, 1)
        r = stats.get(f)
        feeds.append(
            FeedFreshness(
                f,
                r["shared"] if r else 0,
                r["newest"] or 0 if r else 0,
                r["ties"] or 0 if r else 0,
                last[f],
                p.describe(),
                p.fuzz_ms,
            )
        )
    grouped: dict[str, list[Any]] = {}
    for r in listed:
        grouped.setdefault(r["key"], []).append(r)
    key_list = []
    for key in sorted(grouped):
        rs = sorted(grouped[key], key=lambda r: r["feed"])
        top = next(r for r in rs if r["rank"] == 1)
        newest = top["feed"] if top["placed"] is not None and top["rivals"] == 0 else None
        states = [KeyState(r["feed"], r["seq"], r["placed"], r["deleted"], None) for r in rs]
        key_list.append(KeyFreshness(key, newest, states, True))
    return Freshness(feeds, int(totals["keys"] or 0), int(totals["disagreeing"] or 0), key_list)
