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
from convert.diff import diff_datasets
from readers import spec
from tests.conftest import SAMPLE_DATA
from tests.photos import photo_folder
from tests.ray_nodes import RayDriver
from tests.test_interrupted import wait_for_shards
from tests.test_object_storage import BUCKET, s3_server  # noqa: F401 (the fixture)

ROOT = Path(__file__).resolve().parent.parent
RAW = {"encoding": "raw", "resize": 72, "center_crop": 64, "exact_resize": True}


def convert(src: Path | str, dst: Path | str, fmt: str, workers: int = 1, **options: object):
    """In this process unless ``workers`` is given: the pool's readers of each format are
    :func:`test_raw_to_raw_without_geometry_keeps_the_content_checksum`'s subject."""
    return convert_folder(src, dst, ConvertOptions(fmt, **options), workers=workers, progress=False)


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


@pytest.fixture(scope="module")
def raw_pt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sample_data as fixed-size raw pixels in ``pt``: the source most tests convert."""
    dst = tmp_path_factory.mktemp("raw-pt") / "dst"
    convert(SAMPLE_DATA, dst, "pt", **RAW)
    return dst


def test_raw_to_raw_without_geometry_keeps_the_content_checksum(raw_pt, tmp_path):
    """Through the pool, whose workers read each format's shards: there and back."""
    for fmt in ("wds", "hdf5", "lmdb"):
        out = tmp_path / fmt
        result = convert(raw_pt, out, fmt, workers=2, encoding="raw", shard_size=10)
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
        back = convert(out, tmp_path / f"{fmt}-pt", "pt", workers=2, encoding="raw")
        assert readers.load_manifest(back.dst).content_sha256 == a.content_sha256, fmt


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
        report = diff_datasets(via, direct)  # what imgpack diff says of the same pair
        assert report.equivalent and report.max_diff == pytest.approx(max(diffs))
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
    assert f"source     imgpack {raw_pt}" in CliRunner().invoke(main, ["info", str(out)]).output
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
    itself = CliRunner().invoke(main, ["convert", url, url, "--format", "pt", "--overwrite"])
    assert itself.exit_code == 1 and "DST is SRC" in itself.output
    assert readers.load_manifest(url).content_sha256 == manifest.content_sha256  # untouched
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
    resumed = CliRunner().invoke(main, [*command[3:], "--resume"])  # the resume: in-process
    assert resumed.exit_code == 0, resumed.output
    assert "kept" in resumed.stdout
    want, got = readers.load_manifest(reference), readers.load_manifest(dst)
    assert got.content_sha256 == want.content_sha256
    assert got.shards == want.shards  # the very same bytes, shard for shard


# --- foreign sources: WebDataset tars and Hugging Face Parquet ------------------------------
CLASSES = ("nature", "people", "scenes", "space")


def sample_files() -> list[Path]:
    return sorted(p for p in SAMPLE_DATA.rglob("*.*") if p.suffix in (".jpg", ".png"))


