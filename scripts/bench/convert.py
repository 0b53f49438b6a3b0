"""Benchmark conversion speed: imgpack ``convert_folder`` with 1 and 2 workers against a plain
single-process Pillow + ``webdataset.ShardWriter`` script doing the same work; with
``--ray``, ``--executor ray`` on a local Ray instance of 2 CPUs against the local pool; with
``--large N``, the default (DCT-scaled) decode against ``--exact-resize`` on N 2560x1440
JPEGs (:mod:`scripts.bench.decode`'s mosaics), 2 workers. Where ``ffcv`` imports (its own
venv, docs/BENCHMARKS.md), FFCV's ``DatasetWriter`` with 2 workers joins either run.

Every contender turns the source JPEGs into shorter-side-256 (bilinear) JPEGs of quality 90
and writes them; the rounds are interleaved, the source files are in the page cache, and the
output of the previous run is deleted and flushed to disk before each timed run.

    python -m scripts.bench.convert [--folder bench-data/folder] [--repeats 3] [--json F]
        [--ray | --large 48]
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import resource
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import webdataset
from PIL import Image

from convert import ConvertOptions, convert_folder
from scripts.bench.common import (
    ffcv_import_error,
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
from scripts.bench.decode import mosaic
from scripts.bench.measure import Measurement, interleaved, median_rate, warm_page_cache
from scripts.bench.settings import QUALITY, RESIZE

TARGET_W2_OVER_W1 = 1.8
TARGET_W2_OVER_BASELINE = 2.0
TARGET_RAY_OVER_POOL = 1 / 1.3  # Ray's time within 1.3x of the local pool's
TARGET_DCT_OVER_EXACT = 1.3  # --large: the default decode against --exact-resize
LARGE_SIZE = (2560, 1440)
LARGE_WORKERS = 2
DCT_PATHS = {"default (DCT-scaled)": False, "--exact-resize": True}  # name: exact_resize
RAY_CPUS = 2
RAY_FORMATS = ("wds",)  # the shard writing differs by format, the Ray part does not
BASELINE = "baseline (Pillow + wds.ShardWriter)"
FFCV_WRITER = "ffcv DatasetWriter workers=2"
TARGET_OVER_FFCV_WRITER = 2.0


def baseline_convert(src: Path, dst: Path) -> int:
    """The plain script: Pillow decode, shorter side to ``RESIZE`` (bilinear), Pillow JPEG
    encode, ``webdataset.ShardWriter``; one process. Returns the number of images written."""
    dst.mkdir(parents=True)
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    written = 0
    with webdataset.ShardWriter(str(dst / "shard-%06d.tar"), maxcount=10000, verbose=0) as sink:
        for label, name in enumerate(classes):
            for path in sorted((src / name).iterdir()):
                with Image.open(path) as image:
                    rgb = image.convert("RGB")
                w, h = rgb.size
                long = int(RESIZE * max(w, h) / min(w, h))  # torchvision's Resize rule
                size = (RESIZE, long) if w <= h else (long, RESIZE)
                out = io.BytesIO()
                rgb.resize(size, Image.Resampling.BILINEAR).save(out, "JPEG", quality=QUALITY)
                sink.write({"__key__": f"{written:010d}", "jpg": out.getvalue(), "cls": label})
                written += 1
    return written


class ResizedFolder:
    """The source folder as an FFCV user feeds ``DatasetWriter``: Pillow decode, shorter side
    to ``RESIZE`` (bilinear, torchvision's size rule), ``(image, label)`` per index."""

    def __init__(self, src: Path) -> None:
        classes = sorted(p.name for p in src.iterdir() if p.is_dir())
        self.items = [
            (path, label)
            for label, name in enumerate(classes)
            for path in sorted((src / name).iterdir())
        ]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        path, label = self.items[i]
        with Image.open(path) as image:
            rgb = image.convert("RGB")
        w, h = rgb.size
        long = int(RESIZE * max(w, h) / min(w, h))
        size = (RESIZE, long) if w <= h else (long, RESIZE)
        return rgb.resize(size, Image.Resampling.BILINEAR), label


def ffcv_convert(src: Path, workers: int) -> Callable[[Path], int]:
    """FFCV 1.0.2's ``DatasetWriter`` writing the same short-256 images as JPEG q90
    (``max_resolution=None``: FFCV's cap applies to the longer side), ``workers`` processes."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    def run(dst: Path) -> int:
        dst.mkdir(parents=True)
        source = ResizedFolder(src)
        image = RGBImageField(write_mode="jpg", max_resolution=None, jpeg_quality=QUALITY)
        writer = DatasetWriter(
            str(dst / "data.beton"), {"image": image, "label": IntField()}, num_workers=workers
        )
        writer.from_indexed_dataset(source)
        return len(source)

    return run


def cpu_seconds() -> tuple[float, float]:
    """User + system CPU seconds so far of this process and of its reaped children."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def cpu_text(runs: list[Measurement], images: int) -> str:
    """``"main + workers"``: the median CPU milliseconds per image of each side."""
    main, workers = (
        1000 * statistics.median(m.extra[k] for m in runs) / images
        for k in ("cpu_main_s", "cpu_workers_s")
    )
    return f"{main:.2f} + {workers:.2f}"


def measured(
    run: Callable[[Path], int], dst: Path, sources: list[Path]
) -> Callable[[], Measurement]:
    """A contender: clear ``dst``, flush writes and reread ``sources`` into the page cache
    (untimed), then time ``run(dst)`` and record the CPU seconds of this process and of its
    worker processes (once all are reaped: FFCV's writer leaves its pool's processes to be
    reaped later, and their CPU time went to the next contender)."""

    def measure() -> Measurement:
        shutil.rmtree(dst, ignore_errors=True)
        os.sync()
        warm_page_cache(sources)
        cpu_main, cpu_workers = cpu_seconds()
        start = time.perf_counter()
        written = run(dst)
        seconds = time.perf_counter() - start
        deadline = time.monotonic() + 30
        while multiprocessing.active_children() and time.monotonic() < deadline:
            time.sleep(0.01)  # active_children() reaps those that have exited
        after_main, after_workers = cpu_seconds()
        if written != len(sources):
            raise RuntimeError(f"{dst}: wrote {written} images, expected {len(sources)}")
        return Measurement(
            written / seconds,
            {
                "wall_s": seconds,
                "cpu_main_s": after_main - cpu_main,
                "cpu_workers_s": after_workers - cpu_workers,
            },
        )

    return measure


def imgpack_run(
    src: Path, fmt: str, workers: int, executor: str = "local", exact_resize: bool = False
) -> Callable[[Path], int]:
    """``convert_folder`` with ``--encoding jpeg --resize 256`` to ``fmt``."""
    options = ConvertOptions(
        format=fmt, encoding="jpeg", resize=RESIZE, quality=QUALITY, exact_resize=exact_resize
    )
    return lambda dst: (
        convert_folder(
            src, dst, options, workers=workers, progress=False, executor=executor
        ).written
    )


def compare_ray(
    args: argparse.Namespace, info: dict[str, Any], src: Path, files: list[Path]
) -> None:
    """``--executor ray`` (a local Ray instance of ``RAY_CPUS`` CPUs, started once, as a
    cluster is) against the local pool of as many workers; the start itself is reported."""
    import ray

    work, n = args.work / "convert-ray", len(files)
    start = time.perf_counter()
    ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - start
    first = measured(imgpack_run(src, "wds", RAY_CPUS, "ray"), work / "first", files)()
    print(f"ray.init {init_s:.1f} s; first conversion {n / first.rate:.1f} s (workers start)")
    contenders = {"imgpack wds workers=1": measured(imgpack_run(src, "wds", 1), work / "w1", files)}
    for fmt in RAY_FORMATS:
        for executor in ("local", "ray"):
            contenders[f"imgpack {fmt} {executor} ({RAY_CPUS} CPUs)"] = measured(
                imgpack_run(src, fmt, RAY_CPUS, executor), work / f"{fmt}-{executor}", files
            )
    runs = interleaved(contenders, args.repeats, args.max_foreign)
    ray.shutdown()
    rate = {name: median_rate(r) for name, r in runs.items()}
    rows = [[name, rate[name], rates_text(r)] for name, r in runs.items()]
    table = markdown_table(["contender", "images/s (median)", "repeats"], rows)
    targets = [
        target_row(
            f"{fmt}: ray / local pool (rate)",
            rate[f"imgpack {fmt} ray ({RAY_CPUS} CPUs)"]
            / rate[f"imgpack {fmt} local ({RAY_CPUS} CPUs)"],
            round(TARGET_RAY_OVER_POOL, 3),
        )
        for fmt in RAY_FORMATS
    ]
    print(f"\n{n} images, {args.repeats} interleaved rounds\n\n{table}\n\n{target_table(targets)}")
    write_json(
        args.json,
        {
            "machine": info,
            "images": n,
            "repeats": args.repeats,
            "ray_init_s": init_s,
            "ray_first_conversion_s": n / first.rate,
            "images_per_s": runs_json(runs),
            "targets": targets_json(targets),
        },
    )


def compare_dct(args: argparse.Namespace, info: dict[str, Any]) -> None:
    """The default conversion (JPEGs DCT-scaled while they stay 2.5x the target) against
    ``--exact-resize`` and, where it imports, FFCV's writer, on ``args.large`` 2560x1440
    JPEGs, ``LARGE_WORKERS`` workers each."""
    src, work = args.work / "large-src", args.work / "convert-large"
    shutil.rmtree(src, ignore_errors=True)
    for k in range(args.large):
        folder = src / f"class_{k % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k:04d}.jpg").write_bytes(mosaic(LARGE_SIZE, 1000 + k))
    files = image_files(src)
    size = warm_page_cache(files)
    print(f"source: {src}, {len(files)} {LARGE_SIZE[0]}x{LARGE_SIZE[1]} JPEGs, "
          f"mean {size / len(files) / 1000:.0f} KB", flush=True)  # fmt: skip
    contenders = {
        name: measured(imgpack_run(src, "pt", LARGE_WORKERS, exact_resize=exact), work, files)
        for name, exact in DCT_PATHS.items()
    }
    ffcv_missing = ffcv_import_error()
    if ffcv_missing is None:
        contenders[FFCV_WRITER] = measured(ffcv_convert(src, LARGE_WORKERS), work / "ffcv", files)
    else:
        print(f"  FFCV DatasetWriter skipped: ffcv does not import ({ffcv_missing})", flush=True)
    runs = interleaved(contenders, args.repeats, args.max_foreign)
    rate = {name: median_rate(r) for name, r in runs.items()}
    default, exact = (runs[name] for name in DCT_PATHS)
    paired = [a.rate / b.rate for a, b in zip(default, exact, strict=True)]
    rows = [[name, rate[name], rates_text(r), cpu_text(r, len(files))] for name, r in runs.items()]
    headers = ["path", "images/s (median)", "repeats", "CPU ms/image, main + workers"]
    table = markdown_table(headers, rows)
    targets = [
        target_row(
            "default / --exact-resize (rate)",
            median_rate(default) / median_rate(exact),
            TARGET_DCT_OVER_EXACT,
        )
    ]
    if FFCV_WRITER in rate:
        label = f"default / {FFCV_WRITER}"
        targets.append(
            target_row(label, median_rate(default) / rate[FFCV_WRITER], TARGET_OVER_FFCV_WRITER)
        )
    print(
        f"\n{len(files)} images, {args.repeats} interleaved rounds, {LARGE_WORKERS} workers\n\n"
        f"{table}\n\nper-round ratios: {' / '.join(f'{x:.2f}' for x in paired)} "
        f"(median {statistics.median(paired):.2f})\n\n{target_table(targets)}"
    )
    write_json(
        args.json,
        {
            "machine": info,
            "images": len(files),
            "source_bytes": size,
            "repeats": args.repeats,
            "images_per_s": runs_json(runs),
            "per_round_ratios": paired,
            "targets": targets_json(targets),
        },
    )


