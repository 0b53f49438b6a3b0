"""Fields of a dataset in object storage (a loopback S3 server, moto's): a remote ``wds``
tar read by byte ranges fetches a read window's field values of a shard in one round of
merged range requests, as it fetches the images, never one request a value; its
``metadata()`` and ``sizes`` read the tars' indexes and members, never a copy of a tar."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import readers
from readers.bucket_dataset import make_bucket_loader
from readers.epochs.buckets import AspectBuckets
from readers.formats import ShardReader, open_local_shard
from readers.manifest import Manifest
from readers.storage.remote import RemoteFolder
from scripts.s3_server import S3Server
from tests.test_fields_sources import CAPTIONS, PHOTOS, convert, img2dataset_shards
from tests.test_object_storage import BUCKET, s3_server  # noqa: F401 (the fixture)


def cached_tars(cache: Path) -> list[Path]:
    """The tars copied into the reader cache ``cache``."""
    return [p for p in cache.rglob("*") if p.is_file() and p.name.endswith(".tar")]


def remote_and_local(url: str, tmp_path: Path) -> tuple[Path, Path]:
    """Tars with a txt and a json member beside each image converted to ``wds`` at ``url``
    and, alike, into a local folder: 6 samples in 2 shards. That folder, and a reader cache
    folder for ``url`` (not made yet)."""
    src = img2dataset_shards(tmp_path / "src")
    local = tmp_path / "local"
    for dst in (url, local):
        convert(src, dst, "wds", on_error="fail", encoding="jpeg", resize=32, shard_size=4)
    return local, tmp_path / "cache"


@pytest.mark.filterwarnings("ignore:.* was converted without --shuffle:UserWarning")
def test_a_remote_tars_field_values_come_in_merged_range_requests(
    s3_server: S3Server,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
):
    url = f"s3://{BUCKET}/fields-ranges/wds"
    src = img2dataset_shards(tmp_path / "src")  # a txt and a json member beside each image
    convert(src, url, "wds", on_error="fail", encoding="jpeg", resize=32, shard_size=4)
    shards = len(readers.load_manifest(url).shards)
    assert shards == 2 and len(PHOTOS) == 6
    loader = readers.make_loader(
        url, 3, stream=True, shuffle=False, fields=("txt", "json"), num_workers=0, decode=False
    )
    before = s3_server.tar_gets(url)
    batches = list(loader)
    got = s3_server.tar_gets(url) - before
    # One read window: per shard one request for its images and one per text/json field
    # (a request a value would be 2 + 6 x 2 = 14).
    assert got == shards * (1 + 2), got
    captions = [caption for batch in batches for caption in batch[2]]
    assert sorted(captions) == sorted(CAPTIONS)
    scores = sorted(meta["score"] for batch in batches for meta in batch[3])
    assert scores == [0.25 + n for n in range(len(PHOTOS))]


def test_metadata_of_a_remote_tar_dataset_reads_ranges_and_copies_no_shard(
    s3_server: S3Server,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
):
    url = f"s3://{BUCKET}/fields-metadata/wds"
    local, cache = remote_and_local(url, tmp_path)
    ds = readers.open_dataset(url, cache_dir=cache)
    before = s3_server.tar_gets(url)
    table = ds.metadata()
    got = s3_server.tar_gets(url) - before
    assert got == 2 * 2  # per shard, one round of merged requests per text/json field
    assert not cached_tars(cache)
    assert table.equals(readers.open_dataset(local).metadata())
    assert sorted(table["txt"].to_pylist()) == sorted(CAPTIONS)


@pytest.mark.filterwarnings("ignore:.* was converted without --shuffle:UserWarning")
def test_sizes_of_a_remote_tar_dataset_come_from_its_indexes_and_copy_no_shard(
    s3_server: S3Server,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
):
    url = f"s3://{BUCKET}/fields-sizes/wds"
    local, cache = remote_and_local(url, tmp_path)
    before = s3_server.tar_gets(url)
    sizes = readers.open_dataset(url, cache_dir=cache).sizes
    assert s3_server.tar_gets(url) == before  # the sizes are in the indexes beside
    assert not cached_tars(cache)
    np.testing.assert_array_equal(sizes, readers.open_dataset(local).sizes)
    assert len(np.unique(sizes, axis=0)) > 2  # a dataset of several aspects
    # A bucketed loader plans its epoch from the sizes: made, it has copied no shard yet.
    buckets = AspectBuckets.around(area=32 * 32, step=8, max_ratio=2.5)
    loader = make_bucket_loader(url, 2, buckets, shuffle=False, num_workers=0, cache_dir=cache)
    assert s3_server.tar_gets(url) == before and not cached_tars(cache)
    served = [label for _, labels in loader for label in labels.tolist()]
    local_loader = make_bucket_loader(local, 2, buckets, shuffle=False, num_workers=0)
    assert served == [label for _, labels in local_loader for label in labels.tolist()]
    assert len(served) == len(PHOTOS)


OPENED: list[int] = []  # the shards counting_opener opened


def counting_opener(manifest: Manifest, index: int) -> ShardReader:
    """A user's opener: the default one, counted."""
    OPENED.append(index)
    return open_local_shard(manifest, index)


def test_sizes_and_metadata_of_a_remote_tar_dataset_go_through_the_opener_given(
    s3_server: S3Server,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
):
    # opener= is how every shard of the dataset opens: the sizes and the table too, not
    # the ranged reads the default opener allows
    url = f"s3://{BUCKET}/fields-opener/wds"
    local, cache = remote_and_local(url, tmp_path)
    OPENED.clear()
    ds = readers.open_dataset(url, cache_dir=cache, opener=counting_opener)
    np.testing.assert_array_equal(ds.sizes, readers.open_dataset(local).sizes)
    assert ds.metadata().equals(readers.open_dataset(local).metadata())
    assert OPENED == [0, 1]  # each shard once, kept open for both
    assert len(cached_tars(cache)) == 2


V1_WDS = Path(__file__).parent / "fixtures" / "v1" / "wds"  # written by imgpack 0.2.0


def test_sizes_of_a_remote_version_1_tar_dataset_come_from_one_copy_of_each_tar(
    s3_server: S3Server,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
):
    url = f"s3://{BUCKET}/fields-sizes/v1-wds"
    bucket = RemoteFolder(url)
    for path in sorted(V1_WDS.iterdir()):
        bucket.upload(path, path.name)
    cache = tmp_path / "cache"
    before = s3_server.tar_gets(url)
    ds = readers.open_dataset(url, cache_dir=cache)
    # No sizes recorded: the images' headers give them, from one copy of each tar (a range
    # request a sample would fetch the same bytes in many more requests).
    np.testing.assert_array_equal(ds.sizes, readers.open_dataset(V1_WDS).sizes)
    shards = len(ds.manifest.shards)
    assert s3_server.tar_gets(url) - before == shards
    assert len(cached_tars(cache)) == shards
    assert ds.metadata().equals(readers.open_dataset(V1_WDS).metadata())
    assert s3_server.tar_gets(url) - before == shards  # the table reads the copies
