from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import quote

import pytest

from feedlog import failpoints

# moto's S3 server on loopback, one process for the whole run (tests/delta/s3.py): the fixture `s3_server`
from tests.delta.s3 import s3_server_fixture  # noqa: F401

VECTORS = Path(__file__).parent / "vectors"
TOOLS = Path(__file__).resolve().parents[1] / "tools"


def wait_until(pred: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> None:
    """Poll `pred` until it holds; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


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
#: the fail-point file of the shared Spark session's JVM and Python workers (`spark_failpoints`)
_SPARK_POINTS = Path(tempfile.gettempdir()) / f"feedlog-spark-points-{os.getpid()}"


def _start_spark() -> Any:
    if not _SPARK:
        from feedlog.lake import spark_session

        # the JVM and every Python worker it starts read their fail points from the file; this process
        # and the processes tests start do not
        atexit.register(lambda: _SPARK_POINTS.unlink(missing_ok=True))
        before = os.environ.get(failpoints.ENV)
        os.environ[failpoints.ENV] = f"@{_SPARK_POINTS}"
        try:
            s = spark_session("local[2]", "feedlog-tests")
        finally:
            if before is None:
                del os.environ[failpoints.ENV]
            else:
                os.environ[failpoints.ENV] = before
        s.sparkContext.setLogLevel("ERROR")
        _SPARK.append(s)
    return _SPARK[0]


@pytest.fixture
def spark_failpoints(spark: Any) -> Iterator[Callable[[str], None]]:
    """Arms fail points in the shared session's workers for the jobs that follow (`arm("sink.x=exit")`);
    disarmed when the test ends."""
    yield functools.partial(failpoints.arm_file, _SPARK_POINTS)
    failpoints.arm_file(_SPARK_POINTS, "")


#: the tests that take longest (20-90 s), by name, longest first
LONGEST = (
    "test_docs_run_as_written",
    "test_ingest_on_a_cluster_into_s3",
    "test_the_demo_command_tells_its_story",
)


def _cost(item: pytest.Item) -> tuple[int, int]:
    """A rough rank of how long a test runs: the longest (in LONGEST's order), other real Spark jobs,
    other slow tests, then the rest."""
    if item.get_closest_marker("slow") is None:
        return (3, 0)
    # the end-to-end runs (the docs page by page, block by block, the cluster kills, the demo) first, so that none
    # of them starts last while the other worker has nothing left to do
    for i, name in enumerate(LONGEST):
        if item.name.startswith(name):
            return (0, i)
    return (1 if "/lake/" in str(item.path) else 2, 0)


#: the xdist group of every test on the shared Spark session (`tools/run test` runs `--dist loadgroup`)
SPARK_GROUP = "spark"
#: where workers write the group of each grouped test for the controller's scheduler
_GROUPS_ENV = "FEEDLOG_TEST_XDIST_GROUPS"


def pytest_itemcollected(item: pytest.Item) -> None:
    # One worker runs every test on the shared session, one after the other: a second worker's JVM
    # would cost its start (~10 s of CPU on 2 cores) and its own warm-up for the same tests. The
    # group, the largest unit of work, is the first one xdist hands out.
    if "spark" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.xdist_group(SPARK_GROUP))


def pytest_configure(config: pytest.Config) -> None:
    # The controller of a `--dist loadgroup` run: its workers (which inherit the environment) say in
    # this folder which tests belong to which xdist_group
    workers = config.getoption("numprocesses", None)
    if config.getoption("dist", "no") == "loadgroup" and workers and not hasattr(config, "workerinput"):
        os.environ[_GROUPS_ENV] = tempfile.mkdtemp(prefix="feedlog-xdist-groups-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and (where := os.environ.pop(_GROUPS_ENV, None)):
        shutil.rmtree(where, ignore_errors=True)


def _write_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A worker's map of grouped test ids to their xdist_group, for `pytest_xdist_make_scheduler`."""
    where = os.environ.get(_GROUPS_ENV)
    if where is None or not hasattr(config, "workerinput"):
        return
    groups = {
        item.nodeid: "_".join(sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks}))
        for item in items
        if (marks := list(item.iter_markers("xdist_group")))
    }
    path = Path(where) / f"{config.workerinput['workerid']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(path)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` as xdist documents it: xdist 3.8 marks a grouped test by renaming its node
    id, which pytest 9 ignores (ids are read-only there), so every test was its own unit. This
    scheduler reads the groups the workers wrote instead: one unit per group, one per other test,
    handed out largest first, then in collection order (longest first, `_cost`)."""
    if config.getoption("dist", "no") != "loadgroup" or _GROUPS_ENV not in os.environ:
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    where = Path(os.environ[_GROUPS_ENV])

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # called once collection is complete on every worker
                found = sorted(where.glob("*.json"))
                self.groups = json.loads(found[0].read_text()) if found else {}
            group = self.groups.get(nodeid)
            return nodeid if group is None else f"@{group}"

    return GroupScheduling(config, log)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only a run that keeps a Spark test starts one
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Longest first (stable otherwise): with pytest-xdist (`tools/run test` runs cores + 1 workers) the
    # minutes-long end-to-end tests start at once on separate workers, instead of one of them starting
    # last and leaving the other worker idle at the end. Every worker sorts the same way.
    items.sort(key=_cost)
    _write_groups(config, items)
    # Start the JVM before any test creates gRPC threads: PySpark forks it (Popen with a
    # preexec_fn), and a fork while gRPC's threads hold their locks can kill the child before
    # it execs ("Java gateway process exited"; seen once under load in the demo). Under `--dist
    # loadgroup` only the worker given the Spark group starts one, at its first test, which is that
    # group's: xdist hands the largest unit out first, before the worker has run anything.
    if hasattr(config, "workerinput") and getattr(config.option, "loadgroup", False):
        return
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
