"""GPU feeding checks, on a CUDA machine, in one command (a few minutes):

1. ``readers.DevicePrefetcher`` gives bit for bit what the plain path gives (copy, then
   convert and normalise on the GPU), over a real imgpack dataset;
2. host-to-device copy of a uint8 batch: pageable vs pinned vs pinned + ``non_blocking``,
   and the same batch as float32 (the 4x bytes a host-side conversion would send);
3. overlap: a dummy compute step with and without the prefetcher's side-stream copy;
4. CPU JPEG decode (imgpack's) vs GPU decode (``torchvision.io.decode_jpeg(device="cuda")``)
   where torchvision imports.

    python scripts/gpu_check.py [--dataset DIR] [--batch-size 256]

Without ``--dataset`` it converts ``sample_data/`` (raw 224 and JPEG) into a temporary
folder. Prints a markdown table for docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import readers
from convert import ConvertOptions, convert_folder

ROOT = Path(__file__).resolve().parent.parent
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def cuda_ms(fn: Callable[[], object], repeats: int = 20) -> float:
    """Median milliseconds of ``fn`` measured with CUDA events (after one warm-up)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def check_equal(root: Path, batch_size: int) -> str:
    loader = readers.make_loader(root, batch_size, seed=0, pin_memory=True)
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1)
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1)
    plain = [((x.cuda().float().div(255) - mean) / std, y.cuda()) for x, y in loader]
    loader.set_epoch(0)
    fed = list(readers.DevicePrefetcher(loader, mean=MEAN, std=STD))
    same = all(
        torch.equal(a, b.contiguous()) and torch.equal(ya, yb)
        for (a, ya), (b, yb) in zip(fed, plain, strict=True)
    )
    return "bit for bit equal" if same and len(fed) == len(plain) else "DIFFERENT"


def copy_times(batch_size: int) -> list[list[object]]:
    shape = (batch_size, 3, 224, 224)
    pageable = torch.randint(0, 255, shape, dtype=torch.uint8)
    pinned = pageable.pin_memory()
    as_float = pageable.float().pin_memory()
    rows = []
    for label, src, blocking in (
        ("uint8 pageable", pageable, True),
        ("uint8 pinned", pinned, True),
        ("uint8 pinned, non_blocking", pinned, False),
        ("float32 pinned, non_blocking", as_float, False),
    ):
        ms = cuda_ms(lambda src=src, blocking=blocking: src.to("cuda", non_blocking=not blocking))
        rows.append([label, f"{ms:.2f}", f"{src.nbytes / ms / 1e6:.1f}"])
    return rows


def overlap(root: Path, batch_size: int, step_ms: float = 20.0) -> list[list[object]]:
    """Seconds per epoch of a loop whose step is ``step_ms`` of GPU work."""
    work = torch.randn(4096, 4096, device="cuda")

    def step() -> None:
        end = time.perf_counter() + step_ms / 1000
        while time.perf_counter() < end:
            work.mul_(1.0)

    rows = []
    for label, wrap in (
        ("plain .cuda() per batch", lambda loader: ((x.cuda(), y.cuda()) for x, y in loader)),
        ("DevicePrefetcher", lambda loader: readers.DevicePrefetcher(loader, mean=MEAN, std=STD)),
    ):
        loader = readers.make_loader(
            root, batch_size, pin_memory=True, num_workers=2, persistent_workers=True
        )
        start = time.perf_counter()
        for _ in range(3):
            for _x, _y in wrap(loader):
                step()
        torch.cuda.synchronize()
        rows.append([label, f"{(time.perf_counter() - start) / 3:.3f}"])
    return rows


def decode_times(root: Path) -> list[list[object]]:
    ds = readers.open_dataset(root)
    data = [bytes(ds.stored(i)) for i in range(len(ds))]
    start = time.perf_counter()
    for d in data:
        readers.decode_image(d)
    rows = [["CPU (imgpack, 1 thread)", f"{1000 * (time.perf_counter() - start) / len(data):.3f}"]]
    try:
        from torchvision.io import decode_jpeg
    except Exception as e:  # torchvision absent or built for another torch
        rows.append(["GPU (torchvision decode_jpeg)", f"not measured: {type(e).__name__}"])
        return rows
    tensors = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in data]
    ms = cuda_ms(lambda: decode_jpeg(tensors, device="cuda"), repeats=10)
    rows.append(["GPU (torchvision decode_jpeg, batched)", f"{ms / len(data):.3f}"])
    return rows


def table(head: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, help="an imgpack raw dataset of fixed shape")
    parser.add_argument("--jpeg-dataset", type=Path, help="an imgpack jpeg dataset")
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_check needs CUDA: run it on a machine with an NVIDIA GPU")
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as scratch:
        raw, jpeg = args.dataset, args.jpeg_dataset
        for name, encoding in (("raw", "raw"), ("jpeg", "jpeg")):
            if (raw if name == "raw" else jpeg) is None:
                dst = Path(scratch) / name
                options = ConvertOptions(
                    format="pt", encoding=encoding, resize=256, center_crop=224
                )
                convert_folder(ROOT / "sample_data", dst, options, progress=False)
                raw, jpeg = (dst, jpeg) if name == "raw" else (raw, dst)
        batch = min(args.batch_size, len(readers.open_dataset(raw)))
        print(f"\nDevicePrefetcher vs plain path: {check_equal(raw, batch)}")
        print("\n" + table(["host -> device copy", "ms", "MB/s"], copy_times(args.batch_size)))
        print("\n" + table(["20 ms GPU step per batch", "s per epoch"], overlap(raw, batch)))
        print("\n" + table(["JPEG decode", "ms per image"], decode_times(jpeg)))


if __name__ == "__main__":
    main()
