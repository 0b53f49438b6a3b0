"""Datasets in object storage, against a real S3-compatible server (moto's) on loopback.

Conversion to ``s3://`` for every format must give the dataset a local conversion gives
(same content checksum, same samples read back map-style and streamed); a conversion
killed mid-upload resumes to that same dataset, on another machine too (the journal is in
the bucket); the reader cache stays under its limit
and never exposes a torn file; bad URLs are errors, never local folders named after them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from torch.utils.data import DataLoader

import readers
from convert import ConvertOptions, convert_folder
from convert.cli import main
from convert.journal import ENTRY_PREFIX
from readers import spec
from readers.epochs.order import BlockOrder
from readers.storage.cache import ShardCache
from readers.storage.remote import RemoteFolder
from scripts.s3_server import local_s3_server
from tests.conftest import SAMPLE_DATA

BUCKET = "imgpack-test"


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The S3 server for this module, and a reader cache of its own."""
    with pytest.MonkeyPatch.context() as patch, local_s3_server(BUCKET) as endpoint:
        patch.setenv("IMGPACK_CACHE_DIR", str(tmp_path_factory.mktemp("imgpack-cache")))
        yield endpoint


def _options(fmt: str) -> ConvertOptions:
    return ConvertOptions(fmt, shard_size=10 if fmt in ("pt", "wds") else None, shuffle=True)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory):
    """``local(fmt)``: sample_data converted to a local folder with the same options."""
    done: dict[str, Path] = {}

    def build(fmt: str) -> Path:
        if fmt not in done:
            done[fmt] = tmp_path_factory.mktemp(f"local-{fmt}") / "dst"
            convert_folder(SAMPLE_DATA, done[fmt], _options(fmt), workers=2, progress=False)
        return done[fmt]

    return build


def _assert_same_samples(a: readers.ImageDataset, b: readers.ImageDataset) -> None:
    assert len(a) == len(b)
    for i in range(len(a)):
        (x, y), (x2, y2) = a[i], b[i]
        assert torch.equal(x, x2) and y == y2, i
        assert a.source_path(i) == b.source_path(i)


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_converting_to_s3_gives_the_local_dataset(s3_server, local, fmt, tmp_path):
    url = f"s3://{BUCKET}/convert/{fmt}"
    result = convert_folder(SAMPLE_DATA, url, _options(fmt), workers=2, progress=False)
    assert result.dst == url and result.written == 32
    remote = readers.load_manifest(url)
    reference = readers.load_manifest(local(fmt))
    assert remote.url == url
    assert remote.content_sha256 == reference.content_sha256
    assert remote.shards == reference.shards  # the same bytes, shard for shard
    names = RemoteFolder(url).names()
    assert spec.MANIFEST_NAME in names and spec.JOURNAL_NAME not in names
    ds = readers.open_dataset(url, cache_dir=tmp_path / "cache")
    _assert_same_samples(ds, readers.open_dataset(local(fmt)))
    # Used in this process, then forked into workers: each makes its own S3 client.
    forked = DataLoader(
        readers.open_dataset(url, cache_dir=tmp_path / "fresh-cache"),
        batch_size=8,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=readers.collate_any,
    )
    forked.dataset[31]
    assert sum(len(labels) for _, labels in forked) == 32
    assert not list(Path(os.environ["IMGPACK_CACHE_DIR"], "staging").glob("*"))


def test_wds_streams_from_s3_without_copying_shards(s3_server, local, tmp_path):
    url = f"s3://{BUCKET}/stream/wds"
    convert_folder(SAMPLE_DATA, url, _options("wds"), workers=2, progress=False)
    cache = tmp_path / "cache"
    for workers in (0, 2):
        crop = readers.CenterCrop(64)
        streamed = readers.make_loader(
            url, 8, stream=True, num_workers=workers, seed=3, crop=crop, cache_dir=cache
        )
        at_home = readers.make_loader(
            local("wds"), 8, stream=True, num_workers=workers, seed=3, crop=crop
        )
        for epoch in (0, 1):
            streamed.set_epoch(epoch)
            at_home.set_epoch(epoch)
            pairs = list(zip(streamed, at_home, strict=True))
            assert len(pairs) == 4
            for (x, y), (x2, y2) in pairs:
                assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not cache.exists() or not any(cache.rglob("shard-*.tar"))


