"""What users hit first (issue "One description of a dataset", part 2, the reader side and
the CLI): ImageFolder parity (``targets``, ``samples``), clear errors for indices and for
batches of images that do not stack, a path to the manifest accepted as its folder, and a
dataset whose conversion is still running."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections import Counter

import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from torch.utils.data import DataLoader

import readers
from convert import ConvertOptions, convert_folder
from convert.cli import main
from readers import spec
from tests.conftest import ROOT


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_targets_and_samples_are_lists_like_imagefolders(converted, fmt):
    ds = readers.open_dataset(converted(fmt, "raw-fixed"))
    assert isinstance(ds.targets, list) and len(ds.targets) == 32
    assert Counter(ds.targets) == {0: 8, 1: 8, 2: 8, 3: 8}  # what failed as a method
    assert ds.targets == [ds[i][1] for i in range(len(ds))]
    assert ds.samples[5] == (ds.source_path(5), ds.targets[5])
    assert ds.samples[0][0].startswith(ds.classes[0] + "/")


def test_slices_and_other_non_integer_indices_are_a_type_error(converted):
    ds = readers.open_dataset(converted("pt", "raw-fixed"))
    for bad in (slice(0, 4), 1.0, "3", True):
        with pytest.raises(TypeError, match=r"indices must be integers.*Subset"):
            ds[bad]
    assert torch.equal(ds[torch.tensor(3).item()][0], ds[3][0])


def test_a_batch_that_cannot_stack_says_why_and_what_to_do(converted):
    ds = readers.open_dataset(converted("lmdb", "jpeg"))  # sizes vary: no crop
    loader = DataLoader(ds, batch_size=4, collate_fn=readers.collate)
    with pytest.raises(
        ValueError, match=r"different shapes.*--center-crop.*transform=.*collate_any"
    ):
        next(iter(loader))
    images, labels = next(iter(DataLoader(ds, batch_size=4, collate_fn=readers.collate_any)))
    assert isinstance(images, list) and len(images) == len(labels) == 4


def test_a_path_to_the_manifest_stands_for_its_folder(converted):
    root = converted("hdf5", "raw-fixed")
    ds = readers.open_dataset(root / spec.MANIFEST_NAME)
    assert ds.root == root and len(ds) == 32
    result = CliRunner().invoke(main, ["info", str(root / spec.MANIFEST_NAME)])
    assert result.exit_code == 0 and "hdf5" in result.output
    result = CliRunner().invoke(main, ["info", str(root / "shard-000000.h5")])
    assert result.exit_code == 1 and "not a dataset folder" in result.output
    assert "Traceback" not in result.output


def test_opening_a_dataset_being_converted_says_so(tmp_path):
    dst = tmp_path / "dst"
    dst.mkdir()
    holder = subprocess.Popen(  # holds the converter's lock, as a running conversion does
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from convert.output.lock import DestinationLock; "
            "DestinationLock(Path(sys.argv[1])).acquire(); print('locked', flush=True); "
            "time.sleep(60)",
            str(dst),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        (dst / f"{spec.TMP_PREFIX}shard-000000.pt").write_bytes(b"")
        with pytest.raises(readers.DatasetError, match=r"still running.*wait for it"):
            readers.open_dataset(dst)
    finally:
        holder.kill()
        holder.communicate()
    time.sleep(0.1)
    with pytest.raises(readers.DatasetError, match=r"incomplete conversion.*--resume"):
        readers.open_dataset(dst)  # the converter died: now it is resumable


# --- the input side of imgpack convert ---------------------------------------------------------
def small_source(tmp_path, sample_data):
    """Two classes of two sample photos each, plus what notebooks and macOS leave behind."""
    src = tmp_path / "src"
    for name in ("nature", "people"):
        (src / name).mkdir(parents=True)
        for image in sorted((sample_data / name).glob("*.jpg"))[:2]:
            shutil.copy(image, src / name / image.name)
    (src / ".ipynb_checkpoints").mkdir()
    shutil.copy(next((sample_data / "nature").glob("*.jpg")), src / ".ipynb_checkpoints" / "a.jpg")
    (src / "nature" / "._chelsea_00.jpg").write_bytes(b"\0\5\26\7 AppleDouble")
    shutil.copy(next((sample_data / "people").glob("*.jpg")), src / "stray.jpg")
    return src


def convert_cli(*args: object):
    """``imgpack convert`` in this process: what these tests check is decided before the
    samples reach a worker."""
    return CliRunner().invoke(main, ["convert", *map(str, args), "--no-progress", "--workers", "1"])


def test_hidden_entries_are_skipped_and_listed_unless_asked_for(tmp_path, sample_data):
    src = small_source(tmp_path, sample_data)
    result = convert_cli(src, tmp_path / "out", "--format", "pt")
    assert result.exit_code == 0, result.output
    assert "2 hidden entries not read (.ipynb_checkpoints, nature/._chelsea_00.jpg" in result.output
    ds = readers.open_dataset(tmp_path / "out")
    assert ds.classes == ["nature", "people"] and len(ds) == 4
    result = convert_cli(src, tmp_path / "all", "--format", "pt", "--include-hidden")
    assert result.exit_code == 0, result.output
    assert readers.open_dataset(tmp_path / "all").classes == [
        ".ipynb_checkpoints",
        "nature",
        "people",
    ]


def test_an_image_outside_any_class_folder_is_reported(tmp_path, sample_data):
    src = small_source(tmp_path, sample_data)
    assert convert_cli(src, tmp_path / "out", "--format", "wds").exit_code == 0
    errors = (tmp_path / "out" / "errors.jsonl").read_text()
    assert '"stray.jpg"' in errors and "not in a class folder" in errors
    failed = convert_cli(src, tmp_path / "strict", "--format", "wds", "--on-error", "fail")
    assert failed.exit_code == 1 and "stray.jpg" in failed.output


def test_dst_inside_src_or_equal_to_it_is_refused_before_anything_is_written(tmp_path, sample_data):
    src = small_source(tmp_path, sample_data)
    done = convert_cli(src, src / "out", "--format", "pt")
    assert done.exit_code == 1
    assert "DST is inside SRC" in done.stderr and "shift every label" in done.stderr
    assert isinstance(done.exception, SystemExit)  # a one-line error, not a traceback
    assert not (src / "out").exists()
    result = convert_cli(src, src, "--format", "pt")
    assert result.exit_code == 1 and "DST is SRC itself" in result.output


def test_max_pixels_reaches_an_in_process_run_without_changing_pillows_limit(
    tmp_path, sample_data, monkeypatch
):
    src = small_source(tmp_path, sample_data)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000)  # the calling program's own limit
    options = ConvertOptions("pt", encoding="raw", resize=32, max_pixels=10**9)
    result = convert_folder(src, tmp_path / "dst", options, workers=1)
    assert result.written == 4 and result.skipped == 1  # stray.jpg, outside any class
    assert Image.MAX_IMAGE_PIXELS == 1_000


def test_a_centre_crop_larger_than_the_resize_is_refused(tmp_path, sample_data):
    src = small_source(tmp_path, sample_data)
    result = convert_cli(
        src, tmp_path / "out", "--format", "pt", "--resize", 64, "--center-crop", 80
    )
    assert result.exit_code == 1
    assert "--center-crop 80 is larger than --resize 64" in result.output
    assert not (tmp_path / "out").exists()


def test_a_centre_crop_without_a_resize_warns_and_names_the_fix(tmp_path, sample_data):
    src = small_source(tmp_path, sample_data)
    result = convert_cli(src, tmp_path / "out", "--format", "pt", "--center-crop", 224)
    assert result.exit_code == 0, result.output
    assert (
        "warning: --center-crop 224 without --resize keeps only the central 224x224 pixels"
        in result.output
    )
    assert "add --resize 256" in result.output
    plain = convert_cli(
        src, tmp_path / "out2", "--format", "pt", "--resize", 256, "--center-crop", 224
    )
    assert "warning" not in plain.output


def test_a_class_list_keeps_labels_when_a_class_folder_is_missing(tmp_path, sample_data):
    train = small_source(tmp_path, sample_data)
    assert convert_cli(train, tmp_path / "train", "--format", "lmdb").exit_code == 0
    val = tmp_path / "val"
    shutil.copytree(train / "people", val / "people")  # no "nature": labels would shift
    plain = convert_cli(val, tmp_path / "val-plain", "--format", "lmdb")
    assert readers.open_dataset(tmp_path / "val-plain").targets == [0, 0]  # the silent shift
    for how in (["--classes-from", tmp_path / "train"], ["--classes", tmp_path / "classes.txt"]):
        (tmp_path / "classes.txt").write_text("nature\n\npeople\n")
        out = tmp_path / f"val-{how[0]}"
        result = convert_cli(val, out, "--format", "lmdb", *how)
        assert result.exit_code == 0, result.output
        assert "1 listed classes have no folder (nature)" in result.output
        ds = readers.open_dataset(out)
        assert ds.classes == ["nature", "people"] and ds.targets == [1, 1]
    assert plain.exit_code == 0
    (tmp_path / "classes.txt").write_text("people\n")
    result = convert_cli(
        train, tmp_path / "bad", "--format", "lmdb", "--classes", tmp_path / "classes.txt"
    )
    assert result.exit_code == 1
    assert f"{train / 'nature'}: folder is not in the class list" in result.output
    (tmp_path / "classes.txt").write_text("people\npeople\n")
    result = convert_cli(
        val, tmp_path / "bad2", "--format", "lmdb", "--classes", tmp_path / "classes.txt"
    )
    assert result.exit_code == 1 and "repeats people" in result.output


def flat_source(tmp_path, sample_data):
    """ImageNet's validation layout: images in one folder, classes in a separate file."""
    src = tmp_path / "flat"
    src.mkdir()
    rows = []
    for name in ("nature", "people"):
        for image in sorted((sample_data / name).glob("*.jpg"))[:2]:
            shutil.copy(image, src / image.name)
            rows.append((image.name, name))
    return src, rows


