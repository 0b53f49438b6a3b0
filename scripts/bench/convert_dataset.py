"""Benchmark dataset-to-dataset conversion against converting the folder again: the same
``pt`` raw output (shorter side 256, centre crop 224), from the image folder, from an imgpack
``wds`` dataset of its q90 JPEGs at 256 (what a bucket holds) and, re-sharding only, from a
``wds`` raw one; 2 workers each.

The source datasets are converted once, untimed; the rounds are interleaved, each run's
source files are reread into the page cache first and its output deleted and flushed.

    python -m scripts.bench.convert_dataset [--folder bench-data/folder] [--repeats 3] [--json F]
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from convert import ConvertOptions, convert_folder
from scripts.bench.common import (
    image_files,
    machine_info,
    markdown_table,
    parser,
    print_machine,
    rates_text,
    runs_json,
    source_folder,
    write_json,
)
from scripts.bench.measure import Measurement, interleaved, median_rate, warm_page_cache
from scripts.bench.settings import CROP, QUALITY, RESIZE

WORKERS = 2
FOLDER_RUN = "folder -> pt raw"


def conversion(
    src: Path, dst: Path, options: ConvertOptions, warm: list[Path], images: int
) -> Callable[[], Measurement]:
    """A contender: ``src`` converted into ``dst`` with ``options``, timed."""

    def measure() -> Measurement:
        shutil.rmtree(dst, ignore_errors=True)
        os.sync()
        warm_page_cache(warm)
        start = time.perf_counter()
        written = convert_folder(src, dst, options, workers=WORKERS, progress=False).written
        seconds = time.perf_counter() - start
        if written != images:
            raise RuntimeError(f"{dst}: wrote {written} samples, expected {images}")
        return Measurement(written / seconds, {"wall_s": seconds})

    return measure


def shard_files(dataset: Path) -> list[Path]:
    return sorted(p for p in dataset.iterdir() if p.is_file())


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    info = machine_info()
    print_machine(info)
    src = source_folder(args)
    files = image_files(src)
    n = len(files)
    work = args.work / "convert-dataset"
    jpeg_wds, raw_wds = work / "src-wds-jpeg", work / "src-wds-raw"
    out = ConvertOptions("pt", encoding="raw", resize=RESIZE, center_crop=CROP)
    for dst, options in (
        (jpeg_wds, ConvertOptions("wds", encoding="jpeg", resize=RESIZE, quality=QUALITY)),
        (raw_wds, ConvertOptions("wds", encoding="raw", resize=RESIZE, center_crop=CROP)),
    ):
        convert_folder(src, dst, options, workers=WORKERS, overwrite=True, progress=False)
    print(f"source: {src}, {n} images; sources converted once into {work}", flush=True)
    reshard = ConvertOptions("pt", encoding="raw")  # raw -> raw: the same pixels
    contenders = {
        FOLDER_RUN: conversion(src, work / "from-folder", out, files, n),
        "wds jpeg -> pt raw": conversion(
            jpeg_wds, work / "from-jpeg", out, shard_files(jpeg_wds), n
        ),
        "wds raw -> pt raw (re-shard)": conversion(
            raw_wds, work / "from-raw", reshard, shard_files(raw_wds), n
        ),
    }
    runs = interleaved(contenders, args.repeats, args.max_foreign)
    rate = {name: median_rate(r) for name, r in runs.items()}
    rows = [
        [name, rate[name], rates_text(r), rate[name] / rate[FOLDER_RUN]] for name, r in runs.items()
    ]
    table = markdown_table(["source", "samples/s (median)", "repeats", "x folder"], rows)
    print(f"\n{n} images, {WORKERS} workers, {args.repeats} interleaved rounds\n\n{table}")
    write_json(
        args.json,
        {"machine": info, "images": n, "repeats": args.repeats, "samples_per_s": runs_json(runs)},
    )


if __name__ == "__main__":
    main()
