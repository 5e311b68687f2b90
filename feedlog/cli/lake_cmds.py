"""`feedlog ingest SOURCE... TABLE` and `feedlog audit TABLE`: the Spark pipeline and its proof."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgument, printable
from ..metrics import MetricsSettings
from ..metrics import add_arguments as add_metrics_arguments
from ..metrics import settings_of as metrics_settings
from .args import Subcommands, storage_option_args, storage_options_of
from .fmt import Progress, emit, fmt_size, fmt_ts, plural, progress_wanted
from .fork_cmds import witness_args
from .table_cmds import parse_retention, token_args, token_of

if TYPE_CHECKING:  # only the Spark connector imports pyspark at run time
    from pyspark.sql import SparkSession

    from ..lake.ingest import FeedPlan
    from ..lake.sink import TableRef
    from ..lake.stream_metrics import StreamMetrics


@contextlib.contextmanager
def _session(ns: argparse.Namespace) -> Iterator[SparkSession]:
    """The command's Spark session, stopped at the end with its logging off: stopping a
    `local-cluster` master otherwise prints pages of executor-relaunch errors after the result."""
    from ..lake import spark_session

    # Spark's own console bar is off: it draws stages over our progress line (`_Ticker`)
    spark: SparkSession = spark_session(ns.master, "feedlog-ingest", **{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel(spark_log_level())
    try:
        yield spark
    finally:
        with contextlib.suppress(Exception):
            spark.sparkContext.setLogLevel("OFF")
            spark.stop()


#: Spark's log level in the commands' sessions (default OFF: a failed job's cause is the command's
#: own one-line error; FEEDLOG_SPARK_LOG_LEVEL=WARN shows Spark's logs, tracebacks and all)
LOG_LEVEL_ENV = "FEEDLOG_SPARK_LOG_LEVEL"


def spark_log_level() -> str:
    return os.environ.get(LOG_LEVEL_ENV, "OFF").upper()


class _Ticker:
    """The ingest's progress on stderr (a bar on a terminal, a line every few seconds otherwise),
    from Spark's start to the commit: the job's tasks done stand for the entries read and written
    (tasks are ranges of up to maxEntriesPerPartition entries)."""

    def __init__(self, ns: argparse.Namespace, total: int, enabled: bool = True, engine: str = "spark") -> None:
        self.total = total
        self.engine = "Spark tasks" if engine == "spark" else "tasks"
        self.note = "starting Spark" if engine == "spark" else "starting"
        self.done = 0
        self.bar = Progress("ingest", total=total, unit="entries", enabled=enabled and progress_wanted(ns))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="feedlog-ingest-ticker", daemon=True)

    def tasks(self, done: int, total: int) -> None:
        self.done = self.total * done // max(total, 1)
        self.note = f"{self.engine} {done}/{total}"

    def _run(self) -> None:
        while not self.stop.wait(1.0):
            self.bar.update(self.done, self.note)

    def __enter__(self) -> _Ticker:
        if self.bar.enabled:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)
            self.bar.update(self.done, self.note)  # where it ended, not where the last tick saw it
        self.bar.close()


def cmd_ingest(ns: argparse.Namespace) -> None:
    from ..lake.feeds import parse_sources
    from ..lake.ingest import nothing_new, plan, plan_lines
    from ..lake.sink import TableRef, table_location
    from ..lake.witnesses import parse as parse_witnesses

    sources = parse_sources(",".join(ns.sources))  # bad specs and table locations fail here, before Spark starts
    table_location(ns.table)
    storage = storage_options_of(ns)
    _stream_flags(ns)
    metrics = metrics_settings(ns)
    if metrics is not None and not ns.stream:
        raise InvalidArgument("--metrics-listen is for --stream (a batch ingest is over before a scrape sees it)")
    say: Callable[[str], None] = (lambda _m: None) if ns.json else (lambda m: print(m, flush=True))
    # The table is resolved once, here, and its handle goes from the plan to the commits (a stream
    # does not reopen it per trigger).
    ref = TableRef.resolve(ns.table, ns.owner, token_of(ns), storage)
    # Ask the sources and the table first, without Spark (seconds, not the half minute Spark takes
    # to start): a peer that is down, a table of another schema and "nothing new" end here.
    plans = plan(sources, ref, witnesses=parse_witnesses(ns.witness))
    quiet = nothing_new(plans)
    if quiet is not None and (not ns.stream or ns.available_now):
        fields: dict[str, Any] = {"version": None, "rows": 0, "seconds": 0.0, "ict": None}
        emit(ns, {"rows": 0, "seconds": 0.0} if ns.stream else fields, quiet)
        return
    total = sum(p.entries for p in plans)
    engine = _engine(ns, plans)
    if not ns.stream:
        for line in plan_lines(plans):  # what will land, said while Spark starts
            say(line)
        if engine == "local" and ns.engine == "auto":
            size = sum(p.bytes for p in plans)
            say(
                f"landing here without Spark ({plural(total, 'entry', 'entries')}, ~{fmt_size(size)}; "
                "--engine spark runs it as a Spark job)"
            )
    # (a stream reports each micro-batch itself; the bar is for the one batch job)
    with contextlib.ExitStack() as stack:
        ticker = stack.enter_context(_Ticker(ns, total, enabled=not ns.stream, engine=engine))
        observer = _stream_metrics(stack, metrics, [s.key_hex for s in sources], say)
        spark = stack.enter_context(_session(ns)) if engine == "spark" else None
        data, human = _ingest(ns, spark, say, plans, ticker, ref, observer)
    data["engine"] = engine
    emit(ns, data, human)  # after the progress bar closed: the result starts its own line


def _stream_metrics(
    stack: contextlib.ExitStack[Any], settings: MetricsSettings | None, feeds: Sequence[str], say: Callable[[str], None]
) -> StreamMetrics | None:
    """The stream's metrics and their listener (`--metrics-listen`), stopped with the stack; None if not asked."""
    if settings is None:
        return None
    from ..lake.stream_metrics import StreamMetrics
    from ..metrics import MetricsListener, new_registry

    registry = new_registry()
    observer = StreamMetrics(registry, feeds)
    listener = stack.enter_context(MetricsListener(registry, settings))
    say(f"metrics at {listener.url}")
    return observer


