"""Delta tables on an object store: ObjectStorage over moto's S3 server on loopback (tests/delta/s3.py).

Every version feedlog writes there is read identically by deltalake (storage_options) and by
DuckDB (httpfs + delta, loaded offline from their wheels); bad input is one typed error.
"""

from __future__ import annotations

import glob
import os
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import pytest

from feedlog.delta import DeltaTable
from feedlog.delta.objectstore import ObjectStorage, open_storage
from feedlog.delta.storage import LocalStorage
from feedlog.errors import InvalidArgument, NotFound, PermissionDenied, Unsupported

from .conftest import SCHEMA, rows, sorted_rows
from .s3 import S3Server, free_port

COLUMNS = ("seq", "key", "p")


def deltalake_rows(url: str, options: dict[str, str], version: int | None = None) -> pa.Table:
    """Rows as deltalake (delta-rs) reads them, through its own query engine (pyarrow 25/26 can
    abort the process at exit after deltalake's `to_pyarrow_table`; this path does not)."""
    import deltalake

    dt = deltalake.DeltaTable(url, version=version, storage_options={**options, "timeout": "10s", "max_retries": "1"})
    return pa.table(deltalake.QueryBuilder().register("t", dt).execute("select * from t").read_all())


_duck: dict[str, Any] = {}


def duckdb_rows(s3: S3Server, url: str, version: int | None = None) -> pa.Table:
    import duckdb
    import duckdb_extension_delta
    import duckdb_extension_httpfs

    con = _duck.get(s3.endpoint)
    if con is None:
        con = duckdb.connect()
        for module, name in ((duckdb_extension_httpfs, "httpfs"), (duckdb_extension_delta, "delta")):
            (ext,) = glob.glob(
                os.path.join(os.path.dirname(module.__file__), "extensions", "*", f"{name}.duckdb_extension")
            )
            con.execute(f"LOAD '{ext}'")
        host = s3.endpoint.removeprefix("http://")
        con.execute(
            "CREATE SECRET lake (TYPE s3, KEY_ID 'testing', SECRET 'testing', REGION 'us-east-1', "
            f"ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false)"
        )
        _duck[s3.endpoint] = con
    arg = "" if version is None else f", version => {int(version)}"
    return con.sql(f"select * from delta_scan('{url}'{arg})").arrow().read_all()


def all_rows(table: Any) -> list[tuple[Any, ...]]:
    """Every column of every row, sorted; timestamps as UTC microseconds (the readers name UTC differently)."""
    t = pa.table(table)
    us = pa.timestamp("us", tz="UTC")
    cols = [t.column(c).cast(us).cast(pa.int64()) if c == "ts" else t.column(c) for c in SCHEMA.names]
    return sorted(zip(*(c.to_pylist() for c in cols), strict=True))


def assert_readers_agree(s3: S3Server, url: str, versions: Iterable[int] | None = None) -> int:
    """deltalake and DuckDB read every version (default 0..latest) of the table at `url` exactly as
    feedlog does, all columns; deltalake sees the same latest version. Returns the latest version."""
    import deltalake

    table = DeltaTable.open(url, storage_options=s3.options)
    latest = table.version()
    assert deltalake.DeltaTable(url, storage_options=s3.options).version() == latest
    for v in range(latest + 1) if versions is None else versions:
        want = all_rows(table.to_arrow(v))
        assert all_rows(deltalake_rows(url, s3.options, v)) == want, f"deltalake, version {v}"
        assert all_rows(duckdb_rows(s3, url, v)) == want, f"DuckDB, version {v}"
    return latest


def table_on(s3: S3Server, **kw: Any) -> DeltaTable:
    return DeltaTable.create(s3.url(), SCHEMA, storage_options=s3.options, **kw)


# resolving a location


def test_a_path_is_local_and_an_object_store_url_is_object_storage(tmp_path, s3_server: S3Server) -> None:
    assert isinstance(open_storage(tmp_path / "t"), LocalStorage)
    assert isinstance(open_storage(str(tmp_path / "t")), LocalStorage)
    assert isinstance(open_storage(s3_server.url(), s3_server.options), ObjectStorage)
    assert isinstance(open_storage("memory://x"), ObjectStorage)
    assert isinstance(open_storage(f"file://{tmp_path}/f"), ObjectStorage)
    storage = LocalStorage(tmp_path)
    assert open_storage(storage) is storage


