"""`feedlog owner serve` and the managed-table CLI, end to end on loopback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from feedlog.cli import main
from feedlog.delta import DeltaTable
from feedlog_server.owner import OwnerServer
from tests.delta.conftest import deltalake_version

from .conftest import batch


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_managed_table_lifecycle_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with OwnerServer(tmp_path / "o.db", "127.0.0.1:0", roots=[tmp_path]) as server:
        monkeypatch.setenv("FEEDLOG_OWNER", server.endpoint)  # readers and writers ask only a trusted owner
        path = str(tmp_path / "t")
        code, out, _ = run(
            capsys,
            "table",
            "create",
            path,
            "--schema",
            "id:long,who:string",
            "--owner",
            server.endpoint,
            "--batch-size",
            "10",
            "--json",
        )
        assert code == 0
        token = json.loads(out)["token"]
        DeltaTable.open(path, owner_token=token).append(batch([1, 2]))
        code, out, _ = run(capsys, "table", "history", path, "--json")
        assert [h["version"] for h in json.loads(out)] == [1, 0]  # history shows the un-backfilled version
        assert deltalake_version(path) == 0
        code, _, err = run(capsys, "table", "backfill", path)
        assert code == 7 and "token" in err and "Traceback" not in err
        os.environ["FEEDLOG_OWNER_TOKEN"] = token
        try:
            assert run(capsys, "table", "backfill", path)[0] == 0
            assert deltalake_version(path) == 1
            code, out, _ = run(capsys, "table", "info", path, "--json")
            info = json.loads(out)
            assert info["backfilled_version"] == 1 and info["commit_owner"]["endpoint"] == server.endpoint
            assert run(capsys, "table", "convert", path, "--to-filesystem")[0] == 0
            assert DeltaTable.open(path).owner() is None
            code, out, _ = run(capsys, "table", "convert", path, "--to-managed", server.endpoint, "--json")
            assert code == 0 and json.loads(out)["managed"]
        finally:
            del os.environ["FEEDLOG_OWNER_TOKEN"]


@pytest.mark.parametrize(
    "args, code",
    [
        (["table", "create", "{d}/x", "--schema", "id:lng"], 2),
        (["table", "create", "{d}/x", "--schema", "id:long", "--owner", "http://nope"], 2),
        (["table", "create", "{d}/x", "--schema", "id:long", "--batch-size", "3"], 2),
        (["table", "create", "/elsewhere/x", "--schema", "id:long", "--owner", "{e}"], 7),
        (["table", "convert", "{d}/missing", "--to-filesystem"], 3),
        (["table", "backfill", "{d}/missing"], 3),
        (["owner", "serve", "--db", "{d}/o2.db", "--root", "{d}/no-such-dir"], 2),
    ],
)
def test_mistakes_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int) -> None:
    with OwnerServer(tmp_path / "o.db", "127.0.0.1:0", roots=[tmp_path]) as server:
        got, _, err = run(capsys, *(a.format(d=tmp_path, e=server.endpoint) for a in args))
    assert got == code, err
    assert err.count("\n") == 1 and "Traceback" not in err
