"""What the per-sample CRC-32 check costs on the read paths (docs/FORMATS.md, "Per-sample
CRC-32"): encoded batches with the check against the same reads with it switched off, and
the raw ``pt`` gather against the gather plus a CRC-32 of every row (the check raw pixels
do not get). Interleaved rounds, medians.

    .venv/bin/python scripts/bench_sample_checks.py --rounds 7
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch

import readers
from convert import ConvertOptions, convert_folder
from readers.checks import SampleCrcs

ROOT = Path(__file__).resolve().parent.parent


def per_second(fn: Callable[[], int], seconds: float) -> float:
    """Samples per second of ``fn`` (which returns the samples it read), over ``seconds``."""
    fn()  # warm: shards opened, pages cached
    done, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        done += fn()
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=ROOT / "sample_data")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=1.0, help="per contender and round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="imgpack-checks-") as scratch:
        jpeg, raw = Path(scratch) / "jpeg", Path(scratch) / "raw"
        convert_folder(args.folder, jpeg, ConvertOptions(format="pt", resize=256), progress=False)
        raw_options = ConvertOptions(format="pt", encoding="raw", resize=256, center_crop=224)
        convert_folder(args.folder, raw, raw_options, progress=False)
        encoded = readers.open_dataset(jpeg, decode_threads=1)
        pixels = readers.open_dataset(raw, decode_threads=1)
        everything = list(range(len(encoded)))
        check = SampleCrcs.check

        def jpeg_batch(checked: bool) -> int:
            SampleCrcs.check = check if checked else lambda self, i, data: None  # type: ignore[method-assign]
            try:
                return len(encoded.__getitems__(everything))
            finally:
                SampleCrcs.check = check  # type: ignore[method-assign]

        def raw_batch(crc_rows: bool) -> int:
            batch = pixels.__getitems__(everything)
            if crc_rows:
                for row in batch.images.permute(0, 2, 3, 1).numpy():
                    zlib.crc32(row)
            return len(batch)

        contenders: dict[str, Callable[[], int]] = {
            "pt jpeg __getitems__, CRC-32 checked": lambda: jpeg_batch(True),
            "pt jpeg __getitems__, no check": lambda: jpeg_batch(False),
            "pt raw __getitems__ (gather)": lambda: raw_batch(False),
            "pt raw gather + CRC-32 of each row": lambda: raw_batch(True),
        }
        rates: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.rounds):
            for name, fn in contenders.items():
                rates[name].append(per_second(fn, args.seconds))
    print(f"{len(everything)} samples, batches of all of them, 1 decode thread")
    print("| contender | samples/s (median) | rounds |")
    print("|---|---|---|")
    for name, runs in rates.items():
        rounds = " / ".join(f"{r:,.0f}" for r in runs)
        print(f"| {name} | {statistics.median(runs):,.0f} | {rounds} |")
    medians = {name: statistics.median(runs) for name, runs in rates.items()}
    names = list(medians)
    print(f"jpeg: checked / unchecked = {medians[names[0]] / medians[names[1]]:.3f}")
    print(f"raw: gather+crc / gather = {medians[names[3]] / medians[names[2]]:.3f}")


if __name__ == "__main__":
    main()