def _engine(ns: argparse.Namespace, plans: Sequence[Any]) -> str:
    """Where an ingest runs: `spark`, or `local` (this process, no Spark) for `--engine auto` when no
    Spark master was asked for and, for a batch, the ranges are small enough that Spark's start would
    cost more than the work (`ingest.runs_here`). A stream on one machine runs here (`stream_local`:
    it follows the sources' live tails and needs no JVM) unless a master or Spark's checkpoint
    directory is named."""
    from ..lake.ingest import runs_here

    if ns.engine == "local" and ns.master:
        raise InvalidArgument("--master is for --engine spark")
    if ns.engine == "local" and ns.checkpoint_location:
        raise InvalidArgument(
            "--checkpoint-location is for --engine spark (the local engine keeps its progress in the table)"
        )
    if ns.engine != "auto":
        return str(ns.engine)
    if ns.stream:
        return "spark" if ns.master is not None or ns.checkpoint_location else "local"
    return "local" if ns.master is None and runs_here(plans) else "spark"


def _stop_on_signals() -> None:
    """A stream ends as on Ctrl-C on SIGTERM (what a service manager sends) and on SIGINT even where
    the shell started it in the background (which ignores SIGINT): it finishes its micro-batch,
    stops its maintenance and exits 0."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)
        signal.signal(signal.SIGINT, interrupt)


def _stream_flags(ns: argparse.Namespace) -> None:
    """The streaming flags checked before anything runs: each is for --stream, and durations parse
    (`parse_duration`, as `maintain --every`; --trigger also takes 0: as fast as possible)."""
    from ..log.timestamps import parse_duration

    if not ns.stream:
        for flag, given in (
            ("--checkpoint-location", ns.checkpoint_location),
            ("--trigger", ns.trigger),
            ("--maintain-every", ns.maintain_every),
            ("--timeout", ns.timeout),
            ("--available-now", ns.available_now),
            ("--max-entries-per-trigger", ns.max_entries_per_trigger is not None),
        ):
            if given:
                raise InvalidArgument(f"{flag} is for --stream")
    if ns.trigger is not None and ns.available_now:
        raise InvalidArgument("--trigger and --available-now are two triggers: give one")
    if ns.max_entries_per_trigger is not None and ns.max_entries_per_trigger < 1:
        raise InvalidArgument(f"--max-entries-per-trigger must be >= 1, got {ns.max_entries_per_trigger}")
    ns.trigger_ms = (
        None if ns.trigger is None else 0 if ns.trigger.strip() in ("0", "0s", "0ms") else parse_duration(ns.trigger)
    )
    ns.maintain_every_ms = None if ns.maintain_every is None else parse_duration(ns.maintain_every)
    ns.timeout_s = None if ns.timeout is None else parse_duration(ns.timeout) / 1000


def _ingest(
    ns: argparse.Namespace,
    spark: SparkSession | None,
    say: Callable[[str], None],
    plans: Sequence[FeedPlan],
    ticker: _Ticker,
    ref: TableRef,
    observer: StreamMetrics | None = None,
) -> tuple[dict[str, Any], str]:
    """The job; its result as (JSON, human line)."""
    from ..lake.ingest import ingest_batch, ingest_stream

    common: dict[str, Any] = {
        "owner": ns.owner,
        "token": token_of(ns),
        "storage_options": storage_options_of(ns),
        "progress": say,
    }
    if ns.stream:
        ticker.note = "streaming"
        _stop_on_signals()
        r = ingest_stream(
            spark,
            ns.sources,
            ref,
            checkpoint_location=ns.checkpoint_location,
            available_now=ns.available_now,
            max_entries_per_trigger=ns.max_entries_per_trigger,
            trigger_seconds=None if ns.trigger_ms is None else ns.trigger_ms / 1000,
            timeout=ns.timeout_s,
            maintain_every_ms=ns.maintain_every_ms,
            metrics=observer,
            **common,
        )
        commits = f" ({plural(r.commits, 'commit')})" if spark is None else ""
        said = f"ingested {plural(r.rows, 'entry', 'entries')} in {r.seconds:.1f}s{commits}"
        out: dict[str, Any] = {"rows": r.rows, "seconds": round(r.seconds, 3)}
        if spark is None:
            out["commits"], out["version"] = r.commits, r.version
        return out, said
    ticker.note = "planning the Spark job" if spark is not None else "reading and writing"
    r = ingest_batch(spark, ns.sources, ref, plans=plans, tasks=ticker.tasks, **common)
    ticker.done, ticker.note = r.rows, "committed" if r.version is not None else "done"
    rate = r.rows / r.seconds if r.seconds else 0
    human = (
        f"committed version {r.version} (ICT {fmt_ts(r.in_commit_timestamp)}): "
        f"{plural(r.rows, 'entry', 'entries')} in {r.seconds:.1f}s "
        f"({rate:,.{0 if rate >= 10 else 1}f}/s)"
        if r.version is not None
        else "no commit: nothing new"
        if r.rows == 0
        else "no commit: another job had already landed these entries"
    )
    return {"version": r.version, "rows": r.rows, "seconds": round(r.seconds, 3), "ict": r.in_commit_timestamp}, human


def cmd_audit(ns: argparse.Namespace) -> int:
    from ..lake.audit import audit_table

    keys = []
    for k in ns.key or []:
        try:
            raw = bytes.fromhex(k)
        except ValueError:
            raw = b""
        if len(raw) != 32:
            raise InvalidArgument(f"--key {k!r} is not a feed key (64 hex digits)")
        keys.append(raw)
    report = audit_table(ns.table, keys or None, ns.version, owner=ns.owner, storage_options=storage_options_of(ns))

    def human() -> None:
        if not keys:
            print("note: no --key given; trusting the keys named in the table (this proves the rows are what")
            print("      those keys signed, not whose keys they are)")
        for f in report.feeds:
            print(f.summary())
            for line in f.details():
                print(f"  {line}")
        print(report.summary())

    emit(ns, report.to_json(), human)
    return 0 if report.ok else 5


def _lazy_session(stack: contextlib.ExitStack[Any], ns: argparse.Namespace) -> Callable[[], SparkSession]:
    """A function that starts the command's Spark session on its first call (closed with `stack`)."""
    started: list[SparkSession] = []

    def session() -> SparkSession:
        if not started:
            started.append(stack.enter_context(_session(ns)))
        return started[0]

    return session


