"""An S3-compatible server on loopback for the object-storage tests: moto's standalone server.

`s3_server` (session scope) starts moto's server (`MOTO_SERVER`) in a process of its own
on 127.0.0.1 at a free port, creates the bucket `lake`, and checks the server refuses a second
`If-None-Match: *` put (the conditional create feedlog's filesystem committer relies on) before
any test relies on it. Import `s3_server_fixture` into a test module to use the fixture `s3_server`.

moto checks a put's `If-None-Match` / `If-Match` and then writes, with nothing between the two, and
its server is threaded: two writers racing to create one commit could both be told they won (a full
run once saw two writer processes both acknowledged version 18). S3 decides a conditional write
atomically; `MOTO_SERVER` serialises moto's conditional writes to do the same.

The server must not run in the tests' own process (moto's ThreadedMotoServer): deltalake reads
Parquet through an Arrow stream whose `read_all` holds the GIL while it waits for the store, so a
server thread in the same interpreter can never answer it and every deltalake read times out
("Failed to fetch metadata ... error sending request"), even of a table deltalake wrote itself.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

BUCKET = "lake"
#: moto's server (`python -m moto.server -H HOST -p PORT`), its conditional writes made atomic as S3's are
MOTO_SERVER = """
import os, signal, sys, threading
os.environ.setdefault("MOTO_PORT", sys.argv[2])  # as moto's own main does
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app

app = DomainDispatcherApplication(create_backend_app)
app.debug = True  # as moto's own main does
conditional = threading.Lock()

def atomic(environ, start_response):
    if environ.get("HTTP_IF_NONE_MATCH") or environ.get("HTTP_IF_MATCH"):
        with conditional:  # the condition's check and the write it guards, as one step
            return list(app(environ, start_response))
    return app(environ, start_response)

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
run_simple(sys.argv[1], int(sys.argv[2]), atomic, threaded=True, request_handler=MotoRequestHandler)
"""
#: how long the server may take to answer its first request
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str

    @property
    def options(self) -> dict[str, str]:
        """delta-rs style storage_options for this server (the same dict deltalake takes)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def url(self, name: str = "t") -> str:
        """A fresh table URL in the bucket (unique per call)."""
        return f"s3://{self.bucket}/{name}-{uuid.uuid4().hex[:12]}"

    def client(self):  # boto3 client, for the fixture's own checks and for listing what a test left
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def keys(self, prefix: str = "") -> list[str]:
        """Every object name under `prefix` in the bucket, hidden ones included (bounded: 10 pages)."""
        client, keys, token = self.client(), [], None
        for _ in range(10):
            kw: dict[str, str] = {"ContinuationToken": token} if token else {}
            page = client.list_objects_v2(Bucket=self.bucket, Prefix=prefix, **kw)
            keys += [o["Key"] for o in page.get("Contents", ())]
            token = page.get("NextContinuationToken")
            if not token:
                return keys
        raise AssertionError(f"more than 10 pages of objects under {prefix!r}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until_up(process: subprocess.Popen[bytes], endpoint: str, log_path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            with open(log_path, errors="replace") as f:
                raise RuntimeError(f"moto's server exited with {process.returncode}: {f.read()[-2000:]}")
        try:
            with urllib.request.urlopen(endpoint + "/moto-api/", timeout=2):
                return
        except urllib.error.HTTPError:  # an answer, even an error status, means it is serving
            return
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    raise RuntimeError(f"moto's server did not answer on {endpoint} within {START_TIMEOUT_S:.0f} s")


@contextmanager
def moto_server(env: dict[str, str] | None = None) -> Iterator[str]:
    """moto's S3 server in a process of its own on a free loopback port, with `env` added to its
    environment (e.g. INITIAL_NO_AUTH_ACTION_COUNT=0: check every request's credentials); its endpoint."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    own = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | (env or {})  # not the tests'
    with tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False) as log:
        # stdout and stderr to a file: one request log line per call would fill a pipe and stall it
        process = subprocess.Popen(
            [sys.executable, "-c", MOTO_SERVER, "127.0.0.1", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=own,
        )
    try:
        _wait_until_up(process, endpoint, log.name)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        os.unlink(log.name)


@pytest.fixture(scope="session", name="s3_server")
def s3_server_fixture() -> Iterator[S3Server]:
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    import botocore.exceptions

    with moto_server() as endpoint:
        s3 = S3Server(endpoint, BUCKET)
        client = s3.client()
        client.create_bucket(Bucket=BUCKET)
        # the server must refuse a second conditional create, or the tests prove nothing
        client.put_object(Bucket=BUCKET, Key="probe", Body=b"1", IfNoneMatch="*")
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            client.put_object(Bucket=BUCKET, Key="probe", Body=b"2", IfNoneMatch="*")
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        assert client.get_object(Bucket=BUCKET, Key="probe")["Body"].read() == b"1"
        client.delete_object(Bucket=BUCKET, Key="probe")
        yield s3


@contextmanager
def served_owner(s3: S3Server, tmp_path: Path, prefix: str) -> Iterator[Any]:
    """A commit owner service (SQLite in `tmp_path`) whose only root is s3://BUCKET/PREFIX, reaching
    the bucket with credentials of its own (the server's options), stopped on exit."""
    from feedlog_server.owner import OwnerServer

    server = OwnerServer(
        tmp_path / "owner.db", "127.0.0.1:0", roots=[f"s3://{s3.bucket}/{prefix}"], storage_options=s3.options
    ).start()
    try:
        yield server
    finally:
        server.stop(grace=1)
