"""Reading a managed table never writes anywhere, nor talks to an owner nobody trusted (issue 13, item 12).

A table's metadata names its commit owner; anyone who can write a table can make it name any
SQLite file or endpoint. Readers ask only an owner they were configured to trust (`owner=`,
$FEEDLOG_OWNER, the CLI's --owner) and otherwise read the backfilled log, with a warning.
Writers need the owner and are refused with a clear error when it is not trusted, except the
table's own embedded owner (`<table>/_feedlog/owner.db`, the Spark sink's default).
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from feedlog.cli import main
from feedlog.clock import ManualClock
from feedlog.delta import DeltaTable
from feedlog.delta.committer import FilesystemCommitter
from feedlog.delta.managed import OWNER_ENV, Binding, OwnerNotConsulted, OwnerNotTrusted, staged_name
from feedlog.errors import PermissionDenied

from .conftest import SCHEMA, T0, rows


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` with its size and mtime (a created WAL or directory shows)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return out


def forged_table(path: Path, binding: Binding, batches: int = 2) -> None:
    """A managed table naming `binding`, written without ever contacting it (as a hostile writer could)."""
    fs = FilesystemCommitter()
    t = DeltaTable.create(path, SCHEMA, owner=binding, committer=fs, clock=ManualClock(T0))
    for i in range(batches):
        t.append(rows(10 * i, 3))
    # and a commit staged for the next version: the owner may have ratified it, so readers that
    # skip the owner are told what they may miss
    (path / "_delta_log" / "_commits").mkdir(exist_ok=True)
    (path / "_delta_log" / "_commits" / staged_name(batches + 1)).write_text("{}\n")


@pytest.fixture(autouse=True)
def _no_env_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OWNER_ENV, raising=False)


def test_reading_does_not_touch_a_database_the_table_names(tmp_path: Path) -> None:
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    victim = victim_dir / "precious.db"
    with sqlite3.connect(victim) as db:  # someone's database, rollback journal, with data
        db.execute("create table t (x)")
        db.execute("insert into t values (1)")
    db.close()
    absent = tmp_path / "nowhere" / "deep" / "owner.db"
    for name, target in (("a", victim), ("b", absent)):
        forged_table(tmp_path / name, Binding.feedlog(db=str(target)))
    before = _tree(tmp_path)

    for name in ("a", "b"):
        with pytest.warns(OwnerNotConsulted, match="not one this process trusts"):
            t = DeltaTable.open(tmp_path / name)
            assert t.to_arrow().num_rows == 6  # the backfilled log is the whole table here
            assert t.version() == 2 and len(t.history()) == 3 and t.info()["rows"] == 6
            assert t.snapshot(1).version == 1 and t.version_at(T0 + 10**9) == 2

    assert _tree(tmp_path) == before  # no directory, no WAL, no mtime change
    assert not (tmp_path / "nowhere").exists()
    with sqlite3.connect(f"file:{victim}?mode=ro", uri=True) as db:
        assert db.execute("pragma journal_mode").fetchone()[0] == "delete"


class Listener:
    """A TCP port that counts who connects (an owner endpoint nobody should call)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    lis = Listener()
    yield lis
    lis.close()


def test_an_untrusted_endpoint_is_never_contacted(tmp_path: Path, listener: Listener) -> None:
    endpoint = f"grpc://127.0.0.1:{listener.port}"
    forged_table(tmp_path / "t", Binding.parse(endpoint))
    with pytest.warns(OwnerNotConsulted):
        t = DeltaTable.open(tmp_path / "t")
        assert t.to_arrow().num_rows == 6 and t.owner() == Binding.parse(endpoint)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OwnerNotConsulted)
        with pytest.raises(OwnerNotTrusted, match=f"127.0.0.1:{listener.port}.*not one this process trusts"):
            DeltaTable.open(tmp_path / "t").append(rows(100, 1))
        with pytest.raises(PermissionDenied):
            DeltaTable.open(tmp_path / "t").backfill()
        with pytest.raises(PermissionDenied):
            DeltaTable.open(tmp_path / "t").convert_to_filesystem()
        assert DeltaTable.open(tmp_path / "t", owner="grpc://127.0.0.1:1").version() == 2  # another owner: same
    assert listener.accepted == 0