def cmd_expire(ns: argparse.Namespace) -> None:
    from ..delta import DeltaTable
    from ..log.timestamps import parse_duration

    options = storage_options_of(ns)
    DeltaTable.open(ns.table, owner=ns.owner, storage_options=options)  # a missing table fails before Spark starts
    every = parse_duration(ns.every) / 1000 if ns.every else None
    if ns.rounds is not None and ns.rounds < 1:
        raise InvalidArgument("--rounds must be >= 1")
    if ns.engine == "local" and ns.master:
        raise InvalidArgument("--master is for --engine spark")
    with contextlib.ExitStack() as stack:
        # Spark starts only for a round with files that may hold expired rows (their stats say)
        _expire_rounds(ns, _lazy_session(stack, ns), every, options)


def _expire_rounds(
    ns: argparse.Namespace, session: Callable[[], SparkSession], every: float | None, options: Any
) -> None:
    from ..lake.expire import expire
    from ..lake.spark_errors import spark_job

    rounds, token = 0, token_of(ns)
    engine = "spark" if ns.master and ns.engine == "auto" else ns.engine
    while True:
        with spark_job():
            r = expire(session, ns.table, token=token, owner=ns.owner, storage_options=options, engine=engine)
        rounds += 1
        where = " (without Spark; --engine spark runs it as a Spark job)" if r.engine == "local" else ""
        emit(
            ns,
            {
                "version": r.version,
                "files_rewritten": r.files_rewritten,
                "rows_cleared": r.rows_cleared,
                "engine": r.engine,
            },
            f"version {r.version}: {plural(r.rows_cleared, 'expired row')} cleared in "
            f"{plural(r.files_rewritten, 'rewritten file')}{where}"
            if r.version is not None
            else "nothing expired",
        )
        if every is None or (ns.rounds is not None and rounds >= ns.rounds):
            return
        time.sleep(every)


