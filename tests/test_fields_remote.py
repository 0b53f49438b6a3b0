"""Fields of a dataset in object storage (a loopback S3 server, moto's): a remote ``wds``
tar read by byte ranges fetches a read window's field values of a shard in one round of
merged range requests, as it fetches the images, never one request a value."""

from __future__ import annotations

from pathlib import Path

import pytest

import readers
from scripts.s3_server import S3Server
from tests.test_fields_sources import CAPTIONS, PHOTOS, convert, img2dataset_shards
from tests.test_object_storage import BUCKET, s3_server  # noqa: F401 (the fixture)


def tar_gets(server: S3Server, prefix: str) -> int:
    """The GETs of tars (byte ranges of images and field members; not their indexes)."""
    return sum(
        r.method == "GET" and r.target.startswith(prefix) and r.target.endswith(".tar")
        for r in server.requests()
    )


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
    prefix = f"/{url.removeprefix('s3://')}/"
    loader = readers.make_loader(
        url, 3, stream=True, shuffle=False, fields=("txt", "json"), num_workers=0, decode=False
    )
    before = tar_gets(s3_server, prefix)
    batches = list(loader)
    got = tar_gets(s3_server, prefix) - before
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
    src = img2dataset_shards(tmp_path / "src")
    convert(src, url, "wds", on_error="fail", encoding="jpeg", resize=32, shard_size=4)
    local = tmp_path / "local"
    convert(src, local, "wds", on_error="fail", encoding="jpeg", resize=32, shard_size=4)
    cache = tmp_path / "cache"
    ds = readers.open_dataset(url, cache_dir=cache)
    prefix = f"/{url.removeprefix('s3://')}/"
    before = tar_gets(s3_server, prefix)
    table = ds.metadata()
    got = tar_gets(s3_server, prefix) - before
    assert got == 2 * 2  # per shard, one round of merged requests per text/json field
    assert not [p for p in cache.rglob("*") if p.is_file() and p.name.endswith(".tar")]
    assert table.equals(readers.open_dataset(local).metadata())
    assert sorted(table["txt"].to_pylist()) == sorted(CAPTIONS)
