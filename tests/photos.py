"""Real photo pixels for tests that build their inputs on the fly (never solid colours or
noise, which codecs and resizers treat unlike real images)."""

from __future__ import annotations

import importlib.util
import io
import math
import random
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["captioned_photos", "encode", "photo_crop", "photo_folder", "wheel_photo"]

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")


def _package_folder(package: str) -> Path:
    """Where ``package`` is installed, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{package} is not installed (the test extra installs it)")
    return Path(spec.submodule_search_locations[0])


def wheel_photo(name: str) -> np.ndarray:
    """A real photo shipped in the scikit-image or scikit-learn wheel, as Pillow reads its
    file: ``"astronaut"`` (``skimage.data``'s name), a file of ``skimage/data``
    (``"motorcycle_left.png"``) or of scikit-learn's sample images (``"china.jpg"``).

    The same pixels as ``skimage.data.astronaut()`` or ``load_sample_image``, without their
    imports: scikit-learn's took 2.5 s and 83 MB in each test process, which every later
    fork of a DataLoader or conversion worker then copied."""
    skimage_data = _package_folder("skimage") / "data"
    if "." in name:
        candidates = [skimage_data / name, _package_folder("sklearn") / "datasets/images" / name]
    else:
        candidates = sorted(skimage_data.glob(f"{name}.*"))
    for path in candidates:
        if path.is_file():
            with Image.open(path) as image:
                return np.asarray(image)
    raise FileNotFoundError(f"no photo {name!r} in the scikit-image or scikit-learn wheel")


@cache
def _photo(name: str) -> np.ndarray:
    return np.ascontiguousarray(wheel_photo(name)[..., :3])


def photo_crop(height: int, width: int, seed: int = 0) -> np.ndarray:
    """An ``[height, width, 3]`` uint8 crop of a scikit-image photo chosen by ``seed``."""
    rng = random.Random(seed)
    pixels = _photo(PHOTOS[seed % len(PHOTOS)])
    if pixels.shape[0] < height or pixels.shape[1] < width:
        pixels = np.array(Image.fromarray(pixels).resize((width * 2, height * 2)))
    top = rng.randrange(pixels.shape[0] - height + 1)
    left = rng.randrange(pixels.shape[1] - width + 1)
    return np.ascontiguousarray(pixels[top : top + height, left : left + width])


def encode(image: np.ndarray | Image.Image, fmt: str = "JPEG", **params: object) -> bytes:
    """``image`` saved by Pillow in ``fmt`` (JPEG, PNG, ...) with ``params``."""
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    out = io.BytesIO()
    image.save(out, fmt, **params)
    return out.getvalue()


def photo_folder(src: Path, images: int, height: int, width: int, classes: int = 3) -> Path:
    """``src`` filled with ``images`` JPEG photo crops spread over ``classes`` class folders."""
    for i in range(images):
        folder = src / f"class{i % classes}"
        folder.mkdir(exist_ok=True)
        (folder / f"img{i:04d}.jpg").write_bytes(
            encode(photo_crop(height, width, seed=i), quality=92)
        )
    return src


def captioned_photos(src: Path, name: str, n: int, seed: int) -> Path:
    """``n`` class folders of one photo each, about 150x150 at aspects 0.4 to 2.5, with a
    ``txt`` sidecar ``"<name> <index>"``; every fifth a PNG."""
    rng = random.Random(seed)
    for i in range(n):
        aspect = math.exp(rng.uniform(math.log(0.4), math.log(2.5)))
        h, w = round(150 / math.sqrt(aspect)), round(150 * math.sqrt(aspect))
        folder = src / f"c{i:02d}"
        folder.mkdir(parents=True)
        pixels = photo_crop(h, w, seed=seed + i)
        if i % 5 == 4:
            (folder / "img.png").write_bytes(encode(pixels, "PNG"))
        else:
            (folder / "img.jpg").write_bytes(encode(pixels, quality=90))
        (folder / "img.txt").write_text(f"{name} {i}", encoding="utf-8")
    return src
