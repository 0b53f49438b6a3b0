"""A real S3-compatible server (moto's) on a free loopback port, for tests and benchmarks.

``with local_s3_server(bucket) as server:`` starts it in a subprocess, points every S3
client of this process and its children at it (``AWS_ENDPOINT_URL`` and dummy
credentials), creates ``bucket``, and stops it and restores the environment on exit.
``server.stop()`` stops it early (a storage outage); ``server.enforce_permissions(...)``
makes it check every request against IAM users it creates, as AWS does;
``server.requests()`` lists the HTTP requests it has received (to count what a reader
fetches).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import fsspec

from readers.storage.remote import RemoteFolder

__all__ = ["Request", "S3Server", "free_port", "local_s3_server"]

STARTUP_S = 30
# The request line werkzeug (moto's server) logs for every request, before it sends the
# response: '127.0.0.1 - - [date] "GET /bucket/key?query HTTP/1.1" 200 -', coloured with
# ANSI escapes for some status codes.
_REQUEST_LINE = re.compile(rb'"(?:\x1b\[[0-9;]*m)*([A-Z]+) (\S+) HTTP/[0-9.]+')


def free_port() -> int:
    """A loopback port nothing listens on (for a server, or for an unreachable endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Request:
    """One HTTP request the server received: ``method`` and ``target`` as sent
    (``"GET"``, ``"/bucket/prefix/imgpack.json"``; a query stays on the target)."""

    method: str
    target: str


@dataclass
class S3Server:
    """A running moto server: its endpoint URL, process and output (its request log)."""

    endpoint: str
    process: subprocess.Popen
    log: IO[bytes]

    def requests(self) -> list[Request]:
        """Every request received so far, in order: a request is logged before its
        response is sent, so one a client has seen answered is listed."""
        fd = self.log.fileno()  # read without moving the offset the server writes at
        text = os.pread(fd, os.fstat(fd).st_size, 0)
        return [Request(m[1].decode(), m[2].decode()) for m in _REQUEST_LINE.finditer(text)]

    def tar_gets(self, url: str) -> int:
        """The GETs so far of tars below ``url`` (``s3://bucket/prefix``): whole tars and
        byte ranges of their members, not their indexes."""
        prefix = f"/{url.removeprefix('s3://')}/"
        return sum(
            r.method == "GET" and r.target.startswith(prefix) and r.target.endswith(".tar")
            for r in self.requests()
        )

    def stop(self) -> None:
        """Stop the server (a no-op once stopped): every request then fails to connect."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def enforce_permissions(
        self, users: dict[str, list[str] | dict[str, list[str]]]
    ) -> dict[str, dict[str, str]]:
        """Create an IAM user allowed exactly the S3 actions listed for each name (a list:
        on every resource; a dict: each action on the resource ARNs it maps to, such as
        ``arn:aws:s3:::bucket/prefix/shard-*``), then make the server authenticate and
        authorize every request from now on (moto's ``/moto-api/reset-auth``); the dummy
        credentials stop working. Returns each user's ``AWS_ACCESS_KEY_ID``/
        ``AWS_SECRET_ACCESS_KEY``."""
        import boto3  # installed with moto

        iam = boto3.client("iam", endpoint_url=self.endpoint)
        keys = {}
        for name, actions in users.items():
            iam.create_user(UserName=name)
            grants = actions if isinstance(actions, dict) else {a: ["*"] for a in actions}
            if grants:
                statements = [
                    {"Effect": "Allow", "Action": action, "Resource": resources}
                    for action, resources in grants.items()
                ]
                policy = {"Version": "2012-10-17", "Statement": statements}
                iam.put_user_policy(
                    UserName=name, PolicyName="only", PolicyDocument=json.dumps(policy)
                )
            key = iam.create_access_key(UserName=name)["AccessKey"]
            keys[name] = {
                "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
                "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            }
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/reset-auth",
            data=b"0",  # unauthenticated requests left: none
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
        fsspec.get_filesystem_class("s3").clear_instance_cache()
        return keys


@contextlib.contextmanager
def local_s3_server(bucket: str) -> Iterator[S3Server]:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        server = S3Server(endpoint, process, log)
        os.environ.update(env)
        # fsspec keeps one S3 filesystem per set of options: one made for an earlier server
        # (its endpoint read from the environment then) must not be reused.
        s3 = fsspec.get_filesystem_class("s3")
        s3.clear_instance_cache()
        try:
            _wait_for(process, port, log)
            RemoteFolder(f"s3://{bucket}").fs.mkdir(bucket)
            yield server
        finally:
            s3.clear_instance_cache()
            server.stop()
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
