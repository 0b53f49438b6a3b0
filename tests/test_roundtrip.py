"""Conformance of every format × encoding against an independent Pillow + numpy reference.

The reference scans ``sample_data`` with torchvision ``ImageFolder`` rules and computes
pixels with Pillow alone (``Image.open(...).convert("RGB")``, ``Image.resize`` with
torchvision's size rule, centre crop with torchvision's rounding); nothing in it comes
from imgpack's converter.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import io
import itertools
import json
import math
import os
import pickle
import random
import tarfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import h5py
import lmdb
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate

import convert.writers
import readers
from convert import ConvertOptions, convert_folder
from readers import spec
from readers.formats import FORMAT_READERS, SHARD_READERS
from tests.conftest import ENCODING_CASES, SAMPLE_DATA

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
NUM_IMAGES = 32  # sample_data/README.md

FORMAT_CASES = [
    pytest.param(fmt, case, id=f"{fmt}-{case}") for fmt in spec.FORMATS for case in ENCODING_CASES
]
FORMATS = [pytest.param(fmt, id=fmt) for fmt in spec.FORMATS]


# --- the independent reference ----------------------------------------------------------
@functools.cache
def reference_scan() -> tuple[tuple[str, ...], tuple[tuple[str, int], ...]]:
    """``(classes, ((relpath, label), ...))`` of sample_data as ``ImageFolder`` orders them."""
    classes = sorted(e.name for e in os.scandir(SAMPLE_DATA) if e.is_dir())
    samples = []
    for label, name in enumerate(classes):
        for dirpath, _, fnames in sorted(os.walk(SAMPLE_DATA / name, followlinks=True)):
            for fname in sorted(fnames):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    rel = os.path.relpath(os.path.join(dirpath, fname), SAMPLE_DATA)
                    samples.append((rel, label))
    return tuple(classes), tuple(samples)


def pillow_rgb(relpath: str) -> Image.Image:
    with Image.open(SAMPLE_DATA / relpath) as img:
        return img.convert("RGB")


@functools.cache
def reference_pixels(relpath: str, resize: int | None, crop: int | None) -> np.ndarray:
    """HWC uint8 pixels of one source image after torchvision's tensor Resize + CenterCrop:
    Pillow decodes, torch's antialiased bilinear interpolate resizes, numpy crops."""
    pixels = np.asarray(pillow_rgb(relpath))
    if resize is not None:
        h, w = pixels.shape[:2]
        # torchvision: the shorter side becomes `resize`, the longer int(resize * long / short)
        size = (int(resize * h / w), resize) if w <= h else (resize, int(resize * w / h))
        chw = torch.from_numpy(pixels.copy()).permute(2, 0, 1)[None]
        resized = torch.nn.functional.interpolate(chw, size, mode="bilinear", antialias=True)
        pixels = resized[0].permute(1, 2, 0).numpy()
        # and within two levels of torchvision's Pillow path
        w_h = (size[1], size[0])
        via_pillow = np.asarray(pillow_rgb(relpath).resize(w_h, Image.Resampling.BILINEAR))
        assert np.abs(pixels.astype(np.int16) - via_pillow).max() <= 2
    if crop is not None:
        h, w = pixels.shape[:2]
        assert w >= crop and h >= crop, "reference does not pad"
        top = round((h - crop) / 2.0)  # torchvision: int(round(x))
        left = round((w - crop) / 2.0)
        pixels = pixels[top : top + crop, left : left + crop]
    assert pixels.dtype == np.uint8 and pixels.ndim == 3 and pixels.shape[2] == 3
    return np.ascontiguousarray(pixels)


def case_reference(case: str, relpath: str) -> np.ndarray:
    geometry = ENCODING_CASES[case]
    return reference_pixels(relpath, geometry.get("resize"), geometry.get("center_crop"))


def pillow_decode(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return np.array(img.convert("RGB"))


def pillow_jpeg_roundtrip(pixels: np.ndarray, quality: int = 90) -> np.ndarray:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=quality)
    return pillow_decode(out.getvalue())


