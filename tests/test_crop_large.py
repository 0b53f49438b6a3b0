"""Crops (``crop=``) of large JPEGs, 2560-6000 px: a DCT-scaled decode only as far as the
converter's reducing gap allows (:data:`readers.images.jpeg.DCT_REDUCING_GAP`), so both
the kernel and the Python path (``IMGPACK_KERNEL=0``; the Makefile runs this file again
that way) stay within half a level of a full decode followed by the same box, torch's
antialiased resize and flip, and of each other. The former rule (DCT-scaled whenever the
scaled box stayed at least the output) left the resize next to nothing: the kernel up to
3.9 levels off on camera photos, the Python path 4.1.

No photo of 2560 px or more ships in the wheels installed here, so the large photos are
made from the real ones that do: grids of whole photos at their native scale (real-photo
detail at every pixel, gravel's the finest, with seams between the photos), and the
largest, retina (1411 px), upscaled 2x by Pillow's LANCZOS (one whole photo, smoother
than a camera's at that size).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import readers
from convert import ConvertOptions, convert_folder
from readers.images import kernel
from readers.images.crop import Crop
from readers.images.fused import crop_python, plan_crops, start_crops
from readers.images.jpeg import crop_dct_divisors, jpeg_size
from tests.photos import encode, wheel_photo

# The wheels' colour photos at their own size, and gravel (gray, the finest detail) as RGB.
GRID_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "retina")
GRID_PHOTOS += ("gravel", "china.jpg", "flower.jpg")
# (height, width) of the grids: 4:3 at 2560, 4000 and 6000 px, one portrait
GRIDS = ((1920, 2560), (3000, 4000), (6000, 4000))
CROPS: dict[str, Crop] = {
    "center-ratio": readers.CenterCrop(224, ratio=224 / 256),
    "random": readers.RandomResizedCrop(224, flip=True, seed=7),
    "random-wide": readers.RandomResizedCrop((96, 128), scale=(0.02, 1.0), flip=True, seed=8),
}
EPOCHS = 3  # random boxes are drawn anew each epoch: 12 a random crop
# Each path from the recipe per crop and per photo, and the two paths from each other per
# crop. Measured: the kernel 0.13-0.18 a crop (0.24 the worst photo), the Python path
# 0.14-0.20 (0.25), the two 0.004-0.018 apart; the former rule: the kernel 0.37-0.44 (0.68), the
# Python path 0.93-1.07, the two 0.85-1.04 apart.
MEAN_LEVELS = 0.5


def rgb_photo(name: str) -> np.ndarray:
    """A real photo from the scikit-image or scikit-learn wheel, as RGB pixels."""
    pixels = wheel_photo(name)
    return np.ascontiguousarray(np.dstack([pixels] * 3) if pixels.ndim == 2 else pixels[..., :3])


def photo_grid(height: int, width: int, seed: int) -> np.ndarray:
    """``[height, width, 3]`` filled row by row with whole wheel photos at their own scale
    (cut at the right and bottom), in an order drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    grid = np.zeros((height, width, 3), dtype=np.uint8)
    top = 0
    while top < height:
        left, row_height = 0, 0
        while left < width:
            photo = rgb_photo(GRID_PHOTOS[rng.integers(len(GRID_PHOTOS))])
            part = photo[: height - top, : width - left]
            grid[top : top + part.shape[0], left : left + part.shape[1]] = part
            left, row_height = left + part.shape[1], max(row_height, part.shape[0])
        top += row_height
    return grid


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``pt`` dataset of the large photos' q90 JPEGs, stored as they are."""
    src = tmp_path_factory.mktemp("large-src") / "photos"
    src.mkdir()
    for seed, (height, width) in enumerate(GRIDS):
        image = photo_grid(height, width, seed)
        (src / f"grid{seed}.jpg").write_bytes(encode(image, quality=90))
    retina = Image.fromarray(wheel_photo("retina")).resize((2822, 2822), Image.Resampling.LANCZOS)
    (src / "retina-x2.jpg").write_bytes(encode(retina, quality=90))
    dst = tmp_path_factory.mktemp("large-pt")
    options = ConvertOptions(format="pt", encoding="original")
    convert_folder(src.parent, dst, options, workers=1, overwrite=True, progress=False)
    return dst


