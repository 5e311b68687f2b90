import json
import subprocess
import sys

import pytest

from feedlog.cli import main
from feedlog.clock import ManualClock
from feedlog.delta import DeltaTable

from .conftest import SCHEMA, T0, rows


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def table_path(tmp_path):
    path = tmp_path / "t"
    t = DeltaTable.create(path, SCHEMA, in_commit_timestamps=False, clock=ManualClock(T0))
    t.append(rows(0, 4))
    t.append(rows(4, 2))
    return str(path)


def test_table_commands(table_path, capsys):
    code, out, _ = run(capsys, "table", "info", table_path, "--json")
    info = json.loads(out)
    assert code == 0 and info["version"] == 2 and info["rows"] == 6 and info["files"] == 2
    assert info["protocol"] == {"minReaderVersion": 1, "minWriterVersion": 2}

    code, out, _ = run(capsys, "table", "enable-ict", table_path, "--json")
    assert code == 0 and json.loads(out)["version"] == 3
    code, out, _ = run(capsys, "table", "enable-ict", table_path)
    assert code == 0 and "already enabled" in out
    code, out, _ = run(capsys, "table", "info", table_path)
    assert code == 0 and "inCommitTimestamp" in out and "delta.inCommitTimestampEnablementVersion=3" in out

    code, out, _ = run(capsys, "table", "history", table_path, "--json")
    history = json.loads(out)
    assert [h["version"] for h in history] == [3, 2, 1, 0]
    assert history[0]["in_commit_timestamp"] == history[0]["timestamp"] and history[1]["in_commit_timestamp"] is None
    code, out, _ = run(capsys, "table", "history", table_path, "--limit", "1")
    assert code == 0 and len(out.splitlines()) == 1 and "(ict) " in out and "(ict )" not in out

    ict = history[0]["timestamp"]
    code, out, _ = run(capsys, "table", "version-at", table_path, str(ict))
    assert (code, out.strip()) == (0, "3")
    code, out, _ = run(capsys, "table", "version-at", table_path, "2999-01-01T00:00:00Z", "--json")
    assert json.loads(out)["version"] == 3

    code, out, _ = run(capsys, "table", "checkpoint", table_path, "--json")
    assert (code, json.loads(out)) == (0, {"checkpoint": 3})
    code, out, _ = run(capsys, "table", "cleanup", table_path, "--retain", "3650d", "--json")
    assert (code, json.loads(out)) == (0, {"deleted": []})


def test_table_errors_are_one_line_with_exit_codes(tmp_path, table_path, capsys):
    cases = [
        (("table", "info", str(tmp_path / "none")), 3, "no Delta table"),
        (("table", "version-at", table_path, "yesterday"), 2, "bad timestamp"),
        (("table", "version-at", table_path, "1970-01-01"), 3, "before the earliest"),
        (("table", "cleanup", table_path, "--retain", "soon"), 2, "bad duration"),
        (("table", "checkpoint", table_path, "--version", "99"), 3, "version 99 does not exist"),
        (("table",), 2, "required"),
        # before: -1 printed all but the oldest commit and 0 printed nothing, both with exit 0
        (("table", "history", table_path, "--limit", "-1"), 2, "--limit must be >= 1"),
        (("table", "history", table_path, "--limit", "0"), 2, "--limit must be >= 1"),
    ]
    for args, want, message in cases:
        code, _out, err = run(capsys, *args)
        assert code == want and message in err and len(err.strip().splitlines()) == 1, (args, err)


def test_table_command_in_a_real_process(table_path):
    proc = subprocess.run(
        [sys.executable, "-m", "feedlog", "table", "info", table_path + "-missing"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3 and proc.stderr.startswith("feedlog: error: no Delta table") and not proc.stdout