@pytest.mark.parametrize("url", ["foo://x/t", "http://example/t", "s3:lake/t", "S3:/lake/t"])
def test_an_unsupported_url_is_refused_never_a_local_path(tmp_path, url: str, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgument) as e:
        DeltaTable.create(url, SCHEMA)
    assert "\n" not in str(e.value) and url in str(e.value)
    assert os.listdir(tmp_path) == []


def test_options_on_a_local_path_are_refused(tmp_path) -> None:
    with pytest.raises(InvalidArgument, match="local path"):
        open_storage(tmp_path, {"AWS_REGION": "us-east-1"})


def test_an_unknown_option_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="aws_no_such_key"):
        ObjectStorage("s3://lake/t", {"AWS_NO_SUCH_KEY": "1"})


def test_memory_urls_name_one_store_per_process() -> None:
    t = DeltaTable.create("memory://objectstore-once", SCHEMA)
    t.append(rows(0, 3))
    assert DeltaTable.open("memory://objectstore-once").to_arrow().num_rows == 3


def test_a_file_url_table_is_read_by_deltalake(tmp_path) -> None:
    url = f"file://{tmp_path}/ft"
    t = DeltaTable.create(url, SCHEMA)
    t.append(rows(0, 4))
    assert all_rows(deltalake_rows(str(tmp_path / "ft"), {})) == all_rows(rows(0, 4))


# tables on S3


def test_create_append_time_travel_history_and_readers_agree(s3_server: S3Server) -> None:
    t = table_on(s3_server)
    expected: dict[int, list[tuple[Any, ...]]] = {0: []}
    data: list[pa.Table] = []
    for v in range(1, 4):
        data.append(rows(v * 10, 5, part="ab"[v % 2]))
        assert t.append(data[-1]).version == v
        expected[v] = sorted(r for d in data for r in all_rows(d))
    reopened = DeltaTable.open(t.storage.location, storage_options=s3_server.options)
    assert reopened.version() == 3
    for v, want in expected.items():
        assert all_rows(reopened.to_arrow(v)) == want, v
    history = reopened.history()
    assert sorted(h.version for h in history) == [0, 1, 2, 3]
    ts = {h.version: h.timestamp for h in history}
    assert reopened.version_at(ts[2]) == 2
    assert assert_readers_agree(s3_server, t.storage.location) == 3


def test_a_partitioned_table_with_an_overwrite_is_read_alike_at_every_version(s3_server: S3Server) -> None:
    t = table_on(s3_server, partition_by=["p"])
    t.append(rows(0, 4, part="a"))
    t.append(rows(10, 3, part="b c/d"))  # a partition value that needs escaping in the path
    t.append(rows(20, 2, part="a"), mode="overwrite")
    t.append(rows(30, 2, part="b"), txn=("app", 1))
    assert all_rows(t.to_arrow()) == all_rows(pa.concat_tables([rows(20, 2, part="a"), rows(30, 2, part="b")]))
    assert assert_readers_agree(s3_server, t.storage.location) == 4


def test_a_delta_rs_configuration_works_unchanged_both_ways(s3_server: S3Server) -> None:
    import deltalake

    # what a delta-rs user of an S3-compatible server passes, delta-rs-only keys included
    rs = {
        **s3_server.options,
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
        "AWS_CONDITIONAL_PUT": "etag",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "timeout": "10s",
    }
    url = s3_server.url("rs")
    deltalake.write_deltalake(url, rows(0, 3), storage_options=rs, partition_by=["p"])
    deltalake.write_deltalake(url, rows(10, 2, part="b"), storage_options=rs, mode="append")
    t = DeltaTable.open(url, storage_options=rs)
    assert all_rows(t.to_arrow()) == all_rows(pa.concat_tables([rows(0, 3), rows(10, 2, part="b")]))
    assert t.append(rows(20, 2, part="c")).version == 2
    deltalake.write_deltalake(url, rows(30, 1), storage_options=rs, mode="append")
    assert assert_readers_agree(s3_server, url) == 3
    assert len(DeltaTable.open(url, storage_options=rs).to_arrow()) == 8


