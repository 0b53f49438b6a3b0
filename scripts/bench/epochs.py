"""What an epoch plan costs at scale: resuming the map-style order, and the stream's requests.

resume:   a state saved on 8 ranks after 40 steps of 256, loaded on 12 ranks: the time
          from ``load_state_dict`` to the first batch of indices (256) and the peak extra
          RSS over that (``/proc/self/status`` VmHWM after resetting it through
          ``/proc/self/clear_refs``), in a fresh process per case, at 1.28 M, 100 M and
          1 B samples (simulated: ``EpochSampler(N)``, no data). With ``--rev REV`` the same
          child also runs on REV's ``readers`` (before the keyed order: the whole
          permutation), except at 1 B, where that permutation alone is 8 GB.
iterate:  indices/s of ``EpochSampler`` over whole epochs of 1.28 M (one process, three
          epochs, the median), this tree and REV.
requests: range GETs of tars per epoch of ``WdsStream`` from a loopback S3 server (moto):
          20,000 small tiles in ``wds`` shards of 1,000, shuffle window 1,000, 2 ranks (ten
          read windows each), batch 50 (which divides the window and the slice) and 64
          (which does not), 0, 2 and 4 DataLoader workers per rank; with ``--rev`` REV's
          too. The lower bound: one request per shard in each read window of a rank's
          slice (tiny samples: every gap is under the 1 MiB merge gap).

    .venv/bin/python -m scripts.bench.epochs [--rev 6f7a554] [--repeats 3] [--json F]
        [--only resume,iterate,requests]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scripts.bench.common import machine_info, markdown_table, print_machine, write_json

SIZES = (1_281_167, 100_000_000, 1_000_000_000)
PERMUTATION_LIMIT = 100_000_000  # the old order is not run beyond: 8 bytes a sample
BATCH, STEPS, SAVED_ON, RESUMED_ON = 256, 40, 8, 12
TILES, SHARD, WINDOW, RANKS = 20_000, 1000, 1000, 2
STREAM_BATCHES = (50, 64)


def rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def reset_peak_rss() -> int:
    """Start the peak RSS (VmHWM) again from the current RSS, in KiB, which it returns."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_kib("VmRSS")


def measure_resume(make: Callable[[int, int], Any]) -> dict[str, Any]:
    """A state saved by ``make(0, SAVED_ON)`` after ``STEPS`` batches, loaded into
    ``make(RESUMED_ON - 1, RESUMED_ON)``: the time to its first batch of indices and the
    peak extra RSS over that, the state's size, its order and the first index."""
    saved = make(0, SAVED_ON)
    saved.set_epoch(2)
    list(itertools.islice(iter(saved), STEPS * BATCH))
    state = json.dumps(saved.state_dict())
    del saved
    base = reset_peak_rss()
    start = time.perf_counter()
    resumed = make(RESUMED_ON - 1, RESUMED_ON)
    resumed.load_state_dict(json.loads(state))
    batch = list(itertools.islice(iter(resumed), BATCH))
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "extra_mib": (rss_kib("VmHWM") - base) / 1024,
        "state_bytes": len(state),
        "order": json.loads(state).get("order", "permutation (version 1)"),
        "first": batch[0],
    }


def child_resume(num_samples: int) -> None:
    """:func:`measure_resume` of ``EpochSampler(num_samples)``."""
    from readers import EpochSampler
    from scripts.bench.child import emit

    def make(rank: int, world_size: int) -> Any:
        return EpochSampler(num_samples, seed=3, batch_size=BATCH, rank=rank, world_size=world_size)

    emit(**measure_resume(make))


def child_iterate(num_samples: int) -> None:
    """Indices/s of whole epochs of the sampler (the median of three)."""
    from readers import EpochSampler
    from scripts.bench.child import emit

    sampler = EpochSampler(num_samples, seed=0, rank=0, world_size=1)
    rates = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        count = sum(1 for _ in sampler)
        rates.append(count / (time.perf_counter() - start))
    emit(rate=statistics.median(rates), unit="indices/s")


def iterate_rows(trees: dict[str, Path], repeats: int) -> list[list[Any]]:
    from scripts.bench.ab import run_child

    rows = []
    for name, tree in trees.items():
        runs = [run_child(tree, "epochs", ["child-iterate", str(SIZES[0])]) for _ in range(repeats)]
        rows.append([f"{SIZES[0]:,}", name, statistics.median(r["rate"] for r in runs) / 1e6])
        print("  ", rows[-1], flush=True)
    return rows


def child_stream(url: str, rank: int, workers: int, batch: int) -> None:
    """Read rank ``rank``'s epoch of the stream at ``url`` (the parent counts requests)."""
    import readers
    from scripts.bench.child import emit

    loader = readers.make_loader(
        url,
        batch,
        stream=True,
        shuffle_buffer=WINDOW,
        seed=1,
        num_workers=workers,
        rank=rank,
        world_size=RANKS,
        decode=False,
        **({"multiprocessing_context": "fork"} if workers else {}),
    )
    emit(samples=sum(len(labels) for _, labels in loader))


