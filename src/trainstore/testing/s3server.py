"""Start moto's S3 server as a subprocess on 127.0.0.1 with an ephemeral port.

Used by the test-suite, benchmarks and ``trainstore demo --store s3``: a real HTTP S3
endpoint, no in-process patching of botocore.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

ACCESS_KEY = "testing-key"
SECRET_KEY = "testing-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    """A running moto server; ``options()`` gives ``open_store`` keyword arguments."""

    endpoint: str
    process: subprocess.Popen

    def options(self) -> dict:
        return {
            "endpoint": self.endpoint,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "region": "us-east-1",
            "allow_http": True,
        }

    def create_bucket(self, name: str) -> None:
        import boto3  # installed with moto[server]

        client = boto3.client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
        )
        client.create_bucket(Bucket=name)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_s3_server(timeout: float = 30.0) -> S3Server:
    """Start ``moto.server`` on a free loopback port and wait until it answers."""
    port = free_port()
    env = dict(os.environ)
    env.setdefault("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    env.setdefault("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(endpoint + "/moto-api/", timeout=1) as resp:
                resp.read()
            return S3Server(endpoint, proc)
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"moto server did not start on {endpoint} within {timeout}s")
