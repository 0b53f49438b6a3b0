"""The one-core pure decode rate of a dataset's stored JPEGs: a child of the A/B helper
(``scripts.bench.ab``), the yardstick of the plain read path's target.

Every sample's stored bytes are read into memory first (:meth:`readers.ImageDataset.read_stored`),
then decoded one after another by :func:`readers.decode_image` on this thread (what
``scripts.bench.read``'s "pure decode, 1 thread" does), or with ``--threads N`` on N
threads each taking an equal share (TurboJPEG releases the GIL while it decodes); one
untimed pass, then ``--passes`` timed; the result line is ``{"rate": images/s, "unit":
"images/s"}``.

    .venv/bin/python -m scripts.bench.decode_rate bench-data/work/read/pt-jpeg
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import readers
from scripts.bench.child import emit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path, help="an imgpack dataset folder of JPEGs")
    parser.add_argument("--passes", type=int, default=3, help="timed passes")
    parser.add_argument("--threads", type=int, default=1, help="decode threads")
    args = parser.parse_args()
    ds = readers.open_dataset(args.dataset)
    jpegs = [bytes(value) for value in ds.read_stored(range(len(ds)))]
    shares = [jpegs[k :: args.threads] for k in range(args.threads)]

    def decode(share: list[bytes]) -> None:
        for data in share:
            readers.decode_image(data)

    with ThreadPoolExecutor(args.threads) as threads:
        list(threads.map(decode, shares))  # untimed: first calls, caches
        start = time.perf_counter()
        for _ in range(args.passes):
            list(threads.map(decode, shares))
    emit(rate=args.passes * len(jpegs) / (time.perf_counter() - start), unit="images/s")


if __name__ == "__main__":
    main()
