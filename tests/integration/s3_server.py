"""A real S3 endpoint on loopback for the object-store tests: moto's server over HTTP
(``ThreadedMotoServer``), the way s3fs tests itself. Its buckets live in this process, so
stopping the server and starting it again on the same port is an endpoint that was down and
came back with its objects."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from jobs.embedded import free_port
from tasks.adapters.shared_store import forget_stores

pytest.importorskip("moto.server")
from moto.server import ThreadedMotoServer

BUCKET = "prewarm-shared"


class S3Endpoint:
    """moto's S3 server on a port of its own; :meth:`down` stops it, :meth:`up` brings it back."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: ThreadedMotoServer | None = None

    def up(self) -> S3Endpoint:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url, timeout=1)
                return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError(f"moto did not answer at {self.url}")

    def down(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def env(self) -> dict[str, str]:
        """What a worker on another host is given (a ConfigMap and a Secret in Kubernetes)."""
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "prewarm",
                "AWS_SECRET_ACCESS_KEY": "prewarm-secret",
                "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip


@contextmanager
def s3_endpoint(monkeypatch: pytest.MonkeyPatch, bucket: str = BUCKET) -> Iterator[S3Endpoint]:
    """An endpoint with ``bucket``, its address and keys in this process's environment."""
    endpoint = S3Endpoint().up()
    for name, value in endpoint.env().items():
        monkeypatch.setenv(name, value)
    forget_stores()
    import boto3

    boto3.client("s3", endpoint_url=endpoint.url).create_bucket(Bucket=bucket)
    try:
        yield endpoint
    finally:
        endpoint.down()
        forget_stores()
