"""Benchmark conversion speed: imgpack ``convert_folder`` with 1 and 2 workers against a plain
single-process Pillow + ``webdataset.ShardWriter`` script doing the same work.

Every contender turns the source JPEGs into shorter-side-256 (bilinear) JPEGs of quality 90
and writes them; the rounds are interleaved, the source files are in the page cache, and the
output of the previous run is deleted and flushed to disk before each timed run.

    python scripts/bench_convert.py [--folder bench-data/folder] [--repeats 3] [--json F]
"""

from __future__ import annotations

import io
import os
import resource
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

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


def imgpack_run(src: Path, fmt: str, workers: int) -> Callable[[Path], int]:
    """``convert_folder`` with ``--encoding jpeg --resize 256`` to ``fmt``."""
    options = ConvertOptions(format=fmt, encoding="jpeg", resize=RESIZE, quality=QUALITY)
    return lambda dst: convert_folder(src, dst, options, workers=workers, progress=False).written


def main() -> None:
    args = parser(__doc__.splitlines()[0]).parse_args()
    info = machine_info()
    print_machine(info)
    src = source_folder(args)
    files = image_files(src)
    size = warm_page_cache(files)
    n = len(files)
    print(f"source: {src}, {n} images, mean {size / n / 1000:.1f} KB", flush=True)

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
