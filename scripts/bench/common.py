"""What the benchmarks share besides the measuring itself (:mod:`scripts.bench.measure`) and
the settings (:mod:`scripts.bench.settings`): arguments, the machine report, the source folder
(full or ``--quick`` subset), the conversion, the read-time centre crop, the pure-decode
contender, and the markdown/JSON output."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import multiprocessing.pool
import os
import platform
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import Executor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import torch
import webdataset
from PIL import features
from torch.utils.data import DataLoader, Dataset

import readers
from convert import ConvertOptions, convert_folder
from scripts.bench.measure import Measurement, median_rate
from scripts.bench.settings import (
    BATCH,
    CROP,
    FOLDER,
    MAX_FOREIGN_CORES,
    QUICK_IMAGES_PER_CLASS,
    RESIZE,
    ROOT,
    WORK,
)


def parser(description: str, max_foreign: float = MAX_FOREIGN_CORES) -> argparse.ArgumentParser:
    """The arguments the folder benchmarks (read, convert, loader, remote) take; ``max_foreign``
    is the default of ``--max-foreign``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--folder",
        type=Path,
        default=FOLDER,
        help="ImageNet-layout source folder (python -m scripts.bench.make_folder)",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=WORK,
        help="scratch folder for converted datasets (overwritten)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed repeats of each contender")
    p.add_argument(
        "--quick", action="store_true", help=f"use only {QUICK_IMAGES_PER_CLASS} images per class"
    )
    p.add_argument("--json", type=Path, help="also write the results to this JSON file")
    p.add_argument(
        "--max-foreign",
        type=float,
        default=max_foreign,
        help="retry a measurement while other processes kept more cores busy than this",
    )
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
        "imgpack_crop_decoder": readers.decoder_name(crop=True),
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


class CenterCrop:
    """The centre ``size``x``size`` of a ``[3, H, W]`` tensor (a view; H, W >= size)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        h, w = image.shape[-2:]
        top, left = round((h - self.size) / 2), round((w - self.size) / 2)
        return image[..., top : top + self.size, left : left + self.size]


def batch_loader(dataset: Dataset, num_workers: int, shuffle: bool = False) -> DataLoader:
    """A DataLoader of ``BATCH`` samples through imgpack's collate, its workers (if any) kept
    from one epoch to the next."""
    return DataLoader(
        dataset,
        batch_size=BATCH,
        shuffle=shuffle,
        collate_fn=readers.collate,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )


def convert_source(
    src: Path,
    dst: Path,
    fmt: str,
    encoding: str,
    shards: int | None = None,
    shuffle: bool = False,
    restart_markers: bool = True,
) -> Path:
    """Convert ``src`` to ``dst`` resized to ``RESIZE`` (raw is also centre-cropped to
    ``CROP``), in ``shards`` shards of equal size or else the format's default shard size;
    ``shuffle`` as ``--shuffle`` (what a streamed dataset should be); ``restart_markers`` as
    ``--restart-markers``."""
    n = len(image_files(src))
    options = ConvertOptions(
        format=fmt,
        encoding=encoding,
        resize=RESIZE,
        center_crop=CROP if encoding == "raw" else None,
        shard_size=math.ceil(n / shards) if shards else None,
        shuffle=shuffle,
        restart_markers=restart_markers,
    )
    result = convert_folder(src, dst, options, overwrite=True, progress=False)
    print(f"  converted {dst.name}: {result.summary()}", flush=True)
    return dst


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


def ffcv_import_error() -> str | None:
    """Why ``ffcv`` (an optional, benchmark-only dependency) does not import, or ``None``."""
    try:
        import ffcv  # noqa: F401
    except ImportError as e:
        return f"{e}"
    return None
