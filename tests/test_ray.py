"""Conversion on Ray (``--executor ray``) against the local executor, on a real local Ray
instance (one for the module: it takes seconds to start on two cores), each run by a driver
process of its own (``tests/ray_nodes.py`` says why).

Every format gives the dataset the local executor gives (content checksum, and the samples
read back: pixels, labels, source paths), hdf5 and lmdb in several files; bad images follow
``--on-error``; a killed worker's task is run again by Ray; a driver killed mid-run resumes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import readers
from convert import BadInputError, ConvertOptions, convert_folder
from convert.cli import main
from convert.executors import RAY_HINT
from readers import spec
from scripts.s3_server import S3Server, local_s3_server
from tests.conftest import SAMPLE_DATA
from tests.photos import photo_folder
from tests.ray_nodes import RayDriver

ROOT = Path(__file__).resolve().parent.parent
SHARD = 8  # sample_data's 32 images in 4 shards
OPTIONS = {"encoding": "jpeg", "resize": 80, "exact_resize": True, "shard_size": SHARD}
BAD = "people/astronaut_01.jpg"  # made bad in a copy of sample_data
PHOTOS = 480  # the generated source for the kill tests
PHOTO_OPTIONS = {"encoding": "jpeg", "resize": 128, "shard_size": 10}
BUCKET = "imgpack-ray"


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    """The loopback S3 server of the module's object-store tests, started before Ray: the
    write tasks upload their shards, with the environment (endpoint, credentials) their
    workers got when the instance started, as a cluster's nodes have their own."""
    with local_s3_server(BUCKET) as server:
        yield server


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A source slow enough to be caught mid-run: 480 photos in 3 classes."""
    return photo_folder(tmp_path_factory.mktemp("ray-photos"), PHOTOS, 240, 320)


@pytest.fixture(scope="module")
def photos_checksum(photos: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The content checksum of the local executor's dataset of ``photos``."""
    dst = tmp_path_factory.mktemp("ray-photos-local")
    return manifest(convert(photos, dst, None, options=PHOTO_OPTIONS))["content_sha256"]


def convert(src: Path, dst: Path, on: RayDriver | None, **kw) -> Path:
    """``src`` converted into ``dst`` by the local executor, or on Ray ``on`` a driver."""
    fmt = kw.pop("fmt", "wds")
    options = ConvertOptions(format=fmt, **kw.pop("options", OPTIONS))
    if on is None:
        convert_folder(src, dst, options, workers=2, progress=False, **kw)
    else:  # the cluster's CPUs
        on.convert(src, dst, options, progress=False, **kw)
    return dst


def manifest(dst: Path) -> dict:
    return json.loads((dst / spec.MANIFEST_NAME).read_text(encoding="utf-8"))


def read_back(dst: Path | str) -> list[tuple[torch.Tensor, int, str]]:
    ds = readers.open_dataset(dst)
    return [(ds[i][0], ds.targets[i], ds.source_path(i)) for i in range(len(ds))]


def assert_same_samples(a: Path | str, b: Path) -> None:
    ours, theirs = read_back(a), read_back(b)
    assert [s[1:] for s in ours] == [s[1:] for s in theirs]
    assert all(torch.equal(x[0], y[0]) for x, y in zip(ours, theirs, strict=True))