def cmd_maintain(ns: argparse.Namespace) -> None:
    from ..delta import DeltaTable
    from ..lake.maintain import MaintainReport, maintain, maintain_every
    from ..lake.spark_errors import spark_job
    from ..log.timestamps import parse_duration

    options = storage_options_of(ns)
    DeltaTable.open(ns.table, owner=ns.owner, storage_options=options)  # a missing table fails before any work
    every = parse_duration(ns.every) if ns.every else None
    if ns.rounds is not None and (every is None or ns.rounds < 1):
        raise InvalidArgument("--rounds needs --every and must be >= 1")
    if ns.engine == "local" and ns.master:
        raise InvalidArgument("--master is for --engine spark")
    engine = "spark" if ns.master and ns.engine == "auto" else ns.engine

    def say(r: MaintainReport) -> None:
        rewrites = [
            f"{plural(r.rows_expired, 'expired row')} cleared" if r.expired_version is not None else "nothing expired",
            f"{plural(r.rows_forgotten, 'forgotten row')} cleared"
            if r.forgotten_version is not None
            else "nothing forgotten",
        ]
        parts = [
            *(rewrites if r.feedlog_table else ["no TTL or forget (not a table feedlog ingest made)"]),
            *(
                [f"compacted {plural(r.files_compacted, 'file')} into {r.files_written}"]
                if r.compacted_version is not None
                else []
            ),
            f"checkpoint at {r.checkpoint}" if r.checkpoint is not None else "checkpoint current",
            f"{plural(r.log_files_deleted, 'log file')} deleted",
            f"vacuum deleted {plural(r.vacuum['files_deleted'], 'data file')}" if r.vacuum else "nothing to vacuum",
        ]
        if r.deferred:
            parts.append(f"deferred to the next pass (a concurrent rewrite won): {', '.join(r.deferred)}")
        emit(ns, r.to_json(), "; ".join(parts))

    with contextlib.ExitStack() as stack:
        session = _lazy_session(stack, ns)  # Spark starts only for a rewrite too big to do in this process
        kwargs: dict[str, Any] = {
            "token": token_of(ns),
            "owner": ns.owner,
            "storage_options": options,
            "spark": session,
            "engine": engine,
            "vacuum_retain_ms": None if ns.retain is None else parse_retention(ns.retain),
            "vacuum_force": ns.force,
        }
        with spark_job():
            if every is None:
                say(maintain(ns.table, **kwargs))
            else:
                maintain_every(
                    ns.table,
                    every,
                    rounds=ns.rounds,
                    on_report=say,
                    on_error=lambda e: print(
                        f"feedlog: warning: this pass failed, the next retries: {printable(str(e))}", file=sys.stderr
                    ),
                    **kwargs,
                )


