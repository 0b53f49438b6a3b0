"""Datasets as conversion sources: ``imgpack convert DATASET DST`` for an imgpack dataset of
any format, local or at a URL (``convert.sources``).

Real conversions of ``sample_data/`` in the directions that matter: folder -> A -> B against
folder -> B (same pixels within the tolerance, same labels, class names and source paths),
``raw`` -> ``raw`` with no geometry change (the same content checksum), re-sharding and
``--shuffle``, a damaged sample under ``--on-error``, a source on the loopback S3 server and
a dataset-to-dataset conversion killed by SIGKILL and resumed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import readers
from convert import ConvertOptions, convert_folder
from convert.cli import main
from readers import spec
from tests.conftest import SAMPLE_DATA
from tests.photos import photo_folder
from tests.test_interrupted import wait_for_shards
from tests.test_object_storage import BUCKET, s3_server  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parent.parent
RAW = {"encoding": "raw", "resize": 72, "center_crop": 64, "exact_resize": True}


def convert(src: Path | str, dst: Path | str, fmt: str, **options: object):
    return convert_folder(src, dst, ConvertOptions(fmt, **options), workers=2, progress=False)


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


@pytest.fixture(scope="module")
def raw_pt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sample_data as fixed-size raw pixels in ``pt``: the source most tests convert."""
    dst = tmp_path_factory.mktemp("raw-pt") / "dst"
    convert(SAMPLE_DATA, dst, "pt", **RAW)
    return dst


def test_raw_to_raw_without_geometry_keeps_the_content_checksum(raw_pt, tmp_path):
    for fmt in ("wds", "hdf5", "lmdb"):
        out = tmp_path / fmt
        result = convert(raw_pt, out, fmt, encoding="raw", shard_size=10)
        assert result.written == 32 and result.skipped == 0
        a, b = readers.load_manifest(raw_pt), readers.load_manifest(out)
        assert b.content_sha256 == a.content_sha256, fmt
        assert b.classes == a.classes and b.samples_per_class == a.samples_per_class
        assert b.shape == (64, 64, 3)
        assert [s.samples for s in b.shards] == [10, 10, 10, 2]  # re-sharded
        assert b.source == {
            "kind": "imgpack",
            "location": str(raw_pt),
            "format": "pt",
            "encoding": "raw",
            "content_sha256": a.content_sha256,
        }
        src, ds = readers.open_dataset(raw_pt), readers.open_dataset(out)
        assert ds.samples == src.samples  # source paths and labels carried over
        for i in (0, 17, 31):
            assert np.array_equal(ds.stored(i), src.stored(i))


def test_folder_to_a_to_b_matches_folder_to_b(tmp_path):
    # folder -> A -> raw hdf5 against folder -> raw hdf5 directly: A keeping the source
    # bytes gives the very pixels; A re-encoded as a q95 JPEG, pixels within a level or two
    direct = tmp_path / "direct"
    convert(SAMPLE_DATA, direct, "hdf5", **RAW)
    b = readers.open_dataset(direct)
    for encoding, tolerance in (("original", 0.0), ("jpeg", 3.0)):
        a_dir, via = tmp_path / encoding, tmp_path / f"via-{encoding}"
        convert(SAMPLE_DATA, a_dir, "lmdb", encoding=encoding, quality=95)
        convert(a_dir, via, "hdf5", **RAW)
        a = readers.open_dataset(via)
        assert a.samples == b.samples and a.classes == b.classes
        diffs = [mean_abs_diff(a.stored(i), b.stored(i)) for i in range(len(a))]
        assert max(diffs) <= tolerance, (encoding, max(diffs))
        assert readers.load_manifest(via).source["encoding"] == encoding


def test_raw_source_reencoded_as_jpeg_decodes_close_to_the_pixels(raw_pt, tmp_path):
    out = tmp_path / "jpeg"
    convert(raw_pt, out, "wds", encoding="jpeg", quality=95, shard_size=8)
    src, ds = readers.open_dataset(raw_pt), readers.open_dataset(out)
    assert readers.load_manifest(out).encoding == "jpeg"
    for i in range(len(src)):
        x, y = src[i], ds[i]
        assert x[1] == y[1]
        # a q95 JPEG of 64x64 photo crops, chroma subsampled: measured 3.5 levels at most
        assert mean_abs_diff(x[0].numpy(), y[0].numpy()) < 5.0


