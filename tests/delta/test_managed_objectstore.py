"""Managed tables on an object store: the owner (in process and as a gRPC service) stages, ratifies
and backfills on moto's S3 server with its own credentials, confined to its URL roots.

The owner reads a writer's staged commit from the store (bounded in size), backfills it into the
table's `_delta_log` there, and, on a store without conditional put, still decides every commit:
a managed table works where a filesystem table is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from feedlog.delta import DeltaTable
from feedlog.delta.committer import commit_path
from feedlog.delta.managed import COMMITS_DIR, Auth, Binding, TableRef
from feedlog.delta.managed.sqlite import LocalOwner
from feedlog.delta.objectstore import ObjectStorage
from feedlog.errors import InvalidArgument, PermissionDenied
from feedlog_server.owner import OwnerServer

from .conftest import SCHEMA, rows, sorted_rows
from .s3 import S3Server, served_owner

COLUMNS = ("seq", "key", "p")
TOKEN = "managed-s3-token"


@pytest.fixture
def owner_db(tmp_path: Path) -> str:
    return str(tmp_path / "owner.db")


def managed_table(url: str, options: dict[str, str], binding: Binding, batch_size: int | None = None) -> DeltaTable:
    if batch_size is not None:
        binding = Binding.feedlog(**{**binding.config, "batch_size": batch_size})  # type: ignore[arg-type]
    return DeltaTable.create(url, SCHEMA, owner=binding, owner_token=TOKEN, storage_options=options)


def reopen(url: str, options: dict[str, str], binding: Binding) -> DeltaTable:
    return DeltaTable.open(url, owner=binding, owner_token=TOKEN, storage_options=options)


def check_rows(t: DeltaTable, n: int, version: int | None = None) -> None:
    want = sorted(r for v in range(1, n + 1) for r in sorted_rows(rows(v * 10, 3), *COLUMNS))
    assert sorted_rows(t.to_arrow(version), *COLUMNS) == want


@pytest.mark.parametrize("conditional_put", [True, False], ids=["conditional-put", "no-conditional-put"])
def test_in_process_owner_commits_and_backfills_on_s3(
    s3_server: S3Server, owner_db: str, conditional_put: bool
) -> None:
    options = dict(s3_server.options)
    if not conditional_put:
        options["AWS_CONDITIONAL_PUT"] = "disabled"
        assert ObjectStorage(s3_server.url(), options).conditional_put() is False
    url = s3_server.url("managed")
    binding = Binding.feedlog(db=owner_db, batch_size=3)
    t = managed_table(url, options, binding)
    for v in range(1, 8):
        assert t.append(rows(v * 10, 3)).version == v
    store = ObjectStorage(url, options)
    backfilled = {f.path for f in store.list("_delta_log")}
    # batch size 3: versions 0..6 are in the log, 7 only with the owner (a managed reader sees it)
    assert {commit_path(v) for v in range(7)} <= backfilled
    assert commit_path(7) not in backfilled
    fresh = reopen(url, options, binding)
    assert fresh.version() == 7
    check_rows(fresh, 7)
    check_rows(fresh, 4, version=4)
    assert fresh.backfill() == 7
    assert commit_path(7) in {f.path for f in store.list("_delta_log")}
    # backfilled staged commits are cleaned up
    assert len(store.list(COMMITS_DIR)) <= 1


def test_a_filesystem_table_is_refused_where_a_managed_one_works(s3_server: S3Server, owner_db: str) -> None:
    """The same store without conditional put: filesystem commits refused, the managed table commits."""
    from feedlog.errors import Unsupported

    options = {**s3_server.options, "AWS_CONDITIONAL_PUT": "disabled"}
    with pytest.raises(Unsupported, match="managed"):
        DeltaTable.create(s3_server.url("fs"), SCHEMA, storage_options=options)
    t = managed_table(s3_server.url("mc"), options, Binding.feedlog(db=owner_db))
    assert t.append(rows(10, 3)).version == 1


@pytest.fixture
def served(s3_server: S3Server, tmp_path: Path) -> Iterator[OwnerServer]:
    """An owner service whose only root is s3://lake/served, with its own credentials."""
    with served_owner(s3_server, tmp_path, "served") as server:
        yield server


def test_served_owner_backfills_with_its_own_credentials(
    s3_server: S3Server, served: OwnerServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    binding = Binding.feedlog(endpoint=served.endpoint, batch_size=2)
    url = f"s3://{s3_server.bucket}/served/t-{id(served)}"
    t = managed_table(url, s3_server.options, binding)
    for v in range(1, 6):
        t.append(rows(v * 10, 3))
    check_rows(reopen(url, s3_server.options, binding), 5)
    assert served.owner.backfill_idle(20)  # the served owner backfills in the background
    status = served.owner.status(t.snapshot().metadata.id, Auth(TOKEN))
    assert status.path == url and status.latest == 5 and status.backfilled >= 4


@pytest.mark.parametrize(
    "where, error",
    [
        ("s3://lake/elsewhere/t", PermissionDenied),  # outside the owner's root
        ("s3://lake/served", PermissionDenied),  # the root itself
        ("s3://lake/served/../elsewhere/t", InvalidArgument),
        ("s3://lake/served//t", InvalidArgument),
        ("s3://user@lake/served/t", InvalidArgument),
        ("s3://lake/served/t?x=1", InvalidArgument),
        ("s3://lake/served/t\n", InvalidArgument),
        ("ftp://lake/served/t", InvalidArgument),
        ("/tmp/local-table", PermissionDenied),  # no local roots at all
        ("relative/t", InvalidArgument),
    ],
)
def test_served_owner_refuses_locations_outside_its_roots(served: OwnerServer, where: str, error: Any) -> None:
    with pytest.raises(error):
        served.owner.register(TableRef("id-1", where), 0, "0" * 20 + "." + "0" * 36 + ".json", 1, Auth("t"), 10)


def test_a_huge_staged_object_is_refused_unread(s3_server: S3Server, owner_db: str) -> None:
    from feedlog.delta.managed import confined

    url = s3_server.url("huge")
    store = ObjectStorage(url, s3_server.options)
    owner = LocalOwner(owner_db, storage_options=s3_server.options)
    try:
        t = managed_table(url, s3_server.options, Binding.feedlog(db=owner_db))
        name = "00000000000000000001.00000000-0000-0000-0000-000000000001.json"
        store.write_atomic(f"{COMMITS_DIR}/{name}", b" " * 4096)
        with pytest.raises(InvalidArgument, match="limit"):
            confined.read_staged(store, COMMITS_DIR, name, limit=1024)
        ref = TableRef(t.snapshot().metadata.id, url)
        with pytest.raises(InvalidArgument):  # not a commit at all: refused, nothing ratified
            owner.commit(ref, 1, name, 1, Auth(TOKEN))
        assert owner.get_commits(ref, 0).latest == 0
    finally:
        owner.close()
