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

Usage: ``python scripts/bench_memory.py --work /tmp/mem-bench [--sizes 10000 100000]``
(``--code DIR`` measures another checkout of imgpack, e.g. an older commit, with the same
folders).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import ROOT, machine_info, markdown_table, print_machine, write_json
from make_sample_data import load_photo

_TILE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")
_CLASSES = 100

# The peak RSS (KiB) of this process since its exec: VmHWM, not ru_maxrss, which also
# counts the RSS of the process that forked it (this benchmark, or pytest).
_PEAK = """
def status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
def peak_kib():
    return status_kib("VmHWM")
"""

# Runs in a fresh process: one conversion, then its peak RSS as JSON.
_CONVERT = (
    _PEAK
    + """
import json, sys
from convert import ConvertOptions, convert_folder
src, dst, fmt, encoding, workers = sys.argv[1:6]
options = ConvertOptions(format=fmt, encoding=encoding)
convert_folder(src, dst, options, workers=int(workers), overwrite=True, progress=False)
print(json.dumps({"main_kib": peak_kib()}))
"""
)

# Runs in a fresh process: open every shard, read random samples, report memory as JSON.
_READ = (
    _PEAK
    + """
import json, sys, tracemalloc
import numpy as np
import readers
root, reads = sys.argv[1], int(sys.argv[2])
ds = readers.open_dataset(root)
tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
start = 0
for shard in ds.manifest.shards:  # opens it, and loads its paths where they are lazy
    ds.source_path(start)
    start += shard.samples
index_bytes = tracemalloc.get_traced_memory()[0] - before
tracemalloc.stop()
order = np.random.default_rng(0).permutation(len(ds))[:reads].tolist()
for k in range(0, len(order), 256):
    ds.__getitems__(order[k : k + 256])
print(json.dumps({
    "peak_kib": peak_kib(),
    "anon_kib": status_kib("RssAnon"),
    "index_bytes": index_bytes,
}))
"""
)

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


def _run(code: Path, script: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="folders and datasets go here")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--image-size", type=int, default=32, help="tile side in px")
    parser.add_argument("--formats", nargs="+", default=["pt", "hdf5", "lmdb", "wds"])
    parser.add_argument("--encodings", nargs="+", default=["raw", "jpeg"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--reads", type=int, default=4096, help="random samples read")
    parser.add_argument("--code", type=Path, default=ROOT, help="the imgpack checkout to run")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()
    info = machine_info()
    print_machine(info)
    rows, results = [], []
    for fmt in args.formats:
        for encoding in args.encodings:
            measured = []
            for count in args.sizes:
                src = make_folder(args.work / f"tiles-{count}", count, args.image_size)
                dst = args.work / f"{fmt}-{encoding}-{count}"
                conversion = _run(
                    args.code, _CONVERT, str(src), str(dst), fmt, encoding, str(args.workers)
                )
                reading = _run(args.code, _READ, str(dst), str(args.reads))
                measured.append({"samples": count, **conversion, **reading})
                print(fmt, encoding, measured[-1], flush=True)
            (a, b) = (measured[0], measured[-1])
            slope = (b["index_bytes"] - a["index_bytes"]) / max(b["samples"] - a["samples"], 1)
            results.append({"format": fmt, "encoding": encoding, "runs": measured})
            rows.append(
                [
                    fmt,
                    encoding,
                    *(m["main_kib"] / 1024 for m in measured),
                    *(m["peak_kib"] / 1024 for m in measured),
                    *(m["anon_kib"] / 1024 for m in measured),
                    slope,
                ]
            )
    sizes = [f"{n // 1000}k" for n in args.sizes]
    headers = [
        "format",
        "encoding",
        *(f"convert main MiB ({s})" for s in sizes),
        *(f"reader MiB ({s})" for s in sizes),
        *(f"reader private MiB ({s})" for s in sizes),
        "index B/sample",
    ]
    print(markdown_table(headers, rows))
    options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    write_json(args.json, {"machine": info, "args": options, "results": results})


if __name__ == "__main__":
    main()
