"""The served commit owner's `/metrics`: commits ratified, conflicts by kind, ratification latency,
backfill lag per table (which falls to 0 once backfilled), scraped over HTTP and parsed by
Prometheus' text parser."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from feedlog.delta import DeltaTable
from feedlog.delta.committer import CommitConflict
from feedlog.delta.managed import OWNER_ENV, Binding
from feedlog.metrics import MetricsSettings
from feedlog_server.metrics import conflict_kind
from feedlog_server.owner import SERVICE, OwnerServer
from tests.owner.conftest import SCHEMA, batch
from tests.scrape import scrape, value


@pytest.fixture(params=["sqlite", "pg"])
def served(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OwnerServer]:
    """A served owner exporting metrics, its state in SQLite or PostgreSQL (the lag is one query on either)."""
    (tmp_path / "tables").mkdir()
    db = str(tmp_path / "owner.db") if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    server = OwnerServer(db, "127.0.0.1:0", roots=[tmp_path / "tables"], metrics=MetricsSettings("127.0.0.1:0")).start()
    monkeypatch.setenv(OWNER_ENV, server.endpoint)  # the tables here trust this owner
    try:
        yield server
    finally:
        server.stop(grace=1)


def owner_rpc(method: str, code: str) -> dict[str, str]:
    return {"grpc_service": SERVICE, "grpc_method": method, "grpc_type": "unary", "grpc_code": code}


def test_commits_conflicts_and_backfill_lag(served: OwnerServer, tmp_path: Path) -> None:
    assert served.metrics_listener is not None
    url = served.metrics_listener.url
    binding = Binding.feedlog(endpoint=served.endpoint, batch_size=100)  # no backfill until asked
    t = DeltaTable.create(tmp_path / "tables" / "t", SCHEMA, owner=binding)
    table_id = t.snapshot().metadata.id
    for i in range(3):
        t.append(batch(range(i * 10, i * 10 + 10)))
    # two writers on the same version: the second loses it (taken), rebases and is ratified after
    a, b = DeltaTable.open(tmp_path / "tables" / "t"), DeltaTable.open(tmp_path / "tables" / "t")
    a.owner_token = b.owner_token = t.owner_token
    ta, tb = a.transaction(), b.transaction()
    ta.add_files(a.write_files(batch(range(100, 101), "a")))
    tb.add_files(b.write_files(batch(range(200, 201), "b")))
    a.commit(ta)
    b.commit(tb)

    s = scrape(url)
    assert value(s, "feedlog_owner_commits_ratified_total") == 5
    assert value(s, "feedlog_owner_conflicts_total", kind="taken") == 1
    assert value(s, "feedlog_owner_conflicts_total", kind="refused") == 0
    assert value(s, "feedlog_owner_ratification_seconds_count") == 5
    assert value(s, "grpc_server_handled_total", **owner_rpc("Commit", "OK")) == 6  # a conflict is an answer
    assert value(s, "grpc_server_handled_total", **owner_rpc("Register", "OK")) == 1
    assert value(s, "feedlog_owner_tables", state="active") == 1
    assert value(s, "feedlog_owner_backfill_lag_versions", table=table_id) == 5  # versions 1..5 ratified only
    lag_s = value(s, "feedlog_owner_backfill_lag_seconds", table=table_id)
    assert lag_s is not None and lag_s >= 0
    assert value(s, "feedlog_owner_database_errors_total") == 0

    t.backfill()
    s = scrape(url)
    assert value(s, "feedlog_owner_backfill_lag_versions", table=table_id) == 0
    assert value(s, "feedlog_owner_backfill_lag_seconds", table=table_id) == 0
    assert value(s, "grpc_server_handled_total", **owner_rpc("Backfill", "OK")) == 1


def test_a_refused_commit_is_an_error_not_a_ratification(served: OwnerServer, tmp_path: Path) -> None:
    assert served.metrics_listener is not None
    DeltaTable.create(tmp_path / "tables" / "t", SCHEMA, owner=Binding.feedlog(endpoint=served.endpoint))
    wrong = DeltaTable.open(tmp_path / "tables" / "t")
    wrong.owner_token = "not-the-token-of-this-table"
    with pytest.raises(Exception, match="token"):
        wrong.append(batch(range(3)))
    s = scrape(served.metrics_listener.url)
    assert value(s, "feedlog_owner_commits_ratified_total") == 0
    assert value(s, "feedlog_owner_request_errors_total") == 1
    assert value(s, "grpc_server_handled_total", **owner_rpc("Commit", "PermissionDenied")) == 1


def test_conflict_kinds_come_from_the_answers_shape() -> None:
    assert conflict_kind(CommitConflict(3, True, "x", pending=4)) == "pending"
    assert conflict_kind(CommitConflict(3, True, "x", ((3, "f"),))) == "taken"
    assert conflict_kind(CommitConflict(3, True, "held")) == "retry"
    assert conflict_kind(CommitConflict(3, False, "gap")) == "refused"