def test_a_flat_folder_takes_its_labels_from_a_csv_or_tsv_file(tmp_path, sample_data):
    src, rows = flat_source(tmp_path, sample_data)
    refused = convert_cli(src, tmp_path / "nothing", "--format", "pt")
    assert refused.exit_code == 1 and "--labels FILE" in refused.output
    assert "--unlabeled" in refused.output
    csv_file = tmp_path / "val.csv"
    csv_file.write_text("path,label\n" + "".join(f"{p},{c}\n" for p, c in rows[:-1]))
    result = convert_cli(src, tmp_path / "csv", "--format", "hdf5", "--labels", csv_file)
    assert result.exit_code == 0, result.output
    ds = readers.open_dataset(tmp_path / "csv")
    assert ds.classes == ["nature", "people"]
    assert sorted(ds.samples) == sorted((p, ["nature", "people"].index(c)) for p, c in rows[:-1])
    errors = (tmp_path / "csv" / "errors.jsonl").read_text()
    assert rows[-1][0] in errors and "not in val.csv" in errors  # every file has an outcome
    tsv = tmp_path / "val.tsv"
    tsv.write_text("".join(f"{p}\t{c}\n" for p, c in rows) + "missing.jpg\tpeople\n")
    result = convert_cli(src, tmp_path / "tsv", "--format", "wds", "--labels", tsv)
    assert result.exit_code == 0, result.output
    assert len(readers.open_dataset(tmp_path / "tsv")) == 4
    assert "listed in val.tsv but not found" in (tmp_path / "tsv" / "errors.jsonl").read_text()
    tsv.write_text("../outside.jpg\tpeople\n")
    result = convert_cli(src, tmp_path / "bad", "--format", "wds", "--labels", tsv)
    assert result.exit_code == 1 and "not a path inside SRC" in result.output


def test_unlabeled_converts_every_image_with_label_minus_one(tmp_path, sample_data):
    src, _ = flat_source(tmp_path, sample_data)
    (src / "sub").mkdir()
    shutil.copy(next((sample_data / "space").glob("*.jpg")), src / "sub" / "x.jpg")
    result = convert_cli(src, tmp_path / "out", "--format", "lmdb", "--unlabeled")
    assert result.exit_code == 0, result.output
    ds = readers.open_dataset(tmp_path / "out")
    assert ds.classes == [] and ds.targets == [spec.UNLABELED] * 5
    verified = CliRunner().invoke(main, ["verify", str(tmp_path / "out"), "--deep"])
    assert verified.exit_code == 0, verified.output
