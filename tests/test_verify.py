"""``imgpack verify``: every kind of damage is caught, named, and turns the exit status to 1."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from convert.cli import main
from convert.verify import verify_dataset
from convert.writers.base import file_sha256
from readers import spec
from readers.manifest import load_manifest
from readers.storage.remote import RemoteFolder
from tests.conftest import ENCODING_CASES
from tests.test_object_storage import BUCKET, s3_server  # noqa: F401 (the fixture)


def verify(root: Path, *flags: str) -> Result:
    return CliRunner().invoke(main, ["verify", str(root), *flags])


@pytest.fixture
def dataset_copy(converted, tmp_path):
    """``dataset_copy(fmt, case)``: a private copy of a converted dataset, to damage."""

    def copy(fmt: str, case: str = "jpeg") -> Path:
        root = tmp_path / f"{fmt}-{case}"
        shutil.copytree(converted(fmt, case, shard_size=10), root)
        return root

    return copy


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x01]))


def edit_manifest(root: Path, change) -> None:
    path = root / spec.MANIFEST_NAME
    manifest = json.loads(path.read_text(encoding="utf-8"))
    change(manifest)
    path.write_text(json.dumps(manifest), encoding="utf-8")


def reseal(root: Path, shard: int) -> None:
    """Make the manifest agree with shard ``shard`` as it now is on disk (a writer bug, or
    a forger, that the file checksums alone cannot catch)."""
    path = root / spec.shard_name(load_manifest(root).format, shard)

    def change(manifest: dict) -> None:
        manifest["shards"][shard].update(bytes=path.stat().st_size, sha256=file_sha256(path))

    edit_manifest(root, change)


def assert_caught(result: Result, *patterns: str) -> None:
    assert result.exit_code == 1, result.output
    assert "problem(s) found" in result.output
    for pattern in patterns:
        assert pattern in result.output, result.output


@pytest.mark.parametrize("case", ENCODING_CASES)
@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_an_intact_dataset_verifies_quick_and_deep(converted, fmt, case):
    root = converted(fmt, case, shard_size=10)
    quick, deep = verify(root), verify(root, "--deep")
    assert quick.exit_code == 0, quick.output
    assert "OK: 32 samples in 4 shard(s)" in quick.output
    assert deep.exit_code == 0, deep.output
    assert "content checksum matches" in deep.output


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_one_flipped_byte_in_any_format_is_caught_naming_the_shard(dataset_copy, fmt):
    root = dataset_copy(fmt)
    shard = root / spec.shard_name(fmt, 2)
    flip_byte(shard, shard.stat().st_size // 2)
    assert_caught(verify(root), f"{shard}: SHA-256 does not match the manifest")


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_a_truncated_or_missing_shard_is_caught(dataset_copy, fmt):
    root = dataset_copy(fmt)
    truncated, missing = root / spec.shard_name(fmt, 1), root / spec.shard_name(fmt, 3)
    size = truncated.stat().st_size
    with open(truncated, "r+b") as f:
        f.truncate(size // 2)
    missing.unlink()
    assert_caught(
        verify(root, "--deep"),
        f"{truncated}: is {size // 2} bytes, the manifest says {size}",
        f"{missing}: missing",
    )


def test_a_damaged_wds_index_is_caught(dataset_copy):
    root = dataset_copy("wds")
    index = root / (spec.shard_name("wds", 0) + spec.WDS_INDEX_SUFFIX)
    index.write_text(index.read_text().replace('"offsets":[', '"offsets":[0,', 1))
    assert_caught(verify(root), f"{index}: SHA-256 does not match")


@pytest.mark.usefixtures("s3_server")
def test_each_damaged_object_in_a_bucket_is_named_once_by_its_url(converted):
    url = f"s3://{BUCKET}/verify/pt"
    bucket = RemoteFolder(url)
    for path in sorted(converted("pt", "jpeg", shard_size=10).iterdir()):
        bucket.upload(path, path.name)
    deleted, truncated, changed = (spec.shard_name("pt", k) for k in (1, 2, 3))
    bucket.delete([deleted])
    size = len(bucket.read(truncated))
    bucket.write(truncated, bucket.read(truncated)[:100])
    data = bytearray(bucket.read(changed))
    data[len(data) // 2] ^= 0x01
    bucket.write(changed, bytes(data))
    result = verify(url)
    assert_caught(result)
    lines = result.output.splitlines()
    assert lines[:2] == [
        f"{url}/{deleted}: missing",
        f"{url}/{truncated}: is 100 bytes, the manifest says {size}: truncated?",
    ]
    assert lines[2].startswith(f"{url}/{changed}: SHA-256 differs from the manifest's")
    assert lines[3] == f"Error: 3 problem(s) found in {url}"


def test_deep_catches_changed_pixels_the_file_checksums_cannot(dataset_copy):
    root = dataset_copy("pt", "raw-fixed")
    shard = root / spec.shard_name("pt", 0)
    flip_byte(shard, shard.stat().st_size // 2)  # inside the pixels of some sample
    reseal(root, 0)
    assert verify(root).exit_code == 0
    assert_caught(verify(root, "--deep"), "content_sha256 does not match")


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_deep_names_a_sample_that_does_not_decode(dataset_copy, fmt):
    root = dataset_copy(fmt, "jpeg")
    shard = root / spec.shard_name(fmt, 1)
    # Overwrite the start of one stored JPEG (sample 3 of shard 1, found by its bytes).
    data = shard.read_bytes()
    starts = [i for i in range(len(data) - 3) if data[i : i + 4] == b"\xff\xd8\xff\xe0"]
    with open(shard, "r+b") as f:
        f.seek(starts[3])
        f.write(b"\x00" * 16)
    reseal(root, 1)
    assert verify(root).exit_code == 0
    # The reader's CRC-32 of the sample fails before any decode (readers.formats.checks).
    deep = verify(root, "--deep")
    assert_caught(deep, f"{shard}[3] (sample 13): stored bytes fail their CRC-32")
    assert deep.output.count(f"{shard}[3]") == 1  # named once, not by verify and the reader


def test_counts_that_disagree_with_the_shards_are_caught(dataset_copy):
    root = dataset_copy("lmdb")

    def change(manifest: dict) -> None:
        manifest["num_samples"] = 33
        manifest["samples_per_class"]["nature"] += 1

    edit_manifest(root, change)
    assert_caught(verify(root), "num_samples 33 != 32", "class 'nature': 8 samples")


def test_a_folder_that_is_not_a_dataset_fails_verification(tmp_path):
    result = verify(tmp_path)
    assert_caught(result)
    assert result.output.splitlines()[0] == f"{tmp_path}: not an imgpack dataset (no imgpack.json)"


def test_verify_dataset_reports_every_problem_without_raising(dataset_copy):
    root = dataset_copy("hdf5")
    for k in (0, 2):
        shard = root / spec.shard_name("hdf5", k)
        flip_byte(shard, shard.stat().st_size - 100)
    report = verify_dataset(root, deep=True, progress=False)
    assert not report.ok
    assert [p.where for p in report.problems] == [
        str(root / spec.shard_name("hdf5", 0)),
        str(root / spec.shard_name("hdf5", 2)),
    ]
    assert report.samples == 10 + 2  # the intact shards 1 and 3 were still checked
