"""What the benchmarks share: arguments, the machine report, the source folder (full or
``--quick`` subset), page-cache warming, interleaved repeats, the markdown/JSON output, and for
the read benchmarks (``bench_read.py``, ``bench_crops.py``, ``bench_loader.py``) the geometry,
the conversion, contender warm-up and the pure-decode contender."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import multiprocessing.pool
import os
import platform
import resource
import statistics
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import torch
import webdataset
from PIL import features

import readers
from convert import ConvertOptions, convert_folder

ROOT = Path(__file__).resolve().parent.parent
QUICK_IMAGES_PER_CLASS = 60
MAX_FOREIGN_CORES = 0.25  # retry a measurement while other processes used more than this
RETRIES = 3
QUIET_WAIT_S = 60.0  # longest wait for other processes to settle before a measurement

# The read benchmarks' geometry and timing.
RESIZE, CROP, BATCH = 256, 224, 64
WDS_SHARDS = 8  # jpeg tar shards, so that 1 and 2 streaming workers get equal shares
MIN_SECONDS = 1.0  # a timed measurement covers whole epochs lasting at least this long
DECODE_CORES = len(os.sched_getaffinity(0))  # pure decode runs on all usable cores


def parser(description: str) -> argparse.ArgumentParser:
    """The arguments both benchmarks take."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--folder",
        type=Path,
        default=ROOT / "bench-data" / "folder",
        help="ImageNet-layout source folder (scripts/make_bench_folder.py)",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=ROOT / "bench-data" / "work",
        help="scratch folder for converted datasets (overwritten)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed repeats of each contender")
    p.add_argument(
        "--quick", action="store_true", help=f"use only {QUICK_IMAGES_PER_CLASS} images per class"
    )
    p.add_argument("--json", type=Path, help="also write the results to this JSON file")
    return p


def machine_info() -> dict[str, Any]:
    """CPU, memory, library versions and imgpack code state, printed by each benchmark."""
    cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    model = next(
        (ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")),
        platform.processor() or "?",
    )
    meminfo = Path("/proc/meminfo").read_text(encoding="utf-8")
    mem_kb = int(next(ln.split()[1] for ln in meminfo.splitlines() if ln.startswith("MemTotal")))
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": model,
        "ram_gib": round(mem_kb / 2**20, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pillow": PIL.__version__,
        "pillow_libjpeg_turbo": features.version("libjpeg_turbo"),
        "webdataset": webdataset.__version__,
        "imgpack_jpeg_decoder": readers.decoder_name(),
        "imgpack_code": code_state(),
    }


def code_state() -> str:
    """The imgpack commit measured, and any uncommitted changes to ``readers``/``convert``
    (named, with a digest of the diff) since they change what is measured."""

    def git(*args: str) -> str:
        run = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)
        return run.stdout.decode("utf-8", "replace").strip() if run.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git("diff", "--name-only", "HEAD", "--", "readers", "convert").split()
    changed += git("ls-files", "--others", "--exclude-standard", "readers", "convert").split()
    if not changed:
        return head
    digest = hashlib.sha256(git("diff", "HEAD", "--", "readers", "convert").encode()).hexdigest()
    return f"{head} + uncommitted changes to {', '.join(changed)} (diff sha256 {digest[:12]})"


def print_machine(info: dict[str, Any]) -> None:
    """One line per fact, for the log and for docs/BENCHMARKS.md."""
    for key, value in info.items():
        print(f"{key:>22}: {value}")


def source_folder(args: argparse.Namespace) -> Path:
    """The folder to convert: ``--folder``, or with ``--quick`` a symlinked subset of it
    (the first ``QUICK_IMAGES_PER_CLASS`` files of each class) under ``--work``."""
    if not args.quick:
        return args.folder
    subset = args.work / "quick-folder"
    for class_dir in sorted(p for p in args.folder.iterdir() if p.is_dir()):
        (subset / class_dir.name).mkdir(parents=True, exist_ok=True)
        for image in sorted(class_dir.iterdir())[:QUICK_IMAGES_PER_CLASS]:
            link = subset / class_dir.name / image.name
            if not link.is_symlink():
                link.symlink_to(image.resolve())
    return subset


def image_files(folder: Path) -> list[Path]:
    """Every file under the class folders of ``folder``, sorted (ImageFolder order)."""
    return sorted(p for p in folder.glob("*/*") if p.is_file())


