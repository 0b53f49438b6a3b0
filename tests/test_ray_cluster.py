"""Conversion on a real multi-node Ray cluster into a bucket: two raylets on loopback (a head
node and a worker node with a resource of its own, each ``ray start --block`` in its own
process group), converting into the loopback S3 server.

Each write task uploads its shard from the node that wrote it: the tasks report their node
(``--debug`` logs it per shard), and the driver's credentials may not put a shard in the
bucket at all (an IAM policy the server enforces), so a run that completes proves that no
shard went up from the driver. The dataset is the local executor's (content checksum, and
the samples read back).

A module of its own: its driver joins this cluster, while ``tests/test_ray.py``'s join a
local instance (a process joins one Ray cluster at a time).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

import readers
from convert import ConvertOptions, convert_folder
from convert.destination import ERRORS_NAME
from convert.journal import ENTRY_PREFIX
from convert.remote import RemoteDestination, ShardUploader
from readers import spec
from readers.storage.remote import RemoteFolder, StorageError
from scripts.s3_server import free_port, local_s3_server
from tests.conftest import SAMPLE_DATA
from tests.test_ray import assert_same_samples

ROOT = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))
WORKER_RESOURCE = "imgpack_test_worker_node"
STARTED = b"Ray runtime started"
START_S = 60
BUCKET = "imgpack-cluster"
PREFIX = "wds"
# Raw pixels: each shard's prepared samples (8 x 80x106x3 bytes) exceed Ray's 100 KB inline
# limit, so they stay in the object store of the node that prepared them, and Ray runs the
# write task there (its arguments' node), as it does with real shards.
OPTIONS = {"encoding": "raw", "resize": 80, "exact_resize": True, "shard_size": 8}


def _start_node(args: list[str], folder: Path, env: dict[str, str]) -> subprocess.Popen:
    """``ray start --block ...`` in a process group of its own, once it says it started.
    Its session files go into ``folder`` (short: Ray's socket paths must fit in 107
    bytes), as does the cluster address that ``ray start`` leaves for a bare
    ``ray.init()``: in the default ``/tmp/ray`` it would send every later ``ray.init()``
    on this machine (other tests, other users) to this cluster, stopped."""
    folder.mkdir()
    log = folder / "ray-start.log"
    ports = [
        "--node-manager-port",
        "--object-manager-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
        "--metrics-export-port",
    ]
    command = [RAY, "start", "--block", "--num-cpus=1", "--disable-usage-stats", *args]
    command += [f"{flag}={free_port()}" for flag in ports]
    command += [f"--object-store-memory={100 << 20}", f"--temp-dir={folder}"]
    with open(log, "wb") as out:
        node = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    deadline = time.monotonic() + START_S
    while STARTED not in log.read_bytes():
        if node.poll() is not None or time.monotonic() > deadline:
            _stop_nodes([node])
            raise RuntimeError(f"ray start failed: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)
    return node


def _stop_nodes(nodes: list[subprocess.Popen]) -> None:
    """Stop each node as ``ray start --block`` does on SIGTERM (its raylet, its workers...),
    then kill whatever is left in its process group."""
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            node.terminate()
    for node in nodes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        node.wait(timeout=10)


@contextlib.contextmanager
def ray_cluster(env: dict[str, str]) -> Iterator[str]:
    """A head node and a worker node (with :data:`WORKER_RESOURCE`), one CPU each, their
    processes started with ``env``; yields the head's address. Only these two are stopped
    afterwards (never ``ray stop``, which stops every Ray instance on the machine), and
    their files removed."""
    port = free_port()
    head_args = ["--head", f"--port={port}", "--include-dashboard=false"]
    head_args += [f"--dashboard-port={free_port()}"]
    with tempfile.TemporaryDirectory(prefix="imgpack-ray-", dir="/tmp") as folder:
        nodes = [_start_node(head_args, Path(folder, "head"), env)]
        try:
            address = f"127.0.0.1:{port}"
            worker_args = [f"--address={address}", f'--resources={{"{WORKER_RESOURCE}": 1}}']
            nodes.append(_start_node(worker_args, Path(folder, "worker"), env))
            yield address
        finally:
            _stop_nodes(nodes)


def _arn(name: str) -> str:
    return f"arn:aws:s3:::{BUCKET}/{PREFIX}/{name}"


def test_ray_cluster_uploads_each_shard_from_the_node_that_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ray = pytest.importorskip("ray")
    options = ConvertOptions(format="wds", **OPTIONS)
    local = tmp_path / "local"
    convert_folder(SAMPLE_DATA, local, options, workers=2, progress=False)
    url = f"s3://{BUCKET}/{PREFIX}"
    with local_s3_server(BUCKET) as server:
        everywhere = ["*"]
        keys = server.enforce_permissions(
            {
                "driver": {  # everything a run does, except putting a shard
                    "s3:ListBucket": everywhere,
                    "s3:GetObject": everywhere,
                    "s3:DeleteObject": everywhere,
                    "s3:PutObject": [
                        _arn(spec.MANIFEST_NAME),
                        _arn(ERRORS_NAME),
                        _arn(spec.JOURNAL_NAME),
                        _arn(f"{ENTRY_PREFIX}*"),
                    ],
                },
                "nodes": {  # the cluster's identity: shards only
                    "s3:ListBucket": everywhere,
                    "s3:GetObject": [_arn(f"{spec.SHARD_PREFIX}*")],
                    "s3:PutObject": [_arn(f"{spec.SHARD_PREFIX}*")],
                },
            }
        )
        node_env = {**os.environ, **keys["nodes"], "RAY_AUTH_MODE": "disabled"}
        node_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
        )
        for name, value in keys["driver"].items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
        fsspec.get_filesystem_class("s3").clear_instance_cache()  # made with other keys
        # The driver may not put a shard: the run below cannot complete if it uploads one.
        with pytest.raises(StorageError, match="permission denied"):
            RemoteFolder(url).write(spec.shard_name("wds", 99), b"")

        with ray_cluster(node_env) as address:
            ray.init(address=address, log_to_driver=False)
            try:
                alive = [n for n in ray.nodes() if n["Alive"]]
                worker = {n["NodeID"] for n in alive if WORKER_RESOURCE in n["Resources"]}
                assert len(alive) == 2 and len(worker) == 1
                with caplog.at_level(logging.DEBUG, logger="convert.executors.ray_tasks"):
                    result = convert_folder(
                        SAMPLE_DATA,
                        url,
                        options,
                        progress=False,
                        executor="ray",
                        staging=tmp_path / "staging",
                    )
            finally:
                ray.shutdown()

        uploaded_on = {
            r.args[0]: r.args[2]
            for r in caplog.records
            if r.name == "convert.executors.ray_tasks" and r.args[1] == "written and uploaded"
        }
        assert sorted(uploaded_on) == [spec.shard_name("wds", i) for i in range(4)]
        assert set(uploaded_on.values()) == {n["NodeID"] for n in alive}  # both nodes
        assert result.written == 32 and not (tmp_path / "staging").exists()
        remote = readers.load_manifest(url)
        assert remote.content_sha256 == readers.load_manifest(local).content_sha256
        assert_same_samples(url, local)


def test_a_shard_uploaded_into_another_store_is_not_journaled(tmp_path: Path) -> None:
    """A Ray node that reaches another store (its own AWS_ENDPOINT_URL) than the driver's:
    the driver, checking each uploaded shard before journaling it, refuses the run."""
    url = f"s3://{BUCKET}/{PREFIX}"
    name = spec.shard_name("wds", 0)
    data = b"shard bytes"
    shard = spec.ShardInfo(name, 1, len(data), hashlib.sha256(data).hexdigest())
    with local_s3_server(BUCKET):
        destination = RemoteDestination(url, staging=tmp_path / "staging")
        with local_s3_server(BUCKET):  # where the node's environment points
            (tmp_path / name).write_bytes(data)
            uploaded = ShardUploader(RemoteFolder(url))(tmp_path, shard)
        assert not (tmp_path / name).exists()  # freed once up
        with pytest.raises(StorageError, match=f"{name}: a Ray task uploaded it .*no such object"):
            destination.publish(shard, uploaded)
        destination.folder.mkdir()
        (destination.folder / name).write_bytes(data)
        stored = destination.publish(shard, None)  # the driver's own upload, into this store
        assert destination.publish(shard, stored) == stored  # as recorded: journaled
