"""Benchmark read speed of imgpack datasets through a PyTorch DataLoader.

raw:  the folder converted with ``--encoding raw --resize 256 --center-crop 224`` to each
      format (and to ``pt`` in ``MANY_SHARDS`` shards), read in shuffled batches of 64 with
      0/1/2 workers, against the memcpy bound (bytes/s of a large NumPy copy / 150528 bytes
      per sample).
jpeg: the folder converted with ``--encoding jpeg --resize 256``, centre-cropped to 224 at read
      time, read by imgpack's map-style datasets and ``WdsStream``, against the ``webdataset``
      library's own pipeline (Pillow decoder) over the same tars and against the pure decode
      rate of the same JPEG bytes on all cores.

Each contender is warmed up first (persistent workers started, page cache and mmaps warm),
then timed in interleaved rounds over passes of at least ``MIN_SECONDS``; medians are quoted.

crops: crops inside the decode (``crop=``) against FFCV, see :mod:`scripts.bench.crops`.

    python -m scripts.bench.read [--folder bench-data/folder] [--repeats 3] [--json F]
                                 [--section all|raw|jpeg|crops]
"""

from __future__ import annotations

import math
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import webdataset
from torch.utils.data import DataLoader, Dataset, IterableDataset

import readers
from readers import spec
from scripts.bench import crops
from scripts.bench.common import (
    CenterCrop,
    batch_loader,
    convert_source,
    decode_contender,
    decode_processes,
    image_files,
    machine_info,
    markdown_table,
    parser,
    print_machine,
    rates_text,
    runs_json,
    source_folder,
    target_row,
    target_table,
    targets_json,
    write_json,
)
from scripts.bench.measure import (
    Factory,
    Measurement,
    best,
    interleaved,
    median_rate,
    timed,
    warm_page_cache,
    warm_up,
)
from scripts.bench.settings import BATCH, CROP, DECODE_CORES, WDS_SHARDS

SAMPLE_BYTES = CROP * CROP * 3
MANY_SHARDS = 128  # as ImageNet has at the default 10,000 samples per shard
TARGET_RAW_FRACTION = 0.5
MEMCPY = "memcpy bound (np.copyto 512 MB)"
TARGET_OVER_WEBDATASET = 2.5
TARGET_OVER_DECODE = 0.8


def loader_contender(
    dataset: Dataset,
    root: Path,
    num_workers: int,
    shuffle: bool,
    decode_threads: int | None = None,
) -> Callable[[], Measurement]:
    """A DataLoader over ``dataset``, warmed up and timed (:func:`timed`), rereading the
    files under ``root`` before each measurement. ``decode_threads``, if given, is set on the
    dataset before each epoch, so in-process loaders can share one dataset."""
    loader = batch_loader(dataset, num_workers, shuffle)

    def batches() -> DataLoader:
        if decode_threads is not None:
            dataset.decode_threads = decode_threads  # type: ignore[attr-defined]
        return loader

    return timed(batches, sorted(root.iterdir()))


def imgpack_factories(
    name: str, root: Path, transform: CenterCrop | None, threads: tuple[int, ...]
) -> dict[str, Factory]:
    """Contenders reading ``root`` with imgpack's map-style dataset: 2 and 1 DataLoader
    workers (decode_threads=1), then in-process with each of ``threads`` decode threads.

    Loaders with workers come first: they fork before the main process opens the dataset's
    files, because py-lmdb refuses to open a file that any other object in the process (an
    inherited one included) holds open. The in-process contenders share one dataset for the
    same reason."""
    factories: dict[str, Factory] = {}
    for w in (2, 1):
        factories[f"{name} workers={w}"] = lambda w=w: loader_contender(
            readers.open_dataset(root, transform=transform, decode_threads=1), root, w, shuffle=True
        )
    shared: list[Dataset] = []

    def in_process(t: int) -> Callable[[], Measurement]:
        if not shared:
            shared.append(readers.open_dataset(root, transform=transform))
        return loader_contender(shared[0], root, 0, shuffle=True, decode_threads=t)

    for t in threads:
        label = f" threads={t}" if len(threads) > 1 else ""
        factories[f"{name} workers=0{label}"] = lambda t=t: in_process(t)
    return factories