def recipe(pixels: np.ndarray, box: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A full decode's box (inside the image), ``F.interpolate(antialias=True)``, flip."""
    top, left, bh, bw, flip = (int(v) for v in box)
    chw = torch.from_numpy(pixels[top : top + bh, left : left + bw]).permute(2, 0, 1)
    chw = chw[None].contiguous(memory_format=torch.channels_last)
    out = F.interpolate(chw, size=size, mode="bilinear", antialias=True)[0]
    return (out.flip(-1) if flip else out).permute(1, 2, 0).numpy()


@pytest.fixture(scope="module")
def decoded(large: Path) -> list[np.ndarray]:
    """Every sample of ``large`` decoded at full size."""
    ds = readers.open_dataset(large)
    return [readers.decode_image(ds.stored(i)) for i in range(len(ds))]


def read_crops(large: Path, crop: Crop) -> tuple[np.ndarray, np.ndarray]:
    """``(boxes [n, 5], crops [n, H, W, 3])`` of every sample over :data:`EPOCHS` epochs (one
    for a fixed crop), each epoch read as one batch through the readers' public path."""
    ds = readers.open_dataset(large, crop=crop, decode_threads=2)
    indices = np.arange(len(ds))
    sizes = np.array([jpeg_size(ds.stored(i)) for i in indices])
    boxes, crops = [], []
    for epoch in range(EPOCHS if isinstance(crop, readers.RandomResizedCrop) else 1):
        crop.set_epoch(epoch)
        images, _ = readers.collate(ds.__getitems__(indices.tolist()))
        boxes.append(crop.boxes(sizes, indices))
        crops.append(images.permute(0, 2, 3, 1).numpy())
    crop.set_epoch(0)
    return np.concatenate(boxes), np.concatenate(crops)


def mean_levels(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b).mean())


@pytest.mark.parametrize("name", CROPS)
def test_large_crops_stay_within_half_a_level_of_the_full_decode(large, decoded, name):
    crop = CROPS[name]
    boxes, crops = read_crops(large, crop)
    index = np.arange(len(boxes)) % len(decoded)
    want = np.stack(
        [recipe(decoded[i], box, crop.size) for i, box in zip(index, boxes, strict=True)]
    )
    sizes = np.array([decoded[i].shape[:2] for i in index])
    assert (crop_dct_divisors(boxes, sizes, crop.size) > 1).mean() >= 0.5  # mostly scaled
    per_photo = [mean_levels(crops[index == i], want[index == i]) for i in range(len(decoded))]
    assert mean_levels(crops, want) <= MEAN_LEVELS and max(per_photo) <= MEAN_LEVELS, per_photo


needs_kernel = pytest.mark.skipif(kernel.crop_kernel() is None, reason="no crop kernel here")


@needs_kernel
@pytest.mark.parametrize("name", CROPS)
def test_kernel_and_python_path_crop_large_jpegs_alike(large, name):
    """The same batch plan through the kernel and through the Python path (every row, as
    without the kernel): within half a level on average."""
    crop = CROPS[name]
    ds = readers.open_dataset(large)
    values = [ds.stored(i) for i in range(len(ds))]
    indices = np.arange(len(values))
    by_kernel = np.zeros((len(values), *crop.size, 3), dtype=np.uint8)
    by_python = np.zeros_like(by_kernel)
    start_crops(values, indices, crop, by_kernel, str).finish()
    plan = plan_crops(values, indices, crop, str)
    assert plan.fast.all() and (plan.divisors > 1).any()
    crop_python(plan, indices, values, indices, crop, by_python, str)
    assert mean_levels(by_kernel, by_python) <= MEAN_LEVELS
