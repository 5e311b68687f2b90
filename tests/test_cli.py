"""The `feedlog` command: in-process for speed, plus real subprocesses for exit codes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from feedlog.cli import main
from feedlog.clock import SystemClock

ROOT = Path(__file__).resolve().parents[1]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_put_exact_expiry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = str(tmp_path / "feed")
    assert run(capsys, "create", f, "--timestamps", "off")[0] == 0
    before = SystemClock().now_ms()
    code, out, _ = run(capsys, "put", f, "deadline", "x", "--ttl", "1h", "--exact-expiry", "--json")
    after = SystemClock().now_ms()
    assert code == 0 and json.loads(out)["timestamp"] is None
    assert before + 3_600_000 <= json.loads(out)["expires_at"] <= after + 3_600_000
    code, out, _ = run(capsys, "put", f, "vague", "x", "--ttl", "1h", "--json")
    assert code == 0 and json.loads(out)["expires_at"] % 3_600_000 == 0


def test_feed_lifecycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = str(tmp_path / "feed")
    code, out, _ = run(capsys, "create", f, "--timestamps", "truncate:1m", "--ttl", "7d", "--json")
    assert code == 0 and json.loads(out)["timestamps"] == "truncate:1m"
    assert run(capsys, "put", f, "greeting", "hello")[0] == 0
    assert run(capsys, "put", f, "bin", "00ff", "--hex", "--ttl", "1h")[0] == 0
    assert run(capsys, "del", f, "greeting")[0] == 0
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("\n".join(json.dumps({"key": f"k{i}", "value": f"v{i}"}) for i in range(25)) + "\n")
    code, out, _ = run(capsys, "append", f, "--jsonl", str(jsonl), "--batch", "10", "--json")
    assert code == 0 and json.loads(out) == {"appended": 25, "first_seq": 4, "last_seq": 28, "length": 29}

    code, out, _ = run(capsys, "get", f, "k3")
    assert code == 0 and out == "v3\n"
    assert run(capsys, "get", f, "greeting")[0] == 3  # deleted
    code, out, _ = run(capsys, "cat", f, "--from", "1", "--to", "3", "--json", "--raw")
    rows = [json.loads(x) for x in out.splitlines()]
    assert [r["seq"] for r in rows] == [1, 2, 3]
    assert rows[1]["value"] == "00ff" and rows[2]["deleted"] and "block" in rows[0]
    assert rows[0]["timestamp"] % 60_000 == 0
    assert rows[1]["expires_at"] % 60_000 == 0  # truncate:1m: the expiry is no finer than the timestamp

    code, out, _ = run(capsys, "info", f, "--json")
    info = json.loads(out)
    assert info["length"] == 29 and len(info["tree_hash"]) == 64 and info["first_timestamp"] is not None
    code, out, _ = run(capsys, "timestamp", f, "2", "--json")
    assert json.loads(out)["timestamp"] == rows[1]["timestamp"]
    code, out, _ = run(capsys, "verify", f, "--json")
    assert code == 0 and json.loads(out)["length"] == 29
    code, out, _ = run(capsys, "history", f, "greeting", "--json")
    assert [r["deleted"] for r in json.loads(out)] == [False, True]
    code, out, _ = run(capsys, "compact", f, "--overwritten", "--json")
    assert code == 0 and json.loads(out)["cleared"] == 1
    code, out, _ = run(capsys, "cat", f, "--to", "1")
    assert "cleared" in out


def test_drive_event_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = str(tmp_path / "drive")
    assert run(capsys, "create", f, "--type", "drive-event")[0] == 0
    assert run(capsys, "put", f, "/a.txt", '{"mode": 33188, "size": 3}')[0] == 0
    code, _, err = run(capsys, "put", f, "/a.txt", "not json")
    assert code == 2 and "JSON stat" in err
    code, out, _ = run(capsys, "get", f, "/a.txt")
    assert json.loads(out) == {"mode": 33188, "size": 3}


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["info", "{missing}"], 3, "no feed there"),
        (["create", "{feed}"], 4, "already exists"),
        (["create", "{new}", "--timestamps", "sometimes"], 2, "bad timestamp policy"),
        (["create", "{new}", "--ttl", "soon"], 2, "bad duration"),
        (["put", "{feed}", "k", "zz", "--hex"], 2, "not hex"),
        (["timestamp", "{feed}", "99"], 3, "outside the feed"),
        (["timestamp", "{feed}", "x"], 2, "invalid seq 'x'"),
        (["timestamp", "{feed}", "-1"], 2, "a seq is 0 or more"),  # before: exit 3, "outside the feed"
        (["cat", "{feed}", "--from", "-2"], 2, "a seq is 0 or more"),
        (["tail", "grpc://127.0.0.1:1/" + "00" * 32, "--from", "-1"], 2, "a seq is 0 or more"),
        (["append", "{feed}", "--jsonl", "{badjsonl}"], 2, "line 2"),
        (["nonsense"], 2, "invalid choice"),
    ],
)
def test_user_mistakes_are_one_line_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, needle: str
) -> None:
    feed = tmp_path / "feed"
    main(["create", str(feed)])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": "a", "value": "1"}\n{"value": "no key"}\n')
    capsys.readouterr()
    subst = {
        "missing": str(tmp_path / "missing"),
        "feed": str(feed),
        "new": str(tmp_path / "new"),
        "badjsonl": str(bad),
    }
    got, _out, err = run(capsys, *[a.format(**subst) for a in args])
    assert got == code
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "new").exists()


def test_real_process_exit_codes_and_help(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "feedlog", "info", str(tmp_path / "nothing")]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 3 and p.stderr.startswith("feedlog: error:") and "Traceback" not in p.stderr
    for sub in ("create", "put", "append", "cat", "verify", "compact"):
        h = subprocess.run(
            [sys.executable, "-m", "feedlog", sub, "--help"], capture_output=True, text=True, env=env, timeout=60
        )
        assert h.returncode == 0 and "usage: feedlog " + sub in h.stdout
