"""An S3-compatible server on loopback for the object-storage tests: moto's standalone server.

`s3_server` (session scope) starts moto's ThreadedMotoServer on 127.0.0.1 at a free port,
creates the bucket `lake`, and checks the server refuses a second `If-None-Match: *` put (the
conditional create feedlog's filesystem committer relies on) before any test relies on it.
Import `s3_server_fixture` into a test module to use the fixture `s3_server`.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

BUCKET = "lake"


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

    def client(self):  # boto3 client, for the fixture's own checks
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session", name="s3_server")
def s3_server_fixture() -> Iterator[S3Server]:
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    import botocore.exceptions

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one request log line per call otherwise
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        s3 = S3Server(f"http://127.0.0.1:{port}", BUCKET)
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
    finally:
        server.stop()