def test_a_trusted_owner_that_is_down_falls_back_with_a_warning(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        endpoint = f"grpc://127.0.0.1:{s.getsockname()[1]}"
    forged_table(tmp_path / "t", Binding.parse(endpoint))
    with pytest.warns(OwnerNotConsulted, match="unreachable"):
        assert DeltaTable.open(tmp_path / "t", owner=endpoint).to_arrow().num_rows == 6


def test_a_trusted_local_owner_serves_unbackfilled_commits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "owner" / "owner.db"
    binding = Binding.feedlog(db=str(db), batch_size=100)  # nothing after version 0 is backfilled yet
    t = DeltaTable.create(tmp_path / "t", SCHEMA, owner=binding)
    t.append(rows(0, 3))
    t.append(rows(3, 3))
    assert DeltaTable.open(tmp_path / "t", owner=str(db), owner_token=t.owner_token).to_arrow().num_rows == 6
    with pytest.warns(OwnerNotConsulted):
        assert DeltaTable.open(tmp_path / "t").to_arrow().num_rows == 0  # what a plain Delta reader sees
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OwnerNotConsulted)
        with pytest.raises(OwnerNotTrusted, match="owner="):
            DeltaTable.open(tmp_path / "t", owner_token=t.owner_token).append(rows(6, 1))
    monkeypatch.setenv(OWNER_ENV, str(db))
    w = DeltaTable.open(tmp_path / "t", owner_token=t.owner_token)
    assert w.append(rows(6, 1)).version == 3 and w.to_arrow().num_rows == 7


def test_the_embedded_owner_still_serves_writers(tmp_path: Path) -> None:
    path = tmp_path / "t"
    binding = Binding.feedlog(db=str(path.resolve() / "_feedlog" / "owner.db"))
    t = DeltaTable.create(path, SCHEMA, owner=binding)
    token = t.owner_token
    DeltaTable.open(path, owner_token=token).append(rows(0, 2))  # no owner= needed: it is the table's own
    db = path / "_feedlog" / "owner.db"
    before = _tree(path / "_feedlog")
    with warnings.catch_warnings():  # every ratified commit is backfilled: the reader misses nothing
        warnings.simplefilter("error", OwnerNotConsulted)
        assert DeltaTable.open(path).to_arrow().num_rows == 2
    assert _tree(path / "_feedlog") == before and db.exists()


def test_an_embedded_owner_behind_a_symlink_is_not_the_tables_own(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = tmp_path / "t"
    forged_table(path, Binding.feedlog(db=str(path.resolve() / "_feedlog" / "owner.db")), batches=0)
    os.symlink(elsewhere, path / "_feedlog")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OwnerNotConsulted)
        with pytest.raises(OwnerNotTrusted):
            DeltaTable.open(path).append(rows(0, 1))
    assert list(elsewhere.iterdir()) == []


def test_cli_reads_with_one_warning_line_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    absent = tmp_path / "nowhere" / "owner.db"
    forged_table(tmp_path / "t", Binding.feedlog(db=str(absent)))
    before = _tree(tmp_path)
    code = main(["table", "info", str(tmp_path / "t")])
    out, err = capsys.readouterr()
    assert code == 0 and "rows" in out
    assert err.count("\n") == 1 and err.startswith("feedlog: warning:") and "--owner" in err, err
    code = main(["table", "enable-ict", str(tmp_path / "t")])
    out, err = capsys.readouterr()
    assert code == 7 and "not one this process trusts" in err and "Traceback" not in err
    assert _tree(tmp_path) == before


def test_owner_arguments_accept_a_binding_or_several(tmp_path: Path) -> None:
    db = tmp_path / "o.db"
    t = DeltaTable.create(tmp_path / "t", SCHEMA, owner=Binding.feedlog(db=str(db), batch_size=100))
    t.append(pa.table({n: rows(0, 1).column(n) for n in SCHEMA.names}))
    both = DeltaTable.open(tmp_path / "t", owner=["grpc://127.0.0.1:1", Binding.feedlog(db=str(db))])
    assert both.to_arrow().num_rows == 1


def test_the_spark_sink_trusts_its_own_owner_option_only(tmp_path: Path, listener: Listener) -> None:
    sink = pytest.importorskip("feedlog.lake.sink")  # imports pyspark's API only: no JVM starts
    with warnings.catch_warnings():
        warnings.simplefilter("error", OwnerNotConsulted)
        embedded = sink.open_or_create(str(tmp_path / "e"), SCHEMA, {})  # default: <table>/_feedlog/owner.db
        assert embedded.append(rows(0, 2)).version == 1
        assert sink.open_or_create(str(tmp_path / "e"), SCHEMA, {}).to_arrow().num_rows == 2
    endpoint = f"grpc://127.0.0.1:{listener.port}"
    forged_table(tmp_path / "g", Binding.parse(endpoint))
    with pytest.raises(OwnerNotTrusted):
        sink.open_or_create(str(tmp_path / "g"), SCHEMA, {}).transaction()
    assert listener.accepted == 0
