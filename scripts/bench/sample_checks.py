"""What the per-sample checks cost on the read paths (docs/FORMATS.md, "Per-sample
CRC-32"): encoded batches with the CRC-32 check against the same reads with it switched
off; the raw ``pt`` gather against the gather plus a CRC-32 of every row (the check raw
pixels do not get); the raw ``wds`` gather, which now reads each ``.npy`` header beside its
pixels and compares it, against reading the pixels alone (what it did before). Interleaved
rounds, medians.

    .venv/bin/python -m scripts.bench.sample_checks --rounds 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import readers
from convert import ConvertOptions, convert_folder
from readers.formats.checks import SampleCrcs
from readers.formats.wds import WdsShard
from scripts.bench.settings import CROP, RESIZE, ROOT


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
        jpeg_options = ConvertOptions(format="pt", resize=RESIZE)
        convert_folder(args.folder, jpeg, jpeg_options, progress=False)
        raw_options = ConvertOptions(format="pt", encoding="raw", resize=RESIZE, center_crop=CROP)
        convert_folder(args.folder, raw, raw_options, progress=False)
        tars = Path(scratch) / "wds"
        wds_options = ConvertOptions(format="wds", encoding="raw", resize=RESIZE, center_crop=CROP)
        convert_folder(args.folder, tars, wds_options, progress=False)
        encoded = readers.open_dataset(jpeg, decode_threads=1)
        pixels = readers.open_dataset(raw, decode_threads=1)
        tar_pixels = readers.open_dataset(tars, decode_threads=1)
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

        checked_read_pixels = WdsShard.read_pixels

        def pixels_alone(self: WdsShard, idx: np.ndarray, out: torch.Tensor) -> None:
            """``WdsShard.read_pixels`` before the header check (commit b133c47)."""
            rows = out.numpy().reshape(len(idx), -1)
            for row, i in enumerate(idx.tolist()):
                offset, size = int(self._offsets[i]), int(self._sizes[i])
                os.preadv(self._fd, [rows[row]], offset + size - rows.shape[1])

        def wds_batch(checked: bool) -> int:
            WdsShard.read_pixels = checked_read_pixels if checked else pixels_alone  # type: ignore[method-assign]
            try:
                return len(tar_pixels.__getitems__(everything))
            finally:
                WdsShard.read_pixels = checked_read_pixels  # type: ignore[method-assign]

        contenders: dict[str, Callable[[], int]] = {
            "pt jpeg __getitems__, CRC-32 checked": lambda: jpeg_batch(True),
            "pt jpeg __getitems__, no check": lambda: jpeg_batch(False),
            "pt raw __getitems__ (gather)": lambda: raw_batch(False),
            "pt raw gather + CRC-32 of each row": lambda: raw_batch(True),
            "wds raw __getitems__, header checked": lambda: wds_batch(True),
            "wds raw __getitems__, pixels alone (before)": lambda: wds_batch(False),
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
    print(f"wds raw: header checked / pixels alone = {medians[names[4]] / medians[names[5]]:.3f}")


if __name__ == "__main__":
    main()
