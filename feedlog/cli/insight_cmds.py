"""`feedlog activity`, `freshness` and `recent`: writer timestamps put to use (feedlog/lake/insight.py).

Each takes feeds (directories or grpc://HOST:PORT/KEY, read and verified) or one Delta table
that `feedlog ingest` wrote (a directory with `_delta_log/`, or an object-store URL), which is
read with Spark (`feedlog.lake.insight_spark`) so it scales to millions of entries.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..clock import SystemClock
from ..errors import InvalidArgument
from ..log.timestamps import format_duration, parse_duration
from .args import Subcommands, storage_option_args, storage_options_of
from .fmt import emit, fmt_ts

if TYPE_CHECKING:
    import pyarrow as pa

    from ..lake.insight import FeedPolicy


def _now(ns: argparse.Namespace) -> int:
    if not ns.now:
        return SystemClock().now_ms()
    text = ns.now.strip()
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp() * 1000)
    except ValueError:
        raise InvalidArgument(f"--now {text!r}: use ms since the epoch or ISO-8601 (2026-11-20T10:00:00Z)") from None


def _is_table(sources: Sequence[str]) -> bool:
    from ..delta.objectstore import scheme_of

    if len(sources) != 1:
        return False
    s = sources[0]
    scheme = scheme_of(s)
    if scheme is not None:
        return scheme != "grpc"
    return os.path.isdir(os.path.join(s, "_delta_log"))


def _rows(ns: argparse.Namespace) -> tuple[pa.Table | None, dict[str, FeedPolicy] | None]:
    """The feeds' rows and policies, or (None, None) for a table (read by Spark)."""
    from ..lake.feeds import parse_sources
    from ..lake.insight import read_feeds

    if _is_table(ns.sources):
        return None, None
    rows, policies = read_feeds(parse_sources(",".join(ns.sources)))
    return rows, policies


