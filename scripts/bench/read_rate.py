"""One reader's samples/s, in this process: a child of the A/B helper (``scripts.bench.ab``).

``--reader wds-stream``: a ``WdsStream`` over the ``wds`` dataset (shuffle window 1,000,
seed 0) in a ``DataLoader``, what ``scripts.bench.loader --rev`` compares.
``--reader make-loader``: ``readers.make_loader`` over a dataset of any format (shuffled).
Batches of 64; ``--crop`` says how the images become 224x224: ``transform`` (a per-sample
centre crop after the full decode), ``centre`` or ``random`` (``crop=`` inside the decode:
``CenterCrop(224, ratio=224/256)``, ``RandomResizedCrop(224, flip=True)``), ``noop``
(``crop=CenterCrop(224)`` of images stored at 224: the kernel's crop path, no crop), ``none``
(stored at that size: raw, or JPEGs read by the plain path), ``cover`` (``CenterCrop(224,
ratio=1.0)``: resized to cover 224x224, centre-cropped) and ``buckets`` (the same into
``AspectBuckets.around(224 * 224, 32, 2.0)``: 288x160 ... 160x288; ``one-bucket``: one 224x224
bucket, the cover crop's pixels through the bucketed loader). ``--fields txt,json``: read
those fields too (``make_loader(..., fields=...)``). Several datasets with ``make-loader``:
their mixture (``make_loader({name: path}, ...)``, shares by length). One untimed epoch, then
``--passes`` epochs timed; the result line is ``{"rate": samples/s, "unit": "samples/s",
"cpu_rate": samples per CPU-second of this process}`` (its threads', not its workers').

    .venv/bin/python -m scripts.bench.ab --rev a662b92 --rounds 6 \\
        read_rate bench-data/work/read/lmdb-jpeg --reader make-loader --crop centre
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import readers
from scripts.bench.child import emit
from scripts.bench.common import CenterCrop, batch_loader
from scripts.bench.settings import BATCH, CROP, RESIZE

CROPS: dict[str, Callable[[], dict[str, Any]]] = {
    "transform": lambda: {"transform": CenterCrop(CROP)},
    "centre": lambda: {"crop": readers.CenterCrop(CROP, ratio=CROP / RESIZE)},
    "random": lambda: {"crop": readers.RandomResizedCrop(CROP, flip=True)},
    "noop": lambda: {"crop": readers.CenterCrop(CROP)},
    "cover": lambda: {"crop": readers.CenterCrop(CROP, ratio=1.0)},
    "buckets": lambda: {"buckets": readers.AspectBuckets.around(CROP * CROP, 32, 2.0)},
    "one-bucket": lambda: {"buckets": readers.AspectBuckets([(CROP, CROP)])},
    "none": dict,
}


def wds_stream(
    roots: list[Path], workers: int, options: dict[str, Any]
) -> Callable[[int], Iterable]:
    """An epoch's batches of a plain ``WdsStream`` in a ``DataLoader``."""
    (root,) = roots
    stream = readers.WdsStream(root, shuffle_buffer=1000, seed=0, **options)
    loader = batch_loader(stream, workers)

    def epoch(k: int) -> Iterable:
        stream.set_epoch(k)
        return loader

    return epoch


def make_loader(
    roots: list[Path], workers: int, options: dict[str, Any]
) -> Callable[[int], Iterable]:
    """An epoch's batches of ``readers.make_loader`` (of a mixture, given several roots)."""
    loader = readers.make_loader(
        roots[0] if len(roots) == 1 else {root.name: root for root in roots},
        BATCH,
        num_workers=workers,
        decode_threads=1 if workers else None,
        persistent_workers=workers > 0,
        **options,
    )

    def epoch(k: int) -> Iterable:
        loader.set_epoch(k)
        return loader

    return epoch


READERS = {"wds-stream": wds_stream, "make-loader": make_loader}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path, nargs="+", help="imgpack dataset folders")
    parser.add_argument("--reader", choices=READERS, default="wds-stream")
    parser.add_argument("--crop", choices=CROPS, default="transform")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--passes", type=int, default=3, help="timed epochs")
    parser.add_argument("--fields", default="", help="comma-separated fields to read too")
    args = parser.parse_args()
    options = CROPS[args.crop]()
    if args.fields:
        options["fields"] = tuple(args.fields.split(","))
    epoch = READERS[args.reader](args.dataset, args.workers, options)
    for _ in epoch(0):  # workers started, page cache warm
        pass
    seen, start, cpu = 0, time.perf_counter(), time.process_time()
    for k in range(1, args.passes + 1):
        for batch in epoch(k):
            seen += len(batch[1])  # (images, labels, *fields)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    emit(rate=seen / wall, unit="samples/s", cpu_rate=seen / cpu)


if __name__ == "__main__":
    main()
