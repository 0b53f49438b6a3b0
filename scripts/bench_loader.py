"""What ``readers.make_loader`` costs, and how long resuming takes at ImageNet scale.

1. Samples/s of ``make_loader`` against the plain reader it wraps, side by side in
   interleaved rounds (raw ``pt``; JPEG ``lmdb`` in-process and with 2 workers; the
   ``WdsStream`` with 2 workers). Target: the helper costs under 5 %.
2. ``--rev REV``: ``WdsStream`` of this tree against the one at an earlier commit, each run
   in a fresh process over the same tars (the stream's reading changed with make_loader).
3. The time to ``load_state_dict`` and reach the first index at 1,281,167 samples (the
   index is simulated: no images), for the map-style sampler and for the stream's plan,
   resumed on the same and on another world size.

    .venv/bin/python scripts/bench_loader.py --repeats 5 [--rev 4f81ee1] [--json out.json]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bench
from bench_common import BATCH, CROP, MIN_SECONDS, RESIZE, WDS_SHARDS, CenterCrop

import readers
from convert import ConvertOptions, convert_folder
from readers.epochs import plan

IMAGENET = 1_281_167
TARGET_COST = 0.95  # make_loader's rate over the plain reader's


def convert(src: Path, dst: Path, fmt: str, encoding: str, shards: int = 1) -> Path:
    n = sum(1 for p in src.glob("*/*") if p.is_file())
    options = ConvertOptions(
        format=fmt,
        encoding=encoding,
        resize=RESIZE,
        center_crop=CROP if encoding == "raw" else None,
        shard_size=-(-n // shards),
        shuffle=True,  # as a streamed dataset should be
    )
    result = convert_folder(src, dst, options, overwrite=True, progress=False)
    print(f"  converted {dst.name}: {result.summary()}", flush=True)
    return dst


MIN_TIMED_S = [MIN_SECONDS]  # --min-seconds


def timed(batches: Callable[[], Iterable[Any]], root: Path) -> Callable[[], bench.Measurement]:
    """Warm up (one untimed epoch, one to size the passes), then time whole epochs."""

    def epochs(passes: int) -> bench.Measurement:
        bench.warm_page_cache(sorted(root.iterdir()))
        seen, start = 0, time.perf_counter()
        for _ in range(passes):
            for _images, labels in batches():
                seen += len(labels)
        seconds = time.perf_counter() - start
        return bench.Measurement(seen / seconds, {"passes": passes, "seconds": seconds})

    epochs(1)
    passes = max(1, round(MIN_TIMED_S[0] / epochs(1).extra["seconds"]))
    return lambda: epochs(passes)


def plain_map(root: Path, workers: int, transform: Any) -> Callable[[], bench.Measurement]:
    ds = readers.open_dataset(root, transform=transform, decode_threads=1 if workers else None)
    loader = DataLoader(
        ds,
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        collate_fn=readers.collate,
    )
    return timed(lambda: loader, root)


def plain_stream(root: Path, workers: int, transform: Any) -> Callable[[], bench.Measurement]:
    stream = readers.WdsStream(root, transform=transform, batch_size=BATCH)
    loader = DataLoader(
        stream,
        batch_size=BATCH,
        num_workers=workers,
        persistent_workers=workers > 0,
        collate_fn=readers.collate,
    )
    epoch = iter(range(1 << 30))

    def batches() -> DataLoader:
        stream.set_epoch(next(epoch))
        return loader

    return timed(batches, root)


def helper(
    root: Path, workers: int, transform: Any, stream: bool
) -> Callable[[], bench.Measurement]:
    loader = readers.make_loader(
        root,
        BATCH,
        num_workers=workers,
        stream=stream,
        transform=transform,
        decode_threads=1 if workers else None,
        persistent_workers=workers > 0,
    )
    return timed(lambda: loader, root)


def overhead(
    src: Path, work: Path, repeats: int
) -> tuple[dict[str, list[bench.Measurement]], list]:
    raw = convert(src, work / "pt-raw", "pt", "raw")
    lmdb = convert(src, work / "lmdb-jpeg", "lmdb", "jpeg")
    wds = convert(src, work / "wds-jpeg", "wds", "jpeg", shards=WDS_SHARDS)
    crop = CenterCrop(CROP)
    cases = {  # name: (root, workers, transform, stream); loaders with workers first (fork)
        "lmdb jpeg workers=2": (lmdb, 2, crop, False),
        "WdsStream jpeg workers=2": (wds, 2, crop, True),
        "pt raw workers=0": (raw, 0, None, False),
        "lmdb jpeg workers=0": (lmdb, 0, crop, False),
    }
    contenders = {}
    for name, (root, workers, transform, stream) in cases.items():
        print(f"  warming up {name}", flush=True)
        plain = plain_stream if stream else plain_map
        contenders[f"plain {name}"] = plain(root, workers, transform)
        contenders[f"make_loader {name}"] = helper(root, workers, transform, stream)
    runs = bench.interleaved(contenders, repeats)
    rows, targets = [], []
    for name in cases:
        p, m = runs[f"plain {name}"], runs[f"make_loader {name}"]
        ratio = bench.median_rate(m) / bench.median_rate(p)
        rows.append(
            [
                name,
                bench.median_rate(p),
                bench.median_rate(m),
                ratio,
                bench.rates_text(p),
                bench.rates_text(m),
            ]
        )
        targets.append(bench.target_row(f"make_loader / plain, {name}", ratio, TARGET_COST))
    return runs, [rows, targets]


STREAM_RUN = """
import sys, time
sys.path.insert(0, sys.argv[3])
from bench_common import CenterCrop, BATCH, CROP
from torch.utils.data import DataLoader
import readers
root, workers, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[4])
stream = readers.WdsStream(root, transform=CenterCrop(CROP), shuffle_buffer=1000, seed=0)
loader = DataLoader(stream, batch_size=BATCH, num_workers=workers, persistent_workers=workers > 0,
                    collate_fn=readers.collate)