def warm_page_cache(paths: list[Path]) -> int:
    """Read every file once so later reads come from the page cache; return bytes read."""
    total = 0
    for path in paths:
        total += len(path.read_bytes())
    return total


@dataclass
class Measurement:
    """One timed run: a rate (items/s) and optional extra figures for the JSON."""

    rate: float
    extra: dict[str, float] = field(default_factory=dict)


Factory = Callable[[], Callable[[], Measurement]]


class CenterCrop:
    """The centre ``size``x``size`` of a ``[3, H, W]`` tensor (a view; H, W >= size)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        h, w = image.shape[-2:]
        top, left = round((h - self.size) / 2), round((w - self.size) / 2)
        return image[..., top : top + self.size, left : left + self.size]


def convert_source(
    src: Path, dst: Path, fmt: str, encoding: str, shards: int | None = None
) -> Path:
    """Convert ``src`` to ``dst`` resized to ``RESIZE`` (raw is also centre-cropped to
    ``CROP``), in ``shards`` shards of equal size or else the format's default shard size."""
    n = len(image_files(src))
    options = ConvertOptions(
        format=fmt,
        encoding=encoding,
        resize=RESIZE,
        center_crop=CROP if encoding == "raw" else None,
        shard_size=math.ceil(n / shards) if shards else None,
    )
    result = convert_folder(src, dst, options, overwrite=True, progress=False)
    print(f"  converted {dst.name}: {result.summary()}", flush=True)
    return dst


def warm_up(factories: dict[str, Factory]) -> dict[str, Callable[[], Measurement]]:
    """Build (and so warm up) every contender, in order, before any is timed."""
    contenders = {}
    for name, factory in factories.items():
        print(f"  warming up {name}", flush=True)
        contenders[name] = factory()
    return contenders


def best(runs: dict[str, list[Measurement]], prefix: str | tuple[str, ...]) -> tuple[str, float]:
    """The contender (name, median rate) with the highest median among names with prefix."""
    name = max((k for k in runs if k.startswith(prefix)), key=lambda k: median_rate(runs[k]))
    return name, median_rate(runs[name])


_held_jpegs: list[bytes] = []  # a decode process's own copy, set by decode_processes


def _hold(jpegs: list[bytes]) -> None:
    _held_jpegs[:] = jpegs


def _decode_range(jpegs: list[bytes], bounds: tuple[int, int]) -> int:
    for data in jpegs[bounds[0] : bounds[1]]:
        readers.decode_image(data)
    return bounds[1] - bounds[0]


def _decode_held_range(bounds: tuple[int, int]) -> int:
    return _decode_range(_held_jpegs, bounds)


def decode_processes(n: int, jpegs: list[bytes]) -> multiprocessing.pool.Pool:
    """``n`` forked processes for :func:`decode_contender`, each holding ``jpegs`` (inherited
    through the fork, never pickled, so that only the decode is timed)."""
    return multiprocessing.get_context("fork").Pool(n, initializer=_hold, initargs=(jpegs,))


def decode_contender(
    pool: Executor | multiprocessing.pool.Pool, jpegs: list[bytes]
) -> Callable[[], Measurement]:
    """Time decoding all of ``jpegs``, ``BATCH`` at a time, with ``pool.map``: threads, or
    the processes of ``decode_processes(n, jpegs)`` (sent only index ranges into their copy)."""
    chunks = [(i, min(i + BATCH, len(jpegs))) for i in range(0, len(jpegs), BATCH)]
    if isinstance(pool, multiprocessing.pool.Pool):
        decode: Callable[[tuple[int, int]], int] = _decode_held_range
    else:
        decode = partial(_decode_range, jpegs)

    def measure() -> Measurement:
        start = time.perf_counter()
        done = sum(pool.map(decode, chunks))
        return Measurement(done / (time.perf_counter() - start))

    return measure


_TICK = 1 / os.sysconf("SC_CLK_TCK")


def _system_busy_s() -> float:
    """CPU seconds all cores spent busy (steal included) since boot, from /proc/stat."""
    fields = Path("/proc/stat").read_text(encoding="ascii").split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) * _TICK


