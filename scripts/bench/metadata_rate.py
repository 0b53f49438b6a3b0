"""``ds.metadata()`` of one dataset, in this process: its time and the memory it took, a
child of :mod:`scripts.bench.fields`. The result line is ``{"seconds": ..., "rss_mb": ...,
"rows": ...}``: ``rss_mb`` is the growth of this process's peak resident set (``VmHWM``,
started again from the current RSS once the dataset is open) over the call, the table it
returns included. Not ``ru_maxrss``: a forked child starts with its parent's, so a parent
that had just converted the dataset read as 0 MB of growth.

    .venv/bin/python -m scripts.bench.metadata_rate DATASET
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import readers
from scripts.bench.child import emit
from scripts.bench.epochs import reset_peak_rss, rss_kib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path, help="an imgpack dataset")
    args = parser.parse_args()
    ds = readers.open_dataset(args.dataset)
    len(ds)
    before, start = reset_peak_rss(), time.perf_counter()
    table = ds.metadata()
    seconds = time.perf_counter() - start
    emit(seconds=seconds, rss_mb=(rss_kib("VmHWM") - before) / 1024, rows=table.num_rows)


if __name__ == "__main__":
    main()