def _convert_and_kill(url: str, staging: Path, enough: Callable[[list[str]], bool]) -> list[str]:
    """Start ``imgpack convert`` of sample_data into ``url`` (one sample a shard) and SIGKILL
    it once ``enough`` says so of the names in ``url``; returns the command, for a resume."""
    command = [sys.executable, "-m", "convert.cli", "convert", str(SAMPLE_DATA), url]
    command += ["--format", "wds", "--shard-size", "1", "--shuffle", "--workers", "1"]
    folder = RemoteFolder(url)
    process = subprocess.Popen([*command, "--staging", str(staging)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not enough(folder.names()):
            assert process.poll() is None, process.stderr.read()
            assert time.monotonic() < deadline, "the conversion made no progress"
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
        process.stderr.close()
    return command


def test_a_conversion_killed_mid_upload_resumes_to_the_same_dataset(s3_server, local, tmp_path):
    url = f"s3://{BUCKET}/killed/wds"
    staging = tmp_path / "staging"
    command = _convert_and_kill(
        url, staging, lambda names: sum(n.endswith(".tar") for n in names) >= 3
    )
    command += ["--staging", str(staging)]
    folder = RemoteFolder(url)
    assert spec.MANIFEST_NAME not in folder.names()
    with pytest.raises(readers.DatasetError, match="incomplete dataset"):
        readers.open_dataset(url)
    resumed = subprocess.run(
        [*command, "--resume"], capture_output=True, text=True, timeout=120, check=False
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "kept" in resumed.stdout  # the uploaded, journaled shards were not redone
    m = readers.load_manifest(url)
    reference = local("wds")  # in shards of 10: the checksum does not depend on them
    assert m.content_sha256 == readers.load_manifest(reference).content_sha256
    assert not (tmp_path / "staging").exists()
    _assert_same_samples(readers.open_dataset(url), readers.open_dataset(reference))


def test_a_conversion_resumes_on_another_machine_keeping_the_uploaded_shards(
    s3_server, local, tmp_path
):
    url = f"s3://{BUCKET}/elsewhere/wds"

    def four_journaled(names: list[str]) -> bool:
        return sum(n.startswith(ENTRY_PREFIX) for n in names) >= 4

    command = _convert_and_kill(url, tmp_path / "a", four_journaled)
    folder = RemoteFolder(url)
    shutil.rmtree(tmp_path / "a")  # that machine, and its disk, are gone
    journaled = sorted(
        n.removeprefix(ENTRY_PREFIX).removesuffix(".json")
        for n in folder.names()
        if n.startswith(ENTRY_PREFIX)
    )

    def modified(name: str) -> object:
        folder.fs.invalidate_cache()  # not a listing cached before
        return folder.fs.info(folder.path(name))["LastModified"]

    uploaded = {name: modified(name) for name in journaled}
    # The last journaled shard changed in the bucket since, at its size: it is redone.
    changed = journaled[-1]
    data = bytearray(folder.read(changed))
    data[-1] ^= 0xFF
    folder.fs.pipe(folder.path(changed), bytes(data))
    time.sleep(1.1)  # the store's modification times have 1 s resolution: a re-upload shows
    resumed = subprocess.run(
        [*command, "--staging", str(tmp_path / "b"), "--resume"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    kept = len(journaled) - 1
    assert f"(kept {kept} from the interrupted run)" in resumed.stdout  # one sample a shard
    assert all(modified(name) == uploaded[name] for name in journaled[:-1])  # not uploaded again
    assert modified(changed) > uploaded[changed]
    assert not any(n.startswith(ENTRY_PREFIX) or n == spec.JOURNAL_NAME for n in folder.names())
    reference = local("wds")
    assert (
        readers.load_manifest(url).content_sha256 == readers.load_manifest(reference).content_sha256
    )
    _assert_same_samples(readers.open_dataset(url), readers.open_dataset(reference))


def test_cli_info_and_verify_take_urls_and_refuse_to_overwrite(s3_server, tmp_path):
    url = f"s3://{BUCKET}/cli/lmdb"
    runner = CliRunner()
    args = ["convert", str(SAMPLE_DATA), url, "--format", "lmdb", "--workers", "2"]
    done = runner.invoke(main, args)
    assert done.exit_code == 0, done.output
    assert f"-> {url}" in done.output
    again = runner.invoke(main, args)
    assert again.exit_code == 1 and "not empty (holds a dataset)" in again.output
    info = runner.invoke(main, ["info", url])
    assert info.exit_code == 0 and f"dataset    {url}" in info.output
    verify = runner.invoke(main, ["verify", url, "--deep"])
    assert verify.exit_code == 0, verify.output
    assert "OK: 32 samples" in verify.output
    overwritten = runner.invoke(main, [*args, "--overwrite"])
    assert overwritten.exit_code == 0, overwritten.output


def test_a_shard_changed_in_the_bucket_is_reported_not_read(s3_server, tmp_path):
    url = f"s3://{BUCKET}/damaged/pt"
    convert_folder(SAMPLE_DATA, url, _options("pt"), workers=2, progress=False)
    folder = RemoteFolder(url)
    data = bytearray(folder.read("shard-000001.pt"))
    data[-100] ^= 0xFF
    folder.fs.pipe(folder.path("shard-000001.pt"), bytes(data))
    ds = readers.open_dataset(url, cache_dir=tmp_path / "cache")
    ds[0]  # shard 0 is intact
    with pytest.raises(readers.DatasetError, match=r"shard-000001\.pt: SHA-256 differs"):
        ds[15]
    assert not list((tmp_path / "cache").rglob("shard-000001.pt"))  # nothing torn kept


def test_unknown_schemes_and_missing_datasets_are_clear_errors(s3_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        main, ["convert", str(SAMPLE_DATA), "nosuch://bucket/x", "--format", "pt"]
    )
    assert result.exit_code == 1
    assert "unknown storage scheme 'nosuch'" in result.output
    assert not list(tmp_path.iterdir())  # no folder named "nosuch:"
    with pytest.raises(ValueError, match="unknown storage scheme"):
        readers.open_dataset("nosuch://bucket/x")
    with pytest.raises(readers.DatasetError, match="no such dataset"):
        readers.open_dataset(f"s3://{BUCKET}/never-written")


def test_the_cache_stays_under_its_limit_and_shares_files_safely(s3_server, tmp_path):
    url = f"s3://{BUCKET}/cache/pt"
    convert_folder(SAMPLE_DATA, url, _options("pt"), workers=2, progress=False)
    manifest = readers.load_manifest(url)
    largest = max(s.bytes for s in manifest.shards)
    cache = tmp_path / "cache"
    ds = readers.open_dataset(url, cache_dir=cache, cache_limit=largest + 1)
    for i in range(len(ds)):
        ds[i]  # every shard in turn: each new one evicts the one before
    files = [p for p in cache.rglob("shard-*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= largest + 1
    assert [p.name for p in files] == ["shard-000003.pt"]  # the most recently used
    # Several processes filling one cache at once: every file complete, none torn.
    fresh = tmp_path / "shared"
    code = (
        "import readers, sys; ds = readers.open_dataset(sys.argv[1], cache_dir=sys.argv[2]); "
        "[ds[i] for i in range(len(ds))]"
    )
    runs = [
        subprocess.Popen([sys.executable, "-c", code, url, str(fresh)], stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    for run in runs:
        assert run.wait(timeout=120) == 0, run.stderr.read()
        run.stderr.close()
    cached = ShardCache(fresh).mirror(url)
    assert sorted(p.name for p in cached.iterdir()) == [s.path for s in manifest.shards]
    _assert_same_samples(readers.open_dataset(url, cache_dir=fresh), ds)


def test_bench_measures_a_dataset_in_the_bucket(s3_server, tmp_path):
    url = f"s3://{BUCKET}/bench/wds"
    convert_folder(SAMPLE_DATA, url, _options("wds"), workers=2, progress=False)
    report = tmp_path / "bench.json"
    args = ["bench", url, "--samples", "20", "--workers", "0", "--repeats", "1"]
    result = CliRunner().invoke(main, [*args, "--seconds", "0.1", "--json", str(report)])
    assert result.exit_code == 0, result.output
    assert "wds (wds) stream" in result.output
    missing = CliRunner().invoke(main, ["bench", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def _windows_times_shards(url: str, rank: int, world: int, batch: int, buffer: int) -> int:
    """Requests if rank ``rank`` reads each read window once: per window of its slice, one
    merged request per shard its samples there lie in (tiny samples: gaps < 1 MiB)."""
    manifest = readers.load_manifest(url)
    stream = readers.WdsStream(
        url, shuffle_buffer=buffer, seed=3, batch_size=batch, rank=rank, world_size=world
    )
    ((lo, hi),) = stream.split().rank_ranges(rank)
    shard_of = np.repeat(np.arange(len(manifest.shards)), [s.samples for s in manifest.shards])
    order = BlockOrder(tuple(s.samples for s in manifest.shards), 3, 0, buffer)
    window = stream.read_window
    cuts = sorted({lo, hi, *range(lo - lo % window + window, hi, window)})
    return sum(
        len({int(shard_of[i]) for c in order.chunks(a, b) for i in order.indices(*c)})
        for a, b in pairwise(cuts)
    )


def test_wds_stream_fetches_each_read_window_once_per_rank_with_two_workers(s3_server, tmp_path):
    source = tmp_path / "tiles"
    for i in range(2400):  # 2 ranks x 1,200: each rank's slice spans two read windows
        folder = source / f"class{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (i % 256, i // 256, 7)).save(folder / f"{i:05d}.png")
    url = f"s3://{BUCKET}/requests/wds"
    options = ConvertOptions("wds", shard_size=300, shuffle=True)
    convert_folder(source, url, options, workers=2, progress=False)
    server = s3_server
    seen = 0
    for rank in range(2):
        loader = readers.make_loader(
            url,
            8,
            stream=True,
            shuffle_buffer=250,
            seed=3,
            num_workers=2,
            rank=rank,
            world_size=2,
            multiprocessing_context="fork",
            decode=False,
        )
        before = server.tar_gets(url)
        seen += sum(len(labels) for _, labels in loader)
        got = server.tar_gets(url) - before
        expected = _windows_times_shards(url, rank, 2, 8, 250)
        print(f"rank {rank}: {got} tar GETs for the epoch, {expected} windows x shards")
        assert got == expected, rank
    assert seen == 2400
