"""``imgpack diff`` and ``imgpack inspect`` on real conversions of ``sample_data/``.

``diff`` must call two datasets of different formats and encodings equivalent when they hold
the same images (within the tolerance), answer from equal content checksums without
decoding a sample but only for shards of the size and SHA-256 their manifests record (a
damaged copy, local or in S3, is exit 2 naming its shards), and name each difference: a
changed label, a changed image (the worst list holds only samples that differ), a missing
sample, classes only one side has or in another order; exit 0/1/2. ``inspect`` must
summarize from the manifest and draw a contact sheet whose size and tiles are those asked
for.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

import readers
from convert import ConvertOptions, convert_folder
from convert.cli import main
from convert.diff import DEFAULT_TOLERANCE, DiffReport, diff_datasets
from convert.inspection import GAP, LABEL_HEIGHT, contact_sheet, summarize
from readers import spec
from readers.storage.remote import RemoteFolder
from tests.conftest import SAMPLE_DATA
from tests.test_object_storage import BUCKET, s3_server  # noqa: F401 (the fixture)
from tests.test_verify import flip_byte, reseal

GEOMETRY = {"resize": 72, "center_crop": 64, "exact_resize": True}
CHANGED_LABEL, CHANGED_IMAGE, MISSING = (
    "scenes/china_01.jpg",
    "space/rocket_02.jpg",
    "nature/flower_02.jpg",
)


def convert(src: Path, dst: Path, fmt: str, *args: str, **options: object) -> Path:
    convert_folder(src, dst, ConvertOptions(fmt, **options), workers=1, progress=False)
    return dst


def invoke(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """sample_data as raw pt and as q90 JPEG wds of the same geometry; the raw one converted
    again to raw hdf5; and a tampered copy: one label, one image changed, one sample gone."""
    root = tmp_path_factory.mktemp("diff")
    raw = convert(SAMPLE_DATA, root / "raw", "pt", encoding="raw", **GEOMETRY)
    jpeg = convert(SAMPLE_DATA, root / "jpeg", "wds", encoding="jpeg", shard_size=10, **GEOMETRY)
    again = convert(raw, root / "again", "hdf5", encoding="raw")
    folder = root / "tampered-src"
    shutil.copytree(SAMPLE_DATA, folder)
    (folder / MISSING).unlink()
    shutil.copy(folder / "people/astronaut_00.jpg", folder / CHANGED_IMAGE)
    paths = [str(p.relative_to(folder)) for p in sorted(folder.rglob("*.*")) if p.suffix != ".md"]
    rows = [f"{p},{'space' if p == CHANGED_LABEL else p.split('/')[0]}" for p in paths]
    labels = root / "labels.csv"
    labels.write_text("\n".join(rows) + "\n")
    tampered = convert(
        folder, root / "tampered", "lmdb", encoding="raw", labels_file=str(labels), **GEOMETRY
    )
    return {"raw": raw, "jpeg": jpeg, "again": again, "tampered": tampered}


def test_the_same_images_in_other_formats_and_encodings_are_equivalent(datasets):
    report = diff_datasets(datasets["raw"], datasets["jpeg"])
    assert report.equivalent and not report.checksum_match
    assert report.matched == report.compared == 32 and report.over_tolerance == 0
    assert 0 < report.max_diff <= DEFAULT_TOLERANCE
    assert report.worst[0].mean_abs_diff == report.max_diff
    strict = diff_datasets(datasets["raw"], datasets["jpeg"], tolerance=0.5)
    assert not strict.equivalent and strict.over_tolerance > 0
    result = invoke("diff", datasets["jpeg"], datasets["raw"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("EQUIVALENT")


def test_equal_checksums_answer_only_for_shards_that_match_their_manifest(datasets, tmp_path):
    copy = tmp_path / "again"
    shutil.copytree(datasets["again"], copy)
    shard = copy / spec.shard_name("hdf5", 0)
    flip_byte(shard, shard.stat().st_size // 2)
    damaged = invoke("diff", datasets["raw"], copy)
    assert damaged.exit_code == 2, damaged.output
    assert damaged.output.startswith(f"Error: {shard}: SHA-256 does not match the manifest")
    assert len(damaged.output.splitlines()) == 1
    reseal(copy, 0)  # the manifest now vouches for the changed shard: only a decode could tell
    report = diff_datasets(datasets["raw"], copy)
    assert report.checksum_match and report.equivalent and report.matched == 32
    result = invoke("diff", datasets["raw"], copy)
    assert result.exit_code == 0 and "content checksums are equal" in result.output


@pytest.mark.usefixtures("s3_server")
def test_an_s3_copy_with_a_shard_deleted_and_another_truncated_is_exit_2_naming_both(datasets):
    url = f"s3://{BUCKET}/diff/jpeg"
    bucket = RemoteFolder(url)
    for path in sorted(datasets["jpeg"].iterdir()):
        bucket.upload(path, path.name)
    intact = invoke("diff", datasets["jpeg"], url)  # which also fills the reader cache
    assert intact.exit_code == 0 and "content checksums are equal" in intact.output
    deleted, truncated = spec.shard_name("wds", 1), spec.shard_name("wds", 2)
    bucket.delete([deleted])
    data = bucket.read(truncated)
    bucket.write(truncated, data[: len(data) // 2])
    result = invoke("diff", datasets["jpeg"], url)
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"Error: {url}/{deleted}: missing; {url}/{truncated}: is ")
    assert f"is {len(data) // 2} bytes, the manifest says {len(data)}" in result.output
    assert len(result.output.splitlines()) == 1


def test_diff_names_a_changed_label_a_changed_image_and_a_missing_sample(datasets):
    report = diff_datasets(datasets["raw"], datasets["tampered"])
    assert not report.equivalent and report.same_classes
    assert report.only_in_a == [MISSING] and report.only_in_b == []
    assert report.label_mismatches == [{"path": CHANGED_LABEL, "a": "scenes", "b": "space"}]
    assert report.over_tolerance == 1 and report.worst[0].path == CHANGED_IMAGE
    assert report.worst[0].mean_abs_diff > 4 * DEFAULT_TOLERANCE
    assert report.identical == 30  # raw against raw of the same geometry: the very pixels
    assert [w.path for w in report.worst] == [CHANGED_IMAGE]  # only samples that differ
    result = invoke("diff", datasets["raw"], datasets["tampered"])
    assert result.exit_code == 1
    for name in (MISSING, CHANGED_LABEL, CHANGED_IMAGE):
        assert name in result.output
    assert result.output.rstrip().endswith(f"worst:\n  {CHANGED_IMAGE}  {report.max_diff:.2f}")
    as_json = json.loads(invoke("diff", datasets["raw"], datasets["tampered"], "--json").output)
    assert as_json["equivalent"] is False and as_json["only_in_a"] == [MISSING]
    assert as_json["worst"][0]["path"] == CHANGED_IMAGE


def test_by_index_matches_by_position(datasets, tmp_path):
    shuffled = convert(datasets["raw"], tmp_path / "shuffled", "pt", encoding="raw", shuffle=True)
    assert diff_datasets(datasets["raw"], shuffled).equivalent  # by path: the same samples
    by_index = diff_datasets(datasets["raw"], shuffled, by_index=True)
    assert not by_index.equivalent and by_index.over_tolerance > 0


def test_diff_of_other_class_lists_differs_and_errors_exit_2(datasets, tmp_path):
    renamed = tmp_path / "renumbered"
    classes = ("space", "scenes", "people", "nature")
    convert(datasets["raw"], renamed, "pt", encoding="raw", classes=classes)
    report = diff_datasets(datasets["raw"], renamed)
    assert not report.equivalent and not report.same_classes
    assert not report.label_mismatches  # the labels match by class name
    assert (
        "classes differ: the same 4 names in another order, from label 0: 'nature' in A, "
        "'space' in B" in report.summary()
    )
    other = DiffReport("a", "b", 0, 2, 2, classes_a=["cat", "dog", "owl"], classes_b=["cat", "eel"])
    assert other.classes_differ() == "only in A: dog, owl; only in B: eel"
    missing = invoke("diff", datasets["raw"], tmp_path / "nothing")
    assert missing.exit_code == 2
    assert missing.output.strip() == f"Error: {tmp_path / 'nothing'}: no such dataset folder"
    shown = " ".join(invoke("diff", "--help").output.split())  # as wrapped to the terminal
    assert "--tolerance" in shown and f"[default: {DEFAULT_TOLERANCE}]" in shown


def test_inspect_summarizes_a_dataset_and_a_folder(datasets):
    raw = summarize(datasets["raw"])
    assert raw.samples == 32 and raw.classes == ["nature", "people", "scenes", "space"]
    assert raw.samples_per_class == dict.fromkeys(raw.classes, 8)
    assert raw.shapes_from == "manifest" and raw.shapes["distinct"] == 1
    assert raw.stored_bytes == sum(s.bytes for s in readers.load_manifest(datasets["raw"]).shards)
    tampered = summarize(datasets["tampered"])
    assert tampered.samples_per_class == {"nature": 7, "people": 8, "scenes": 7, "space": 9}
    folder = summarize(SAMPLE_DATA, shape_samples=10)
    assert folder.kind == "folder" and folder.samples == 32
    assert folder.shapes_from == "headers of 10 sample(s)"
    assert 200 <= folder.shapes["height"]["min"] <= folder.shapes["height"]["max"] <= 484
    text = invoke("inspect", datasets["tampered"]).output
    assert "smallest nature 7, scenes 7" in text and "largest  space 9" in text
    as_json = json.loads(invoke("inspect", datasets["jpeg"], "--json").output)
    assert as_json["encoding"] == "jpeg" and as_json["samples"] == 32


def test_inspect_grid_draws_the_tiles_asked_for(datasets, tmp_path):
    out = tmp_path / "sheet.png"
    sheet = contact_sheet(datasets["jpeg"], out, per_class=3, classes=["space", "people"], tile=48)
    with Image.open(out) as image:
        assert image.format == "PNG"
        assert image.size == sheet.size == (3 * (48 + GAP), 2 * (48 + LABEL_HEIGHT + GAP))
    assert sheet.classes == ["space", "people"]
    assert [len(t) for t in sheet.tiles.values()] == [3, 3] and not sheet.unreadable
    assert all(p.startswith("space/") for p in sheet.tiles["space"])
    again = contact_sheet(datasets["raw"], tmp_path / "again.png", per_class=3, tile=48)
    assert again.tiles["space"] == sheet.tiles["space"]  # seeded: the same samples
    result = invoke("inspect", SAMPLE_DATA, "--grid", tmp_path / "folder.png", "--per-class", "2")
    assert result.exit_code == 0 and "8 tiles" in result.output
    refused = invoke("inspect", datasets["raw"], "--grid", tmp_path / "x.png", "--classes", "cats")
    assert refused.exit_code == 1 and "no class 'cats'" in refused.output


def test_a_damaged_sample_is_an_error_naming_it(datasets, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(datasets["jpeg"], damaged)
    tar = damaged / "shard-000001.tar"
    index = json.loads((damaged / "shard-000001.tar.idx.json").read_text())
    data = bytearray(tar.read_bytes())
    middle = index["offsets"][4] + index["sizes"][4] // 2
    data[middle : middle + 8] = bytes(8)
    tar.write_bytes(bytes(data))
    result = invoke("diff", datasets["raw"], damaged)
    assert result.exit_code == 2
    assert "shard-000001.tar[4]" in result.output and "Traceback" not in result.output