def _table_df(ns: argparse.Namespace) -> Any:
    from ..lake import spark_session
    from ..lake.insight_spark import table_frame
    from .lake_cmds import spark_log_level

    spark = spark_session(ns.master, "feedlog-insight", **{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel(spark_log_level())
    return table_frame(spark, ns.sources[0], storage_options=storage_options_of(ns), owner=ns.owner)


def cmd_activity(ns: argparse.Namespace) -> None:
    from ..lake import insight

    every = parse_duration(ns.every)
    now = _now(ns)
    if ns.plot:
        from ..lake.plots import check_plot_target

        check_plot_target(ns.plot)  # a bad file name fails before any work
    rows, policies = _rows(ns)
    if rows is None:
        from ..lake import insight_spark
        from ..lake.spark_errors import spark_job

        with spark_job():  # a failed Spark job: the feedlog error behind it, one line
            a = insight_spark.activity(_table_df(ns), every, now)
    else:
        assert policies is not None
        a = insight.activity(rows, every, policies, now)
    if ns.plot:
        from ..lake.plots import plot_activity

        plot_activity(a, ns.plot)

    def human() -> None:
        feeds = sorted(a.entries)
        named = feeds if len(feeds) <= 6 else []
        head = f"{'bucket (UTC)':<20} {'total':>8} {'writers':>7}" + "".join(f" {f[:10]:>10}" for f in named)
        print(head)
        for i, b in enumerate(a.buckets):
            cells = "".join(f" {a.per_feed[f][i]:>10,}" for f in named)
            print(f"{fmt_ts(b)[:19]:<20} {a.totals[i]:>8,} {a.writers[i]:>7}{cells}")
        if not a.buckets:
            print("(no entry has a usable timestamp)")
        print(f"buckets of {format_duration(a.every_ms)}", end="")
        if a.widened_by:
            print(f" (asked {format_duration(a.requested_ms)}: widened for " + ", ".join(a.widened_by) + ")", end="")
        print()
        for f in feeds:
            apart = ", ".join(f"{n:,} {c}" for c, n in a.apart[f].items() if n)
            extra = f"; apart: {apart}" if apart else ""
            print(f"feed {f[:16]}...  {a.entries[f]:,} entries, policy {a.policies[f]}{extra}")
        if ns.plot:
            print(f"picture: {os.path.abspath(ns.plot)}")

    emit(ns, {**a.to_json(), "plot": os.path.abspath(ns.plot) if ns.plot else None}, human)


def cmd_freshness(ns: argparse.Namespace) -> None:
    from ..lake import insight

    now = _now(ns)
    if ns.plot:
        from ..lake.plots import check_plot_target

        check_plot_target(ns.plot)
    rows, policies = _rows(ns)
    if rows is None:
        from ..lake import insight_spark
        from ..lake.spark_errors import spark_job

        with spark_job():  # a failed Spark job: the feedlog error behind it, one line
            f = insight_spark.freshness(_table_df(ns), now)
    else:
        assert policies is not None
        if len(policies) < 2:
            raise InvalidArgument("freshness compares feeds: name at least two")
        f = insight.freshness(rows, policies, now)
    if ns.plot:
        from ..lake.plots import plot_freshness

        plot_freshness(f, ns.plot)

    def human() -> None:
        print(f"{f.shared_keys:,} keys written by more than one feed; {f.disagreeing:,} where the latest writes differ")
        for x in f.feeds:
            print(f"feed {x.feed[:16]}...  {x.summary()}")
        shown = [k for k in f.keys if k.disagree][: ns.keys]
        for k in shown:
            states = ", ".join(
                f"{s.feed[:8]}… seq {s.seq} {fmt_ts(s.ts_ms) if s.ts_ms is not None else 'no time'}"
                f"{' (deleted)' if s.deleted else ''}"
                for s in k.states
            )
            newest = f"newest {k.newest[:8]}…" if k.newest else "no single newest"
            print(f"  {k.key}: {newest}; {states}")
        if ns.plot:
            print(f"picture: {os.path.abspath(ns.plot)}")

    emit(ns, {**f.to_json(ns.keys), "plot": os.path.abspath(ns.plot) if ns.plot else None}, human)


def cmd_recent(ns: argparse.Namespace) -> None:
    from ..lake import insight

    since = parse_duration(ns.since) if ns.since else None
    now = _now(ns)
    if ns.limit < 1:
        raise InvalidArgument("--limit must be >= 1")
    rows, policies = _rows(ns)
    if rows is None:
        from ..lake import insight_spark
        from ..lake.spark_errors import spark_job

        with spark_job():  # a failed Spark job: the feedlog error behind it, one line
            events, unplaced = insight_spark.recent(_table_df(ns), now, since, ns.limit)
    else:
        assert policies is not None
        events, unplaced = insight.recent(rows, policies, now, since, ns.limit)

    def human() -> None:
        for e in events:
            flags = f"  [{', '.join(e.flags)}]" if e.flags else ""
            print(f"{fmt_ts(e.ts_ms)}  {e.feed[:12]}…  seq {e.seq:<8} {e.kind:<11} {e.key}{flags}")
        if not events:
            print("no events" + (f" in the last {ns.since}" if ns.since else ""))
        skipped = ", ".join(f"{n:,} {c}" for c, n in unplaced.items() if n)
        if skipped:
            print(f"not placed in time: {skipped}")

    emit(
        ns,
        {
            "events": [
                {
                    "timestamp": e.ts_ms,
                    "feed": e.feed,
                    "seq": e.seq,
                    "kind": e.kind,
                    "key": e.key,
                    "flags": list(e.flags),
                }
                for e in events
            ],
            "unplaced": unplaced,
        },
        human,
    )


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "sources",
        nargs="+",
        metavar="SOURCE",
        help="feeds (directories or grpc://HOST:PORT/KEY), or one Delta table feedlog ingest wrote (read with Spark)",
    )
    p.add_argument("--now", metavar="TIME", help="what 'now' is (ms or ISO-8601; default: the clock)")
    p.add_argument("--master", help="Spark master for a table (default local[*])")
    p.add_argument("--owner", help="a managed table's commit owner to trust (grpc://HOST:PORT or a database file)")
    storage_option_args(p)
    p.add_argument("--json", action="store_true")


def register(sub: Subcommands) -> None:
    a = sub.add_parser(
        "activity",
        help="entries per time bucket across feeds, by writer timestamp (text, --json, --plot)",
        description="Entries per time bucket, per feed and in total, and active writers per bucket. Buckets are "
        "never finer than a feed's timestamp policy (truncation unit, fuzz bound); entries without a timestamp, "
        "at 1970, in the future or behind their feed's clock are counted apart.",
    )
    _common(a)
    a.add_argument("--every", default="1d", metavar="DURATION", help="bucket width, e.g. 1h, 1d, 7d (default 1d)")
    a.add_argument("--plot", metavar="FILE", help="also draw a heatmap of feeds x time and the totals (.png or .svg)")
    a.set_defaults(handler=cmd_activity)

    f = sub.add_parser(
        "freshness",
        help="which of several feeds holds the newest write of each shared key",
        description="For keys written by more than one feed (mirrors, forks): each feed's latest write (by seq), "
        "which is newest by writer timestamp (within the feeds' fuzz a tie), and where the feeds disagree.",
    )
    _common(f)
    f.add_argument("--keys", type=int, default=20, metavar="N", help="disagreeing keys to list (default 20)")
    f.add_argument("--plot", metavar="FILE", help="also draw newest/tied/older per feed (.png or .svg)")
    f.set_defaults(handler=cmd_freshness)

    r = sub.add_parser(
        "recent",
        help="the most recent events across feeds, newest first by writer timestamp",
        description="Puts, deletions and drive events, newest first by writer timestamp (seq breaks ties); "
        "out-of-order and future timestamps are flagged, entries without a usable one counted.",
    )
    _common(r)
    r.add_argument("--since", metavar="DURATION", help="only events newer than this, e.g. 1h")
    r.add_argument("--limit", type=int, default=20, metavar="N", help="at most N events (default 20)")
    r.set_defaults(handler=cmd_recent)
