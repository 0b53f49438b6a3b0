"""The main job on the bundled sample: convert ``sample_data/`` into every format and read
each back, printing samples, bytes on disk and read speed per format.

    python scripts/demo.py [--src sample_data] [--out out/demo]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from torch.utils.data import DataLoader

import readers
from convert import ConvertOptions, convert_folder
from readers import spec

ROOT = Path(__file__).resolve().parent.parent


def read_rate(root: Path) -> tuple[int, float]:
    """Samples read through a shuffled DataLoader, and samples/s (best of 3 epochs)."""
    dataset = readers.open_dataset(root)
    loader = DataLoader(dataset, batch_size=8, shuffle=True, collate_fn=readers.collate)
    best, seen = 0.0, 0
    for _ in range(3):
        start, seen = time.perf_counter(), 0
        for _images, labels in loader:
            seen += len(labels)
        best = max(best, seen / (time.perf_counter() - start))
    return seen, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=ROOT / "sample_data")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "demo")
    args = parser.parse_args()

    runs = [
        ("raw", {"resize": 256, "center_crop": 224}),
        ("jpeg", {"resize": 256, "center_crop": 224}),
    ]
    print(f"JPEG decoder: {readers.decoder_name()}")
    print(
        f"{'format':<6} {'encoding':<8} {'samples':>7} {'bytes on disk':>14} "
        f"{'convert/s':>10} {'read/s':>9}"
    )
    for encoding, geometry in runs:
        for fmt in spec.FORMATS:
            dst = args.out / f"{fmt}-{encoding}"
            options = ConvertOptions(format=fmt, encoding=encoding, **geometry)
            result = convert_folder(args.src, dst, options, overwrite=True, progress=False)
            on_disk = sum(s.bytes for s in readers.load_manifest(dst).shards)
            samples, rate = read_rate(dst)
            print(
                f"{fmt:<6} {encoding:<8} {samples:>7} {on_disk:>14,} "
                f"{result.written / result.seconds:>10.0f} {rate:>9.0f}"
            )
    print(f"datasets in {args.out}; inspect one with: imgpack info {args.out}/pt-raw")


if __name__ == "__main__":
    main()