for _ in loader: pass
seen, start = 0, time.perf_counter()
for epoch in range(1, passes + 1):
    stream.set_epoch(epoch)
    for _, labels in loader:
        seen += len(labels)
print(seen / (time.perf_counter() - start))
"""


def stream_ab(wds: Path, rev: str, repeats: int, workers: int) -> dict[str, list[float]]:
    """WdsStream samples/s of this tree and of ``rev``, alternating fresh processes."""
    rates: dict[str, list[float]] = {rev: [], "working tree": []}
    with tempfile.TemporaryDirectory(prefix="imgpack-ab-") as scratch:
        old = Path(scratch) / "old"
        subprocess.run(["git", "worktree", "add", "-q", str(old), rev], cwd=bench.ROOT, check=True)
        try:
            for round_ in range(repeats):
                for name, tree in ((rev, old), ("working tree", bench.ROOT)):
                    command = [sys.executable, "-W", "ignore", "-c", STREAM_RUN, str(wds.resolve())]
                    command += [str(workers), str(bench.ROOT / "scripts"), "3"]
                    env = {**os.environ, "PYTHONPATH": str(tree)}
                    done = subprocess.run(
                        command, cwd=tree, env=env, capture_output=True, text=True, check=True
                    )
                    rates[name].append(float(done.stdout.split()[-1]))
                    print(f"  round {round_ + 1}: stream {name:>14} {rates[name][-1]:7.0f} /s")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=bench.ROOT)
            shutil.rmtree(old, ignore_errors=True)
    return rates


def resume_times(repeats: int) -> list[list[Any]]:
    """Milliseconds from a stored state to the first index, at ImageNet's sample count."""
    step, batch = 400, 256  # 400 steps of 256 on 8 ranks: 819,200 samples into the epoch
    start = plan.EpochState.start(5, 0, IMAGENET)
    split = plan.Split(start.remaining, 8, False, batch)
    state = start.advanced(split, split.consumed(step)).state_dict(8)
    shards = tuple([1000] * (IMAGENET // 1000) + [IMAGENET % 1000])

    def sampler_first(world: int) -> None:
        sampler = readers.EpochSampler(
            IMAGENET, batch_size=batch, rank=world - 1, world_size=world, seed=0
        )
        sampler.load_state_dict(state)
        next(iter(sampler))

    def stream_first(world: int) -> None:  # what WdsStream.__iter__ does before reading
        loaded = plan.EpochState.from_dict(state, IMAGENET, 0)
        ranges = plan.Split(loaded.remaining, world, False, batch).worker_ranges(world - 1, 3, 4)
        lo, hi = plan.wrapped(ranges, IMAGENET)[0]
        order = plan.BlockOrder(shards, 0, loaded.epoch, 5000)
        a, b = order.chunks(lo, hi)[0]
        order.indices(a, b)

    rows = []
    for label, fn in (
        ("EpochSampler (map-style)", sampler_first),
        ("WdsStream plan", stream_first),
    ):
        for world in (8, 12):
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                fn(world)
                times.append(1000 * (time.perf_counter() - t))
            rows.append([label, f"8 -> {world}", statistics.median(times), min(times), max(times)])
    return rows


def main() -> None:
    p = bench.parser(__doc__.splitlines()[0])
    p.add_argument("--rev", help="also A/B WdsStream against this commit")
    p.add_argument("--min-seconds", type=float, default=MIN_SECONDS, help="per measurement")
    args = p.parse_args()
    MIN_TIMED_S[0] = args.min_seconds
    info = bench.machine_info()
    bench.print_machine(info)
    src = bench.source_folder(args)
    args.work.mkdir(parents=True, exist_ok=True)
    runs, (rows, targets) = overhead(src, args.work.resolve(), args.repeats)
    print()
    headers = ["reader", "plain /s", "make_loader /s", "ratio", "plain runs", "make_loader runs"]
    print(bench.markdown_table(headers, rows))
    print()
    print(bench.target_table(targets))
    results: dict[str, Any] = {
        "machine": info,
        "overhead": bench.runs_json(runs),
        "targets": bench.targets_json(targets),
    }
    if args.rev:
        for workers in (0, 2):
            ab = stream_ab(args.work / "wds-jpeg", args.rev, args.repeats, workers)
            medians = {name: statistics.median(v) for name, v in ab.items()}
            print(
                f"\nWdsStream workers={workers}: "
                + ", ".join(
                    f"{name} {m:,.0f}/s ({' / '.join(f'{v:.0f}' for v in ab[name])})"
                    for name, m in medians.items()
                )
            )
            results[f"stream_ab_workers_{workers}"] = ab
    resume = resume_times(max(args.repeats, 7))
    print()
    print(bench.markdown_table(["resume of", "world", "median ms", "min ms", "max ms"], resume))
    results["resume_ms"] = resume
    bench.write_json(args.json, results)


if __name__ == "__main__":
    main()
