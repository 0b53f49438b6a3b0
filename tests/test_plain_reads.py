"""The plain read path (no ``crop=``) of a dataset stored at its training size: whole
batches of JPEGs of one size go through the compiled kernel (:mod:`readers.images.whole`),
with the pixels every other path gives (``ds[i]``, the per-sample path with
``IMGPACK_KERNEL=0``, DataLoader workers), ``transform=`` seeing those same images, and
batches that mix in other images (a PNG, another size) still served whole or as a list."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import readers
import readers.dataset
from convert import ConvertOptions, convert_folder
from readers.images.kernel import crop_kernel
from readers.images.pool import DecodePool
from readers.images.whole import start_batch
from tests.photos import encode, photo_crop

ROOT = Path(__file__).resolve().parent.parent
SIDE = 32  # stored size: --resize 40 --center-crop 32
FORMATS = ("pt", "wds", "lmdb", "hdf5")
COUNT = 14

needs_kernel = pytest.mark.skipif(crop_kernel() is None, reason="the crop kernel is not built")


def photo_source(src: Path, sizes: list[tuple[int, int]], png: set[int] = frozenset()) -> Path:
    """Photo crops of ``sizes`` in two class folders; the rows in ``png`` as PNGs."""
    for i, (height, width) in enumerate(sizes):
        folder = src / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = photo_crop(height, width, seed=i)
        name, data = (f"{i:02d}.png", encode(pixels, "PNG")) if i in png else (f"{i:02d}.jpg", None)
        (folder / name).write_bytes(data or encode(pixels, quality=90))
    return src


@pytest.fixture(scope="module")
def stored_at_size(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each format's dataset of COUNT photos converted to SIDE x SIDE JPEGs."""
    src = photo_source(
        tmp_path_factory.mktemp("plain-src"), [(60 + i, 50 + 2 * i) for i in range(COUNT)]
    )
    roots = {}
    for fmt in FORMATS:
        dst = tmp_path_factory.mktemp(f"plain-{fmt}") / "dst"
        options = ConvertOptions(fmt, resize=40, center_crop=SIDE, shard_size=5)
        convert_folder(src, dst, options, workers=1, progress=False)
        roots[fmt] = dst
    return roots


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Original files: JPEGs of one size, a PNG of that size (row 3), and a JPEG of
    another size (row 5)."""
    sizes = [(SIDE, SIDE)] * 5 + [(SIDE + 8, SIDE)] + [(SIDE, SIDE)] * 2
    src = photo_source(tmp_path_factory.mktemp("mixed-src"), sizes, png={3})
    dst = tmp_path_factory.mktemp("mixed") / "dst"
    convert_folder(src, dst, ConvertOptions("pt", encoding="original"), workers=1, progress=False)
    return dst


def digest(images: torch.Tensor) -> str:
    return hashlib.sha256(images.contiguous().numpy().tobytes()).hexdigest()


def one_by_one(ds: readers.ImageDataset, indices: list[int]) -> torch.Tensor:
    return torch.stack([ds[i][0] for i in indices])


class Counted:
    """``readers.dataset.decode_image``, counting its calls: the per-sample decodes."""

    def __init__(self) -> None:
        self.calls = 0
        self.decode = readers.dataset.decode_image

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.decode(*args, **kwargs)


@needs_kernel
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_batch_of_one_size_decodes_in_the_kernel_with_the_same_pixels(
    stored_at_size, fmt, monkeypatch
) -> None:
    ds = readers.open_dataset(stored_at_size[fmt])
    indices = [3, 0, 13, 7, 6, 12, 1]  # across shards, out of order
    want = one_by_one(ds, indices)
    counted = Counted()
    monkeypatch.setattr(readers.dataset, "decode_image", counted)
    images, labels = readers.collate(ds.__getitems__(indices))
    assert counted.calls == 0  # no per-sample decode: one kernel batch
    assert images.shape == (len(indices), 3, SIDE, SIDE)
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(images, want)
    assert labels.tolist() == [ds[i][1] for i in indices]


def batch_digests(roots: list[Path]) -> list[str]:
    """Each dataset's batch of all its samples, digested."""
    digests = []
    for root in roots:
        ds = readers.open_dataset(root)
        images, _ = readers.collate(ds.__getitems__(list(range(len(ds)))))
        digests.append(digest(images))
    return digests