def _own_cpu_s() -> float:
    """CPU seconds of this process, its reaped children and its live descendants."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text(encoding="ascii", errors="replace").rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        pid = int(stat.parent.name)
        parents[pid], ticks[pid] = int(fields[1]), int(fields[11]) + int(fields[12])
    mine, frontier = set(), [os.getpid()]
    while frontier:
        pid = frontier.pop()
        mine.add(pid)
        frontier += [child for child, parent in parents.items() if parent == pid]
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return sum(ticks.get(pid, 0) for pid in mine) * _TICK + reaped.ru_utime + reaped.ru_stime


def foreign_load(measure: Callable[[], Measurement]) -> Measurement:
    """Run ``measure`` and record in its extra ``foreign_cores``: the average number of
    cores that processes other than this benchmark (and the hypervisor) kept busy meanwhile."""
    system, own, start = _system_busy_s(), _own_cpu_s(), time.perf_counter()
    m = measure()
    seconds = time.perf_counter() - start
    foreign = (_system_busy_s() - system) - (_own_cpu_s() - own)
    m.extra["foreign_cores"] = max(0.0, foreign / seconds)
    return m


def _idle_second() -> Measurement:
    time.sleep(1)
    return Measurement(0.0)


def wait_for_quiet(max_foreign: float, max_wait_s: float = QUIET_WAIT_S) -> float:
    """Sample other processes' load in 1 s windows until it is at most ``max_foreign`` cores
    or ``max_wait_s`` have passed; return the last sample."""
    deadline = time.perf_counter() + max_wait_s
    while True:
        load = foreign_load(_idle_second).extra["foreign_cores"]
        if load <= max_foreign or time.perf_counter() > deadline:
            return load
        print(f"  (other processes busy {load:.2f} cores: waiting)", flush=True)


def interleaved(
    contenders: dict[str, Callable[[], Measurement]],
    repeats: int,
    max_foreign: float = MAX_FOREIGN_CORES,
) -> dict[str, list[Measurement]]:
    """Run ``repeats`` rounds, each calling every contender once in order, so that slow
    phases of a noisy machine hit all of them alike; return each one's measurements.

    Each measurement starts once other processes keep at most ``max_foreign`` cores busy
    (waiting up to ``QUIET_WAIT_S``), and one during which they kept more busy is taken
    again, up to ``RETRIES`` times; the quietest is kept."""
    runs: dict[str, list[Measurement]] = {name: [] for name in contenders}
    for round_ in range(repeats):
        for name, measure in contenders.items():
            tries: list[Measurement] = []
            for _ in range(RETRIES + 1):
                wait_for_quiet(max_foreign)
                tries.append(foreign_load(measure))
                if tries[-1].extra["foreign_cores"] <= max_foreign:
                    break
            m = min(tries, key=lambda t: t.extra["foreign_cores"])
            m.extra["discarded"] = len(tries) - 1
            runs[name].append(m)
            extra = "  ".join(f"{k} {v:.2f}" for k, v in m.extra.items())
            print(
                f"  round {round_ + 1}/{repeats}  {name:<36} {m.rate:9.0f} /s  {extra}", flush=True
            )
    return runs


def median_rate(runs: list[Measurement]) -> float:
    """The median rate of one contender's repeats."""
    return statistics.median(m.rate for m in runs)


def rates_text(runs: list[Measurement]) -> str:
    """Every repeat's rate, in the order measured: ``"812 / 790 / 805"``."""
    return " / ".join(f"{m.rate:.0f}" for m in runs)


def runs_json(runs: dict[str, list[Measurement]]) -> dict[str, Any]:
    """Each contender's median rate and every measurement, for the JSON output."""
    return {
        name: {"median": median_rate(r), "measurements": [vars(m) for m in r]}
        for name, r in runs.items()
    }


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table; floats are shown without decimals unless below 10."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.2f}" if abs(v) < 10 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def target_row(label: str, measured: float, target: float) -> list[Any]:
    """``[label, measured, ">= target", verdict]``: met, or missed by how much."""
    verdict = "met" if measured >= target else f"missed by {100 * (1 - measured / target):.1f} %"
    return [label, measured, f">= {target}", verdict]


def target_table(rows: list[list[Any]]) -> str:
    return markdown_table(["ratio (of medians)", "measured", "target", "verdict"], rows)


def targets_json(rows: list[list[Any]]) -> dict[str, Any]:
    return {label: {"measured": m, "target": t, "verdict": v} for label, m, t, v in rows}


def write_json(path: Path | None, results: dict[str, Any]) -> None:
    """Write ``results`` to ``path`` (if given), creating its folder."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"results written to {path}")
