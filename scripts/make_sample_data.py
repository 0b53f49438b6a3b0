"""Regenerate ``sample_data/``: a small ImageNet-layout folder of real, freely licensed photos.

The photos ship inside the scikit-image and scikit-learn wheels, so no network is needed.
Several images per photo are derived by deterministic crops, scales and flips.

Usage: ``python scripts/make_sample_data.py [--out sample_data]``
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import skimage.data
from PIL import Image
from sklearn.datasets import load_sample_image

SEED = 0
JPEG_QUALITY = 90
PNG_COMPRESS_LEVEL = 9


@dataclass(frozen=True)
class Photo:
    """A photograph shipped inside a PyPI wheel, with its licence and credit."""

    package: str  # "scikit-image" or "scikit-learn"
    ref: str  # skimage.data function name, or sklearn sample image file name
    licence: str
    credit: str

    @property
    def source(self) -> str:
        """The Python call that loads the photo."""
        if self.package == "scikit-learn":
            return f"sklearn.datasets.load_sample_image('{self.ref}')"
        return f"skimage.data.{self.ref}()"


PHOTOS: dict[str, Photo] = {
    "astronaut": Photo(
        "scikit-image", "astronaut", "Public domain", "NASA, Eileen Collins (flic.kr/p/r9qvLn)"
    ),
    "camera": Photo("scikit-image", "camera", "CC0", "Lav Varshney"),
    "chelsea": Photo("scikit-image", "chelsea", "CC0", "Stefan van der Walt"),
    "coffee": Photo("scikit-image", "coffee", "CC0", "Rachel Michetti, Pikolo Espresso Bar"),
    "hubble": Photo(
        "scikit-image", "hubble_deep_field", "Public domain", "NASA, Hubble eXtreme Deep Field"
    ),
    "rocket": Photo("scikit-image", "rocket", "Public domain", "SpaceX, DSCOVR launch on Falcon 9"),
    "china": Photo(
        "scikit-learn",
        "china.jpg",
        "CC BY 2.0",
        "danielbuechele, flickr.com/photos/danielbuechele/6061409035",
    ),
    "flower": Photo(
        "scikit-learn",
        "flower.jpg",
        "CC BY 2.0",
        "vultilion, flickr.com/photos/vultilion/6056698931",
    ),
}

# (class folder, photo, number of images)
PLAN: tuple[tuple[str, str, int], ...] = (
    ("nature", "chelsea", 4),
    ("nature", "flower", 4),
    ("people", "astronaut", 5),
    ("people", "camera", 3),
    ("scenes", "china", 4),
    ("scenes", "coffee", 4),
    ("space", "hubble", 4),
    ("space", "rocket", 4),
)

# Images saved as PNG instead of JPEG (one RGB, one grayscale).
PNG_STEMS = frozenset({"chelsea_03", "camera_02"})

LICENCE_URLS = {
    "CC0": "https://creativecommons.org/publicdomain/zero/1.0/",
    "CC BY 2.0": "https://creativecommons.org/licenses/by/2.0/",
}


def load_photo(name: str) -> Image.Image:
    """Load a photo from ``PHOTOS`` as a Pillow image (mode RGB or L), offline."""
    photo = PHOTOS[name]
    if photo.package == "scikit-learn":
        array = load_sample_image(photo.ref)
    else:
        array = getattr(skimage.data, photo.ref)()
    return Image.fromarray(np.ascontiguousarray(array))


def fit_within(width: int, height: int, max_side: int) -> tuple[int, int]:
    """Scale (width, height) down so the longer side is at most ``max_side``."""
    scale = min(1.0, max_side / max(width, height))
    return round(width * scale), round(height * scale)


def random_crop(
    photo: Image.Image, size: tuple[int, int], min_area: float, rng: np.random.Generator
) -> Image.Image:
    """Crop a random region (``min_area``-100 % of the area, aspect of ``size``), resize it."""
    area = photo.width * photo.height * rng.uniform(min_area, 1.0)
    return crop_area(photo, size, area, rng)


def crop_area(
    photo: Image.Image, size: tuple[int, int], area: float, rng: np.random.Generator
) -> Image.Image:
    """Crop a region of about ``area`` pixels with the aspect of ``size`` at a random place
    (clipped to the photo), and resize it to ``size``."""
    aspect = size[0] / size[1]
    crop_w = min(photo.width, round(np.sqrt(area * aspect)))
    crop_h = min(photo.height, round(crop_w / aspect))
    crop_w = min(crop_w, round(crop_h * aspect))
    left = int(rng.integers(0, photo.width - crop_w + 1))
    top = int(rng.integers(0, photo.height - crop_h + 1))
    view = photo.crop((left, top, left + crop_w, top + crop_h))
    return view.resize(size, Image.Resampling.LANCZOS)


def random_flip(image: Image.Image, rng: np.random.Generator) -> Image.Image:
    """Flip horizontally with probability 0.5."""
    if rng.random() < 0.5:
        return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return image


def random_view(photo: Image.Image, rng: np.random.Generator) -> Image.Image:
    """Random crop (40-100 % of the area), random resize to 200-500 px, random flip."""
    size = (int(rng.integers(200, 501)), int(rng.integers(200, 501)))
    return random_flip(random_crop(photo, size, 0.4, rng), rng)


def save_image(image: Image.Image, path: Path) -> None:
    """Save as JPEG or PNG with fixed options and no metadata (byte-reproducible)."""
    if path.suffix == ".png":
        image.save(path, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    else:
        image.save(path, format="JPEG", quality=JPEG_QUALITY)


def make_images(out: Path) -> list[tuple[str, str, Image.Image]]:
    """Write every planned image under ``out``; return (relative path, photo, image) rows."""
    rng = np.random.default_rng(SEED)
    rows = []
    for class_name, photo_name, count in PLAN:
        class_dir = out / class_name
        class_dir.mkdir(parents=True, exist_ok=True)
        photo = load_photo(photo_name)
        for index in range(count):
            if index == 0:  # the whole photo, scaled to fit 480 px
                image = photo.resize(fit_within(*photo.size, 480), Image.Resampling.LANCZOS)
            else:
                image = random_view(photo, rng)
            stem = f"{photo_name}_{index:02d}"
            file_name = f"{stem}.png" if stem in PNG_STEMS else f"{stem}.jpg"
            save_image(image, class_dir / file_name)
            rows.append((f"{class_name}/{file_name}", photo_name, image))
    return rows


def remove_stale_images(out: Path) -> None:
    """Delete images left in the planned class folders by an earlier run."""
    for class_name in sorted({class_name for class_name, _, _ in PLAN}):
        for path in sorted((out / class_name).glob("*")):
            if path.suffix in {".jpg", ".png"}:
                path.unlink()


def readme_text(rows: list[tuple[str, str, Image.Image]]) -> str:
    """Render README.md: provenance, regeneration command, per-file table and credits."""
    used = sorted({photo_name for _, photo_name, _ in rows})
    n_classes = len({class_name for class_name, _, _ in PLAN})
    lines = [
        "# sample_data",
        "",
        f"A small ImageNet-layout folder ({len(rows)} images in {n_classes} class folders) for",
        "tests and examples. Every image is derived from a real photograph that ships inside the",
        "scikit-image or scikit-learn wheel under a free licence (public domain, CC0 or CC BY",
        "2.0). The `_00` image of each photo is the whole photo scaled to fit 480 px; the others",
        "are deterministic random crops, rescales and horizontal flips. Most files are RGB JPEGs",
        "(quality 90); `nature/chelsea_03.png` is an RGB PNG, and the `camera` images are",
        "grayscale (mode L), one of them a PNG.",
        "",
        "This folder and this README are generated; do not edit them by hand. To regenerate",
        "(byte-identical output for the same Pillow/libjpeg versions):",
        "",
        "```sh",
        "python scripts/make_sample_data.py",
        "```",
        "",
        "| File | Source photo | Package | Licence | Size (WxH) | Mode |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for rel_path, photo_name, image in rows:
        photo = PHOTOS[photo_name]
        lines.append(
            f"| `{rel_path}` | `{photo.source}` | {photo.package} | {photo.licence} "
            f"| {image.width}x{image.height} | {image.mode} |"
        )
    lines += ["", "## Credits", ""]
    for photo_name in used:
        photo = PHOTOS[photo_name]
        licence = photo.licence
        if licence in LICENCE_URLS:
            licence = f"[{licence}]({LICENCE_URLS[licence]})"
        lines.append(f"- `{photo.source}`: {photo.credit}. Licence: {licence}.")
    lines += [
        "",
        "The CC BY 2.0 photos (`china`, `flower`) were cropped, rescaled and flipped; the",
        "original credits are in scikit-learn's `sklearn/datasets/images/README.txt`. The other",
        "licences are stated in the docstrings of the `skimage.data` functions.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    """Parse arguments and regenerate the sample folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("sample_data"), help="output folder")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    remove_stale_images(args.out)
    rows = make_images(args.out)
    (args.out / "README.md").write_text(readme_text(rows), encoding="utf-8")
    print(f"wrote {len(rows)} images and README.md to {args.out}")


if __name__ == "__main__":
    main()
