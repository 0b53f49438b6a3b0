"""The converter's resize of pixels the kernel does not decode (PNGs, EXIF-rotated JPEGs,
datasets' raw pixels): the kernel's port (``kernel.resize``) against torch's
``F.interpolate(antialias=True)`` on one thread, which it replaced, on the source photos
decoded once and resized to short side ``--resize``, interleaved round by round (CPU time,
medians). Both give the same pixels (the tests check); only their time differs.

    .venv/bin/python -m scripts.bench.pixel_resize [--folder bench-data/folder]
        [--images 200] [--rounds 7] [--resize 256] [--json F]
"""

from __future__ import annotations

import statistics

import numpy as np
import torch
import torch.nn.functional as F

from convert.process import shorter_size
from readers.images import kernel
from readers.images.decode import decode_image
from scripts.bench.common import write_json
from scripts.bench.resize_levels import arguments, per_image_us


def torch_resize(pixels: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """What ``convert.codec.geometry.resize_shorter`` runs without the kernel."""
    batch = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)
    resized = F.interpolate(batch, size=size, mode="bilinear", antialias=True)
    return resized[0].permute(1, 2, 0).contiguous().numpy()


def main() -> None:
    args = arguments(__doc__, images=200)
    module = kernel.crop_kernel()
    if module is None:
        raise SystemExit("pixel_resize needs the compiled kernel (make setup builds it)")
    torch.set_num_threads(1)  # as in a conversion worker
    files = sorted(p for p in args.folder.rglob("*") if p.suffix.lower() in (".jpg", ".png"))
    images = [decode_image(f.read_bytes()) for f in files[: args.images]]
    jobs = [(pixels, shorter_size(*pixels.shape[:2], args.resize)) for pixels in images]
    for pixels, size in jobs[:20]:  # the same pixels, or the comparison means nothing
        assert np.array_equal(kernel.resize(module, pixels, size), torch_resize(pixels, size))
    contenders = {
        "kernel": lambda job: kernel.resize(module, *job),
        "torch": lambda job: torch_resize(*job),
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, run in contenders.items():
            times[name].append(per_image_us(run, jobs))
    medians = {name: statistics.median(values) for name, values in times.items()}
    shapes = statistics.median(p.shape[0] * p.shape[1] for p in images) / 1e6
    print(f"{len(jobs)} photos (median {shapes:.2f} MP) to short side {args.resize}, one thread,")
    print(f"{args.rounds} interleaved rounds, median CPU µs an image")
    print("| | µs | x torch |")
    print("|---|---|---|")
    for name, value in medians.items():
        print(f"| {name} | {value:.0f} | {value / medians['torch']:.2f} |")
    write_json(args.json, {"images": len(jobs), "resize": args.resize, "us": times})


if __name__ == "__main__":
    main()
