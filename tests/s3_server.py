"""A real S3-compatible server (moto's) on a free loopback port, for tests and benchmarks.

``with local_s3_server(bucket) as endpoint:`` starts it in a subprocess, points every S3
client of this process and its children at it (``AWS_ENDPOINT_URL`` and dummy
credentials), creates ``bucket``, and stops it and restores the environment on exit.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import IO

import fsspec

from readers.storage import RemoteFolder

__all__ = ["local_s3_server"]

STARTUP_S = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_s3_server(bucket: str) -> Iterator[str]:
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        os.environ.update(env)
        # fsspec keeps one S3 filesystem per set of options: one made for an earlier server
        # (its endpoint read from the environment then) must not be reused.
        s3 = fsspec.get_filesystem_class("s3")
        s3.clear_instance_cache()
        try:
            _wait_for(server, port, log)
            RemoteFolder(f"s3://{bucket}").fs.mkdir(bucket)
            yield endpoint
        finally:
            s3.clear_instance_cache()
            server.terminate()
            server.wait(timeout=10)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _wait_for(server: subprocess.Popen, port: int, log: IO[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise RuntimeError(f"moto server did not start: {log.read()!r}") from None
            time.sleep(0.1)
