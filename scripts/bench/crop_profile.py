"""Where one thread's time goes per sample of a crop: the Python path (what
``IMGPACK_KERNEL=0`` or a machine without the compiled kernel runs) against the kernel, on
the crop section's stored JPEGs (short side 256, q90: ``scripts.bench.read --section crops``
writes them), for ``CenterCrop(224, ratio=224/256)`` and ``RandomResizedCrop(224, flip=True)``.

The kernel's stages are told apart by what it is asked to decode (one call per sample; the
cost of a call that decodes nothing is taken off):

- header: the batch's marker walk (:func:`readers.images.kernel.jpeg_headers`);
- entropy decode to the box's last row: a 1x16 box on that row (IDCT of one iMCU row);
- IDCT, upsampling and colour of the box, and its store: the box copied out, less the above;
- resize and flip: the box resized to 224, less the copy;
- the rest of the file (entropy only): what a sample not ``verified`` by its CRC-32 adds;
- Python around the kernel: ``fused.start_crops`` on batches of 64, less the kernel's calls.

JPEGs with restart markers (the converter's default) decode only the intervals around the
box, so a thin box no longer measures the entropy decode of the box's: there the entropy
decode, IDCT, colour and store are one stage (the box copied out). Both are profiled when
``--unmarked`` (the same pixels written with ``--no-restart-markers``; the crop section
writes it) exists: the Python path and the split stages on it, the kernel on both.

The Python path's: the marker probe, libjpeg-turbo's full decode through ctypes, and the
crop, resize and flip on the decoded pixels (torch's antialiased bilinear), each timed on
its own, and ``fused.start_crops(...).finish()`` with the kernel off.

    .venv/bin/python -m scripts.bench.crop_profile [--dataset bench-data/work/read/pt-jpeg]
        [--unmarked bench-data/work/read/lmdb-jpeg-unmarked] [--repeats 5] [--json F]
        [--libjpeg-huffman]

``--libjpeg-huffman``: verified bytes decode their Huffman codes through libjpeg's decoder,
as before the kernel had its own (``readers/images/huffman.c``): ``IMGPACK_KERNEL_HUFFMAN=0``
set before the kernel is first imported, which reads it once.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import readers
from readers.images import fused, kernel
from readers.images.turbo import turbo_decoder
from scripts.bench.common import machine_info, markdown_table, print_machine, write_json
from scripts.bench.settings import BATCH, CROP, RESIZE, WORK

CROPS = {
    "centre": readers.CenterCrop(CROP, ratio=CROP / RESIZE),
    "random": readers.RandomResizedCrop(CROP, flip=True),
}
THIN = 16  # the width of the box that measures the entropy decode alone


def per_sample_us(run: Callable[[], Any], samples: int, repeats: int) -> float:
    """Median over ``repeats`` of ``run()``'s time per sample, in microseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) / samples * 1e6


def kernel_stages(
    values: list[bytes], boxes: np.ndarray, sizes: np.ndarray, repeats: int, marked: bool
):
    """µs per sample of each kernel stage (see the module's docstring); ``marked``: the
    values carry restart markers, so the entropy decode is not told apart."""
    k = kernel.crop_kernel()
    n = len(values)
    one = [np.zeros(1, dtype=np.int64)] * n
    status = np.zeros(1, dtype=np.int32)
    thin = boxes.copy()
    thin[:, 0] = np.maximum(boxes[:, 0] + boxes[:, 2] - 1, 0)
    thin[:, 2:] = (1, THIN, 0)
    thin[:, 1] = np.minimum(np.maximum(boxes[:, 1], 0), sizes[:, 1] - THIN)
    by_shape: dict[tuple[int, int], np.ndarray] = {}  # one reused output per box shape
    copies = [
        by_shape.setdefault((int(b[2]), int(b[3])), np.empty((1, b[2], b[3], 3), np.uint8))
        for b in boxes
    ]
    thin_out = np.empty((1, 1, THIN, 3), dtype=np.uint8)
    resized = np.empty((1, CROP, CROP, 3), dtype=np.uint8)

    def each(
        which: np.ndarray, out: Callable[[int], np.ndarray], verified: bool
    ) -> Callable[[], None]:
        def run() -> None:
            for i in range(n):
                o = out(i)
                k.crop(
                    [values[i]], one[i], which[i : i + 1], sizes[i : i + 1], o, status,
                    o.shape[1], o.shape[2], None, verified,
                )  # fmt: skip

        return run

    nothing = boxes.copy()
    nothing[:, 2] = 0  # a box of no rows: the call alone, refused before any decoding
    copy = per_sample_us(each(boxes, copies.__getitem__, True), n, repeats)
    resize = per_sample_us(each(boxes, lambda i: resized, True), n, repeats)
    whole = per_sample_us(each(boxes, lambda i: resized, False), n, repeats)
    stages = {"header": per_sample_us(lambda: kernel.jpeg_headers(k, values), n, repeats)}
    if marked:
        stages["entropy decode, IDCT, colour and store of the intervals around the box"] = copy
    else:  # the thin box, less a call that decodes nothing, tells the entropy decode apart
        calls = per_sample_us(each(nothing, lambda i: thin_out, True), n, repeats)
        entropy = per_sample_us(each(thin, lambda i: thin_out, True), n, repeats) - calls
        stages["entropy decode to the box's last row"] = entropy
        stages["IDCT, upsampling, colour and store of the box"] = copy - entropy
    stages["resize and flip"] = resize - copy
    stages["rest of the file (samples without a CRC-32)"] = whole - resize
    return stages