def memcpy_contender(nbytes: int = 512 << 20, tries: int = 5) -> Callable[[], Measurement]:
    """The memcpy bound, in samples/s: the best bytes/s of ``tries`` ``np.copyto`` between
    two pre-faulted ``nbytes`` arrays, divided by the bytes of one raw sample."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros_like(src)

    def measure() -> Measurement:
        best = math.inf
        for _ in range(tries):
            start = time.perf_counter()
            np.copyto(dst, src)
            best = min(best, time.perf_counter() - start)
        return Measurement(nbytes / best / SAMPLE_BYTES, {"GB_per_s": nbytes / best / 1e9})

    return measure


def run_raw(
    src: Path, work: Path, repeats: int, max_foreign: float
) -> dict[str, list[Measurement]]:
    """The raw-pixel section: every format at 0/1/2 workers, ``pt`` also split into
    ``MANY_SHARDS`` shards, and the memcpy bound."""
    factories: dict[str, Factory] = {MEMCPY: memcpy_contender}
    for fmt in spec.FORMATS:
        root = convert_source(src, work / f"{fmt}-raw", fmt, "raw")
        factories.update(imgpack_factories(fmt, root, None, threads=(1,)))
    root = convert_source(src, work / f"pt-raw-{MANY_SHARDS}", "pt", "raw", MANY_SHARDS)
    factories.update(imgpack_factories(f"pt {MANY_SHARDS} shards", root, None, threads=(1,)))
    return interleaved(warm_up(factories), repeats, max_foreign)


def webdataset_pipeline(urls: list[str]) -> IterableDataset:
    """The ``webdataset`` library's own pipeline over ``urls``: its Pillow decoder
    (``torchrgb8``: uint8 ``[3, H, W]``), ``(jpg, cls)`` tuples, the same centre crop."""
    return (
        webdataset.WebDataset(urls, shardshuffle=False)
        .decode("torchrgb8")
        .to_tuple("jpg", "cls")
        .map_tuple(CenterCrop(CROP), None)
    )


def stored_jpegs(root: Path) -> list[bytes]:
    """Every image member's bytes of an imgpack ``wds`` dataset, in memory."""
    manifest = readers.load_manifest(root)
    data = []
    for i in range(len(manifest.shards)):
        with tarfile.open(manifest.shard_path(i)) as tar:
            for member in tar:
                if member.name.endswith(".jpg"):
                    data.append(tar.extractfile(member).read())  # type: ignore[union-attr]
    return data


def run_jpeg(src: Path, work: Path, repeats: int, max_foreign: float) -> dict[str, Any]:
    """The JPEG section: imgpack readers vs webdataset's Pillow pipeline vs pure decode."""
    roots = {
        fmt: convert_source(
            src, work / f"{fmt}-jpeg", fmt, "jpeg", WDS_SHARDS if fmt == "wds" else None
        )
        for fmt in spec.FORMATS
    }
    crop = CenterCrop(CROP)
    factories: dict[str, Factory] = {}
    for fmt in spec.FORMATS:
        factories.update(imgpack_factories(f"imgpack {fmt}", roots[fmt], crop, threads=(1, 2)))
    for w in (0, 2):
        factories[f"imgpack WdsStream workers={w}"] = lambda w=w: loader_contender(
            readers.WdsStream(roots["wds"], transform=crop), roots["wds"], w, shuffle=False
        )
    manifest = readers.load_manifest(roots["wds"])
    urls = [str(manifest.shard_path(i)) for i in range(len(manifest.shards))]
    for w in (0, 1, 2):
        factories[f"webdataset Pillow workers={w}"] = lambda w=w: loader_contender(
            webdataset_pipeline(urls), roots["wds"], w, shuffle=False
        )

    jpegs = stored_jpegs(roots["wds"])
    with (
        decode_processes(DECODE_CORES, jpegs) as procs,
        ThreadPoolExecutor(DECODE_CORES) as threads,
        ThreadPoolExecutor(1) as single,
    ):
        factories[f"pure decode, {DECODE_CORES} processes"] = lambda: decode_contender(procs, jpegs)
        factories[f"pure decode, {DECODE_CORES} threads"] = lambda: decode_contender(threads, jpegs)
        factories["pure decode, 1 thread"] = lambda: decode_contender(single, jpegs)
        runs = interleaved(warm_up(factories), repeats, max_foreign)
    sizes = [len(d) for d in jpegs]
    return {"stored_jpeg_mean_bytes": float(np.mean(sizes)), "runs": runs}