def test_checkpoint_and_cleanup_on_s3(s3_server: S3Server) -> None:
    t = table_on(s3_server)
    for v in range(1, 5):
        t.append(rows(v * 10, 2))
    assert t.checkpoint() == 4
    t.append(rows(100, 2))
    assert assert_readers_agree(s3_server, t.storage.location) == 5  # through the checkpoint, every version
    removed = t.cleanup(retain_ms=0)
    assert removed and all("_delta_log/" in r for r in removed)
    want = sorted(r for v in [*range(1, 5), 10] for r in all_rows(rows(v * 10, 2)))
    fresh = DeltaTable.open(t.storage.location, storage_options=s3_server.options)
    assert all_rows(fresh.to_arrow()) == want
    assert assert_readers_agree(s3_server, t.storage.location, [4, 5]) == 5  # what cleanup kept


@pytest.mark.slow  # ~7 s: three readers of 19 versions
def test_concurrent_appends_from_threads_lose_nothing(s3_server: S3Server) -> None:
    t = table_on(s3_server)
    url, writers, each = t.storage.location, 6, 3
    versions: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    barrier = threading.Barrier(writers)

    def writer(i: int) -> None:
        try:
            mine = DeltaTable.open(url, storage_options=s3_server.options)
            barrier.wait(timeout=30)
            for j in range(each):
                v = mine.append(rows(1000 * i + j, 1)).version
                assert v is not None
                with lock:
                    versions.append(v)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads)
    assert not errors, errors
    assert sorted(versions) == list(range(1, writers * each + 1))  # 0 lost, 0 duplicate versions
    want = Counter(1000 * i + j for i in range(writers) for j in range(each))
    fresh = DeltaTable.open(url, storage_options=s3_server.options)
    assert Counter(r[0] for r in sorted_rows(fresh.to_arrow(), "seq")) == want
    assert assert_readers_agree(s3_server, url) == writers * each


# bad input


def test_a_missing_bucket_is_one_line_not_found(s3_server: S3Server) -> None:
    with pytest.raises(NotFound) as e:
        DeltaTable.create("s3://no-such-bucket/t", SCHEMA, storage_options=s3_server.options)
    assert "no-such-bucket" in str(e.value) and "\n" not in str(e.value)


def test_missing_credentials_are_one_line_permission_denied(s3_server: S3Server, monkeypatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    options = {k: v for k, v in s3_server.options.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    # without keys object_store asks the instance metadata service: point it at a closed loopback port
    options |= {"AWS_METADATA_ENDPOINT": "http://127.0.0.1:9", "MAX_RETRIES": "0"}
    with pytest.raises(PermissionDenied) as e:
        DeltaTable.create(s3_server.url(), SCHEMA, storage_options=options)
    assert "credentials" in str(e.value) and "\n" not in str(e.value)


def test_no_credentials_with_instance_metadata_off_is_refused_at_once(s3_server: S3Server, monkeypatch) -> None:
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    options = {**s3_server.options, "AWS_EC2_METADATA_DISABLED": "true"}
    del options["AWS_ACCESS_KEY_ID"], options["AWS_SECRET_ACCESS_KEY"]
    with pytest.raises(PermissionDenied, match=r"no credentials.*AWS_EC2_METADATA_DISABLED"):
        ObjectStorage(s3_server.url(), options)
    # keys, a public bucket (no signing) or metadata left on: object_store goes on as before
    ObjectStorage(s3_server.url(), {**options, "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"})
    ObjectStorage(s3_server.url(), {**options, "AWS_SKIP_SIGNATURE": "true"})
    ObjectStorage(s3_server.url(), {**options, "AWS_EC2_METADATA_DISABLED": "false"})
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    t = DeltaTable.create(s3_server.url(), SCHEMA, storage_options=options)  # keys from the environment
    assert t.version() == 0


def test_no_azure_credentials_name_what_to_set(monkeypatch) -> None:
    for name in [n for n in os.environ if n.startswith("AZURE_")]:
        monkeypatch.delenv(name)
    # without a key object_store asks the managed-identity endpoint for a token: a closed loopback port here
    options = {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_MSI_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    storage = ObjectStorage("az://container/t", {**options, "max_retries": "0"})
    with pytest.raises(PermissionDenied, match=r"no credentials.*AZURE_STORAGE_ACCOUNT_KEY") as e:
        storage.list("_delta_log")
    assert "az://container/t" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"AWS_PROFILE": "dev"}, "AWS_PROFILE: AWS profiles are not read here"),
        ({"AWS_REGION": "us-east-1", "aws_region": "eu-west-1"}, "aws_region given twice"),
        ({"AWS_CONDITIONAL_PUT": "sometimes"}, "bad storage option AWS_CONDITIONAL_PUT='sometimes'"),
        ({"timeout": "soon"}, "bad storage option timeout='soon'"),
    ],
)
def test_a_bad_option_is_invalid_argument_naming_it(options: dict[str, str], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match) as e:
        ObjectStorage("s3://lake/t", options)
    assert "\n" not in str(e.value)


