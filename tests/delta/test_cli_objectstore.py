"""`feedlog table ...` on object-store URLs (moto's S3 server on loopback, tests/delta/s3.py): what works,
and bad input. Each mistake is one line on stderr naming what is wrong, the exit code the README's
table gives (2 invalid input, 3 not found, 7 missing credentials, 8 unavailable, 9 unsupported), no
traceback, bounded in time, and nothing in the bucket a reader would see afterwards.

Most cases run `feedlog.cli.main` in this process (an exception that is not a typed error would
escape it and fail the test, as a traceback would); one runs the installed `feedlog` command with
a scrubbed environment, to show the real process stays bounded and quiet.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from feedlog.delta import DeltaTable

from .s3 import S3Server, free_port, moto_server

EXIT_INVALID, EXIT_NOT_FOUND, EXIT_DENIED, EXIT_UNAVAILABLE, EXIT_UNSUPPORTED = 2, 3, 7, 8, 9
FEEDLOG = str(Path(sys.executable).with_name("feedlog"))


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from feedlog.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def option_args(options: dict[str, str]) -> list[str]:
    return [a for k, v in options.items() for a in ("--storage-option", f"{k}={v}")]


def without_keys(s3: S3Server) -> dict[str, str]:
    return {k: v for k, v in s3.options.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}


def one_line_error(err: str, *names: str) -> None:
    """stderr is one line, an error (no traceback), naming each of `names`."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("feedlog"), err
    for name in names:
        assert name in lines[0], (name, err)


def keys_under(s3: S3Server, url: str) -> list[str]:
    """Every object of the table at `url`, hidden ones (the conditional-put probe) included."""
    return s3.keys(url.removeprefix(f"s3://{s3.bucket}/") + "/")


@pytest.fixture
def no_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS_* variables: credentials come only from what a test passes."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def blackhole() -> Iterator[str]:
    """http://127.0.0.1:PORT where a connection is never accepted (the listen queue is full), as an
    address that drops packets behaves (169.254.169.254 off EC2, on some networks)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fillers = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(server.getsockname())
        fillers.append(s)
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        for s in fillers:
            s.close()
        server.close()


# what works


def test_table_commands_work_on_s3(s3_server: S3Server, capsys: pytest.CaptureFixture[str]) -> None:
    url, opts = s3_server.url("cli"), option_args(s3_server.options)
    code, out, err = cli(capsys, "table", "create", url, "--schema", "seq:long,key:string", *opts)
    assert code == 0, err
    DeltaTable.open(url, storage_options=s3_server.options).append(pa.table({"seq": [1, 2], "key": ["a", "b"]}))
    code, out, err = cli(capsys, "table", "info", url, "--json", *opts)
    assert code == 0 and json.loads(out)["version"] == 1 and json.loads(out)["rows"] == 2, (out, err)
    code, out, err = cli(capsys, "table", "checkpoint", url, *opts)
    assert code == 0, err
    code, out, err = cli(capsys, "table", "history", url, "--json", *opts)
    assert code == 0 and sorted(h["version"] for h in json.loads(out)) == [0, 1], (out, err)


# a URL feedlog does not serve


@pytest.mark.parametrize("url", ["foo://lake/t", "s3:lake/t", "http://127.0.0.1/lake/t", "S3:/lake/t"])
def test_an_unknown_scheme_is_refused_and_creates_nothing(
    url: str, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    before = s3_server.keys()
    code, out, err = cli(capsys, "table", "create", url, "--schema", "id:long")
    assert code == EXIT_INVALID and not out
    one_line_error(err, url, "storage URL")
    assert os.listdir(tmp_path) == []  # never a local directory named s3: or foo:
    assert s3_server.keys() == before


# options


@pytest.mark.parametrize("bad", ["NOEQUALS", "=value", " KEY=v"])
def test_storage_options_are_parsed_strictly(s3_server: S3Server, bad: str, capsys) -> None:
    code, _out, err = cli(capsys, "table", "info", s3_server.url(), "--storage-option", bad)
    assert code == EXIT_INVALID
    one_line_error(err, "KEY=VALUE")


@pytest.mark.parametrize(
    ("option", "names"),
    [
        ("AWS_NO_SUCH_KEY=1", ["aws_no_such_key"]),
        ("AWS_PROFILE=dev", ["AWS_PROFILE", "AWS_ACCESS_KEY_ID"]),
        ("AWS_CONDITIONAL_PUT=sometimes", ["AWS_CONDITIONAL_PUT", "sometimes"]),
        ("AWS_ALLOW_HTTP=maybe", ["AWS_ALLOW_HTTP", "maybe"]),
        ("aws_region=eu-west-1", ["aws_region", "twice"]),  # AWS_REGION is given too, in another case
    ],
)
def test_a_bad_option_is_one_line_naming_it(
    s3_server: S3Server, option: str, names: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = s3_server.url("badopt")
    key, _, value = option.partition("=")
    options = {**s3_server.options, key: value}  # AWS_ALLOW_HTTP replaces the good one; aws_region joins AWS_REGION
    code, out, err = cli(capsys, "table", "create", url, "--schema", "id:long", *option_args(options))
    assert code == EXIT_INVALID and not out
    one_line_error(err, url, *names)
    assert keys_under(s3_server, url) == []


# a bucket that does not exist


@pytest.mark.parametrize("command", [["create", "--schema", "id:long"], ["info"], ["history"]])
def test_a_missing_bucket_is_not_found(
    s3_server: S3Server, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = "s3://no-such-bucket/t"
    code, out, err = cli(capsys, "table", command[0], url, *command[1:], *option_args(s3_server.options))
    assert code == EXIT_NOT_FOUND and not out
    one_line_error(err, "no-such-bucket", "does not exist")
    assert "no-such-bucket" not in [b["Name"] for b in s3_server.client().list_buckets()["Buckets"]]


# missing credentials


def test_no_credentials_with_instance_metadata_off_is_refused_before_any_request(
    s3_server: S3Server, no_aws_env: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = s3_server.url("nocreds")
    for how in ("option", "environment"):
        options = without_keys(s3_server)
        if how == "option":
            options["AWS_EC2_METADATA_DISABLED"] = "true"
        else:
            monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        # and an endpoint nothing answers on: a request would fail differently, not as missing credentials
        options["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"
        started = time.monotonic()
        code, out, err = cli(capsys, "table", "create", url, "--schema", "id:long", *option_args(options))
        assert code == EXIT_DENIED and not out, (how, err)
        one_line_error(err, url, "no credentials", "AWS_ACCESS_KEY_ID", "AWS_EC2_METADATA_DISABLED")
        assert time.monotonic() - started < 2, how
    assert keys_under(s3_server, url) == []


def test_no_credentials_where_instance_metadata_drops_packets_is_bounded(
    s3_server: S3Server, no_aws_env: None, blackhole: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # object_store asks the instance metadata service for credentials (it ignores AWS_EC2_METADATA_DISABLED,
    # which feedlog honours above); each try times out after 1 s of connecting, 10 retries by default
    url = s3_server.url("imds")
    options = {**without_keys(s3_server), "AWS_METADATA_ENDPOINT": blackhole, "max_retries": "2"}
    started = time.monotonic()
    code, out, err = cli(capsys, "table", "info", url, *option_args(options))
    assert code == EXIT_DENIED and not out
    one_line_error(err, url, "no credentials", "AWS_ACCESS_KEY_ID")
    assert time.monotonic() - started < 10
    assert keys_under(s3_server, url) == []


@pytest.fixture(scope="module")
def checking_server() -> Iterator[str]:
    """A second moto server that checks every request's credentials (it knows none, so refuses all)."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    with moto_server({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:
        yield endpoint


