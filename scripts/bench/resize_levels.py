"""The kernel's resize at each instruction level, one thread, in one process: the
converter's decode and resize (``kernel.decode_whole`` to short side ``--resize``) of the
source photos with each call's ``simd`` at 2 (AVX2, grouped taps), 1 (AVX2, a pixel at a
time) and 0 (plain C) where the CPU has them, interleaved round by round, and the decode alone, so
that the resize's own time is the difference. All levels give the same pixels (the tests
check); only their time differs.

    .venv/bin/python -m scripts.bench.resize_levels [--folder bench-data/folder]
        [--images 500] [--rounds 7] [--json F]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from convert.process import shorter_size
from readers.images import kernel
from scripts.bench.common import write_json
from scripts.bench.settings import FOLDER, RESIZE


def per_image_us(run: Callable[[bytes], object], data: list[bytes]) -> float:
    """CPU µs an image of ``run`` over ``data``."""
    start = time.process_time()
    for value in data:
        run(value)
    return (time.process_time() - start) / len(data) * 1e6


def arguments(doc: str, images: int) -> argparse.Namespace:
    """The resize benchmarks' command line: photos, rounds, target and JSON output."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=FOLDER)
    parser.add_argument("--images", type=int, default=images)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--resize", type=int, default=RESIZE)
    parser.add_argument("--json", type=Path)
    return parser.parse_args()


def main() -> None:
    args = arguments(__doc__, images=500)
    module = kernel.crop_kernel()
    if module is None:
        raise SystemExit("resize_levels needs the compiled kernel (make setup builds it)")
    files = sorted(p for p in args.folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    data = [f.read_bytes() for f in files[: args.images]]

    def resized(value: bytes, level: int) -> object:
        return kernel.decode_whole(
            module, value, None, lambda h, w: shorter_size(h, w, args.resize), simd=level
        )

    def decoded(value: bytes) -> object:
        return kernel.decode_whole(module, value, None)

    levels = list(range(module.SIMD, -1, -1))
    times: dict[str, list[float]] = {f"level {k}": [] for k in levels} | {"decode only": []}
    for _ in range(args.rounds):
        for level in levels:  # the level is each call's own (kernel.decode_whole's simd)
            times[f"level {level}"].append(
                per_image_us(lambda value, level=level: resized(value, level), data)
            )
        times["decode only"].append(per_image_us(decoded, data))
    medians = {name: statistics.median(values) for name, values in times.items()}
    decode = medians["decode only"]
    print(f"{len(data)} photos to short side {args.resize}, {args.rounds} interleaved rounds")
    print("| | decode + resize µs | resize µs | x level 1 |")
    print("|---|---|---|---|")
    for level in levels:
        total = medians[f"level {level}"]
        ratio = total / medians["level 1"] if "level 1" in medians else float("nan")
        print(f"| level {level} | {total:.0f} | {total - decode:.0f} | {ratio:.3f} |")
    print(f"| decode only | {decode:.0f} | | |")
    write_json(args.json, {"images": len(data), "resize": args.resize, "us": times})


if __name__ == "__main__":
    main()
