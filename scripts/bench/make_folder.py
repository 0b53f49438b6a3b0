"""Build an ImageNet-shaped benchmark folder of JPEGs derived from freely licensed real photos.

Each image is a random crop of one of the colour photos from ``make_sample_data.PHOTOS``,
resized to an ImageNet-like size (300-500 x 250-450 px), randomly flipped and given a mild
brightness/contrast jitter. To keep the fine detail (and so the file size, ~60 KB) of
ImageNet's JPEGs rather than that of smooth upscales, crops are mostly downscaled (at most
1.2x upscaled, at most 2x downscaled, log-uniform in area), get a mild unsharp mask after
resizing, and ``SUBSAMPLING_444`` of them are saved with 4:4:4 chroma (the rest 4:2:0), as
ImageNet mixes both. Output is deterministic given ``--seed``.

Usage: ``python -m scripts.bench.make_folder --out /tmp/bench [--images 3000] [--classes 10]``
"""

from __future__ import annotations

import argparse
import os
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

from scripts.make_sample_data import PHOTOS, crop_area, load_photo, random_flip

MAX_UPSCALE = 1.2  # linear scale factors a crop may be resized by
MAX_DOWNSCALE = 2.0
SUBSAMPLING_444 = 0.4  # fraction of images saved with 4:4:4 chroma instead of 4:2:0

_photos: list[Image.Image] = []
_weights: list[float] = []


def _init_worker() -> None:
    """Load the colour photos once per worker; weight them by pixel count."""
    for name in sorted(PHOTOS):
        photo = load_photo(name)
        if photo.mode == "RGB":
            _photos.append(photo)
    total = sum(photo.width * photo.height for photo in _photos)
    _weights.extend(photo.width * photo.height / total for photo in _photos)


def detailed_crop(
    photo: Image.Image, size: tuple[int, int], rng: np.random.Generator
) -> Image.Image:
    """Crop a random region with the aspect of ``size`` that is resized to ``size`` by a
    factor within [1 / MAX_DOWNSCALE, MAX_UPSCALE] where the photo allows, then resize it."""
    target = size[0] * size[1]
    photo_area = photo.width * photo.height
    low = min(photo_area, target / MAX_UPSCALE**2)
    high = min(photo_area, target * MAX_DOWNSCALE**2)
    area = float(np.exp(rng.uniform(np.log(low), np.log(high))))
    return crop_area(photo, size, area, rng)


def make_image(rng: np.random.Generator) -> Image.Image:
    """Crop and resize to an ImageNet-like size, flip, jitter, then sharpen mildly."""
    photo = _photos[rng.choice(len(_photos), p=_weights)]
    size = (int(rng.integers(300, 501)), int(rng.integers(250, 451)))
    image = random_flip(detailed_crop(photo, size, rng), rng)
    image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.8, 1.2))
    image = ImageEnhance.Contrast(image).enhance(rng.uniform(0.8, 1.2))
    sharpen = ImageFilter.UnsharpMask(radius=1.5, percent=int(rng.integers(80, 141)), threshold=2)
    return image.filter(sharpen)


def _write(task: tuple[Path, int, int, int]) -> tuple[int, int, int]:
    """Make image number ``index`` and save it; return (width, height, file size in bytes)."""
    path, index, seed, quality = task
    rng = np.random.default_rng([seed, index])
    image = make_image(rng)
    subsampling = 0 if rng.random() < SUBSAMPLING_444 else 2  # Pillow: 0 = 4:4:4, 2 = 4:2:0
    image.save(path, format="JPEG", quality=quality, subsampling=subsampling)
    return image.width, image.height, path.stat().st_size


def main() -> None:
    """Parse arguments, write the folder in parallel and print a one-line summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--images", type=int, default=3000, help="total number of images")
    parser.add_argument("--classes", type=int, default=10, help="number of class folders")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality")
    args = parser.parse_args()
    if args.images < 1 or args.classes < 1:
        parser.error("--images and --classes must be at least 1")

    tasks = []
    for index in range(args.images):
        class_dir = args.out / f"class_{index % args.classes:03d}"
        class_dir.mkdir(parents=True, exist_ok=True)
        tasks.append((class_dir / f"img_{index:06d}.jpg", index, args.seed, args.quality))
    with Pool(os.cpu_count(), initializer=_init_worker) as pool:
        stats = np.array(pool.map(_write, tasks, chunksize=16), dtype=float)
    width, height, size = stats.mean(axis=0)
    print(
        f"wrote {args.images} images in {args.classes} classes to {args.out}: "
        f"mean {width:.0f}x{height:.0f} px, mean {size / 1000:.1f} KB ({size / 1024:.1f} KiB), "
        f"total {stats[:, 2].sum() / 1e6:.1f} MB"
    )


if __name__ == "__main__":
    main()