def main() -> None:
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--ray", action="store_true", help="--executor ray against the local pool")
    cli.add_argument(
        "--large",
        type=int,
        default=0,
        metavar="N",
        help="the default decode against --exact-resize on N 2560x1440 JPEGs",
    )
    args = cli.parse_args()
    info = machine_info()
    print_machine(info)
    if args.large:
        compare_dct(args, info)
        return
    src = source_folder(args)
    files = image_files(src)
    size = warm_page_cache(files)
    n = len(files)
    print(f"source: {src}, {n} images, mean {size / n / 1000:.1f} KB", flush=True)
    if args.ray:
        compare_ray(args, info, src, files)
        return

    work = args.work / "convert"
    contenders = {BASELINE: measured(lambda dst: baseline_convert(src, dst), work / "base", files)}
    for fmt in ("wds", "pt"):
        for workers in (1, 2):
            contenders[f"imgpack {fmt} workers={workers}"] = measured(
                imgpack_run(src, fmt, workers), work / f"{fmt}-w{workers}", files
            )
    ffcv_missing = ffcv_import_error()
    if ffcv_missing is None:
        contenders[FFCV_WRITER] = measured(ffcv_convert(src, 2), work / "ffcv", files)
    else:
        print(f"  FFCV DatasetWriter skipped: ffcv does not import ({ffcv_missing})", flush=True)
    runs = interleaved(contenders, args.repeats, args.max_foreign)

    rate = {name: median_rate(r) for name, r in runs.items()}
    rows = []
    for name, r in runs.items():
        rows.append([name, rate[name], rates_text(r), rate[name] / rate[BASELINE], cpu_text(r, n)])
    table = markdown_table(
        ["contender", "images/s (median)", "repeats", "x baseline", "CPU ms/image, main + workers"],
        rows,
    )
    targets = []
    for fmt in ("wds", "pt"):
        w1, w2 = rate[f"imgpack {fmt} workers=1"], rate[f"imgpack {fmt} workers=2"]
        targets.append(target_row(f"{fmt}: workers=2 / workers=1", w2 / w1, TARGET_W2_OVER_W1))
        targets.append(
            target_row(f"{fmt}: workers=2 / baseline", w2 / rate[BASELINE], TARGET_W2_OVER_BASELINE)
        )
        if FFCV_WRITER in rate:
            label = f"{fmt}: workers=2 / {FFCV_WRITER}"
            targets.append(target_row(label, w2 / rate[FFCV_WRITER], TARGET_OVER_FFCV_WRITER))
    print(f"\n{n} images, {args.repeats} interleaved rounds\n\n{table}\n\n{target_table(targets)}")
    write_json(
        args.json,
        {
            "machine": info,
            "images": n,
            "source_bytes": size,
            "repeats": args.repeats,
            "images_per_s": runs_json(runs),
            "targets": targets_json(targets),
        },
    )


if __name__ == "__main__":
    main()