def test_a_store_without_conditional_put_refuses_filesystem_commits(s3_server: S3Server) -> None:
    options = {**s3_server.options, "AWS_CONDITIONAL_PUT": "disabled"}
    storage = ObjectStorage(s3_server.url(), options)
    assert storage.conditional_put() is False
    with pytest.raises(Unsupported, match="managed") as e:
        DeltaTable.create(storage, SCHEMA)
    assert "\n" not in str(e.value)
    assert storage.list("_delta_log") == []  # nothing a reader would see


def test_an_append_refused_for_want_of_conditional_put_leaves_no_data_file(s3_server: S3Server) -> None:
    url = s3_server.url()
    DeltaTable.create(url, SCHEMA, storage_options=s3_server.options).append(rows(0, 3))
    before = ObjectStorage(url, s3_server.options).list("")
    no_cp = DeltaTable.open(url, storage_options={**s3_server.options, "AWS_CONDITIONAL_PUT": "disabled"})
    with pytest.raises(Unsupported, match="conditional put"):
        no_cp.append(rows(10, 3))
    assert ObjectStorage(url, s3_server.options).list("") == before  # the refused write's file is gone
    assert DeltaTable.open(url, storage_options=s3_server.options).version() == 1


#: an HTTP server that holds each GET until another is in flight too (at most HOLD_S), and then
#: serves the file; `/max-in-flight` tells how many it ever held at once
HOLDING_SERVER = """
import functools, http.server, sys, threading, time
lock, cond = threading.Lock(), threading.Condition(threading.Lock())
state = {"now": 0, "max": 0}

class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/max-in-flight":
            body = str(state["max"]).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        with cond:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
            cond.notify_all()
            cond.wait_for(lambda: state["now"] >= 2, timeout=float(sys.argv[3]))
        try:
            super().do_GET()
        finally:
            with cond:
                state["now"] -= 1

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer
server.request_queue_size = 64
server(("127.0.0.1", int(sys.argv[1])), functools.partial(Handler, directory=sys.argv[2])).serve_forever()
"""


def test_read_many_on_an_object_store_has_its_reads_in_flight_together(tmp_path) -> None:
    """A log replay reads its commits one round trip each: `ObjectStorage.read_many` sends them
    together (obstore waits for the store without the GIL). The server holds each request until a
    second one arrives (or 2 s pass), so reads sent one after another would each wait it out."""
    import subprocess
    import sys
    import urllib.request

    from obstore.store import HTTPStore

    from feedlog.delta.storage import read_many

    served = tmp_path / "served"
    (served / "_delta_log").mkdir(parents=True)
    for v in range(8):
        (served / "_delta_log" / f"{v:020d}.json").write_bytes(b'{"v":%d}\n' % v)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", HOLDING_SERVER, str(port), str(served), "2"])
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(100):  # up within 10 s
            try:
                urllib.request.urlopen(endpoint + "/max-in-flight", timeout=1).read()
                break
            except OSError:
                threading.Event().wait(0.1)
        store = HTTPStore.from_url(endpoint + "/", client_options={"allow_http": True})
        storage = ObjectStorage("http://127.0.0.1/served", store=store)
        paths = [f"_delta_log/{v:020d}.json" for v in range(8)] + ["_delta_log/missing.json"]
        got = read_many(storage, paths)
        assert got[:8] == [b'{"v":%d}\n' % v for v in range(8)]
        assert isinstance(got[8], NotFound)
        held = int(urllib.request.urlopen(endpoint + "/max-in-flight", timeout=5).read())
        assert held >= 2, "the reads went one after another"
    finally:
        server.terminate()
        server.wait(timeout=10)
