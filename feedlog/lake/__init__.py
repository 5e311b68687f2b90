"""The lakehouse side: feeds into Delta tables with Spark.

    from feedlog.lake import spark_session
    spark = spark_session()                       # local Spark, both data sources registered
    df = spark.read.format("feedlog").option("feed", "grpc://127.0.0.1:7000/<key>").load()
    df.write.format("feedlog-delta").mode("append").save("data/table")

`feedlog` (`source.py`) reads feeds, verified, as rows of `rows.SCHEMA`;
`feedlog-delta` (`sink.py`) lands any DataFrame in a Delta table through its
commit owner, exactly once per feed range; `audit.py` proves a table's rows
are the signed feeds; `ingest.py` is the job behind `feedlog ingest`.

`spark_session` points PySpark's Python workers at this interpreter
(`PYSPARK_PYTHON`, unless already set), so executors find feedlog and its
dependencies; importing the package changes nothing.

A Spark job that fails because of a feedlog error (a schema mismatch, a peer
that went away, a refused commit) raises, in a session `spark_session` made or
`register` saw, an exception that is both that feedlog error's class and the
PySpark exception (`except SchemaMismatch` and `except AnalysisException` both
catch it), whose message starts with the feedlog error's line (`spark_errors`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_LOG4J = os.path.join(os.path.dirname(__file__), "log4j2.properties")
#: start-up settings measured to matter on a 2-core machine: the serial GC and the C1 JIT alone start the
#: driver JVM about twice as fast cold (the driver mostly plans; the work runs in Python workers)
JAVA_OPTIONS = "spark.driver.extraJavaOptions"
EXECUTOR_JAVA_OPTIONS = "spark.executor.extraJavaOptions"
FAST_START = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
SPARK_CONF = {
    JAVA_OPTIONS: f"{FAST_START} -Dlog4j2.configurationFile={_LOG4J}",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
    "spark.sql.session.timeZone": "UTC",
    # the feedlog-delta sink gets Arrow batches of this many rows (Spark's default: 10,000); Spark
    # still ends a batch at spark.sql.execution.arrow.maxBytesPerBatch (64 MB), so wide rows stay
    # bounded. 1M narrow rows (4 columns): sink vs Spark's Parquet writer 0.76-0.80x -> 0.92-0.93x at
    # 50-100k (250k and 1M slower again); feedlog's own wide rows: within noise
    "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",
}
#: Settings for a session (or a job: they are SQL settings, `spark.conf.set` works) whose rows are all
#: small: Arrow batches to Python end at 1,000 rows and at no byte bound. With a byte bound (Spark 4's
#: maxBytesPerBatch, 64 MB by default) the JVM measures the whole batch after every row (JFR:
#: ArrowWriter.sizeInBytes, a setValueCount on every vector, led the profile); Spark skips that only
#: when the bound is Int.MaxValue. On feedlog's rows (~30 Arrow vectors, two structs) the sink's JVM
#: CPU per 1M rows fell from 5.2 s to 3.1-3.3 s, and the sink went from 0.78x to 1.45-1.48x of Spark's
#: Parquet writer (narrow rows: ~0.9x -> ~1.2x). Not the default: with no byte bound a batch is
#: 1,000 rows whatever they weigh, and feedlog entries may reach 8 MiB (a batch of such rows would
#: exceed local Spark's 1 GB of JVM memory and Arrow's 2 GiB per column). ~0.4 MB of typical
#: feedlog rows; 128 MB of 64 KB entries.
ROW_BOUNDED_BATCHES = {
    "spark.sql.execution.arrow.maxRecordsPerBatch": "1000",
    "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
}


@contextlib.contextmanager
def sql_settings(spark: Any, settings: dict[str, str]) -> Iterator[None]:
    """Runtime SQL settings for the jobs started inside the block, put back as they were after it:
    `with sql_settings(spark, ROW_BOUNDED_BATCHES): df.write.format("feedlog-delta").save(path)`."""
    before = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


#: Python data sources get filters pushed down (the feedlog-delta reader prunes files with them)
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
#: a class-data-sharing archive of the JVM classes a feedlog job loads (`python -m feedlog.lake.classes`
#: writes it): Spark's JVM maps them instead of loading and verifying each, ~2x faster to a first job
CLASS_ARCHIVE_ENV = "FEEDLOG_SPARK_CLASS_ARCHIVE"
#: the JVM's own notes about the archive (e.g. one made by another JDK, which it then ignores) stay quiet
CDS_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: what the JVM prints on every start because Spark's launcher adds `--add-modules=jdk.incubator.vector`
#: (JavaModuleOptions, not configurable); the JVM has no flag to silence it, so our sessions drop the line
INCUBATOR_WARNING = b"WARNING: Using incubator modules"


def spark_session(master: str | None = None, app_name: str = "feedlog", **conf: str) -> Any:
    """A SparkSession (local[*] unless `master`) with the feedlog data sources registered."""
    from pyspark.sql import SparkSession

    # workers started by the JVM run `python3` from PATH unless told otherwise, which may lack our packages
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # local Spark binds its driver and block manager to loopback, not to whatever the host name resolves to
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    master = master or os.environ.get("FEEDLOG_SPARK_MASTER", "local[*]")
    settings = {**SPARK_CONF, **conf}
    archive = class_archive()
    shared = f" -XX:SharedArchiveFile={archive} {CDS_QUIET}" if archive.is_file() else ""
    if JAVA_OPTIONS not in conf:
        settings[JAVA_OPTIONS] += shared
    if master.startswith("local-cluster") and EXECUTOR_JAVA_OPTIONS not in conf:
        # Spark's test cluster: its executor JVMs start on this machine, where the archive is, and do little
        # but shuttle Arrow batches to Python workers; these settings cut a small job's CPU by a third
        settings[EXECUTOR_JAVA_OPTIONS] = FAST_START + shared
    if not _start_jvm(master, app_name, settings):
        builder = SparkSession.builder.appName(app_name).master(master)
        for k, v in settings.items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
    else:
        spark = SparkSession.builder.getOrCreate()  # on the context just made, with every setting
    register(spark)
    return spark


def spark_install() -> dict[str, str]:
    """What a class archive is valid for: this PySpark (its version, and the folder and the state of
    its jars: the JVM checks every jar's path, size and time against the archive's) and this JDK."""
    import pyspark
    from pyspark.version import __version__

    home = os.path.realpath(os.path.dirname(pyspark.__file__))
    java = os.path.realpath(shutil.which("java") or "java")
    return {
        "pyspark": __version__,
        "pyspark_home": home,
        "jars": jars_state(home) or "",
        "java_home": os.environ.get("JAVA_HOME", ""),
        "java": java,
    }


def jars_state(home: str) -> str | None:
    """What a class archive's record holds of the jars in PySpark folder `home`: their folder's
    mtime, which a reinstall changes ("" without a jars folder; None without the folder itself)."""
    try:
        return str(os.stat(os.path.join(home, "jars")).st_mtime_ns)
    except OSError:  # no jars folder: a JVM cannot start from this install anyway
        return "" if os.path.isdir(home) else None


def class_archive() -> Path:
    """Where the class archive for this PySpark installation and JDK is ($FEEDLOG_SPARK_CLASS_ARCHIVE,
    else in the user's cache directory). Only `classes.build` writes it, whole or not at all: a JVM
    given a cut archive dies (SIGBUS); one given an archive of another JDK or class path ignores it,
    silently, so another checkout's venv (the same PySpark in another folder) gets its own file."""
    given = os.environ.get(CLASS_ARCHIVE_ENV)
    if given:
        return Path(given)
    install = spark_install()
    key = hashlib.sha256("\n".join(f"{k}={v}" for k, v in sorted(install.items())).encode()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "feedlog" / f"spark-{install['pyspark']}-{key}.jsa"


#: tries to start Spark's JVM: a launch lost to the fork (see `_start_jvm`) is tried once more
GATEWAY_ATTEMPTS = 2


def _start_jvm(master: str, app_name: str, settings: dict[str, str]) -> bool:
    """Start Spark's JVM and context ourselves, its stderr through a filter (`_forward`), when no
    JVM runs yet in this process; False when one does (or spark-submit started us with one)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return False
    conf = SparkConf(loadDefaults=False).setMaster(master).setAppName(app_name)
    for k, v in settings.items():
        conf.set(k, v)
    for attempt in range(GATEWAY_ATTEMPTS):
        # `popen_kwargs` is PySpark's documented hook for "capturing stdout/stderr" of the JVM it
        # starts. The pipe is read from before the JVM starts: what it prints while starting (why
        # it could not) reaches our stderr as it would unfiltered.
        read_end, write_end = os.pipe()
        threading.Thread(target=_forward, args=(read_end,), name="feedlog-spark-stderr", daemon=True).start()
        try:
            gateway = launch_gateway(conf, popen_kwargs={"stderr": write_end})  # type: ignore[no-untyped-call]
            break
        except Exception as e:
            # PySpark forks its launcher with a preexec_fn; `feedlog ingest` asks the peers (gRPC,
            # whose threads then run) before it decides to start Spark, and such a fork can lose the
            # child before it execs: "Java gateway process exited" (seen once in CI). Once more;
            # a JVM that cannot start fails the second time too, and that error is raised.
            condition = getattr(e, "getCondition", lambda: None)()
            if condition != "JAVA_GATEWAY_EXITED" or attempt + 1 == GATEWAY_ATTEMPTS:
                raise
        finally:
            os.close(write_end)  # the JVM holds its own copy; ours would keep the pipe open after it exits
    SparkContext(conf=conf, gateway=gateway)
    return True


def _forward(fd: int, out: int = 2) -> None:
    """Copy the JVM's stderr to ours as it comes (log lines, Spark's progress redrawn with CR),
    minus the incubator warning line. Ends when the JVM closes its stderr."""
    held = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            break
        held += chunk
        lines = held.split(b"\n")
        held = lines.pop()  # after the last newline: a partial line
        text = b"".join(line + b"\n" for line in lines if not line.startswith(INCUBATOR_WARNING))
        if held and not INCUBATOR_WARNING.startswith(held[: len(INCUBATOR_WARNING)]):
            text, held = text + held, b""  # a partial line that cannot become the warning goes out now
        _write(out, text)
    if held and not held.startswith(INCUBATOR_WARNING):
        _write(out, held)
    os.close(fd)


def _write(fd: int, data: bytes) -> None:
    while data:
        try:
            n = os.write(fd, data)
        except OSError:  # our stderr is gone (a closed pipe): the JVM's lines have nowhere to go
            return
        data = data[n:]


def register(spark: Any) -> None:
    """Register the `feedlog` and `feedlog-delta` data sources with `spark`, and make its failed
    jobs raise the feedlog error behind them (`spark_errors.install`)."""
    from .sink import DeltaSink
    from .source import FeedDataSource
    from .spark_errors import install

    spark.dataSource.register(FeedDataSource)
    spark.dataSource.register(DeltaSink)
    # the feedlog-delta reader prunes files by pushed filters; Spark refuses such a reader without this
    spark.conf.set(PUSHDOWN_CONF, "true")
    install()