@pytest.fixture(scope="module")
def folder_raw(tmp_path_factory: pytest.TempPathFactory) -> readers.Manifest:
    """sample_data converted from its folder, as the foreign sources are converted below."""
    dst = tmp_path_factory.mktemp("folder-raw") / "dst"
    convert(SAMPLE_DATA, dst, "pt", **RAW)
    return readers.load_manifest(dst)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sample_data as WebDataset tars written by webdataset.ShardWriter: the key is the
    relative path without its extension, the class number in ``cls``, its name in ``txt``."""
    import webdataset

    folder = tmp_path_factory.mktemp("foreign-wds")
    with webdataset.ShardWriter(str(folder / "train-%04d.tar"), maxcount=10, verbose=0) as sink:
        for path in sample_files():
            rel = path.relative_to(SAMPLE_DATA)
            sink.write(
                {
                    "__key__": str(rel.with_suffix("")),
                    path.suffix[1:]: path.read_bytes(),
                    "cls": CLASSES.index(rel.parts[0]),
                    "txt": rel.parts[0],
                }
            )
    return folder


def test_webdataset_tars_of_other_tools_convert_like_the_folder(shards, folder_raw, tmp_path):
    classes = tmp_path / "classes.txt"
    classes.write_text("\n".join(CLASSES) + "\n")
    srcs = {
        "folder": [str(shards)],
        "brace": [str(shards / "train-{0000..0003}.tar")],
        "glob": [str(shards / "train-*.tar")],
        "names": [str(shards), "--label-key", "txt"],
    }
    for name, src in srcs.items():
        out = tmp_path / name
        extra = ["--classes", str(classes)] if name != "names" else []
        args = ["convert", *src, str(out), "--format", "pt", "--encoding", "raw", *extra]
        geometry = ["--resize", "72", "--center-crop", "64", "--exact-resize"]
        # --no-fields: the folder has no txt (or cls) field, and fields enter the checksum
        result = CliRunner().invoke(main, [*args, *geometry, "--no-fields"])
        assert result.exit_code == 0, (name, result.output)
        manifest = readers.load_manifest(out)
        # the tar member names are the folder's relative paths: the same samples exactly
        assert manifest.content_sha256 == folder_raw.content_sha256, name
        assert manifest.classes == CLASSES and manifest.source["kind"] == "webdataset"
    numeric = tmp_path / "numeric"
    convert(shards, numeric, "pt", **RAW)
    assert readers.load_manifest(numeric).classes == ("0", "1", "2", "3")


def test_webdataset_bad_samples_are_listed_by_their_member_names(shards, tmp_path):
    import webdataset

    src = tmp_path / "bad"
    src.mkdir()
    for tar in shards.glob("*.tar"):
        (src / tar.name).write_bytes(tar.read_bytes())
    with webdataset.ShardWriter(str(src / "extra-%04d.tar"), maxcount=10, verbose=0) as sink:
        sink.write({"__key__": "broken/cut", "jpg": b"\xff\xd8\xff\xe0 not a jpeg", "cls": 1})
        sink.write({"__key__": "broken/textonly", "json": b"{}", "cls": 2})
    out = tmp_path / "out"
    result = convert(src, out, "wds", encoding="jpeg", shard_size=10)
    assert result.written == 32 and result.skipped == 2
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert [e["path"] for e in errors] == ["broken/textonly", "broken/cut.jpg"]
    assert "no image member" in errors[0]["error"] and "broken/cut.jpg" in errors[1]["error"]


def _parquet_rows(with_paths: bool) -> tuple[list[dict], list[int]]:
    images, labels = [], []
    for path in sample_files():
        rel = path.relative_to(SAMPLE_DATA)
        images.append({"bytes": path.read_bytes(), "path": str(rel) if with_paths else None})
        labels.append(CLASSES.index(rel.parts[0]))
    return images, labels


def test_parquet_written_by_datasets_converts_like_the_folder(folder_raw, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # writes local files only
    import datasets  # the test extra installs it

    images, labels = _parquet_rows(with_paths=True)
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=list(CLASSES))}
    )
    hub = tmp_path / "hub"
    (hub / "data").mkdir(parents=True)
    table = datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
    table.select(range(20)).to_parquet(str(hub / "data/train-00000-of-00002.parquet"), batch_size=8)
    table.select(range(20, 32)).to_parquet(str(hub / "data/train-00001-of-00002.parquet"))
    out = tmp_path / "out"
    convert(hub, out, "pt", **RAW)
    manifest = readers.load_manifest(out)
    assert manifest.content_sha256 == folder_raw.content_sha256  # paths, labels, pixels
    assert manifest.classes == CLASSES  # from the ClassLabel feature
    assert manifest.source == {"kind": "parquet", "location": str(hub), "files": 2}


def test_parquet_of_plain_bytes_takes_its_class_names_from_a_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    images, labels = _parquet_rows(with_paths=False)
    table = pa.table({"jpeg": [i["bytes"] for i in images], "target": labels})
    pq.write_table(table, tmp_path / "plain.parquet", row_group_size=10)
    classes = tmp_path / "classes.txt"
    classes.write_text("\n".join(CLASSES) + "\n")
    out = tmp_path / "out"
    args = ["convert", tmp_path / "plain.parquet", out, "--format", "hdf5", "--encoding", "raw"]
    args += ["--exact-resize"]
    result = CliRunner().invoke(
        main, [str(a) for a in args] + ["--label-key", "target", "--classes", str(classes)]
    )
    assert result.exit_code == 0, result.output
    ds = readers.open_dataset(out)
    assert ds.classes == list(CLASSES) and ds.targets == labels
    assert ds.samples[3][0] == "plain.parquet#3"  # no path column: the file and the row
    no_label = CliRunner().invoke(
        main, ["convert", str(tmp_path / "plain.parquet"), str(tmp_path / "x"), "--format", "pt"]
    )
    assert no_label.exit_code == 0  # no label column found: unlabeled, as --unlabeled
    assert readers.load_manifest(tmp_path / "x").classes == ()
    hidden = pa.table({"jpeg": [i["bytes"] for i in images], "target": [-1] * len(images)})
    pq.write_table(hidden, tmp_path / "test-split.parquet")  # the Hub's -1: no label
    unlabeled = tmp_path / "unlabeled"
    convert(tmp_path / "test-split.parquet", unlabeled, "pt", label_key="target")
    assert readers.open_dataset(unlabeled).targets == [-1] * 32
    plain, elsewhere = str(tmp_path / "plain.parquet"), str(tmp_path / "y")
    wrong = CliRunner().invoke(
        main, ["convert", plain, elsewhere, "--format", "pt", "--label-key", "nope"]
    )
    assert wrong.exit_code == 1 and "no column 'nope'" in wrong.output


@pytest.mark.usefixtures("s3_server")
def test_webdataset_tars_at_a_url_convert_like_local_ones(shards, folder_raw, tmp_path):
    from readers.storage.remote import RemoteFolder

    bucket = RemoteFolder(f"s3://{BUCKET}/sources/foreign")
    for tar in sorted(shards.glob("*.tar")):
        bucket.upload(tar, tar.name)
    out = tmp_path / "out"
    tars = f"s3://{BUCKET}/sources/foreign/train-{{0000..0003}}.tar"
    convert(tars, out, "pt", **RAW, fields=())  # no fields: the folder's checksum
    assert readers.load_manifest(out).content_sha256 == folder_raw.content_sha256
    listed = tmp_path / "listed"
    convert(f"s3://{BUCKET}/sources/foreign", listed, "pt", **RAW, fields=())
    assert readers.load_manifest(listed).content_sha256 == folder_raw.content_sha256


def test_ray_executor_converts_dataset_and_foreign_sources_as_local(
    ray_driver: RayDriver, raw_pt, shards, folder_raw, tmp_path
):
    for src, want in ((raw_pt, readers.load_manifest(raw_pt)), (shards, folder_raw)):
        out = tmp_path / src.name
        extra = {**RAW, "fields": ()} if src == shards else {"encoding": "raw"}
        options = ConvertOptions("wds", **extra)  # no fields: the folder's checksum
        ray_driver.convert(src, out, options, progress=False)
        assert readers.load_manifest(out).content_sha256 == want.content_sha256, src