def stored_images(root: Path, fmt: str) -> list[bytes]:
    """The encoded image bytes as stored on disk, read with the format's own library."""
    manifest = json.loads((root / spec.MANIFEST_NAME).read_text(encoding="utf-8"))
    out: list[bytes] = []
    for shard in manifest["shards"]:
        path = root / shard["path"]
        if fmt == "pt":
            tensors = torch.load(path, weights_only=True)
            data = tensors[spec.PT_DATA].numpy()
            offsets = tensors[spec.PT_OFFSETS].tolist()
            out += [data[a:b].tobytes() for a, b in itertools.pairwise(offsets)]
        elif fmt == "hdf5":
            with h5py.File(path, "r") as f:
                out += [value.tobytes() for value in f[spec.H5_IMAGES][()]]
        elif fmt == "lmdb":
            env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
            try:
                with env.begin() as txn:
                    out += [bytes(v) for k, v in txn.cursor() if not k.startswith(b"__")]
            finally:
                env.close()
        elif fmt == "wds":
            with tarfile.open(path) as tar:
                for member in tar.getmembers():
                    ext = member.name.partition(".")[2]
                    if ext in spec.WDS_IMAGE_EXTS:
                        out.append(tar.extractfile(member).read())
        else:
            raise AssertionError(f"no reference reader for format {fmt!r}")
    return out


def read_all(root: Path, **kwargs: Any) -> list[tuple[torch.Tensor, int, str]]:
    """Every sample of ``root`` as (image copy, label, source path); the dataset is then
    dropped, so its handles are closed before the caller opens another."""
    ds = readers.open_dataset(root, **kwargs)
    items = [(ds[i][0].clone(), ds[i][1], ds.source_path(i)) for i in range(len(ds))]
    del ds
    return items


def assert_same_image(actual: Any, expected: torch.Tensor) -> None:
    assert isinstance(actual, torch.Tensor)
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert torch.equal(actual, expected)


# --- registries -------------------------------------------------------------------------
def test_format_registries_agree() -> None:
    assert set(readers.DATASETS) == set(convert.writers.FORMAT_WRITERS) == set(spec.FORMATS)
    assert set(convert.writers.WRITERS) == set(spec.FORMATS)
    assert set(SHARD_READERS) == set(spec.SHARD_SUFFIX) == set(spec.FORMATS)
    assert set(FORMAT_READERS) == set(spec.FORMATS)
    assert {cls.format for cls in readers.DATASETS.values()} == set(spec.FORMATS)
    for fmt, cls in readers.DATASETS.items():
        assert cls.format == fmt


@pytest.mark.parametrize("fmt", FORMATS)
def test_open_dataset_picks_the_format_class(converted, fmt: str) -> None:
    root = converted(fmt, "raw-fixed")
    ds = readers.open_dataset(root)
    assert type(ds) is readers.DATASETS[fmt]
    assert isinstance(ds, Dataset)
    for other, cls in readers.DATASETS.items():
        if other != fmt:
            with pytest.raises(readers.DatasetError, match=fmt):
                cls(root)


# --- the reference itself -----------------------------------------------------------------
def test_reference_scan_matches_sample_data_readme() -> None:
    classes, samples = reference_scan()
    assert classes == ("nature", "people", "scenes", "space")
    assert len(samples) == NUM_IMAGES
    assert not any(rel.endswith(".md") for rel, _ in samples)
    assert Counter(label for _, label in samples) == {0: 8, 1: 8, 2: 8, 3: 8}


def test_turbojpeg_and_pillow_decode_sample_data_identically() -> None:
    """The claim the 'original' checks rest on: readers.decode_image == Pillow, exactly."""
    _, samples = reference_scan()
    for rel, _ in samples:
        data = (SAMPLE_DATA / rel).read_bytes()
        assert np.array_equal(readers.decode_image(data, rel), pillow_decode(data)), rel
    # and for JPEGs that imgpack encodes itself
    pixels = reference_pixels(samples[0][0], 80, None)
    from readers.images.decode import encode_jpeg

    data = encode_jpeg(np.ascontiguousarray(pixels), 90)
    assert np.array_equal(readers.decode_image(data), pillow_decode(data))


# --- conformance: index, labels, classes, paths, pixels -------------------------------------
@pytest.mark.parametrize(("fmt", "case"), FORMAT_CASES)
def test_labels_order_and_paths_follow_imagefolder(converted, fmt: str, case: str) -> None:
    classes, samples = reference_scan()
    ds = readers.open_dataset(converted(fmt, case))
    assert len(ds) == len(samples) == NUM_IMAGES
    assert ds.classes == list(classes)
    assert ds.class_to_idx == {c: i for i, c in enumerate(classes)}
    assert [ds.source_path(i) for i in range(len(ds))] == [rel for rel, _ in samples]
    labels = [label for _, label in samples]
    got = [ds[i][1] for i in range(len(ds))]
    assert got == labels
    assert all(type(label) is int for label in got)
    assert ds.targets == labels