def test_shuffle_reorders_the_same_samples_reproducibly(raw_pt, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    convert(raw_pt, one, "pt", encoding="raw", shuffle=True, seed=7)
    convert(raw_pt, two, "pt", encoding="raw", shuffle=True, seed=7)
    src, ds = readers.open_dataset(raw_pt), readers.open_dataset(one)
    assert ds.samples != src.samples and sorted(ds.samples) == sorted(src.samples)
    assert readers.load_manifest(one).content_sha256 == readers.load_manifest(two).content_sha256
    where = {p: i for i, (p, _) in enumerate(src.samples)}
    for i, (path, _) in enumerate(ds.samples):
        assert np.array_equal(ds.stored(i), src.stored(where[path]))


def test_class_list_renumbers_the_labels_by_name(raw_pt, tmp_path):
    classes = ("space", "scenes", "people", "nature", "unused")
    out = tmp_path / "renumbered"
    convert(raw_pt, out, "pt", encoding="raw", classes=classes)
    src, ds = readers.open_dataset(raw_pt), readers.open_dataset(out)
    assert ds.classes == list(classes)
    for (path, old), (path2, new) in zip(src.samples, ds.samples, strict=True):
        assert path == path2 and src.classes[old] == ds.classes[new]
    with pytest.raises(ValueError, match="'nature' is not in the class list"):
        convert(raw_pt, tmp_path / "short", "pt", encoding="raw", classes=("space",))


def test_a_damaged_sample_is_skipped_by_its_source_path_or_stops_the_run(tmp_path):
    src = tmp_path / "wds"
    convert(SAMPLE_DATA, src, "wds", encoding="original")
    index = json.loads((src / f"shard-000000.tar{spec.WDS_INDEX_SUFFIX}").read_text())
    victim = 5
    tar = src / "shard-000000.tar"
    data = bytearray(tar.read_bytes())
    middle = index["offsets"][victim] + index["sizes"][victim] // 2
    data[middle : middle + 16] = bytes(16)  # the CRC recorded for it no longer matches
    tar.write_bytes(bytes(data))
    path = index["paths"][victim]
    out = tmp_path / "out"
    result = convert(src, out, "pt", encoding="jpeg", shard_size=10)
    assert result.written == 31 and result.skipped == 1
    [error] = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert error["path"] == path and path in error["error"] and "CRC" in error["error"]
    assert path not in [p for p, _ in readers.open_dataset(out).samples]
    failed = CliRunner().invoke(
        main, ["convert", str(src), str(tmp_path / "fail"), "--format", "pt", "--on-error", "fail"]
    )
    assert failed.exit_code == 1 and path in failed.output and "Traceback" not in failed.output


def test_cli_converts_a_dataset_and_refuses_what_does_not_apply(raw_pt, tmp_path):
    out = tmp_path / "cli"
    result = CliRunner().invoke(
        main, ["convert", str(raw_pt), str(out), "--format", "lmdb", "--encoding", "raw"]
    )
    assert result.exit_code == 0, result.output
    assert readers.load_manifest(out).content_sha256 == readers.load_manifest(raw_pt).content_sha256
    refusals = {
        ("--encoding", "original"): "stores raw pixels, which have no original bytes",
        ("--unlabeled",): "--unlabeled applies to image folders only",
    }
    for extra, message in refusals.items():
        refused = CliRunner().invoke(
            main, ["convert", str(raw_pt), str(tmp_path / "no"), "--format", "pt", *extra]
        )
        assert refused.exit_code == 1 and message in refused.output, refused.output
        assert not (tmp_path / "no").exists()
    itself = CliRunner().invoke(main, ["convert", str(raw_pt), str(raw_pt), "--format", "pt"])
    assert itself.exit_code == 1 and "DST is SRC itself" in itself.output


# --- a URL source -------------------------------------------------------------------------
@pytest.mark.usefixtures("s3_server")
def test_a_dataset_at_a_url_converts_like_the_same_dataset_at_home(raw_pt, tmp_path):
    url = f"s3://{BUCKET}/sources/raw-wds"
    convert(raw_pt, url, "wds", encoding="raw", shard_size=10)
    out = tmp_path / "from-url"
    convert(url, out, "pt", encoding="raw")
    manifest = readers.load_manifest(out)
    assert manifest.content_sha256 == readers.load_manifest(raw_pt).content_sha256
    assert manifest.source["location"] == url and manifest.source["format"] == "wds"
    missing = CliRunner().invoke(
        main, ["convert", f"s3://{BUCKET}/nothing", str(tmp_path / "no"), "--format", "pt"]
    )
    assert missing.exit_code == 1 and f"s3://{BUCKET}/nothing: no such dataset" in missing.output


# --- resume after SIGKILL -----------------------------------------------------------------
IMAGES, SHARD = 120, 10
ARGS = ["--format", "wds", "--encoding", "jpeg", "--resize", "128", "--shard-size", str(SHARD)]


def test_a_killed_dataset_conversion_resumes_to_the_uninterrupted_result(tmp_path):
    (tmp_path / "photos").mkdir()
    photos = photo_folder(tmp_path / "photos", IMAGES, 192, 256)
    src = tmp_path / "src"
    convert(photos, src, "pt", encoding="original")
    reference = tmp_path / "reference"
    convert(src, reference, "wds", encoding="jpeg", resize=128, shard_size=SHARD)
    dst = tmp_path / "dst"
    command = [sys.executable, "-m", "convert.cli", "convert", str(src), str(dst), *ARGS]
    command += ["--workers", "2"]
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_shards(process, dst, 2)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
        process.stderr.close()
    assert not (dst / spec.MANIFEST_NAME).exists()
    resumed = subprocess.run(
        [*command, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "kept" in resumed.stdout
    want, got = readers.load_manifest(reference), readers.load_manifest(dst)
    assert got.content_sha256 == want.content_sha256
    assert got.shards == want.shards  # the very same bytes, shard for shard
