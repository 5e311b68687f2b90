"""A class-data-sharing archive for Spark's JVM: `python -m feedlog.lake.classes`.

Starting local Spark is mostly the JVM loading, verifying and linking some ten
thousand classes. The JVM can instead map them from an archive made by a run
that loaded them (JDK dynamic CDS, `-XX:ArchiveClassesAtExit`): on the 2-core
machine that halves the time to a first job. `spark_session` uses the archive
at `feedlog.lake.class_archive()` when it exists; this module makes it.

Making it runs a small feedlog job (a 3-entry feed into a table, read back) in
a child process whose JVM writes the archive as it exits, waits for that JVM
to end, and only then moves the archive into place: a JVM given a cut archive
crashes, so a partial one must never sit at the final path. An archive made by
another JDK or for another class path is ignored by the JVM (no speed-up,
no harm), so the default path names the PySpark installation (its folder and
jars) and the JDK, and a new one is recorded for each. About 150 MB; recording
one removes those whose PySpark folder is gone (a deleted venv or checkout).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import Unavailable
from ..log.storage import atomic_write
from . import CDS_QUIET, JAVA_OPTIONS, SPARK_CONF, class_archive, jars_state, spark_install

#: for the child's whole run: start Spark, one job, stop, dump ~150 MB
BUILD_TIMEOUT_S = 900


def build(path: Path | None = None) -> Path:
    """Write the archive to `path` (default `class_archive()`), replacing any there. Returns it."""
    default = path is None
    path = path or class_archive()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "feedlog.lake.classes", "--record", str(tmp)],
            timeout=BUILD_TIMEOUT_S,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
            tail = (done.stderr or "").strip().splitlines()[-1:] or ["no archive written"]
            raise Unavailable(f"could not record Spark's classes: {tail[0]}")
        if default:  # the record first: another checkout's `prune` removes an archive without one
            atomic_write(path.with_suffix(".json"), json.dumps(spark_install()).encode())
        os.replace(tmp, path)  # whole, at once: readers see the old archive, none, or this one
    finally:
        tmp.unlink(missing_ok=True)
    if default:
        prune(path.parent, keep=path)
    return path


def prune(folder: Path, keep: Path) -> list[Path]:
    """Remove the archives in `folder` recorded for a PySpark installation that is gone or changed
    (a deleted venv or checkout, a reinstall in the same folder: ~160 MB each), and those with no
    record (made by a feedlog that named them otherwise: nothing finds them now); returns them. One
    whose record cannot be read is kept."""
    gone = []
    for archive in sorted(folder.glob("spark-*.jsa")):
        if archive == keep:
            continue
        record = archive.with_suffix(".json")
        try:
            install = json.loads(record.read_text())
            home, jars = install["pyspark_home"], install.get("jars")
        except FileNotFoundError:
            home = jars = None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if not isinstance(home, str) or jars_state(home) != jars:
            archive.unlink(missing_ok=True)
            record.unlink(missing_ok=True)
            gone.append(archive)
    return gone


def _record(tmp: Path) -> None:
    """The child: a small ingest and read with `-XX:ArchiveClassesAtExit`, then wait for the JVM to exit."""
    from pyspark import SparkContext

    from ..log.feed import Feed, Write
    from . import spark_session
    from .ingest import ingest_batch

    options = f"{SPARK_CONF[JAVA_OPTIONS]} -XX:ArchiveClassesAtExit={tmp} {CDS_QUIET}"
    with tempfile.TemporaryDirectory(prefix="feedlog-classes-") as d:
        feed = Feed.create(Path(d) / "feed", timestamps="exact", fsync=False)
        feed.append([Write(f"/k{i}", b"v") for i in range(3)])
        feed.close()
        spark = spark_session("local[*]", "feedlog-classes", **{JAVA_OPTIONS: options})
        spark.sparkContext.setLogLevel("ERROR")
        ingest_batch(spark, [str(Path(d) / "feed")], str(Path(d) / "table"), progress=lambda _m: None)
        assert spark.read.format("feedlog-delta").load(str(Path(d) / "table")).count() == 3
        gateway = SparkContext._gateway
        spark.stop()
        proc = getattr(gateway, "proc", None)
        if proc is None:
            raise Unavailable("Spark's JVM was not started by this process")
        proc.stdin.close()  # the gateway JVM exits when its stdin closes, writing the archive first
        proc.wait(timeout=BUILD_TIMEOUT_S)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m feedlog.lake.classes", description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", type=Path, help="where (default: feedlog.lake.class_archive())")
    ap.add_argument("--record", type=Path, help=argparse.SUPPRESS)  # the child's part
    ns = ap.parse_args()
    if ns.record is not None:
        _record(ns.record)
        return
    print(build(ns.path))


if __name__ == "__main__":
    main()
