"""Delta tables on an object store: ObjectStorage over moto's S3 server on loopback (tests/delta/s3.py).

Every version feedlog writes there is read identically by deltalake (storage_options) and by
DuckDB (httpfs + delta, loaded offline from their wheels); bad input is one typed error.
"""

from __future__ import annotations

import glob
import json
import os
import threading
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest

from feedlog.delta import DeltaTable
from feedlog.delta.objectstore import ObjectStorage, open_storage
from feedlog.delta.storage import LocalStorage
from feedlog.errors import InvalidArgument, NotFound, PermissionDenied, Unsupported

from .conftest import SCHEMA, rows, sorted_rows
from .s3 import S3Server, s3_server_fixture  # noqa: F401 (the fixture s3_server)

COLUMNS = ("seq", "key", "p")


_DELTALAKE_ON_MOTO: dict[str, str | None] = {}


def _query(dt: Any) -> pa.Table:
    import deltalake

    return pa.table(deltalake.QueryBuilder().register("t", dt).execute("select * from t").read_all())


def deltalake_rows(url: str, options: dict[str, str], version: int | None = None) -> pa.Table:
    """Rows as deltalake reads them from the server; a skip (with the reason) where deltalake cannot
    read from moto's server at all, which a table deltalake wrote there itself shows."""
    import deltalake

    options = {**options, "timeout": "10s", "max_retries": "1"}
    try:
        return _query(deltalake.DeltaTable(url, version=version, storage_options=options))
    except Exception as e:
        endpoint = options["AWS_ENDPOINT_URL"]
        if endpoint not in _DELTALAKE_ON_MOTO:
            own = url.rsplit("/", 1)[0] + "/deltalake-own"
            try:
                deltalake.write_deltalake(own, pa.table({"a": [1]}), storage_options=options, mode="overwrite")
                _query(deltalake.DeltaTable(own, storage_options=options))
                _DELTALAKE_ON_MOTO[endpoint] = None
            except Exception as own_error:
                _DELTALAKE_ON_MOTO[endpoint] = str(own_error).splitlines()[0][:200]
        reason = _DELTALAKE_ON_MOTO[endpoint]
        if reason is None:
            raise AssertionError(f"deltalake reads its own tables on this server but not feedlog's: {e}") from e
        pytest.skip(f"deltalake cannot read even a table it wrote itself from moto's server: {reason}")


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
    assert sorted_rows(deltalake_rows(str(tmp_path / "ft"), {}), *COLUMNS) == sorted_rows(rows(0, 4), *COLUMNS)


# tables on S3


def test_create_append_time_travel_history_and_readers_agree(s3_server: S3Server) -> None:
    t = table_on(s3_server)
    expected: dict[int, list[tuple[Any, ...]]] = {0: []}
    data: list[pa.Table] = []
    for v in range(1, 4):
        data.append(rows(v * 10, 5, part="ab"[v % 2]))
        assert t.append(data[-1]).version == v
        expected[v] = sorted(r for d in data for r in sorted_rows(d, *COLUMNS))
    reopened = DeltaTable.open(t.storage.location, storage_options=s3_server.options)
    assert reopened.version() == 3
    for v, want in expected.items():
        assert sorted_rows(reopened.to_arrow(v), *COLUMNS) == want, v
        assert sorted_rows(duckdb_rows(s3_server, t.storage.location, v), *COLUMNS) == want, v
    history = reopened.history()
    assert sorted(h.version for h in history) == [0, 1, 2, 3]
    ts = {h.version: h.timestamp for h in history}
    assert reopened.version_at(ts[2]) == 2
    for v, want in expected.items():
        assert sorted_rows(deltalake_rows(t.storage.location, s3_server.options, v), *COLUMNS) == want, v


def test_checkpoint_and_cleanup_on_s3(s3_server: S3Server) -> None:
    t = table_on(s3_server)
    for v in range(1, 5):
        t.append(rows(v * 10, 2))
    assert t.checkpoint() == 4
    t.append(rows(100, 2))
    removed = t.cleanup(retain_ms=0)
    assert removed and all("_delta_log/" in r for r in removed)
    want = sorted(r for v in [*range(1, 5), 10] for r in sorted_rows(rows(v * 10, 2), *COLUMNS))
    fresh = DeltaTable.open(t.storage.location, storage_options=s3_server.options)
    assert sorted_rows(fresh.to_arrow(), *COLUMNS) == want
    assert sorted_rows(duckdb_rows(s3_server, t.storage.location), *COLUMNS) == want
    assert sorted_rows(deltalake_rows(t.storage.location, s3_server.options), *COLUMNS) == want


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
    assert Counter(r[0] for r in sorted_rows(duckdb_rows(s3_server, url), "seq")) == want


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


def test_a_store_without_conditional_put_refuses_filesystem_commits(s3_server: S3Server) -> None:
    options = {**s3_server.options, "AWS_CONDITIONAL_PUT": "disabled"}
    storage = ObjectStorage(s3_server.url(), options)
    assert storage.conditional_put() is False
    with pytest.raises(Unsupported, match="managed") as e:
        DeltaTable.create(storage, SCHEMA)
    assert "\n" not in str(e.value)
    assert storage.list("_delta_log") == []  # nothing a reader would see


# the CLI


def cli(capsys, *args: str) -> tuple[int, str, str]:
    from feedlog.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def option_args(s3: S3Server) -> list[str]:
    return [a for k, v in s3.options.items() for a in ("--storage-option", f"{k}={v}")]


def test_cli_table_commands_work_on_s3(s3_server: S3Server, capsys) -> None:
    url, opts = s3_server.url("cli"), option_args(s3_server)
    code, out, err = cli(capsys, "table", "create", url, "--schema", "seq:long,key:string", *opts)
    assert code == 0, err
    DeltaTable.open(url, storage_options=s3_server.options).append(pa.table({"seq": [1, 2], "key": ["a", "b"]}))
    code, out, err = cli(capsys, "table", "info", url, "--json", *opts)
    assert code == 0 and json.loads(out)["version"] == 1, (out, err)
    code, out, err = cli(capsys, "table", "checkpoint", url, *opts)
    assert code == 0, err
    code, out, err = cli(capsys, "table", "history", url, "--json", *opts)
    assert code == 0, err


def test_cli_refuses_an_unknown_scheme_and_makes_no_directory(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    for url in ("foo://lake/t", "s3:lake/t"):
        code, _out, err = cli(capsys, "table", "create", url, "--schema", "id:long")
        assert code == 2 and "storage URL" in err and len(err.strip().splitlines()) == 1, (url, err)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("bad", ["NOEQUALS", "=value", " KEY=v"])
def test_cli_storage_options_are_parsed_strictly(s3_server: S3Server, bad: str, capsys) -> None:
    code, _out, err = cli(capsys, "table", "info", s3_server.url(), "--storage-option", bad)
    assert code == 2 and "KEY=VALUE" in err and len(err.strip().splitlines()) == 1, err


def test_cli_missing_bucket_is_one_line_with_its_exit_code(s3_server: S3Server, capsys) -> None:
    code, _out, err = cli(
        capsys, "table", "create", "s3://no-such-bucket/t", "--schema", "id:long", *option_args(s3_server)
    )
    assert code == 3 and "no-such-bucket" in err and len(err.strip().splitlines()) == 1, err
