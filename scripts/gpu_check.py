"""GPU feeding checks, on a CUDA machine, in one command (a few minutes):

1. ``readers.DevicePrefetcher`` gives bit for bit what the plain path gives (copy, then
   convert and normalise on the GPU), over a real imgpack dataset;
2. host-to-device copy of a uint8 batch: pageable vs pinned vs pinned + ``non_blocking``,
   and the same batch as float32 (the 4x bytes a host-side conversion would send);
3. overlap: 20 ms of queued GPU work a batch, fed by plain ``.cuda()`` copies or the
   prefetcher's side-stream copy, against the step alone; and that a loader's state taken
   inside the prefetcher resumes at the next batch;
4. CPU JPEG decode (imgpack's) vs GPU decode (``torchvision.io.decode_jpeg(device="cuda")``)
   where torchvision imports;
5. ``DevicePrefetcher(..., gpu_decode=True)`` over a ``decode=False`` loader against the
   CPU-decoded batches: labels equal, pixel difference stated (nvJPEG's IDCT and chroma
   upsampling are not libjpeg-turbo's, so a few levels apart is expected).

    python scripts/gpu_check.py [--dataset DIR] [--batch-size 256]

Without ``--dataset`` / ``--jpeg-dataset`` it converts ``sample_data/``'s images, 128 copies
of each, to raw 224 and JPEG in a temporary folder. Prints markdown tables for
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

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


@cache
def normalisation() -> tuple[torch.Tensor, torch.Tensor]:
    """MEAN and STD as ``[1, 3, 1, 1]`` tensors on the GPU, made once (a blocking copy)."""
    return tuple(torch.tensor(v, device="cuda").view(1, 3, 1, 1) for v in (MEAN, STD))


def plain_batches(
    loader: Iterable[tuple[torch.Tensor, torch.Tensor]], non_blocking: bool = False
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The usual loop: copy on the training stream, then convert and normalise."""
    mean, std = normalisation()
    for x, y in loader:
        x, y = x.cuda(non_blocking=non_blocking), y.cuda(non_blocking=non_blocking)
        yield (x.float().div(255) - mean) / std, y


def check_equal(root: Path, batch_size: int) -> str:
    loader = readers.make_loader(root, batch_size, seed=0, pin_memory=True)
    plain = list(plain_batches(loader))
    loader.set_epoch(0)
    fed = list(readers.DevicePrefetcher(loader, mean=MEAN, std=STD))
    same = all(
        torch.equal(a, b.contiguous()) and torch.equal(ya, yb)
        for (a, ya), (b, yb) in zip(fed, plain, strict=True)
    )
    return "bit for bit equal" if same and len(fed) == len(plain) else "DIFFERENT"


def check_gpu_decode(root: Path, batch_size: int) -> str:
    plain = readers.make_loader(root, batch_size, seed=0)
    encoded = readers.make_loader(root, batch_size, seed=0, decode=False)
    fed = list(readers.DevicePrefetcher(encoded, gpu_decode=True))
    diffs, labels_equal = [], True
    for (gpu, y_gpu), (cpu, y_cpu) in zip(fed, plain, strict=True):
        if isinstance(gpu, list) or gpu.shape != cpu.shape:
            return "DIFFERENT shapes"
        diffs.append((gpu.mul(255).round() - cpu.cuda().float()).abs().flatten())
        labels_equal &= torch.equal(y_gpu.cpu(), y_cpu)
    levels = torch.cat(diffs).sort().values  # quantile() refuses over 2**24 elements
    p99 = levels[int(0.99 * (levels.numel() - 1))]
    return (
        f"{levels.numel() // 3:,} pixels, labels {'equal' if labels_equal else 'DIFFERENT'}; "
        f"|GPU - CPU| in uint8 levels: mean {levels.mean():.3f}, "
        f"99th percentile {p99:.0f}, max {levels[-1]:.0f}"
    )


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
        rows.append([label, f"{ms:.2f}", f"{src.nbytes / ms / 1e6:.1f}"])  # bytes/ms/1e6: GB/s
    return rows


