"""One conversion, or one reading process, and its memory: the child processes of
:mod:`scripts.bench.memory` (each in a fresh process, so that its peak is its own).

``convert SRC DST FORMAT ENCODING WORKERS``: ``convert_folder``, then ``{"main_kib": peak}``.
``read DATASET READS``: open every shard and ask for a path in each (which loads lazy path
tables), read ``READS`` random samples in batches of 256, then ``{"peak_kib", "anon_kib",
"index_bytes"}``: the peak RSS, the anonymous RSS at the end, and the Python heap
(tracemalloc) that the open shards hold.

The peak is ``VmHWM``, not ``ru_maxrss``, which also counts the RSS of the process that forked
this one (the benchmark, or pytest).
"""

from __future__ import annotations

import argparse
import tracemalloc
from pathlib import Path

import numpy as np

import readers
from convert import ConvertOptions, convert_folder
from scripts.bench.child import emit

READ_BATCH = 256


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (``VmHWM``: the peak RSS since exec)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def convert(args: argparse.Namespace) -> None:
    options = ConvertOptions(format=args.format, encoding=args.encoding)
    convert_folder(
        args.src, args.dst, options, workers=args.workers, overwrite=True, progress=False
    )
    emit(main_kib=status_kib("VmHWM"))


def read(args: argparse.Namespace) -> None:
    ds = readers.open_dataset(args.dataset)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    start = 0
    for shard in ds.manifest.shards:  # opens it, and loads its paths where they are lazy
        ds.source_path(start)
        start += shard.samples
    index_bytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    order = np.random.default_rng(0).permutation(len(ds))[: args.reads].tolist()
    for k in range(0, len(order), READ_BATCH):
        ds.__getitems__(order[k : k + READ_BATCH])
    emit(peak_kib=status_kib("VmHWM"), anon_kib=status_kib("RssAnon"), index_bytes=index_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(required=True)
    conversion = commands.add_parser("convert", help="one conversion's peak RSS")
    conversion.add_argument("src", type=Path)
    conversion.add_argument("dst", type=Path)
    conversion.add_argument("format")
    conversion.add_argument("encoding")
    conversion.add_argument("workers", type=int)
    conversion.set_defaults(run=convert)
    reading = commands.add_parser("read", help="a reading process's memory")
    reading.add_argument("dataset", type=Path)
    reading.add_argument("reads", type=int)
    reading.set_defaults(run=read)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
