"""The manifest ``imgpack.json``: what a conversion writes, and what readers refuse."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

import readers
from readers import spec
from readers.manifest import Manifest, json_text, load_manifest

SAMPLE_CLASSES = ["nature", "people", "scenes", "space"]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(root: Path) -> dict:
    return json.loads((root / spec.MANIFEST_NAME).read_text(encoding="utf-8"))


# --- what a conversion writes ---------------------------------------------------------------
def test_manifest_of_a_fixed_size_raw_pt_conversion_describes_it(converted):
    root = converted("pt", "raw-fixed")  # raw, resize 72, center-crop 64
    m = read_manifest(root)
    assert m["format"] == "pt"
    assert m["format_version"] == spec.FORMAT_VERSION
    assert m["imgpack_version"] == readers.__version__
    assert m["encoding"] == "raw"
    assert m["shape"] == [64, 64, 3]
    assert m["dtype"] == "uint8"
    assert m["classes"] == SAMPLE_CLASSES
    assert m["samples_per_class"] == dict.fromkeys(SAMPLE_CLASSES, 8)
    assert m["written"] == 32
    assert m["num_samples"] == 32
    assert m["skipped"] == 0
    assert "errors_file" not in m
    assert not (root / "errors.jsonl").exists()
    options = m["options"]
    assert options["format"] == "pt"
    assert options["encoding"] == "raw"
    assert options["resize"] == 72
    assert options["center_crop"] == 64
    assert options["shuffle"] is False
    digest = m["content_sha256"]
    assert isinstance(digest, str) and len(digest) == 64
    int(digest, 16)


def test_manifest_shards_match_the_files_on_disk(converted):
    root = converted("pt", "raw-fixed")
    shards = read_manifest(root)["shards"]
    assert shards, "no shard listed"
    assert sum(s["samples"] for s in shards) == 32
    for s in shards:
        assert set(s) >= {"path", "samples", "bytes", "sha256"}
        path = root / s["path"]
        assert path.is_file(), s["path"]
        assert path.parent == root
        assert s["bytes"] == path.stat().st_size
        assert s["sha256"] == sha256_of(path)
    # Nothing half-written is left behind.
    assert not [p.name for p in root.iterdir() if p.name.startswith(spec.TMP_PREFIX)]


@pytest.mark.parametrize("fmt", ["hdf5", "wds"])
def test_shard_checksums_match_for_other_formats_too(converted, fmt):
    root = converted(fmt, "jpeg")
    for s in read_manifest(root)["shards"]:
        path = root / s["path"]
        assert s["bytes"] == path.stat().st_size
        assert s["sha256"] == sha256_of(path)


def test_raw_without_crop_records_a_variable_shape(converted):
    m = read_manifest(converted("pt", "raw-variable"))
    assert m["shape"] == "variable"
    assert m["encoding"] == "raw"
    assert m["options"]["resize"] == 48
    assert m["options"]["center_crop"] is None


def test_load_manifest_returns_the_parsed_manifest(converted):
    root = converted("pt", "raw-fixed")
    manifest = readers.load_manifest(root)
    assert manifest.format == "pt"
    assert manifest.encoding == "raw"
    assert manifest.shape == (64, 64, 3)
    assert manifest.classes == tuple(SAMPLE_CLASSES)
    assert manifest.num_samples == 32
    assert manifest.to_json() == read_manifest(root)
    assert manifest.shard_path(0) == root / manifest.shards[0].path


# --- what load_manifest refuses -------------------------------------------------------------
@pytest.fixture
def dataset_copy(converted, tmp_path) -> Path:
    """A private copy of a 4-shard pt dataset (jpeg, 10 samples per shard) to damage."""
    dst = tmp_path / "ds"
    shutil.copytree(converted("pt", "jpeg", shard_size=10), dst)
    return dst


def write_manifest(root: Path, manifest: dict) -> None:
    (root / spec.MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")


def test_folder_without_manifest_is_not_an_imgpack_dataset(tmp_path):
    (tmp_path / "holiday.jpg").write_bytes(b"x")
    with pytest.raises(readers.DatasetError, match="not an imgpack dataset") as info:
        readers.load_manifest(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_empty_folder_is_not_an_imgpack_dataset(tmp_path):
    with pytest.raises(readers.DatasetError, match="not an imgpack dataset"):
        readers.load_manifest(tmp_path)


def test_missing_folder_is_refused_naming_it(tmp_path):
    with pytest.raises(readers.DatasetError, match="nowhere"):
        readers.load_manifest(tmp_path / "nowhere")


def test_shards_without_manifest_are_an_incomplete_conversion(dataset_copy):
    (dataset_copy / spec.MANIFEST_NAME).unlink()
    with pytest.raises(readers.DatasetError, match="incomplete conversion") as info:
        readers.load_manifest(dataset_copy)
    assert str(dataset_copy) in str(info.value)


def test_temporary_files_without_manifest_are_an_incomplete_conversion(tmp_path):
    (tmp_path / (spec.TMP_PREFIX + "shard-000000.pt")).write_bytes(b"partial")
    with pytest.raises(readers.DatasetError, match="incomplete conversion"):
        readers.load_manifest(tmp_path)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"format": "pt", ', id="truncated-json"),
        pytest.param("", id="empty-file"),
        pytest.param("[1, 2, 3]", id="not-an-object"),
    ],
)
def test_invalid_manifest_json_is_refused_naming_the_file(dataset_copy, text):
    (dataset_copy / spec.MANIFEST_NAME).write_text(text, encoding="utf-8")
    with pytest.raises(readers.DatasetError) as info:
        readers.load_manifest(dataset_copy)
    assert str(dataset_copy / spec.MANIFEST_NAME) in str(info.value)


def test_manifest_that_is_not_utf8_is_refused(dataset_copy):
    (dataset_copy / spec.MANIFEST_NAME).write_bytes(b'{"format": "\xff\xfe"}')
    with pytest.raises(readers.DatasetError, match=r"imgpack\.json"):
        readers.load_manifest(dataset_copy)


# Each case: (change to the manifest, pattern the message must contain).
BAD_MANIFESTS = {
    "newer-version": (
        lambda m: m.update(format_version=spec.FORMAT_VERSION + 1),
        "newer",
    ),
    "version-missing": (lambda m: m.pop("format_version"), "format_version"),
    "version-zero": (lambda m: m.update(format_version=0), "format_version"),
    "unknown-format": (lambda m: m.update(format="parquet"), "unknown format 'parquet'"),
    "unknown-encoding": (lambda m: m.update(encoding="avif"), "unknown encoding 'avif'"),
    "parent-path": (
        lambda m: m["shards"][1].update(path="../../etc/passwd"),
        r"shard 1: path '\.\./\.\./etc/passwd'",
    ),
    "absolute-path": (
        lambda m: m["shards"][0].update(path="/etc/passwd"),
        r"shard 0: path '/etc/passwd'",
    ),
    "dotdot-inside-path": (
        lambda m: m["shards"][0].update(path="sub/../../x.pt"),
        "is not a file inside the dataset folder",
    ),
    "empty-path": (
        lambda m: m["shards"][0].update(path=""),
        "is not a file inside the dataset folder",
    ),
    "shape-four-channels": (lambda m: m.update(shape=[64, 64, 4]), "invalid shape"),
    "shape-two-dims": (lambda m: m.update(shape=[64, 64]), "invalid shape"),
    "shape-zero": (lambda m: m.update(shape=[0, 64, 3]), "invalid shape"),
    "shape-string": (lambda m: m.update(shape="64x64x3"), "invalid shape"),
    "negative-samples": (
        lambda m: m["shards"][2].update(samples=-1),
        "shard 2: invalid sample count -1",
    ),
    "negative-bytes": (lambda m: m["shards"][0].update(bytes=-5), "invalid byte size"),
    "shard-missing-field": (lambda m: m["shards"][0].pop("sha256"), "missing field"),
    "classes-not-strings": (lambda m: m.update(classes=[1, 2]), "classes"),
    "shards-not-a-list": (lambda m: m.update(shards={"path": "x"}), "shards must be a list"),
    "sha256-not-hex": (lambda m: m["shards"][0].update(sha256="x" * 64), "invalid sha256"),
    "sidecar-leaves-the-folder": (
        lambda m: m["shards"][0].update(sidecars={"/../../etc/x": "0" * 64}),
        "is not a file inside the dataset folder",
    ),
    "count-negative": (lambda m: m.update(num_samples=-3), "invalid num_samples -3"),
    "count-a-string": (lambda m: m.update(skipped="none"), "invalid skipped 'none'"),
    "per-class-a-list": (lambda m: m.update(samples_per_class=[8, 8]), "samples_per_class"),
    "content-checksum-short": (lambda m: m.update(content_sha256="abc"), "invalid content_sha256"),
}


@pytest.mark.parametrize("case", BAD_MANIFESTS)
def test_invalid_manifest_content_is_refused_naming_the_file(dataset_copy, case):
    change, pattern = BAD_MANIFESTS[case]
    manifest = read_manifest(dataset_copy)
    change(manifest)
    write_manifest(dataset_copy, manifest)
    with pytest.raises(readers.DatasetError, match=pattern) as info:
        readers.load_manifest(dataset_copy)
    assert str(dataset_copy / spec.MANIFEST_NAME) in str(info.value)
    # Every reader refuses it the same way, before touching a shard.
    with pytest.raises(readers.DatasetError, match=pattern):
        readers.open_dataset(dataset_copy)


def test_dataset_error_is_a_value_error():
    # Callers catching ValueError (as the CLI does for conversions) also catch these.
    assert issubclass(readers.DatasetError, ValueError)


# --- reading with a damaged or mismatched dataset -------------------------------------------
def test_missing_shard_fails_naming_it_only_when_read(dataset_copy):
    shards = read_manifest(dataset_copy)["shards"]
    assert [s["samples"] for s in shards] == [10, 10, 10, 2]
    (dataset_copy / shards[1]["path"]).unlink()
    ds = readers.open_dataset(dataset_copy)  # opening reads only the manifest
    assert len(ds) == 32
    image, label = ds[0]  # shard 0 is intact
    assert image.shape[0] == 3
    assert label == 0
    ds[25]  # and so is shard 2
    with pytest.raises(readers.DatasetError, match=shards[1]["path"]) as info:
        ds[15]
    assert "missing" in str(info.value)


@pytest.mark.parametrize("fmt", ["pt", "hdf5"])
def test_index_out_of_range_raises_index_error_naming_the_index(converted, fmt):
    ds = readers.open_dataset(converted(fmt, "jpeg"))
    n = len(ds)
    assert n == 32
    ds[-1]  # negative indices count from the end, like a list
    with pytest.raises(IndexError, match=rf"\b{n}\b"):
        ds[n]
    with pytest.raises(IndexError, match=r"\b1000\b"):
        ds[1000]


def test_negative_index_out_of_range_names_the_index_given(converted):
    ds = readers.open_dataset(converted("pt", "jpeg"))
    with pytest.raises(IndexError) as info:
        ds[-33]
    # The message must name the index the caller passed, not -33 + len(ds).
    assert "-33" in str(info.value), str(info.value)


def test_iterating_a_dataset_stops_at_its_length(converted):
    ds = readers.open_dataset(converted("pt", "raw-fixed"))
    assert sum(1 for _ in ds) == 32


def test_format_reader_refuses_another_format_pointing_to_open_dataset(converted):
    root = converted("hdf5", "jpeg")
    with pytest.raises(readers.DatasetError, match="open_dataset") as info:
        readers.PtDataset(root)
    assert "hdf5" in str(info.value)
    assert isinstance(readers.open_dataset(root), readers.Hdf5Dataset)


def test_wds_stream_refuses_a_pt_dataset(converted):
    with pytest.raises(readers.DatasetError, match="open_dataset"):
        readers.WdsStream(converted("pt", "jpeg"))


class _WritesAFile:
    """A pickle payload that would create a file when unpickled."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_pt_shard_carrying_a_pickle_payload_is_refused_without_running_it(
    converted, tmp_path
) -> None:
    root = tmp_path / "hostile"
    shutil.copytree(converted("pt", "jpeg"), root)
    target = tmp_path / "payload-ran"
    shard = root / spec.shard_name("pt", 0)
    tensors = torch.load(shard, weights_only=True)
    torch.save({**tensors, "extra": _WritesAFile(str(target))}, shard)
    # A consistent manifest, so that the weights-only unpickler is what refuses it (not
    # the size check before opening).
    manifest = json.loads((root / spec.MANIFEST_NAME).read_text())
    manifest["shards"][0]["bytes"] = shard.stat().st_size
    (root / spec.MANIFEST_NAME).write_text(json.dumps(manifest))
    ds = readers.open_dataset(root)
    with pytest.raises(readers.DatasetError, match=r"shard-000000\.pt.*(?i:weights.only|unpickl)"):
        ds[0]
    assert not target.exists()


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_manifests_round_trip_through_the_typed_manifest_unchanged(converted, fmt):
    root = converted(fmt, "jpeg")
    on_disk = (root / spec.MANIFEST_NAME).read_text(encoding="utf-8")
    manifest = load_manifest(root)
    assert Manifest.from_json(root, manifest.to_json()) == manifest
    assert manifest.to_json() == json.loads(on_disk)
    assert json_text(manifest.to_json(), indent=1) == on_disk  # the same bytes
    assert manifest.written == manifest.recorded_samples == manifest.num_samples == 32
    assert manifest.options["format"] == fmt and manifest.converted_with["workers"] == 1