def gpu_step(step_ms: float) -> Callable[[torch.Tensor], None]:
    """A training step's stand-in: about ``step_ms`` of matrix products queued on the GPU
    after a read of the batch, the CPU free meanwhile (as a real step's launches leave it)."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    products = max(1, round(step_ms / cuda_ms(lambda: torch.mm(a, a, out=out))))

    def step(images: torch.Tensor) -> None:
        images.float().mean()
        for _ in range(products):
            torch.mm(a, a, out=out)

    return step


def timed_epochs(
    feed: Callable[[], Iterable[tuple[torch.Tensor, Any]]],
    step: Callable[[torch.Tensor], None],
    epochs: int = 3,
) -> tuple[float, float]:
    """Seconds per epoch of ``step`` over ``feed()``'s batches, and the median milliseconds
    from an epoch's start to its first batch (after one warm-up epoch)."""
    for x, _y in feed():  # warm-up: workers started, allocator primed
        step(x)
    torch.cuda.synchronize()
    first = []
    start = time.perf_counter()
    for _ in range(epochs):
        began = time.perf_counter()
        for k, (x, _y) in enumerate(feed()):
            if k == 0:
                first.append(time.perf_counter() - began)
            step(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / epochs, 1000 * statistics.median(first)


def overlap(
    root: Path, batch_size: int, step_ms: float = 20.0, rounds: int = 5
) -> list[list[object]]:
    """Seconds per epoch of a loop whose step is ``step_ms`` of queued GPU work, what each
    way of feeding adds per batch over the step alone, and the wait for an epoch's first
    batch: medians of ``rounds`` interleaved runs."""
    step = gpu_step(step_ms)
    loader = readers.make_loader(
        root, batch_size, pin_memory=True, num_workers=8, persistent_workers=True
    )
    staged = [x.cuda() for x, _ in loader]
    prefetcher = readers.DevicePrefetcher(loader, mean=MEAN, std=STD)
    feeds = {
        "step alone (batches already on the GPU)": lambda: ((x, None) for x in staged),
        "plain .cuda() per batch": lambda: plain_batches(loader),
        "plain .cuda(non_blocking=True)": lambda: plain_batches(loader, non_blocking=True),
        "DevicePrefetcher, made once": lambda: prefetcher,
        "DevicePrefetcher, made each epoch": lambda: readers.DevicePrefetcher(
            loader, mean=MEAN, std=STD
        ),
    }
    runs: dict[str, list[tuple[float, float]]] = {label: [] for label in feeds}
    for _ in range(rounds):  # interleaved, medians quoted: the host's noise hits all alike
        for label, feed in feeds.items():
            runs[label].append(timed_epochs(feed, step))
    timed = {
        label: (statistics.median(r[0] for r in got), statistics.median(r[1] for r in got))
        for label, got in runs.items()
    }
    alone = timed["step alone (batches already on the GPU)"][0]
    return [
        [label, f"{s:.3f}", f"{1000 * (s - alone) / len(staged):+.2f}", f"{first:.1f}"]
        for label, (s, first) in timed.items()
    ]


def check_resume(root: Path, batch_size: int) -> str:
    """A loader's state taken after two batches of the prefetcher resumes at the third."""
    whole = [y for _, y in readers.make_loader(root, batch_size, seed=5)]
    loader = readers.make_loader(root, batch_size, seed=5, pin_memory=True)
    fed = iter(readers.DevicePrefetcher(loader))
    trained = [next(fed)[1].cpu() for _ in range(2)]
    resumed = readers.make_loader(root, batch_size, seed=5)
    resumed.load_state_dict(loader.state_dict())
    labels = torch.cat(trained + [y for _, y in resumed])
    if torch.equal(labels, torch.cat(whole)):
        return "the rest of the epoch, exactly"
    return f"DIFFERENT: {len(labels)} labels against {sum(len(y) for y in whole)}"


def replicated_sample_data(into: Path, copies: int) -> Path:
    """``sample_data/``'s images ``copies`` times over (a few batches of 256 an epoch)."""
    for image in sorted((ROOT / "sample_data").glob("*/*.*")):
        folder = into / image.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(copies):
            shutil.copyfile(image, folder / f"{image.stem}-{k}{image.suffix}")
    return into


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
        if raw is None or jpeg is None:
            images = replicated_sample_data(Path(scratch) / "images", copies=128)
            for encoding in ("raw", "jpeg"):
                options = ConvertOptions(
                    format="pt", encoding=encoding, resize=256, center_crop=224
                )
                convert_folder(images, Path(scratch) / encoding, options, progress=False)
            raw, jpeg = raw or Path(scratch) / "raw", jpeg or Path(scratch) / "jpeg"
        batch = min(args.batch_size, len(readers.open_dataset(raw)))
        print(f"\nDevicePrefetcher vs plain path: {check_equal(raw, batch)}")
        print("\n" + table(["host -> device copy", "ms", "GB/s"], copy_times(args.batch_size)))
        head = [
            "20 ms GPU step per batch",
            "s per epoch",
            "ms per batch over the step alone",
            "ms to an epoch's first batch",
        ]
        print("\n" + table(head, overlap(raw, batch)))
        print(
            f"\nA state taken after 2 prefetched batches resumes with: {check_resume(raw, batch)}"
        )
        print("\n" + table(["JPEG decode", "ms per image"], decode_times(jpeg)))
        print(f"\nDevicePrefetcher(gpu_decode=True) vs CPU decode: {check_gpu_decode(jpeg, batch)}")


if __name__ == "__main__":
    main()