@needs_kernel
def test_kernel_batches_equal_the_python_path(stored_at_size, request, monkeypatch) -> None:
    roots = [stored_at_size[fmt] for fmt in ("pt", "wds")]
    kernel = batch_digests(roots)
    request.getfixturevalue("python_path")
    counted = Counted()
    monkeypatch.setattr(readers.dataset, "decode_image", counted)
    assert kernel == batch_digests(roots)
    assert counted.calls == sum(len(readers.open_dataset(root)) for root in roots)  # per sample


@pytest.mark.parametrize("workers", [0, 2])
def test_make_loader_serves_the_samples_ds_i_does(stored_at_size, workers) -> None:
    root = stored_at_size["lmdb"]
    ds = readers.open_dataset(root)
    want = sorted(digest(ds[i][0]) for i in range(len(ds)))
    loader = readers.make_loader(root, 4, num_workers=workers, decode_threads=1)
    got = sorted(digest(image) for images, _ in loader for image in images)
    assert got == want


def test_transform_sees_the_decoded_images_once_each(stored_at_size) -> None:
    seen: list[tuple[tuple[int, ...], torch.dtype]] = []

    def shift(image: torch.Tensor) -> torch.Tensor:
        seen.append((tuple(image.shape), image.dtype))
        return image.to(torch.int16) + 1

    plain = readers.open_dataset(stored_at_size["pt"])
    ds = readers.open_dataset(stored_at_size["pt"], transform=shift)
    indices = [9, 2, 4, 11]
    images, _ = readers.collate(ds.__getitems__(indices))
    assert seen == [((3, SIDE, SIDE), torch.uint8)] * len(indices)
    assert images.dtype == torch.int16
    assert torch.equal(images, one_by_one(plain, indices).to(torch.int16) + 1)


def test_a_png_of_the_size_joins_the_batch_another_size_makes_a_list(mixed) -> None:
    ds = readers.open_dataset(mixed)
    by_path = {Path(ds.source_path(i)).name: i for i in range(len(ds))}
    same = [by_path[f"{k:02d}.{'png' if k == 3 else 'jpg'}"] for k in (0, 3, 1, 7)]
    images, _ = readers.collate(ds.__getitems__(same))
    assert isinstance(images, torch.Tensor) and torch.equal(images, one_by_one(ds, same))
    other = [*same[:2], by_path["05.jpg"]]
    batch = ds.__getitems__(other)
    assert isinstance(batch.images, list)
    for image, i in zip(batch.images, other, strict=True):
        assert torch.equal(image, ds[i][0])


@needs_kernel
@pytest.mark.parametrize(
    "params",
    [
        {"quality": 90},
        {"quality": 75, "progressive": True},
        {"quality": 95, "subsampling": 0},
        {"quality": 85, "subsampling": 1},
    ],
    ids=["baseline-420", "progressive", "444", "422"],
)
def test_unverified_bytes_decode_as_turbojpeg_does(params) -> None:
    values = [encode(photo_crop(37, 53, seed=k), **params) for k in range(5)]
    values.append(encode(Image.fromarray(photo_crop(37, 53, seed=9)).convert("L"), **params))
    want = np.stack([readers.decode_image(v) for v in values])  # TurboJPEG, unverified
    for ahead in (False, True):  # the caller decoding beside the pool, or the pool alone
        started = start_batch(values, False, lambda row: 1 / 0, None, DecodePool(), 2, ahead)
        images = started.result()  # no fallback: the kernel takes every one
        assert isinstance(images, torch.Tensor)
        np.testing.assert_array_equal(images.permute(0, 2, 3, 1).numpy(), want)