def resume_rows(trees: dict[str, Path], repeats: int) -> list[list[Any]]:
    from scripts.bench.ab import run_child

    rows = []
    for n in SIZES:
        for name, tree in trees.items():
            if name != "this tree" and n > PERMUTATION_LIMIT:
                continue
            runs = [run_child(tree, "epochs", ["child-resume", str(n)]) for _ in range(repeats)]
            rows.append(
                [
                    f"{n:,}",
                    f"{name} ({runs[0]['order']})",
                    1000 * statistics.median(r["seconds"] for r in runs),
                    statistics.median(r["extra_mib"] for r in runs),
                    runs[0]["state_bytes"],
                ]
            )
            print("  ", rows[-1], flush=True)
    return rows


def tiles(folder: Path) -> Path:
    from PIL import Image

    for i in range(TILES):
        sub = folder / f"class{i % 10}"
        sub.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (16, 16), (i % 256, i // 256, 3)).save(sub / f"{i:05d}.png")
    return folder


def lower_bound(url: str, rank: int) -> int:
    """One request per shard in each read window of the rank's slice."""
    import numpy as np

    import readers
    from readers.epochs.order import BlockOrder

    manifest = readers.load_manifest(url)
    counts = [s.samples for s in manifest.shards]
    shard_of = np.repeat(np.arange(len(counts)), counts)
    order = BlockOrder(tuple(counts), 1, 0, WINDOW)
    per_rank = TILES // RANKS
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    cuts = sorted({lo, hi, *range(lo - lo % WINDOW + WINDOW, hi, WINDOW)})
    return sum(
        len({int(shard_of[i]) for c in order.chunks(a, b) for i in order.indices(*c)})
        for a, b in itertools.pairwise(cuts)
    )


def request_rows(trees: dict[str, Path]) -> list[list[Any]]:
    from convert import ConvertOptions, convert_folder
    from scripts.bench.ab import run_child
    from scripts.s3_server import local_s3_server

    rows = []
    with tempfile.TemporaryDirectory() as scratch, local_s3_server("bench-epochs") as server:
        url = "s3://bench-epochs/tiles"
        options = ConvertOptions("wds", shard_size=SHARD, shuffle=True)
        convert_folder(tiles(Path(scratch)), url, options, workers=2, progress=False)
        prefix = "/bench-epochs/tiles/"

        def tar_gets() -> int:  # byte ranges of samples, not the tars' indexes
            return sum(
                r.method == "GET" and r.target.startswith(prefix) and r.target.endswith(".tar")
                for r in server.requests()
            )

        bound = sum(lower_bound(url, rank) for rank in range(RANKS))
        for batch, workers in itertools.product(STREAM_BATCHES, (0, 2, 4)):
            for name, tree in trees.items():
                before, samples = tar_gets(), 0
                for rank in range(RANKS):
                    args = ["child-stream", url, str(rank), str(workers), str(batch)]
                    samples += run_child(tree, "epochs", args)["samples"]
                gets = tar_gets() - before
                rows.append([batch, workers, name, samples, gets, bound, gets / bound])
                print("  ", rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rev", help="also run the children on this commit's readers")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    p.add_argument("--only", default="resume,iterate,requests", help="the parts to run")
    p.add_argument("child", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        what, *rest = args.child
        if what == "child-resume":
            child_resume(int(rest[0]))
        elif what == "child-iterate":
            child_iterate(int(rest[0]))
        else:
            child_stream(rest[0], int(rest[1]), int(rest[2]), int(rest[3]))
        return
    from scripts.bench import ab
    from scripts.bench.settings import ROOT

    info = machine_info()
    print_machine(info)
    with ab.worktree(args.rev) if args.rev else contextlib.nullcontext() as old:
        trees = {"this tree": ROOT, **({args.rev: old} if args.rev else {})}
        parts = args.only.split(",")
        resume = resume_rows(trees, args.repeats) if "resume" in parts else []
        iterate = iterate_rows(trees, args.repeats) if "iterate" in parts else []
        requests = request_rows(trees) if "requests" in parts else []
    tables = [
        (
            [
                "samples",
                "code (order)",
                "resume to first batch, ms",
                "extra peak RSS, MiB",
                "state, bytes",
            ],
            resume,
        ),
        (["samples", "code", "M indices/s"], iterate),
        (
            [
                "batch",
                "workers / rank",
                "code",
                "samples read",
                "tar GETs / epoch",
                "one per window x shard",
                "ratio",
            ],
            requests,
        ),
    ]
    for headers, rows in tables:
        if rows:
            print(markdown_table(headers, rows))
    write_json(
        args.json, {"machine": info, "resume": resume, "iterate": iterate, "requests": requests}
    )


if __name__ == "__main__":
    sys.exit(main())