@pytest.mark.parametrize("command", [["create", "--schema", "id:long"], ["info"]])
def test_refused_credentials_are_permission_denied_with_the_stores_reason(
    checking_server: str, command: list[str], no_aws_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    options = {
        "AWS_ENDPOINT_URL": checking_server,
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "AKIAWRONGWRONGWRONG0",
        "AWS_SECRET_ACCESS_KEY": "wrong",
    }
    code, out, err = cli(capsys, "table", command[0], "s3://lake/t", *command[1:], *option_args(options))
    assert code == EXIT_DENIED and not out
    one_line_error(err, "s3://lake/t", "refused access", "InvalidAccessKeyId", "does not exist in our records")
    assert "<?xml" not in err


def test_the_feedlog_command_without_credentials_is_one_quiet_line(s3_server: S3Server, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | {"AWS_EC2_METADATA_DISABLED": "true"}
    url = s3_server.url("proc")
    started = time.monotonic()
    done = subprocess.run(
        [FEEDLOG, "table", "create", url, "--schema", "id:long", *option_args(without_keys(s3_server))],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == EXIT_DENIED and not done.stdout, done
    one_line_error(done.stderr, url, "no credentials")
    assert time.monotonic() - started < 30
    assert os.listdir(tmp_path) == [] and keys_under(s3_server, url) == []


# a store without conditional put


def test_a_store_without_conditional_put_refuses_create_and_leaves_nothing(
    s3_server: S3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    url = s3_server.url("nocp")
    options = {**s3_server.options, "AWS_CONDITIONAL_PUT": "disabled"}
    code, out, err = cli(capsys, "table", "create", url, "--schema", "id:long", *option_args(options))
    assert code == EXIT_UNSUPPORTED and not out
    one_line_error(err, url, "conditional put", "managed")
    assert keys_under(s3_server, url) == []  # not even the probe that found it out
    code, _out, err = cli(capsys, "table", "info", url, *option_args(s3_server.options))
    assert code == EXIT_NOT_FOUND, err


def test_a_store_without_conditional_put_refuses_a_commit_to_an_existing_table(
    s3_server: S3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    url, good = s3_server.url("nocp-existing"), option_args(s3_server.options)
    code, _out, err = cli(capsys, "table", "create", url, "--schema", "id:long", "--no-ict", *good)
    assert code == 0, err
    before = keys_under(s3_server, url)
    bad = option_args({**s3_server.options, "AWS_CONDITIONAL_PUT": "disabled"})
    code, out, err = cli(capsys, "table", "enable-ict", url, *bad)
    assert code == EXIT_UNSUPPORTED and not out
    one_line_error(err, url, "conditional put", "managed")
    assert keys_under(s3_server, url) == before
    code, out, err = cli(capsys, "table", "info", url, "--json", *good)
    assert code == 0 and json.loads(out)["version"] == 0, err


# an endpoint nobody answers on


def test_an_unreachable_endpoint_is_unavailable(s3_server: S3Server, capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    options = {**s3_server.options, "AWS_ENDPOINT_URL": endpoint, "max_retries": "1"}
    started = time.monotonic()
    code, out, err = cli(capsys, "table", "info", "s3://lake/t", *option_args(options))
    assert code == EXIT_UNAVAILABLE and not out
    one_line_error(err, "s3://lake/t", endpoint)
    assert time.monotonic() - started < 10
