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
            "--token-out",
            str(tmp_path / "secret" / "token"),
            "--json",
        )
        assert code == 0
        token_file = json.loads(out)["token_file"]
        assert token_file == str(tmp_path / "secret" / "token") and "token" not in json.loads(out)
        token = Path(token_file).read_text().strip()
        DeltaTable.open(path, owner_token=token).append(batch([1, 2]))
        code, out, _ = run(capsys, "table", "history", path, "--json")
        assert [h["version"] for h in json.loads(out)] == [1, 0]  # history shows the un-backfilled version
        assert deltalake_version(path) == 0
        code, _, err = run(capsys, "table", "backfill", path)
        assert code == 7 and "token" in err and "Traceback" not in err
        code, _, err = run(capsys, "table", "backfill", path, "--token-file", str(tmp_path / "missing"))
        assert code == 2 and "cannot read token file" in err
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
        (["owner", "serve", "--db", "{d}/o2.db", "--root", "{d}", "--listen", "0.0.0.0:0"], 2),
        (["owner", "serve", "--db", "{d}/o2.db", "--root", "{d}", "--listen", "[::]:0"], 2),
        (["owner", "serve", "--db", "{d}/o2.db", "--root", "ftp://lake/tables", "--listen", "127.0.0.1:0"], 2),
        (["owner", "serve", "--db", "{d}/o2.db", "--root", "s3://lake/../x", "--listen", "127.0.0.1:0"], 2),
        (["owner", "serve", "--db", "{d}/o2.db", "--root", "s3://lake/t", "--storage-option", "NOEQUALS"], 2),
        (["owner", "serve", "--db", "{d}/o2.db", "--root", "s3://lake/t", "--storage-option", "AWS_NOPE=1"], 2),
    ],
)
def test_mistakes_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int) -> None:
    with OwnerServer(tmp_path / "o.db", "127.0.0.1:0", roots=[tmp_path]) as server:
        got, _, err = run(capsys, *(a.format(d=tmp_path, e=server.endpoint) for a in args))
    assert got == code, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_create_writes_the_token_to_a_private_file_and_never_prints_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with OwnerServer(tmp_path / "o.db", "127.0.0.1:0", roots=[tmp_path]) as server:
        path = str(tmp_path / "t")
        code, out, err = run(
            capsys, "table", "create", path, "--schema", "id:long,who:string", "--owner", server.endpoint
        )
        assert code == 0, err
        kept = Path(path) / "_feedlog" / "owner-token"
        token = kept.read_text().strip()
        assert len(token) >= 32 and token not in out + err
        assert str(kept) in out and (kept.stat().st_mode & 0o777) == 0o600
        # the table's own token file is found without flags; --token-file names another; --token warns
        code, _, err = run(capsys, "table", "backfill", path, "--owner", server.endpoint)
        assert code == 0, err
        (tmp_path / "tok").write_text(token + "\n")
        kept.unlink()
        code, _, err = run(capsys, "table", "backfill", path, "--owner", server.endpoint)
        assert code == 7 and "token" in err
        code, _, err = run(
            capsys, "table", "backfill", path, "--owner", server.endpoint, "--token-file", str(tmp_path / "tok")
        )
        assert code == 0 and not err
        code, _, err = run(capsys, "table", "backfill", path, "--owner", server.endpoint, "--token", token)
        assert code == 0 and "warning: --token is visible" in err, err
        code, _, err = run(capsys, "table", "backfill", path, "--token", token, "--token-file", str(tmp_path / "tok"))
        assert code == 2  # one or the other


def test_a_failed_create_leaves_no_token_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "elsewhere").mkdir()
    with OwnerServer(tmp_path / "o.db", "127.0.0.1:0", roots=[tmp_path / "elsewhere"]) as server:
        path = tmp_path / "t"
        code, _, err = run(capsys, "table", "create", str(path), "--schema", "id:long", "--owner", server.endpoint)
    assert code == 7 and "outside" in err
    assert not (path / "_feedlog" / "owner-token").exists()


def test_generated_tokens_never_start_with_a_dash() -> None:
    """`--token -x...` is an option to argparse: one generated token in 64 used to start with '-',
    and `table backfill --token TOKEN` then failed with a usage error (seen in CI)."""
    from feedlog.delta.managed import new_token

    assert not any(new_token().startswith("-") for _ in range(5000))
