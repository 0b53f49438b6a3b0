"""How long one JPEG takes to decode, by decoder, on one core: Pillow, Pillow with
``draft()`` (DCT-domain downscaling), PyTurboJPEG, PyTurboJPEG with a scaling factor, and a
predecoded read (a copy of the decoded pixels, what a raw dataset costs at least).

Two sets: 2560x1440 photos (mosaics of the freely licensed photos the sample data comes
from, each piece scaled at most 1.6x, unsharp-masked, q90 4:2:0), and ImageNet-sized
JPEGs from the benchmark folder. The scaled decoders produce the smallest image whose
shorter side is still >= ``--target`` (256: what a conversion with ``--resize 256``
needs), as the converter does unless ``--exact-resize``.

The conversion speed-up this buys on large sources is ``scripts.bench.convert --large``.

    .venv/bin/python -m scripts.bench.decode [--folder bench-data/folder] [--repeats 5]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

import readers
from readers.images.jpeg import dct_scale
from scripts.bench.settings import FOLDER
from scripts.make_sample_data import load_photo

MOSAIC = ("hubble", "coffee", "rocket", "astronaut", "chelsea", "china", "flower")


def mosaic(size: tuple[int, int], seed: int) -> bytes:
    """A ``size`` JPEG tiled from the photos, each tile at most 1.6x its native scale."""
    rng = np.random.default_rng(seed)
    canvas = Image.new("RGB", size)
    x = 0
    while x < size[0]:
        y, column = 0, 0
        while y < size[1]:
            photo = load_photo(MOSAIC[rng.integers(len(MOSAIC))]).convert("RGB")
            scale = rng.uniform(1.0, 1.6)
            tile = photo.resize((int(photo.width * scale), int(photo.height * scale)))
            tile = tile.filter(ImageFilter.UnsharpMask(radius=1.2, percent=60, threshold=2))
            canvas.paste(tile, (x, y))
            y, column = y + tile.height, max(column, tile.width)
        x += column
    out = io.BytesIO()
    canvas.save(out, "JPEG", quality=90, subsampling=2)
    return out.getvalue()


def decoders(target: int) -> dict[str, Callable[[bytes], np.ndarray]]:
    from turbojpeg import TJPF_RGB, TurboJPEG

    tj = TurboJPEG()

    def pillow(data: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(data)) as img:
            return np.asarray(img.convert("RGB"))

    def pillow_draft(data: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(data)) as img:
            scale = dct_scale(img.width, img.height, target)
            img.draft("RGB", (img.width * scale[0] // scale[1], img.height * scale[0] // scale[1]))
            return np.asarray(img.convert("RGB"))

    def turbo(data: bytes) -> np.ndarray:
        return tj.decode(data, pixel_format=TJPF_RGB)

    def turbo_scaled(data: bytes) -> np.ndarray:
        width, height, _, _ = tj.decode_header(data)
        return tj.decode(
            data, pixel_format=TJPF_RGB, scaling_factor=dct_scale(width, height, target)
        )

    return {
        "Pillow": pillow,
        "Pillow draft()": pillow_draft,
        "PyTurboJPEG": turbo,
        "PyTurboJPEG scaled": turbo_scaled,
        "imgpack decode_image": readers.decode_image,
        "imgpack decode_image(min_side)": lambda d: readers.decode_image(d, min_side=target),
    }


def per_image_ms(fn: Callable[[bytes], object], images: list[bytes], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for data in images:
            fn(data)
        times.append(1000 * (time.perf_counter() - start) / len(images))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=FOLDER)
    parser.add_argument("--images", type=int, default=200, help="ImageNet-sized ones")
    parser.add_argument("--large", type=int, default=8, help="2560x1440 ones")
    parser.add_argument("--target", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sets = {
        "2560x1440": [mosaic((2560, 1440), seed) for seed in range(args.large)],
        "ImageNet-sized": [p.read_bytes() for p in sorted(args.folder.glob("*/*"))[: args.images]],
    }
    print(
        f"decoder: {readers.decoder_name()}; ms per image, one thread, median of "
        f"{args.repeats}; scaled decoders keep the shorter side >= {args.target}"
    )
    print("| decoder | " + " | ".join(sets) + " |")
    print("|---|" + "---|" * len(sets))
    rows: dict[str, list[str]] = {}
    for label, images in sets.items():
        for name, fn in decoders(args.target).items():
            rows.setdefault(name, []).append(f"{per_image_ms(fn, images, args.repeats):.2f}")
        pixels = [readers.decode_image(d) for d in images]
        copies = [np.empty_like(p) for p in pixels]

        def copy(k: int, pixels=pixels, copies=copies) -> None:
            np.copyto(copies[k], pixels[k])

        ms = per_image_ms(copy, list(range(len(images))), args.repeats)  # type: ignore[arg-type]
        rows.setdefault("predecoded (copy of the pixels)", []).append(f"{ms:.3f}")
        mean_px = statistics.mean(p.shape[0] * p.shape[1] for p in pixels)
        print(
            f"  {label}: {len(images)} images, mean {mean_px / 1e6:.2f} Mpx, "
            f"{statistics.mean(map(len, images)) / 1e3:.0f} KB",
            file=sys.stderr,
        )
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