@pytest.mark.parametrize(("fmt", "case"), FORMAT_CASES)
def test_images_are_uint8_chw_of_the_manifest_shape(converted, fmt: str, case: str) -> None:
    ds = readers.open_dataset(converted(fmt, case))
    fixed = ENCODING_CASES[case].get("center_crop")
    expected_shape = (fixed, fixed, 3) if case == "raw-fixed" else None
    assert ds.manifest.shape == expected_shape
    assert ds.manifest.encoding == ENCODING_CASES[case]["encoding"]
    for i in range(len(ds)):
        image, _ = ds[i]
        assert isinstance(image, torch.Tensor)
        assert image.dtype == torch.uint8
        assert image.ndim == 3 and image.shape[0] == 3
        if expected_shape is not None:
            assert tuple(image.shape) == (3, fixed, fixed)


@pytest.mark.parametrize("case", ["raw-fixed", "raw-variable"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_raw_pixels_equal_the_reference_resize_and_crop(converted, fmt: str, case: str) -> None:
    ds = readers.open_dataset(converted(fmt, case))
    _, samples = reference_scan()
    for i, (rel, _) in enumerate(samples):
        expected = torch.from_numpy(case_reference(case, rel).copy()).permute(2, 0, 1)
        assert_same_image(ds[i][0], expected)


@pytest.mark.parametrize("fmt", FORMATS)
def test_jpeg_pixels_are_the_stored_jpeg_decoded(converted, fmt: str) -> None:
    """Exact against Pillow's decode of the stored bytes; close to Pillow's own q90 JPEG."""
    root = converted(fmt, "jpeg")
    stored = stored_images(root, fmt)  # before the dataset opens the files (LMDB)
    _, samples = reference_scan()
    assert len(stored) == len(samples)
    ds = readers.open_dataset(root)
    for i, (rel, _) in enumerate(samples):
        assert stored[i].startswith(b"\xff\xd8\xff"), rel
        image = ds[i][0]
        assert_same_image(image, torch.from_numpy(pillow_decode(stored[i])).permute(2, 0, 1))
        reference = pillow_jpeg_roundtrip(case_reference("jpeg", rel))
        actual = image.permute(1, 2, 0).numpy()
        assert actual.shape == reference.shape, rel
        diff = np.abs(actual.astype(np.int16) - reference.astype(np.int16)).mean()
        assert diff < 2, f"{rel}: mean abs diff {diff:.2f} from Pillow's JPEG q90"


@pytest.mark.parametrize("fmt", FORMATS)
def test_original_stores_source_bytes_and_decodes_like_pillow(converted, fmt: str) -> None:
    root = converted(fmt, "original")
    stored = stored_images(root, fmt)
    _, samples = reference_scan()
    assert [len(b) for b in stored] == [(SAMPLE_DATA / rel).stat().st_size for rel, _ in samples]
    ds = readers.open_dataset(root)
    for i, (rel, _) in enumerate(samples):
        assert stored[i] == (SAMPLE_DATA / rel).read_bytes(), rel
        expected = np.array(pillow_rgb(rel))
        assert_same_image(ds[i][0], torch.from_numpy(expected).permute(2, 0, 1))


# --- batches -------------------------------------------------------------------------------
@pytest.mark.parametrize(("fmt", "case"), FORMAT_CASES)
def test_getitems_matches_getitem(converted, fmt: str, case: str) -> None:
    ds = readers.open_dataset(converted(fmt, case))
    order = list(range(len(ds)))
    random.Random(1).shuffle(order)
    indices = [*order[:10], order[2], order[-1]]  # shuffled, one index repeated
    singles = [ds[i] for i in indices]
    batch = ds.__getitems__(indices)
    assert len(batch) == len(indices)
    assert batch.labels.dtype == torch.int64
    assert batch.labels.tolist() == [label for _, label in singles]
    for (image, label), (expected, expected_label) in zip(batch, singles, strict=True):
        assert label == expected_label
        assert_same_image(image, expected)

    if case == "raw-fixed":
        stacked = torch.stack([image for image, _ in singles])
        labels = torch.tensor([label for _, label in singles])
        for collated in (readers.collate(batch), default_collate(batch)):
            images, collated_labels = collated
            assert images.shape == (len(indices), 3, 64, 64)
            assert torch.equal(images, stacked)
            assert torch.equal(collated_labels, labels)
    else:
        assert isinstance(batch.images, list)  # shapes vary: nothing to stack
        # samples that happen to share a shape are stacked and collate like the fixed case
        by_shape: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i in range(len(ds)):
            by_shape[tuple(ds[i][0].shape)].append(i)
        same = max(by_shape.values(), key=len)
        assert len(same) >= 2
        same = [*same, same[0]]
        batch = ds.__getitems__(same)
        expected = torch.stack([ds[i][0] for i in same])
        labels = torch.tensor([ds[i][1] for i in same])
        for images, collated_labels in (readers.collate(batch), default_collate(batch)):
            assert torch.equal(images, expected)
            assert torch.equal(collated_labels, labels)


@pytest.mark.parametrize(("fmt", "case"), FORMAT_CASES)
def test_negative_index_and_index_error(converted, fmt: str, case: str) -> None:
    ds = readers.open_dataset(converted(fmt, case))
    n = len(ds)
    for negative, positive in ((-1, n - 1), (-n, 0), (-7, n - 7)):
        image, label = ds[negative]
        expected, expected_label = ds[positive]
        assert label == expected_label
        assert_same_image(image, expected)
        assert ds.source_path(negative) == ds.source_path(positive)
    for bad in (n, n + 1, -n - 1):
        with pytest.raises(IndexError):
            ds[bad]
        with pytest.raises(IndexError):
            ds.__getitems__([0, bad])
        with pytest.raises(IndexError):
            ds.source_path(bad)
    assert sum(1 for _ in ds) == n  # the legacy iteration protocol stops at IndexError


@pytest.mark.parametrize(("fmt", "case"), FORMAT_CASES)
def test_transform_applies_in_getitem_and_getitems(converted, fmt: str, case: str) -> None:
    root = converted(fmt, case)
    plain = read_all(root)
    seen: list[torch.Tensor] = []

    def crop8(x: torch.Tensor) -> torch.Tensor:
        seen.append(x)
        return x[:, :8, :8]

    ds = readers.open_dataset(root, transform=crop8)
    for i, (expected, label, _) in enumerate(plain):
        image, actual_label = ds[i]
        assert actual_label == label
        assert_same_image(image, expected[:, :8, :8])
    assert len(seen) == len(plain)

    seen.clear()
    indices = [5, 31, 0, 5, 17]
    batch = ds.__getitems__(indices)
    assert len(seen) == len(indices)
    assert all(x.dtype == torch.uint8 and x.ndim == 3 and x.shape[0] == 3 for x in seen)
    for (image, label), i in zip(batch, indices, strict=True):
        assert label == plain[i][1]
        assert_same_image(image, plain[i][0][:, :8, :8])
    images, labels = readers.collate(batch)
    assert torch.equal(images, torch.stack([plain[i][0][:, :8, :8] for i in indices]))
    assert labels.tolist() == [plain[i][1] for i in indices]


# --- shards and shuffling ---------------------------------------------------------------------
@pytest.mark.parametrize(("fmt", "case"), FORMAT_CASES)
def test_shard_size_splits_into_boundaries_read_like_one_shard(
    converted, fmt: str, case: str
) -> None:
    single = read_all(converted(fmt, case))
    root = converted(fmt, case, shard_size=7)
    manifest = json.loads((root / spec.MANIFEST_NAME).read_text(encoding="utf-8"))
    shards = manifest["shards"]
    assert len(shards) == math.ceil(NUM_IMAGES / 7)
    assert [s["samples"] for s in shards] == [7, 7, 7, 7, 4]
    for k, shard in enumerate(shards):
        assert shard["path"] == spec.shard_name(fmt, k)
        path = root / shard["path"]
        assert path.is_file()
        assert path.stat().st_size == shard["bytes"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == shard["sha256"]
        if fmt == "wds":
            assert Path(str(path) + spec.WDS_INDEX_SUFFIX).is_file()
    assert not list(root.glob(spec.TMP_PREFIX + "*"))

    ds = readers.open_dataset(root)
    assert len(ds.manifest.shards) == 5
    assert len(ds) == len(single)
    for i, (expected, label, path) in enumerate(single):
        image, actual_label = ds[i]
        assert (actual_label, ds.source_path(i)) == (label, path)
        assert_same_image(image, expected)
    # one batch that straddles every boundary, out of order, with a repeat
    indices = [6, 7, 13, 14, 20, 21, 27, 28, 31, 0, 7, 3]
    batch = ds.__getitems__(indices)
    for (image, label), i in zip(batch, indices, strict=True):
        assert label == single[i][1]
        assert_same_image(image, single[i][0])
    if case == "raw-fixed":
        images, labels = readers.collate(batch)
        assert torch.equal(images, torch.stack([single[i][0] for i in indices]))
        assert labels.tolist() == [single[i][1] for i in indices]


def _content(items: list[tuple[torch.Tensor, int, str]]) -> Counter:
    return Counter(
        (path, label, tuple(image.shape), image.contiguous().numpy().tobytes())
        for image, label, path in items
    )


@pytest.mark.parametrize("case", ["raw-fixed", "jpeg"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_shuffle_permutes_samples_reproducibly_by_seed(
    converted, tmp_path: Path, fmt: str, case: str
) -> None:
    plain = read_all(converted(fmt, case))
    shuffled = read_all(converted(fmt, case, shuffle=True, seed=3))
    assert _content(shuffled) == _content(plain)
    assert [p for _, _, p in shuffled] != [p for _, _, p in plain]
    # every sample keeps its own label
    _, samples = reference_scan()
    label_of = dict(samples)
    assert all(label == label_of[path] for _, label, path in shuffled)

    again = tmp_path / "again"
    options = ConvertOptions(format=fmt, **ENCODING_CASES[case], shuffle=True, seed=3)
    convert_folder(SAMPLE_DATA, again, options, workers=1, progress=False)
    repeated = read_all(again)
    assert [p for _, _, p in repeated] == [p for _, _, p in shuffled]
    assert _content(repeated) == _content(shuffled)
    for (a, _, _), (b, _, _) in zip(repeated, shuffled, strict=True):
        assert torch.equal(a, b)

    other = read_all(converted(fmt, case, shuffle=True, seed=4))
    assert [p for _, _, p in other] != [p for _, _, p in shuffled]
    assert _content(other) == _content(plain)


# --- several instances of one dataset in one process -----------------------------------------
def another_reader(first: readers.ImageDataset, how: str) -> readers.ImageDataset:
    if how == "second instance":
        return readers.open_dataset(first.root, transform=lambda x: x)
    if how == "deepcopy":
        return copy.deepcopy(first)
    return pickle.loads(pickle.dumps(first))


@pytest.mark.parametrize("fmt", FORMATS)
def test_two_live_datasets_over_one_folder_both_read(converted, fmt: str) -> None:
    """E.g. train/val views with different transforms, a deepcopy, or an unpickled copy."""
    first = readers.open_dataset(converted(fmt, "raw-fixed"))
    expected = [first[i][0].clone() for i in range(3)]
    problems = []
    for i, how in enumerate(("second instance", "deepcopy", "unpickled copy")):
        try:
            assert_same_image(another_reader(first, how)[i][0], expected[i])
            assert_same_image(first[i][0], expected[i])
        except Exception as e:
            # kept as text: a live traceback would keep the datasets (and their LMDB
            # environments) open for the tests that follow
            problems.append(f"{how}: {type(e).__name__}: {e}")
    del first
    assert not problems, "\n".join(problems)


def bump(x: torch.Tensor) -> torch.Tensor:
    """An in-place transform (like RandomErasing(inplace=True)): not idempotent."""
    return x.add_(1)


@pytest.mark.parametrize(("fmt", "case"), FORMAT_CASES)
def test_changing_a_returned_image_in_place_leaves_the_dataset_intact(
    converted, fmt: str, case: str
) -> None:
    """Every read gives the caller its own pixels, as ImageFolder does."""
    root = converted(fmt, case)
    expected = read_all(root)

    ds = readers.open_dataset(root, transform=bump)
    for i in (0, 9):
        for _ in range(2):
            assert_same_image(ds[i][0], expected[i][0] + 1)
    for _ in range(2):
        batch = ds.__getitems__([20, 31])
        for (image, _), i in zip(batch, [20, 31], strict=True):
            assert_same_image(image, expected[i][0] + 1)
    del ds, batch

    ds = readers.open_dataset(root)
    ds[3][0].zero_()
    assert_same_image(ds[3][0], expected[3][0])
    batch = ds.__getitems__([4, 5])
    batch[0][0].zero_()
    assert_same_image(ds[4][0], expected[4][0])


@pytest.mark.parametrize("compression", ["gzip", "lzf"])
def test_compressed_hdf5_reads_like_uncompressed(converted, compression: str) -> None:
    plain = readers.open_dataset(converted("hdf5", "raw-fixed"))
    packed = readers.open_dataset(converted("hdf5", "raw-fixed", compression=compression))
    indices = [5, 0, 31, 5, 17]
    expected = plain.__getitems__(indices)
    for batch in (packed.__getitems__(indices), [packed[i] for i in indices]):
        for (image, label), (want, want_label) in zip(batch, expected, strict=True):
            assert label == want_label
            assert_same_image(image, want)
    with h5py.File(packed.manifest.shard_path(0)) as f:
        assert f[spec.H5_IMAGES].compression == compression
