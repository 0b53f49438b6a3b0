"""The benchmarks' shared settings: where the data lives, the read geometry, and how long
and how quietly a measurement runs. Constants only (no imports of the library), so a child
process of the A/B helper can read them over any commit's ``readers``/``convert``."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout these benchmarks belong to
FOLDER = ROOT / "bench-data" / "folder"  # the source images (scripts.bench.make_folder)
WORK = ROOT / "bench-data" / "work"  # converted datasets, overwritten

QUICK_IMAGES_PER_CLASS = 60  # --quick
MAX_FOREIGN_CORES = 0.25  # retry a measurement while other processes used more than this
RETRIES = 3
QUIET_WAIT_S = 60.0  # longest wait for other processes to settle before a measurement

# The geometry every benchmark converts and reads at.
RESIZE, CROP, BATCH = 256, 224, 64
QUALITY = 90  # of the JPEGs a conversion writes
WDS_SHARDS = 8  # jpeg tar shards, so that 1 and 2 streaming workers get equal shares
MIN_SECONDS = 1.0  # a timed measurement covers whole epochs lasting at least this long
DECODE_CORES = len(os.sched_getaffinity(0))  # pure decode runs on all usable cores
