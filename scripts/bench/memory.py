"""Peak memory of a conversion and of a reading process, at two dataset sizes.

For each format and encoding, converts a folder of small real-photo tiles at every
``--sizes`` count, each in a fresh process, and records that process's peak RSS (the main
process, which writes; the pool's workers each prepare one chunk at a time). Then it opens
the result in a fresh process that opens every shard, asks for a path in each (which loads
lazy path tables) and reads ``--reads`` random samples in batches, recording its peak RSS
and the Python heap (tracemalloc) that the open shards hold. The heap's growth between the
two sizes, divided by the samples added, is the reader's index cost per sample without the
per-shard constant. A reader's peak RSS also counts the pages of mmap'd shards it touched
(``pt`` and ``lmdb``: the kernel maps up to 64 KiB around each page read), which are the
page cache's, shared and reclaimable: "private" is its anonymous memory (RssAnon) at the end.

``--convert-only`` measures the conversions alone, and says how much the main process's
peak grew from the first size to the last: at 100k and 1M small files it should stay
within 20 % (the sample table costs ~12 bytes a file beside its path, the content checksum
none: ``convert.samples``, ``convert.ledger.ContentDigest``).

Each conversion and each read is :mod:`scripts.bench.memory_probe` in a fresh process.
``--rev REV`` measures an earlier commit instead, checked out by the A/B helper
(:mod:`scripts.bench.ab`: this tree's benchmarks over that commit's ``readers`` and
``convert``); ``--code DIR`` another checkout that has ``scripts/bench/``.

Usage: ``python -m scripts.bench.memory --work /tmp/mem-bench [--sizes 10000 100000]
[--rev e2c6b1e]``; the converter alone at 1 M files (it writes the 1 M tiles first):
``python -m scripts.bench.memory --work /tmp/mem-bench --sizes 100000 1000000 --formats wds
--encodings jpeg --convert-only``
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from scripts.bench import ab
from scripts.bench.common import machine_info, markdown_table, print_machine, write_json
from scripts.bench.settings import ROOT
from scripts.make_sample_data import load_photo

_TILE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")
_CLASSES = 100
PROBE = "memory_probe"

_tiles: list[np.ndarray] = []


def _load_tiles() -> None:
    _tiles.extend(np.asarray(load_photo(name).convert("RGB")) for name in _TILE_PHOTOS)


def _write_tile(job: tuple[Path, int, int]) -> None:
    """One JPEG: a random crop of a photo, resized to ``size`` px."""
    path, i, size = job
    rng = np.random.default_rng(i)
    photo = _tiles[i % len(_tiles)]
    side = int(rng.integers(size, min(photo.shape[:2]) // 2))
    top = int(rng.integers(0, photo.shape[0] - side + 1))
    left = int(rng.integers(0, photo.shape[1] - side + 1))
    tile = Image.fromarray(photo[top : top + side, left : left + side]).resize((size, size))
    tile.save(path, quality=90)


def make_folder(root: Path, count: int, size: int) -> Path:
    """``count`` ``size``-px JPEG tiles in ``_CLASSES`` class folders (kept if present)."""
    done = root / ".complete"
    if done.is_file():
        return root
    jobs = []
    for i in range(count):
        folder = root / f"class{i % _CLASSES:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        jobs.append((folder / f"tile{i:06d}.jpg", i, size))
    with Pool(initializer=_load_tiles) as pool:
        pool.map(_write_tile, jobs, chunksize=512)
    done.touch()
    return root


def measure(args: argparse.Namespace, tree: Path) -> tuple[list[list[Any]], list[dict[str, Any]]]:
    """Every format and encoding at every size, converted and read by ``tree``'s code: the
    table's rows and the results for the JSON."""
    rows, results = [], []
    for fmt in args.formats:
        for encoding in args.encodings:
            measured = []
            for count in args.sizes:
                src = make_folder(args.work / f"tiles-{count}", count, args.image_size)
                dst = args.work / f"{fmt}-{encoding}-{count}"
                convert = ["convert", str(src), str(dst), fmt, encoding, str(args.workers)]
                conversion = ab.run_child(tree, PROBE, convert)
                reading = {}
                if not args.convert_only:
                    reading = ab.run_child(tree, PROBE, ["read", str(dst), str(args.reads)])
                measured.append({"samples": count, **conversion, **reading})
                print(fmt, encoding, measured[-1], flush=True)
            (a, b) = (measured[0], measured[-1])
            results.append({"format": fmt, "encoding": encoding, "runs": measured})
            row = [fmt, encoding, *(m["main_kib"] / 1024 for m in measured)]
            if args.convert_only:
                row.append(f"{100 * (b['main_kib'] / a['main_kib'] - 1):+.0f} %")
            else:
                slope = (b["index_bytes"] - a["index_bytes"]) / max(b["samples"] - a["samples"], 1)
                row += [
                    *(m["peak_kib"] / 1024 for m in measured),
                    *(m["anon_kib"] / 1024 for m in measured),
                    slope,
                ]
            rows.append(row)
    return rows, results


def print_table(counts: list[int], rows: list[list[Any]], convert_only: bool) -> None:
    """The markdown table of ``rows``, a column per size of each measure."""
    sizes = [f"{n // 1000}k" for n in counts]
    headers = ["format", "encoding", *(f"convert main MiB ({s})" for s in sizes)]
    if convert_only:
        headers.append(f"growth {sizes[0]} -> {sizes[-1]}")
    else:
        headers += [
            *(f"reader MiB ({s})" for s in sizes),
            *(f"reader private MiB ({s})" for s in sizes),
            "index B/sample",
        ]
    print(markdown_table(headers, rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="folders and datasets go here")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--image-size", type=int, default=32, help="tile side in px")
    parser.add_argument("--formats", nargs="+", default=["pt", "hdf5", "lmdb", "wds"])
    parser.add_argument("--encodings", nargs="+", default=["raw", "jpeg"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--reads", type=int, default=4096, help="random samples read")
    parser.add_argument(
        "--convert-only", action="store_true", help="measure the conversions, not the reading"
    )
    code = parser.add_mutually_exclusive_group()
    code.add_argument("--rev", help="measure this commit instead (a temporary git worktree)")
    code.add_argument(
        "--code", type=Path, default=ROOT, help="the imgpack checkout to run (with scripts/bench/)"
    )
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    args.work = args.work.resolve()  # the probes run in the checkout measured
    if not (args.code / "scripts" / "bench" / f"{PROBE}.py").is_file():
        parser.error(f"--code {args.code} has no scripts/bench/{PROBE}.py: use --rev REV")
    info = machine_info()
    print_machine(info)
    with ab.worktree(args.rev) if args.rev else nullcontext(args.code.resolve()) as tree:
        rows, results = measure(args, tree)
    print_table(args.sizes, rows, args.convert_only)
    options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    write_json(args.json, {"machine": info, "args": options, "results": results})


if __name__ == "__main__":
    main()