def python_stages(values: list[bytes], boxes: np.ndarray, sizes: np.ndarray, repeats: int):
    """µs per sample of each stage of the Python path."""
    turbo = turbo_decoder()
    n = len(values)
    arrays = [np.frombuffer(v, dtype=np.uint8) for v in values]
    out = np.empty((CROP, CROP, 3), dtype=np.uint8)
    decoded = [
        turbo.decode(a, int(w), int(h), 1).copy() for a, (h, w) in zip(arrays, sizes, strict=True)
    ]

    def decode_all() -> None:
        for a, (h, w) in zip(arrays, sizes, strict=True):
            turbo.decode(a, int(w), int(h), 1)

    def place_all() -> None:
        for pixels, box in zip(decoded, boxes, strict=True):
            fused.place(pixels, box, out)

    return {
        "marker probe": per_sample_us(lambda: [fused.probe(v, turbo) for v in values], n, repeats),
        "full decode (tjDecompress2, ctypes)": per_sample_us(decode_all, n, repeats),
        "crop, resize and flip (torch)": per_sample_us(place_all, n, repeats),
    }


def crop_parts_us(values: list[bytes], crop: readers.Crop, repeats: int) -> float:
    """µs per sample of ``fused.start_crops`` on batches of ``BATCH``, on this thread."""
    rows = np.empty((BATCH, CROP, CROP, 3), dtype=np.uint8)
    starts = range(0, len(values) - BATCH + 1, BATCH)

    def run() -> None:
        for s in starts:
            batch = values[s : s + BATCH]
            fused.start_crops(batch, np.arange(s, s + BATCH), crop, rows, str, True).finish()

    return per_sample_us(run, len(starts) * BATCH, repeats)


def kernel_switched(on: bool) -> None:
    """Turn the kernel on or off for this process (``IMGPACK_KERNEL``, read once)."""
    if on:
        os.environ.pop(kernel.KERNEL_ENV, None)
    else:
        os.environ[kernel.KERNEL_ENV] = "0"
    kernel.crop_kernel.cache_clear()


def stored(dataset: Path) -> tuple[list[bytes], np.ndarray, bool]:
    """The stored JPEGs of ``dataset``, their ``[n, 2]`` sizes, and whether they carry
    restart markers (a DRI segment)."""
    ds = readers.open_dataset(dataset)
    values = [bytes(v) for v in ds.read_stored(range(len(ds)))]
    headers = kernel.jpeg_headers(kernel.crop_kernel(), values)
    sizes = np.ascontiguousarray(headers[:, [kernel.HEIGHT, kernel.WIDTH]])
    return values, sizes, all(b"\xff\xdd" in v[: v.find(b"\xff\xda")] for v in values)


def profile(datasets: list[Path], repeats: int) -> dict[str, dict[str, dict[str, float]]]:
    """The stages of each crop: the Python path on the first dataset, the kernel on each."""
    results: dict[str, dict[str, dict[str, float]]] = {name: {} for name in CROPS}
    for k, dataset in enumerate(datasets):
        values, sizes, marked = stored(dataset)
        for name, crop in CROPS.items():
            boxes = crop.boxes(sizes, np.arange(len(values)))
            after = kernel_stages(values, boxes, sizes, repeats, marked)
            after["Python around the kernel (crop_parts)"] = crop_parts_us(
                values, crop, repeats
            ) - sum(v for key, v in after.items() if not key.startswith("rest"))
            results[name]["kernel, restart markers" if marked else "kernel"] = after
            if k == 0:
                kernel_switched(False)
                before = python_stages(values, boxes, sizes, repeats)
                before["Python around them (crop_parts)"] = crop_parts_us(
                    values, crop, repeats
                ) - sum(before.values())
                kernel_switched(True)
                results[name]["python path"] = before
    return results


def report(results: dict[str, dict[str, dict[str, float]]]) -> str:
    rows = []
    for name, paths in results.items():
        for path, stages in paths.items():
            for stage, us in stages.items():
                rows.append([name, path, stage, f"{us:.1f}"])
            counted = {k: v for k, v in stages.items() if not k.startswith("rest")}
            rows.append([name, path, "**total per sample**", f"**{sum(counted.values()):.1f}**"])
    return markdown_table(["crop", "path", "stage", "µs per sample, one thread"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", type=Path, default=WORK / "read" / "pt-jpeg")
    p.add_argument("--unmarked", type=Path, default=WORK / "read" / "lmdb-jpeg-unmarked")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--libjpeg-huffman",
        action="store_true",
        help="verified bytes decode through libjpeg's Huffman decoder, not the kernel's own",
    )
    args = p.parse_args()
    if args.libjpeg_huffman:  # before the first crop_kernel(): the module reads it at import
        os.environ["IMGPACK_KERNEL_HUFFMAN"] = "0"
    if kernel.crop_kernel() is None or turbo_decoder() is None:
        raise SystemExit("the profile needs the compiled kernel and libjpeg-turbo")
    if args.libjpeg_huffman and kernel.crop_kernel().HUFFMAN:
        raise SystemExit("the kernel was imported before IMGPACK_KERNEL_HUFFMAN=0 was set")
    torch.set_num_threads(1)  # one thread, as on a decode thread (the resize's too)
    info = machine_info()
    print_machine(info)
    datasets = [args.unmarked] if args.unmarked.exists() else []
    results = profile([*datasets, args.dataset], args.repeats)
    print(report(results))
    write_json(args.json, {"machine": info, "profile_us": results})


if __name__ == "__main__":
    main()
