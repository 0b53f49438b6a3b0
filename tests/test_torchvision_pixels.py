"""The converter's pixels against torchvision's own recipe on real photos.

torchvision cannot be installed here, so its Pillow path is written out as it computes it:
``ImageFolder``'s loader (``Image.open(f).convert("RGB")``), ``Resize(n)`` on a PIL image
(``img.resize((w, h), BILINEAR)``, shorter side ``n``, longer ``int(n * long / short)``)
and ``CenterCrop(c)`` (top ``int(round((h - c) / 2.0))``, left likewise).

Sources are real photos from the scikit-image and scikit-learn wheels at their own sizes
(300-1411 px; gravel, a gray texture, has the finest detail), ImageNet-sized crops of
them, and, for 1601-4000 px, mosaics tiled from those photos at their native scale
(nothing resampled: real-photo detail per tile, with seams between tiles), all saved as
JPEG. Targets span 64-512; the default conversion DCT-scales a JPEG only as far as
``DCT_REDUCING_GAP`` allows (at 2, gravel is 1.69 levels off at 64), ``--exact-resize``
never.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from functools import cache

import numpy as np
import pytest
from PIL import Image

from convert.process import Transform, prepare
from tests.photos import wheel_photo

# (resize, center crop) from 64 to 512: most crops at 7/8 (ImageNet's 224/256), one none.
TARGETS = ((64, 64), (80, 70), (96, 84), (128, 112), (160, 144), (192, 168), (256, 224))
TARGETS += ((320, 280), (384, None), (512, 448))
MEAN_LEVELS = 0.5  # mean over the photos of each one's mean absolute difference, per target
WORST_LEVELS = 1.5  # the largest mean absolute difference of any one photo
EXACT_LEVELS = 0.1  # --exact-resize: measured 0.04 at most (torch's uint8 kernel vs Pillow)


@cache
def _photo(name: str) -> np.ndarray:
    pixels = wheel_photo(name)  # RGB(A), or gray (saved as a gray JPEG)
    return np.ascontiguousarray(pixels[..., :3] if pixels.ndim == 3 else pixels)


MOSAIC_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "china.jpg", "flower.jpg")
MOSAIC_PHOTOS += ("motorcycle_left.png", "hubble_deep_field")


def _mosaic(width: int, height: int, seed: int) -> np.ndarray:
    """A ``width``x``height`` canvas tiled in columns with whole photos at their own scale
    (cut at the right and bottom edges), in an order chosen by ``seed``."""
    rng = np.random.default_rng(seed)
    canvas = np.zeros((height, width, 3), np.uint8)
    x = 0
    while x < width:
        y, column = 0, 0
        while y < height:
            tile = _photo(MOSAIC_PHOTOS[rng.integers(len(MOSAIC_PHOTOS))])
            canvas[y : y + tile.shape[0], x : x + tile.shape[1]] = tile[: height - y, : width - x]
            y, column = y + tile.shape[0], max(column, tile.shape[1])
        x += column
    return canvas


def _jpeg(pixels: np.ndarray, quality: int = 90, subsampling: int = 2) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=quality, subsampling=subsampling)
    return out.getvalue()


@cache
def _sources() -> dict[str, bytes]:
    """name -> JPEG bytes, 300 to 4000 px."""
    photos = ("chelsea", "coffee", "rocket", "china.jpg", "flower.jpg", "astronaut")
    photos += ("motorcycle_left.png", "hubble_deep_field", "retina", "gravel")
    sources = {name: _jpeg(_photo(name)) for name in photos}
    for name, (w, h) in (("china.jpg", (500, 375)), ("coffee", (400, 350))):
        sources[f"{name} {w}x{h}"] = _jpeg(_photo(name)[:h, :w])  # ImageNet-sized
    sources["motorcycle_left 739x497 4:4:4"] = _jpeg(
        _photo("motorcycle_left.png")[:497, :739], 95, 0
    )
    for seed, (w, h) in enumerate(((1601, 1203), (2560, 1440), (2249, 4000))):
        sources[f"mosaic {w}x{h}"] = _jpeg(_mosaic(w, h, seed))
    return sources


@cache
def _loaded(data: bytes) -> Image.Image:
    """``torchvision.datasets.folder.pil_loader``: open, ``convert("RGB")``."""
    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


@cache
def torchvision_pixels(data: bytes, resize: int, crop: int | None) -> np.ndarray:
    """``ImageFolder`` loading, ``Resize(resize)`` then ``CenterCrop(crop)``, on PIL."""
    img = _loaded(data)
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(resize * long / short)
    img = img.resize((resize, new_long) if w <= h else (new_long, resize), Image.BILINEAR)
    if crop is not None:
        w, h = img.size
        top, left = round((h - crop) / 2.0), round((w - crop) / 2.0)  # int(round(...))
        img = img.crop((left, top, left + crop, top + crop))
    return np.asarray(img)


def _differences(exact: bool, targets: tuple[tuple[int, int | None], ...]) -> np.ndarray:
    """``[source, target]`` mean absolute difference (levels of 255) from torchvision."""
    sources = _sources()
    diff = np.zeros((len(sources), len(targets)))
    for i, data in enumerate(sources.values()):
        for j, (resize, crop) in enumerate(targets):
            t = Transform("raw", resize, crop, exact_resize=exact)
            ours = prepare(data, f"source {i}", t).data
            theirs = torchvision_pixels(data, resize, crop)
            assert ours.shape == theirs.shape, (list(sources)[i], resize, crop)
            diff[i, j] = np.abs(ours.astype(np.int16) - theirs).mean()
    return diff


def _table(diff: np.ndarray, targets: tuple[tuple[int, int | None], ...]) -> str:
    head = "".join(f"{r}/{c or '-':<4} " for r, c in targets)
    rows = [
        f"{name:>30} " + "".join(f"{d:8.2f} " for d in row)
        for name, row in zip(_sources(), diff, strict=True)
    ]
    return "\n".join([f"{'':>30} {head}", *rows])


@pytest.fixture(scope="module", autouse=True)
def _release_photos() -> Iterator[None]:
    """The decoded photos (about 100 MB) serve this module's tests only: freed as it ends,
    since every later fork of the test process would copy their page tables."""
    yield
    for cached in (_photo, _sources, _loaded, torchvision_pixels):
        cached.cache_clear()


def test_sources_are_real_photos_from_300_to_4000_px() -> None:
    sizes = [Image.open(io.BytesIO(data)).size for data in _sources().values()]
    assert min(min(s) for s in sizes) == 300 and max(max(s) for s in sizes) == 4000


def test_default_conversion_is_within_half_a_level_of_torchvision() -> None:
    diff = _differences(exact=False, targets=TARGETS)
    table = _table(diff, TARGETS)
    assert diff.mean(axis=0).max() <= MEAN_LEVELS, f"mean per target over the limit:\n{table}"
    assert diff.max() <= WORST_LEVELS, f"one photo over the limit:\n{table}"


def test_exact_resize_gives_torchvisions_pixels() -> None:
    targets = TARGETS[::3]  # 64 to 512: a full decode at every size takes longer
    diff = _differences(exact=True, targets=targets)
    assert diff.max() <= EXACT_LEVELS, _table(diff, targets)


# The tables docs/FORMATS.md quotes: python -m tests.test_torchvision_pixels
if __name__ == "__main__":
    for exact in (False, True):
        diff = _differences(exact, TARGETS)
        print("--exact-resize" if exact else "default", "\n" + _table(diff, TARGETS))
        for label, values in (("mean", diff.mean(axis=0)), ("worst", diff.max(axis=0))):
            print(f"{label:>30} " + "".join(f"{d:8.2f} " for d in values))
