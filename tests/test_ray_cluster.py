"""Conversion on a real multi-node Ray cluster into a bucket: two raylets on loopback (a head
node and a worker node with a resource of its own, each ``ray start --block`` in its own
process group), converting into the loopback S3 server.

Each write task uploads its shard from the node that wrote it: the tasks report their node
(``--debug`` logs it per shard), and the driver's credentials may not put a shard in the
bucket at all (an IAM policy the server enforces), so a run that completes proves that no
shard went up from the driver. The dataset is the local executor's (content checksum, and
the samples read back).

The driver runs in a process of its own, as in ``tests/test_ray.py`` (``tests/ray_nodes.py``
says why).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import fsspec
import pytest

import readers
from convert import ConvertOptions, convert_folder
from convert.journal import ENTRY_PREFIX
from convert.output.destination import ERRORS_NAME
from convert.output.remote import RemoteDestination, ShardUploader
from readers import spec
from readers.storage.remote import RemoteFolder, StorageError
from scripts.s3_server import local_s3_server
from tests.conftest import SAMPLE_DATA
from tests.ray_nodes import RayDriver, convert_logging_nodes, ray_cluster
from tests.test_ray import assert_same_samples

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parent.parent
WORKER_RESOURCE = "imgpack_test_worker_node"
BUCKET = "imgpack-cluster"
PREFIX = "wds"
# Raw pixels: each shard's prepared samples (8 x 80x106x3 bytes) exceed Ray's 100 KB inline
# limit, so they stay in the object store of the node that prepared them, and Ray runs the
# write task there (its arguments' node), as it does with real shards.
OPTIONS = {"encoding": "raw", "resize": 80, "exact_resize": True, "shard_size": 8}


def _arn(name: str) -> str:
    return f"arn:aws:s3:::{BUCKET}/{PREFIX}/{name}"


def test_ray_cluster_uploads_each_shard_from_the_node_that_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray")
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
        node_env = {**os.environ, **keys["nodes"]}
        node_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
        )
        for name, value in keys["driver"].items():
            monkeypatch.setenv(name, value)
        fsspec.get_filesystem_class("s3").clear_instance_cache()  # made with other keys
        # The driver may not put a shard: the run below cannot complete if it uploads one.
        with pytest.raises(StorageError, match="permission denied"):
            RemoteFolder(url).write(spec.shard_name("wds", 99), b"")

        with ray_cluster(node_env, head_cpus=1, worker_resource=WORKER_RESOURCE) as address:
            driver = RayDriver(address)  # the driver's keys: those set above
            try:
                result, alive, logged = driver.call(
                    convert_logging_nodes,
                    SAMPLE_DATA,
                    url,
                    options,
                    progress=False,
                    executor="ray",
                    ray_address=address,
                    staging=tmp_path / "staging",
                )
            finally:
                driver.close()
        worker = {n["NodeID"] for n in alive if WORKER_RESOURCE in n["Resources"]}
        assert len(alive) == 2 and len(worker) == 1

        uploaded_on = {args[0]: args[2] for args in logged if args[1] == "written and uploaded"}
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