def with_bad_image(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    shutil.copytree(SAMPLE_DATA, src)
    (src / BAD).write_bytes(b"\xff\xd8\xff\xe0 not a JPEG")
    return src


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_ray_writes_the_local_dataset(ray_driver: RayDriver, tmp_path: Path, fmt: str) -> None:
    local = convert(SAMPLE_DATA, tmp_path / "local", None, fmt=fmt)
    on_ray = convert(SAMPLE_DATA, tmp_path / "ray", ray_driver, fmt=fmt)
    assert manifest(on_ray)["content_sha256"] == manifest(local)["content_sha256"]
    assert len(manifest(on_ray)["shards"]) == 4  # hdf5 and lmdb too: one file per shard
    assert_same_samples(on_ray, local)


def test_ray_skips_bad_images_as_local(ray_driver: RayDriver, tmp_path: Path) -> None:
    src = with_bad_image(tmp_path)
    local = convert(src, tmp_path / "local", None)
    on_ray = convert(src, tmp_path / "ray", ray_driver)
    assert manifest(on_ray)["content_sha256"] == manifest(local)["content_sha256"]
    assert manifest(on_ray)["skipped"] == manifest(local)["skipped"] == 1
    errors = "errors.jsonl"
    assert (on_ray / errors).read_text() == (local / errors).read_text()


def test_ray_stops_at_bad_image_and_resumes(ray_driver: RayDriver, tmp_path: Path) -> None:
    src = with_bad_image(tmp_path)
    messages = []
    for name, on in (("local", None), ("ray", ray_driver)):
        with pytest.raises(BadInputError) as stopped:
            convert(src, tmp_path / name, on, on_error="fail")
        messages.append(str(stopped.value))
        assert not (tmp_path / name / spec.MANIFEST_NAME).exists()
    assert messages[1] == messages[0]
    assert BAD in messages[0] and "--resume" in messages[0]
    shutil.copy(SAMPLE_DATA / BAD, src / BAD)  # fixed
    convert(src, tmp_path / "ray", ray_driver, on_error="fail", resume=True)
    reference = convert(SAMPLE_DATA, tmp_path / "reference", None)
    assert manifest(tmp_path / "ray")["content_sha256"] == manifest(reference)["content_sha256"]


def test_ray_refuses_shard_bytes(ray_driver: RayDriver, tmp_path: Path) -> None:
    options = {**OPTIONS, "shard_bytes": 1 << 20}
    with pytest.raises(ValueError, match=r"--shard-bytes.*--shard-size"):
        convert(SAMPLE_DATA, tmp_path / "dst", ray_driver, options=options)
    assert not (tmp_path / "dst").exists()


def ray_workers_running(task: str) -> list[int]:
    """Pids of Ray workers running ``task`` now (Ray titles them ``ray::<task>``)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(
                f"ray::{task}".encode()
            ):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_ray_reruns_the_task_of_a_killed_worker(
    ray_driver: RayDriver, photos: Path, photos_checksum: str, tmp_path: Path
) -> None:
    killed: list[int] = []
    done = threading.Event()

    def kill_one_preparing() -> None:
        while not done.is_set() and not killed:
            for pid in ray_workers_running("_prepare")[:1]:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.002)

    killer = threading.Thread(target=kill_one_preparing)
    killer.start()
    try:
        on_ray = convert(photos, tmp_path / "ray", ray_driver, options=PHOTO_OPTIONS)
    finally:
        done.set()
        killer.join()
    assert killed, "no preparation task was caught running"
    assert manifest(on_ray)["content_sha256"] == photos_checksum


def journaled(dst: Path) -> int:
    try:
        return len((dst / spec.JOURNAL_NAME).read_text(encoding="utf-8").splitlines()) - 1
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_ray_driver_stopped_mid_run_resumes(
    ray_driver: RayDriver,
    photos: Path,
    photos_checksum: str,
    tmp_path: Path,
    stop: signal.Signals,
) -> None:
    """A driver killed (its tasks end with its job) or stopped (it cancels them first)."""
    dst = tmp_path / "ray"
    args = ["--format", "wds", "--encoding", "jpeg", "--resize", "128", "--shard-size", "10"]
    args += ["--executor", "ray", "--ray-address", ray_driver.address, "--no-progress"]
    driver = subprocess.Popen(
        [sys.executable, "-m", "convert.cli", "convert", str(photos), str(dst), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while journaled(dst) < 3:
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, "the driver made no progress"
        time.sleep(0.002)
    driver.send_signal(stop)
    _, stderr = driver.communicate(timeout=60)
    assert not (dst / spec.MANIFEST_NAME).exists(), "the run ended before the kill"
    if stop == signal.SIGTERM:
        assert driver.returncode == 130, stderr
        assert "rerun the same command with --resume" in stderr

    options = ConvertOptions(format="wds", **PHOTO_OPTIONS)
    result = ray_driver.convert(photos, dst, options, resume=True, progress=False)
    assert result.resumed >= 30  # the journaled shards were kept
    assert manifest(dst)["content_sha256"] == photos_checksum


def test_ray_missing_says_how_to_install(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed: find_spec gives None
    args = [str(SAMPLE_DATA), str(tmp_path / "dst"), "--format", "pt", "--executor", "ray"]
    done = CliRunner().invoke(main, ["convert", *args])
    assert done.exit_code == 1 and isinstance(done.exception, SystemExit)  # no traceback
    assert RAY_HINT in done.stderr
    assert not (tmp_path / "dst").exists()


def test_ray_converts_to_an_object_store_destination(ray_driver: RayDriver, tmp_path: Path) -> None:
    local = convert(SAMPLE_DATA, tmp_path / "local", None)
    url = f"s3://{BUCKET}/wds"
    convert(SAMPLE_DATA, url, ray_driver, staging=tmp_path / "staging")
    remote = readers.load_manifest(url)
    assert remote.content_sha256 == manifest(local)["content_sha256"]
    assert len(remote.shards) == 4 and not (tmp_path / "staging").exists()
    assert_same_samples(url, local)


def test_ray_resumes_an_object_store_conversion_on_another_machine(
    ray_driver: RayDriver, photos: Path, photos_checksum: str, tmp_path: Path
) -> None:
    """The journal is in the bucket: a driver killed mid-run, its staging folder lost, is
    resumed elsewhere, keeping the shards it uploaded (planned shards, in any order)."""
    from convert.journal import ENTRY_PREFIX
    from readers.storage.remote import RemoteFolder

    url = f"s3://{BUCKET}/resume/wds"
    args = ["--format", "wds", "--encoding", "jpeg", "--resize", "128", "--shard-size", "10"]
    args += ["--executor", "ray", "--ray-address", ray_driver.address, "--no-progress"]
    args += ["--staging", str(tmp_path / "a")]
    driver = subprocess.Popen(
        [sys.executable, "-m", "convert.cli", "convert", str(photos), url, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    folder = RemoteFolder(url)
    deadline = time.monotonic() + 120
    while sum(n.startswith(ENTRY_PREFIX) for n in folder.names()) < 3:
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, "the driver made no progress"
        time.sleep(0.05)
    driver.kill()
    driver.communicate(timeout=60)
    shutil.rmtree(tmp_path / "a")
    options = ConvertOptions(format="wds", **PHOTO_OPTIONS)
    result = ray_driver.convert(
        photos, url, options, resume=True, progress=False, staging=tmp_path / "b"
    )
    assert result.resumed >= 30  # the journaled shards were kept
    assert readers.load_manifest(url).content_sha256 == photos_checksum
