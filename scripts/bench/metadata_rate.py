"""``ds.metadata()`` of one dataset, in this process: its time and the memory it took, a
child of :mod:`scripts.bench.fields`. The result line is ``{"seconds": ..., "rss_mb": ...,
"rows": ...}``: ``rss_mb`` is the growth of this process's peak resident set from the opened
dataset to the end of the call (the table it returns included).

    .venv/bin/python -m scripts.bench.metadata_rate DATASET
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

import readers
from scripts.bench.child import emit


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path, help="an imgpack dataset")
    args = parser.parse_args()
    ds = readers.open_dataset(args.dataset)
    len(ds)
    before, start = peak_rss_mb(), time.perf_counter()
    table = ds.metadata()
    seconds = time.perf_counter() - start
    emit(seconds=seconds, rss_mb=peak_rss_mb() - before, rows=table.num_rows)


if __name__ == "__main__":
    main()
