"""Whether libjpeg's faster variants make a conversion faster here: decoding the source with
``TJFLAG_FASTDCT`` (libjpeg's ``JDCT_IFAST``) or ``TJFLAG_FASTUPSAMPLE`` (no fancy
upsampling), and encoding the stored JPEG with ``TJFLAG_FASTDCT``, or with optimised Huffman
tables (Pillow's ``optimize=True``; libjpeg-turbo 2.1's TurboJPEG API has no flag for it).
Each against the converter's own choice (accurate DCT, fancy upsampling, standard tables),
one thread, ms per image over the folder's first ``--images`` photos, interleaved rounds,
medians, with what each changes: the mean absolute pixel difference from the default's
output (levels of 255) and the stored bytes.

imgpack offers a variant only where this shows it faster by more than the noise; see
docs/BENCHMARKS.md ("Faster libjpeg variants").

    .venv/bin/python -m scripts.bench.jpeg_variants [--folder bench-data/folder]
        [--images 300] [--repeats 5] [--json F]
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from turbojpeg import TJFLAG_FASTDCT, TJFLAG_FASTUPSAMPLE, TJPF_RGB, TJSAMP_420, TurboJPEG

from convert.process import resize_shorter
from scripts.bench.common import (
    image_files,
    machine_info,
    markdown_table,
    print_machine,
    write_json,
)
from scripts.bench.settings import FOLDER, RESIZE

QUALITY = 90
DECODES = {
    "decode: accurate DCT, fancy upsampling (imgpack)": 0,
    "decode: TJFLAG_FASTDCT": TJFLAG_FASTDCT,
    "decode: TJFLAG_FASTUPSAMPLE": TJFLAG_FASTUPSAMPLE,
    "decode: both": TJFLAG_FASTDCT | TJFLAG_FASTUPSAMPLE,
}


def pillow_encode(pixels: np.ndarray, optimize: bool) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=QUALITY, optimize=optimize)
    return out.getvalue()


def encoders(tj: TurboJPEG) -> dict[str, Callable[[np.ndarray], bytes]]:
    def turbo(flags: int) -> Callable[[np.ndarray], bytes]:
        return lambda p: tj.encode(p, QUALITY, TJPF_RGB, TJSAMP_420, flags)

    return {
        "encode: accurate DCT, standard tables (imgpack)": turbo(0),
        "encode: TJFLAG_FASTDCT": turbo(TJFLAG_FASTDCT),
        "encode: Pillow, standard tables": lambda p: pillow_encode(p, False),
        "encode: Pillow, optimize=True": lambda p: pillow_encode(p, True),
    }


def timed_ms(run: Callable[[], Any], count: int) -> float:
    start = time.perf_counter()
    run()
    return (time.perf_counter() - start) / count * 1e3


def measure(folder: Path, images: int, repeats: int) -> dict[str, dict[str, float]]:
    tj = TurboJPEG()
    sources = [p.read_bytes() for p in image_files(folder)[:images]]
    decoded = {
        name: [tj.decode(s, TJPF_RGB, None, f) for s in sources] for name, f in DECODES.items()
    }
    reference = decoded[next(iter(DECODES))]
    resized = [resize_shorter(p, RESIZE) for p in reference]
    encode = encoders(tj)
    encoded = {name: [fn(p) for p in resized] for name, fn in encode.items()}
    default_bytes = sum(map(len, next(iter(encoded.values()))))
    runs: dict[str, list[float]] = {name: [] for name in [*DECODES, *encode]}
    for _ in range(repeats):
        for name, flags in DECODES.items():
            runs[name].append(
                timed_ms(lambda f=flags: [tj.decode(s, TJPF_RGB, None, f) for s in sources], images)
            )
        for name, fn in encode.items():
            runs[name].append(timed_ms(lambda fn=fn: [fn(p) for p in resized], images))
    results = {}
    for name in DECODES:
        diff = np.mean(
            [
                np.abs(a.astype(int) - b).mean()
                for a, b in zip(decoded[name], reference, strict=True)
            ]
        )
        results[name] = {
            "ms": statistics.median(runs[name]),
            "pixel_diff": float(diff),
            "bytes": 1.0,
        }
    base = [tj.decode(e, TJPF_RGB) for e in next(iter(encoded.values()))]
    for name in encode:
        back = [tj.decode(e, TJPF_RGB) for e in encoded[name]]
        diff = np.mean([np.abs(a.astype(int) - b).mean() for a, b in zip(back, base, strict=True)])
        size = sum(map(len, encoded[name])) / default_bytes
        results[name] = {
            "ms": statistics.median(runs[name]),
            "pixel_diff": float(diff),
            "bytes": size,
        }
    return results


def report(results: dict[str, dict[str, float]]) -> str:
    rows = []
    for group in ("decode", "encode"):
        names = [n for n in results if n.startswith(group)]
        default = results[names[0]]["ms"]
        for name in names:
            r = results[name]
            rows.append(
                [
                    name,
                    f"{r['ms']:.3f}",
                    f"{default / r['ms']:.3f}",
                    f"{r['pixel_diff']:.3f}",
                    f"{r['bytes']:.3f}",
                ]
            )
    headers = [
        "variant",
        "ms per image (median)",
        "speed vs imgpack's",
        "mean |diff| (levels)",
        "bytes vs imgpack's",
    ]
    return markdown_table(headers, rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", type=Path, default=FOLDER)
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(1)
    info = machine_info()
    print_machine(info)
    results = measure(args.folder, args.images, args.repeats)
    print(report(results))
    write_json(args.json, {"machine": info, "variants": results})


if __name__ == "__main__":
    main()
