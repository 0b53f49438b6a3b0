"""What ``readers.make_loader`` costs, and how long resuming takes at ImageNet scale.

1. Samples/s of ``make_loader`` against the plain reader it wraps, side by side in
   interleaved rounds (raw ``pt``; JPEG ``lmdb`` in-process and with 2 workers; the
   ``WdsStream`` with 2 workers). Target: the helper costs under 5 %.
2. ``--rev REV``: ``WdsStream`` of this tree against the one at an earlier commit, each run
   in a fresh process over the same tars (the stream's reading changed with make_loader):
   the A/B helper (:mod:`scripts.bench.ab`) running :mod:`scripts.bench.read_rate`.
3. The time to ``load_state_dict`` and reach the first index at 1,281,167 samples (the
   index is simulated: no images), for the map-style sampler and for the stream's plan,
   resumed on the same and on another world size.

    .venv/bin/python -m scripts.bench.loader --repeats 5 [--rev 4f81ee1] [--json out.json]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

import readers
from readers.epochs import order, ranges, split, state
from scripts.bench import ab
from scripts.bench.common import (
    CenterCrop,
    batch_loader,
    convert_source,
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
from scripts.bench.measure import Measurement, interleaved, median_rate, timed
from scripts.bench.settings import BATCH, CROP, MIN_SECONDS, WDS_SHARDS

IMAGENET = 1_281_167
TARGET_COST = 0.95  # make_loader's rate over the plain reader's


def plain_map(
    root: Path, workers: int, transform: Any, min_seconds: float
) -> Callable[[], Measurement]:
    """The plain map-style reader in a shuffled DataLoader, timed."""
    ds = readers.open_dataset(root, transform=transform, decode_threads=1 if workers else None)
    loader = batch_loader(ds, workers, shuffle=True)
    return timed(lambda: loader, sorted(root.iterdir()), min_seconds)


def plain_stream(
    root: Path, workers: int, transform: Any, min_seconds: float
) -> Callable[[], Measurement]:
    """The plain ``WdsStream`` in a DataLoader, a new epoch each pass, timed."""
    stream = readers.WdsStream(root, transform=transform, batch_size=BATCH)
    loader = batch_loader(stream, workers)
    epoch = iter(range(1 << 30))

    def batches() -> DataLoader:
        stream.set_epoch(next(epoch))
        return loader

    return timed(batches, sorted(root.iterdir()), min_seconds)


def helper(
    root: Path, workers: int, transform: Any, stream: bool, min_seconds: float
) -> Callable[[], Measurement]:
    """``readers.make_loader`` over the same data, timed."""
    loader = readers.make_loader(
        root,
        BATCH,
        num_workers=workers,
        stream=stream,
        transform=transform,
        decode_threads=1 if workers else None,
        persistent_workers=workers > 0,
    )
    return timed(lambda: loader, sorted(root.iterdir()), min_seconds)


def overhead(
    src: Path, work: Path, repeats: int, min_seconds: float, max_foreign: float
) -> tuple[dict[str, list[Measurement]], list]:
    """make_loader against the plain reader, in ``repeats`` interleaved rounds; the
    datasets in one shard each (the tars in ``WDS_SHARDS``), shuffled as a stream wants."""
    raw = convert_source(src, work / "pt-raw", "pt", "raw", shards=1, shuffle=True)
    lmdb = convert_source(src, work / "lmdb-jpeg", "lmdb", "jpeg", shards=1, shuffle=True)
    wds = convert_source(src, work / "wds-jpeg", "wds", "jpeg", WDS_SHARDS, shuffle=True)
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
        contenders[f"plain {name}"] = plain(root, workers, transform, min_seconds)
        contenders[f"make_loader {name}"] = helper(root, workers, transform, stream, min_seconds)
    runs = interleaved(contenders, repeats, max_foreign)
    rows, targets = [], []
    for name in cases:
        p, m = runs[f"plain {name}"], runs[f"make_loader {name}"]
        ratio = median_rate(m) / median_rate(p)
        rows.append(
            [
                name,
                median_rate(p),
                median_rate(m),
                ratio,
                rates_text(p),
                rates_text(m),
            ]
        )
        targets.append(target_row(f"make_loader / plain, {name}", ratio, TARGET_COST))
    return runs, [rows, targets]


def stream_ab(wds: Path, rev: str, repeats: int, workers: int) -> dict[str, list[float]]:
    """WdsStream samples/s of this tree and of ``rev``, alternating fresh processes."""
    args = [str(wds.resolve()), "--reader", "wds-stream", "--workers", str(workers)]
    results = ab.side_by_side(rev, "read_rate", [*args, "--passes", "3"], repeats)
    return {name: [r["rate"] for r in runs] for name, runs in results.items()}


def resume_times(repeats: int) -> list[list[Any]]:
    """Milliseconds from a stored state to the first index, at ImageNet's sample count."""
    step, batch = 400, 256  # 400 steps of 256 on 8 ranks: 819,200 samples into the epoch
    start = state.EpochState.start(5, 0, IMAGENET, "feistel")
    dealt = split.Split(start.remaining, 8, False, batch)
    stored = start.advanced(dealt, dealt.consumed(step)).state_dict(8)
    shards = tuple([1000] * (IMAGENET // 1000) + [IMAGENET % 1000])

    def sampler_first(world: int) -> None:
        sampler = readers.EpochSampler(
            IMAGENET, batch_size=batch, rank=world - 1, world_size=world, seed=0
        )
        sampler.load_state_dict(stored)
        next(iter(sampler))

    def stream_first(world: int) -> None:  # what WdsStream.__iter__ does before reading
        loaded = state.EpochState.from_dict(
            {**stored, "order": "windows"}, IMAGENET, 0, ("windows",)
        )
        dealt = split.Split(loaded.remaining, world, False, batch, 4, 5000)
        lo, hi = ranges.wrapped(dealt.worker_ranges(world - 1, 3), IMAGENET)[0]
        blocks = order.BlockOrder(shards, 0, loaded.epoch, 5000)
        a, b = blocks.chunks(lo, hi)[0]
        blocks.indices(a, b)

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
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rev", help="also A/B WdsStream against this commit")
    p.add_argument("--min-seconds", type=float, default=MIN_SECONDS, help="per measurement")
    args = p.parse_args()
    info = machine_info()
    print_machine(info)
    src = source_folder(args)
    args.work.mkdir(parents=True, exist_ok=True)
    runs, (rows, targets) = overhead(
        src, args.work.resolve(), args.repeats, args.min_seconds, args.max_foreign
    )
    print()
    headers = ["reader", "plain /s", "make_loader /s", "ratio", "plain runs", "make_loader runs"]
    print(markdown_table(headers, rows))
    print()
    print(target_table(targets))
    results: dict[str, Any] = {
        "machine": info,
        "overhead": runs_json(runs),
        "targets": targets_json(targets),
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
    print(markdown_table(["resume of", "world", "median ms", "min ms", "max ms"], resume))
    results["resume_ms"] = resume
    write_json(args.json, results)


if __name__ == "__main__":
    main()