def raw_report(runs: dict[str, list[Measurement]]) -> tuple[str, list[list[Any]]]:
    """Markdown table of the raw section and its target row."""
    bound = median_rate(runs[MEMCPY])
    rows = []
    for name in (*spec.FORMATS, f"pt {MANY_SHARDS} shards"):
        rates = [median_rate(runs[f"{name} workers={w}"]) for w in (0, 1, 2)]
        rows.append([name, *rates, max(rates), f"{100 * max(rates) / bound:.0f} %"])
    table = markdown_table(
        ["format", "workers=0", "workers=1", "workers=2", "best", "of memcpy bound"], rows
    )
    name, rate = best(runs, tuple(spec.FORMATS))
    label = f"raw: best ({name}) / memcpy bound ({bound:,.0f}/s)"
    return table, [target_row(label, rate / bound, TARGET_RAW_FRACTION)]


def jpeg_report(jpeg: dict[str, Any]) -> tuple[str, list[list[Any]]]:
    """Markdown table of the JPEG section and its target rows."""
    runs = jpeg["runs"]
    wds_name, wds_rate = best(runs, "webdataset")
    dec_name, dec_rate = best(runs, "pure decode")
    rows = [
        [
            name,
            median_rate(r),
            rates_text(r),
            median_rate(r) / wds_rate,
            f"{100 * median_rate(r) / dec_rate:.0f} %",
        ]
        for name, r in runs.items()
    ]
    table = markdown_table(
        ["contender", "samples/s (median)", "repeats", "x webdataset best", "of pure decode best"],
        rows,
    )
    name, rate = best(runs, "imgpack")
    return table, [
        target_row(
            f"jpeg: imgpack best ({name}) / webdataset best ({wds_name})",
            rate / wds_rate,
            TARGET_OVER_WEBDATASET,
        ),
        target_row(
            f"jpeg: imgpack best / pure decode best ({dec_name})",
            rate / dec_rate,
            TARGET_OVER_DECODE,
        ),
    ]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--section",
        choices=("all", "raw", "jpeg", "crops"),
        default="all",
        help="crops: crop= inside the decode against FFCV (scripts/bench/crops.py)",
    )
    args = p.parse_args()
    info = machine_info()
    print_machine(info)
    src = source_folder(args)
    files = image_files(src)
    size = warm_page_cache(files)
    n = len(files)
    print(f"source: {src}, {n} images, mean {size / n / 1000:.1f} KB")

    results: dict[str, Any] = {
        "machine": info,
        "images": n,
        "repeats": args.repeats,
        "batch_size": BATCH,
    }
    report, targets = [], []
    if args.section in ("all", "raw"):
        print("raw section", flush=True)
        raw = run_raw(src, args.work / "read", args.repeats, args.max_foreign)
        table, rows = raw_report(raw)
        bound = median_rate(raw[MEMCPY])
        report.append(f"raw uint8 {CROP}x{CROP} (memcpy bound {bound:,.0f}/s):\n\n{table}")
        results["raw"], targets = {"runs": runs_json(raw)}, targets + rows
    if args.section in ("all", "jpeg"):
        print("jpeg section", flush=True)
        jpeg = run_jpeg(src, args.work / "read", args.repeats, args.max_foreign)
        table, rows = jpeg_report(jpeg)
        kb = jpeg["stored_jpeg_mean_bytes"] / 1000
        report.append(
            f"jpeg (stored mean {kb:.1f} KB), centre crop {CROP} at read time:\n\n{table}"
        )
        jpeg["runs"] = runs_json(jpeg["runs"])
        results["jpeg"], targets = jpeg, targets + rows
    if args.section in ("all", "crops"):
        print("crops section", flush=True)
        cropped = crops.run_crops(src, args.work / "read", args.repeats, args.max_foreign)
        table, rows = crops.crops_report(cropped)
        kb = cropped["stored_jpeg_mean_bytes"] / 1000
        report.append(f"crops inside the decode (stored mean {kb:.1f} KB):\n\n{table}")
        cropped["runs"] = runs_json(cropped["runs"])
        results["crops"], targets = cropped, targets + rows
    header = f"{n} images, batch {BATCH}, {args.repeats} interleaved rounds, samples/s medians"
    print("\n\n".join(["", header, *report, target_table(targets)]))
    results["targets"] = targets_json(targets)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
