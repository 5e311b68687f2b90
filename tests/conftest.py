from __future__ import annotations

import importlib.util
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import quote

import pytest

# moto's S3 server on loopback, one process for the whole run (tests/delta/s3.py): the fixture `s3_server`
from tests.delta.s3 import s3_server_fixture  # noqa: F401

VECTORS = Path(__file__).parent / "vectors"
TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(name: str) -> ModuleType:
    """tools/NAME.py (NAME may hold a folder: "bench/bench_x") as a module, imported as it runs as a
    script: its own folder on sys.path, so it can import the scripts beside it."""
    path = TOOLS / f"{name}.py"
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def load_vectors(name: str) -> Any:
    return json.loads((VECTORS / name).read_text())


@pytest.fixture
def hypercore_vectors() -> Any:
    return load_vectors("hypercore-11.37.1.json")


@pytest.fixture
def hyperdb_vectors() -> Any:
    return load_vectors("hyperdb-3.5.0.json")


_SPARK: list[Any] = []


def _start_spark() -> Any:
    if not _SPARK:
        from feedlog.lake import spark_session

        s = spark_session("local[2]", "feedlog-tests")
        s.sparkContext.setLogLevel("ERROR")
        _SPARK.append(s)
    return _SPARK[0]


#: the tests that take minutes, by name
LONGEST = (
    "test_ingest_on_a_cluster_into_s3",
    "test_readme_runs_as_written",
    "test_a_job_killed_mid_batch",
)


def _cost(item: pytest.Item) -> int:
    """A rough rank of how long a test runs: the minutes-long ones, other real Spark jobs, other slow
    tests, then the rest."""
    if item.get_closest_marker("slow") is None:
        return 3
    # the three that take minutes (the cluster kills, the README run block by block, the killed batch):
    # first, so that they run side by side on different workers instead of one starting last
    if item.name.startswith(LONGEST):
        return 0
    return 1 if "/lake/" in str(item.path) else 2


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only a run that keeps a Spark test starts one
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Longest first (stable otherwise): with pytest-xdist (`tools/run test` runs one worker per core) the
    # minutes-long end-to-end tests start at once on separate workers, instead of one of them starting
    # last and leaving the other worker idle at the end. Every worker sorts the same way.
    items.sort(key=_cost)
    # Start the JVM before any test creates gRPC threads: PySpark forks it (Popen with a
    # preexec_fn), and a fork while gRPC's threads hold their locks can kill the child before
    # it execs ("Java gateway process exited"; seen once under load in the demo).
    if any("spark" in getattr(item, "fixturenames", ()) for item in items):
        _start_spark()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one real local Spark session of a test run (starting one costs ~8 s)."""
    yield _start_spark()
    if _SPARK:
        _SPARK.pop().stop()


# ---- PostgreSQL (the commit owner's shared state engine) ---------------------------------------

POSTGRES_ENV = "FEEDLOG_TEST_POSTGRES"
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
_postgres: list[str | None] = []  # probed once per session


def postgres_dsn() -> str:
    """The PostgreSQL server the tests use: `$FEEDLOG_TEST_POSTGRES` (a DSN), else the local server
    if it answers; skips the test, saying why, when there is none."""
    import psycopg  # loaded only by a run that has a PostgreSQL test

    if not _postgres:
        dsn = os.environ.get(POSTGRES_ENV) or DEFAULT_POSTGRES
        try:
            with psycopg.connect(dsn, connect_timeout=3) as conn:
                conn.execute("SELECT 1")
            _postgres.append(dsn)
        except psycopg.Error as e:
            _postgres.append(None)
            _postgres.append(f"no PostgreSQL at {dsn} (set {POSTGRES_ENV} to a DSN): {str(e).strip()}")
    if _postgres[0] is None:
        pytest.skip(str(_postgres[1]))
    return _postgres[0]


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A DSN whose tables live in a fresh schema, dropped afterwards (runs never see each other)."""
    import psycopg

    dsn = postgres_dsn()
    schema = f"feedlog_test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in dsn else "?"
    try:
        yield f"{dsn}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
