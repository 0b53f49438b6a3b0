"""Benchmark conversion speed: imgpack ``convert_folder`` with 1 and 2 workers against a plain
single-process Pillow + ``webdataset.ShardWriter`` script doing the same work; with
``--ray``, ``--executor ray`` on a local Ray instance of 2 CPUs against the local pool.

Every contender turns the source JPEGs into shorter-side-256 (bilinear) JPEGs of quality 90
and writes them; the rounds are interleaved, the source files are in the page cache, and the
output of the previous run is deleted and flushed to disk before each timed run.

    python scripts/bench_convert.py [--folder bench-data/folder] [--repeats 3] [--json F]
        [--ray]
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import webdataset
from bench_common import (
    Measurement,
    image_files,
    interleaved,
    machine_info,
    markdown_table,
    median_rate,
    parser,
    print_machine,
    rates_text,
    runs_json,
    source_folder,
    target_row,
    target_table,
    targets_json,
    warm_page_cache,
    write_json,
)
from PIL import Image

from convert import ConvertOptions, convert_folder

RESIZE = 256
QUALITY = 90
TARGET_W2_OVER_W1 = 1.8
TARGET_W2_OVER_BASELINE = 2.0
TARGET_RAY_OVER_POOL = 1 / 1.3  # Ray's time within 1.3x of the local pool's
RAY_CPUS = 2
RAY_FORMATS = ("wds",)  # the shard writing differs by format, the Ray part does not
BASELINE = "baseline (Pillow + wds.ShardWriter)"


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


def cpu_seconds() -> tuple[float, float]:
    """User + system CPU seconds so far of this process and of its reaped children."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def measured(
    run: Callable[[Path], int], dst: Path, sources: list[Path]
) -> Callable[[], Measurement]:
    """A contender: clear ``dst``, flush writes and reread ``sources`` into the page cache
    (untimed), then time ``run(dst)`` and record the CPU seconds of this process and of its
    worker processes."""

    def measure() -> Measurement:
        shutil.rmtree(dst, ignore_errors=True)
        os.sync()
        warm_page_cache(sources)
        cpu_main, cpu_workers = cpu_seconds()
        start = time.perf_counter()
        written = run(dst)
        seconds = time.perf_counter() - start
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
    src: Path, fmt: str, workers: int, executor: str = "local"
) -> Callable[[Path], int]:
    """``convert_folder`` with ``--encoding jpeg --resize 256`` to ``fmt``."""
    options = ConvertOptions(format=fmt, encoding="jpeg", resize=RESIZE, quality=QUALITY)
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
    runs = interleaved(contenders, args.repeats)
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


def main() -> None:
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--ray", action="store_true", help="--executor ray against the local pool")
    args = cli.parse_args()
    info = machine_info()
    print_machine(info)
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
    runs = interleaved(contenders, args.repeats)

    rate = {name: median_rate(r) for name, r in runs.items()}
    rows = []
    for name, r in runs.items():
        cpu = {
            k: 1000 * statistics.median(m.extra[k] for m in r) / n
            for k in ("cpu_main_s", "cpu_workers_s")
        }
        rows.append(
            [
                name,
                rate[name],
                rates_text(r),
                rate[name] / rate[BASELINE],
                f"{cpu['cpu_main_s']:.2f} + {cpu['cpu_workers_s']:.2f}",
            ]
        )
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