def rewrite_job_args(p: argparse.ArgumentParser, every_help: str, engine_help: str) -> None:
    """The arguments of a job that rewrites a table's files (expire, maintain): the table, a schedule, its
    owner and token, its store, and where the rewrites run."""
    p.add_argument("table", metavar="TABLE")
    p.add_argument("--every", metavar="DURATION", help=every_help)
    p.add_argument("--rounds", type=int, help="with --every: stop after this many runs")
    token_args(p)
    p.add_argument(
        "--owner",
        metavar="OWNER",
        help="the table's commit owner to trust, grpc://HOST:PORT or a database file "
        "(default: <TABLE>/_feedlog/owner.db and $FEEDLOG_OWNER)",
    )
    storage_option_args(p)
    p.add_argument("--engine", choices=("auto", "spark", "local"), default="auto", help=engine_help)


def register(sub: Subcommands) -> None:
    p = sub.add_parser(
        "ingest",
        help="land feeds in a Delta table, with Spark or in process (exactly once, through the commit owner)",
        description="Read feeds (grpc://HOST:PORT/KEY or feed directories), verify every block against "
        "the signed tree, and append them to a Delta table (created managed, with in-commit "
        "timestamps, if missing). Rerunning picks up where the table stopped.",
    )
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="grpc://HOST:PORT/KEY or a feed directory")
    p.add_argument("table", metavar="TABLE", help="the Delta table: a directory, or an object-store URL (s3://...)")
    witness_args(p)  # issue 40: a fork fails the job before a row lands; agreeing witnesses go in the commit
    p.add_argument(
        "--owner",
        help="commit owner for a new table, and the one trusted for an existing one: grpc://HOST:PORT, a SQLite "
        "file, or 'filesystem' (default: in process, <TABLE>/_feedlog/owner.db; $FEEDLOG_OWNER is trusted too; "
        "a table on an object store needs one named)",
    )
    token_args(p)
    storage_option_args(p)
    p.add_argument(
        "--stream", action="store_true", help="follow the sources and land new entries until stopped (Ctrl-C)"
    )
    p.add_argument("--available-now", action="store_true", help="with --stream: stop once caught up")
    p.add_argument(
        "--trigger",
        metavar="DURATION",
        help="with --stream: a micro-batch at most every DURATION, e.g. 100ms, 1s; 0: as fast as possible "
        "(default 100ms on the local engine, 1s on Spark)",
    )
    p.add_argument(
        "--max-entries-per-trigger",
        type=int,
        metavar="N",
        help="with --stream: at most about N entries a micro-batch (the local engine commits as soon as it holds N)",
    )
    p.add_argument(
        "--maintain-every",
        metavar="DURATION",
        help="with --stream: a `feedlog maintain` pass every DURATION beside the stream, e.g. 10m",
    )
    p.add_argument("--timeout", metavar="DURATION", help="with --stream: stop after DURATION")
    p.add_argument("--checkpoint-location", metavar="DIR", help="with --stream on Spark: Spark's checkpoint directory")
    add_metrics_arguments(p)  # --metrics-listen: with --stream
    p.add_argument(
        "--engine",
        choices=("auto", "spark", "local"),
        default="auto",
        help="where the ingest runs: 'spark' (a Spark job), 'local' (this process, no Spark), or 'auto' "
        "(default): a batch runs locally for up to 1,000,000 new entries and 1 GiB of blocks, a --stream "
        "always, unless --master (or --checkpoint-location) is given",
    )
    p.add_argument("--master", help="Spark master URL (default local[*]); implies --engine spark under auto")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_ingest)

    a = sub.add_parser(
        "audit",
        help="prove a table's rows are exactly the signed feed prefixes",
        description="Re-derive every row's Merkle leaf from the table, rebuild each feed's tree and verify "
        "its signatures with the given keys; report missing, extra and altered rows (exit 5).",
    )
    a.add_argument("table", metavar="TABLE")
    a.add_argument("--key", action="append", metavar="HEX", help="a trusted feed key (repeatable)")
    a.add_argument("--version", type=int, help="audit this table version (default: the latest)")
    a.add_argument(
        "--owner",
        metavar="OWNER",
        help="the commit owner to ask for un-backfilled commits, grpc://HOST:PORT or a database file "
        "(default $FEEDLOG_OWNER; without one the backfilled log is audited)",
    )
    storage_option_args(a)
    a.add_argument("--json", action="store_true")
    a.set_defaults(handler=cmd_audit)

    e = sub.add_parser(
        "expire",
        help="TTL compaction of a feedlog table (in process or a Spark job): expired rows become auditable tombstones",
        description="Rewrite the files holding rows past expires_at: each keeps its seq and Merkle leaf hash "
        "but loses value, block and stat; committed through the table's commit owner.",
    )
    rewrite_job_args(
        e,
        "run periodically, e.g. 10m (until Ctrl-C)",
        "where the files are rewritten: 'spark' (a Spark job), 'local' (this process, no Spark), or 'auto' "
        "(default): local when the files that may hold expired rows total at most 256 MiB and no --master "
        "is given, else Spark",
    )
    e.add_argument("--master", help="Spark master URL (default local[*]); implies --engine spark under auto")
    e.add_argument("--json", action="store_true")
    e.set_defaults(handler=cmd_expire)

    m = sub.add_parser(
        "maintain",
        help="one maintenance pass over a table (or one every --every): TTL compaction, forget rewrites, checkpoint, "
        "log cleanup, vacuum",
        description="In a safe order, each step through the table's commit owner: expired rows and rows a "
        "writer withdrew (feedlog forget) become tombstones; the newest backfilled version gets a checkpoint; "
        "log files past delta.logRetentionDuration are deleted; data files that no version inside "
        "delta.deletedFileRetentionDuration needs are vacuumed. Safe beside a running ingest; killable at any point "
        "and rerun to finish.",
    )
    rewrite_job_args(
        m,
        "run a pass every DURATION, e.g. 10m (until Ctrl-C)",
        "where rewrites run, as for expire (default auto: in this process unless they are big)",
    )
    m.add_argument("--master", help="Spark master URL (default local[*]); implies --engine spark under auto")
    m.add_argument(
        "--retain",
        metavar="DURATION",
        help="vacuum's retention (default: the table's delta.deletedFileRetentionDuration, 7 days unless set)",
    )
    m.add_argument("--force", action="store_true", help="allow --retain shorter than the table's retention")
    m.add_argument("--json", action="store_true")
    m.set_defaults(handler=cmd_maintain)
