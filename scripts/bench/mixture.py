"""Mixtures and aspect buckets (issue 31), measured side by side in one run: what reading
several sources by weight, and batches of one bucket each, cost.

rate:    ``make_loader`` samples/s (``crop=RandomResizedCrop(224, flip=True)``, batches of
         64, no workers, decode threads on every usable core) over the benchmark folder
         converted to one ``pt`` jpeg dataset at 256, against the same images converted the
         same way as three datasets (classes 0-3, 4-6 and 7-9: 600, 450 and 450 images) read
         as a mixture with shares by length: the same pixels, the same crops' work. Each
         contender a child process (:mod:`scripts.bench.read_rate`), in interleaved rounds
         whose order reverses each round; medians quoted. Target: >= 0.95x.
buckets: the one dataset read in batches of one aspect bucket each
         (``AspectBuckets.around(224 * 224, 32, 2.0)``) against the fixed-size crop doing the
         same work (``CenterCrop(224, ratio=1.0)``: cover, then centre crop), interleaved in the
         same rounds. Target: >= 0.9x. Beside them, one 224x224 bucket: the cover crop's
         pixels through the bucketed loader, what the bucketing itself costs; and the pixels
         each decodes a sample (its boxes' mean area: a bucket keeps more of an image than a
         square does), so that rates can be compared per decoded pixel too.
resume:  a mixture of three sources totalling 1 B samples (600 M, 300 M, 100 M; weights
         0.5, 0.3, 0.2; simulated: lengths only, no data), its state saved on 8 ranks after 40
         steps of 256 and loaded on 12: the time from ``load_state_dict`` to the first batch
         of indices and the peak extra RSS over it, in a fresh process, three runs. Target:
         under 100 ms and 50 MB.

    .venv/bin/python -m scripts.bench.mixture --folder bench-data/folder --rounds 5 [--json F]
        [--passes 8]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

import readers
from convert import ConvertOptions, convert_folder
from readers.bucket_dataset import BucketCrop
from scripts.bench.ab import run_child
from scripts.bench.common import machine_info, print_machine, write_json
from scripts.bench.epochs import BATCH, measure_resume
from scripts.bench.read_rate import CROPS
from scripts.bench.settings import FOLDER, QUALITY, RESIZE, ROOT, WORK

PARTS = {"part-a": range(0, 4), "part-b": range(4, 7), "part-c": range(7, 10)}
SIMULATED = {"a": 600_000_000, "b": 300_000_000, "c": 100_000_000}
WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}


class Simulated:
    """A source of ``n`` samples and nothing else: what a mixture's order and state see."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def set_epoch(self, epoch: int) -> None:
        """No crops to draw."""


def simulated_sampler(rank: int, world_size: int) -> Any:
    from readers.epochs.mixture import Mixture, MixtureSource, make_schedule
    from readers.mixture_dataset import MixtureDataset, MixtureSampler

    sources = tuple(MixtureSource(name, n, f"sha-{name}") for name, n in SIMULATED.items())
    total = sum(SIMULATED.values())
    mixture = Mixture(sources, make_schedule(WEIGHTS, sources), total, seed=3)
    dataset = MixtureDataset({name: Simulated(n) for name, n in SIMULATED.items()})
    return MixtureSampler(dataset, mixture, batch_size=BATCH, rank=rank, world_size=world_size)


def child_resume() -> None:
    """:func:`scripts.bench.epochs.measure_resume` of the simulated 1 B-sample mixture."""
    from scripts.bench.child import emit

    emit(**measure_resume(simulated_sampler))


def convert(src: Path, dst: Path) -> Path:
    options = ConvertOptions("pt", encoding="jpeg", resize=RESIZE, quality=QUALITY)
    convert_folder(src, dst, options, workers=2, overwrite=True, progress=False)
    return dst


def datasets(folder: Path, work: Path) -> tuple[Path, list[Path]]:
    """The folder as one dataset and as the three of ``PARTS`` (converted alike)."""
    classes = sorted(p for p in folder.iterdir() if p.is_dir())
    one = convert(folder, work / "one")
    parts = []
    for name, picked in PARTS.items():
        src = work / f"src-{name}"
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        for k in picked:
            (src / classes[k].name).symlink_to(classes[k].resolve())
        parts.append(convert(src, work / name))
    return one, parts


def decoded_pixels(dataset: Path) -> dict[str, float]:
    """The mean box a sample (full-size pixels decoded) of the cover crop and the buckets."""
    sizes = readers.open_dataset(dataset).sizes
    indices = np.arange(len(sizes))
    cover = CROPS["cover"]()["crop"].boxes(sizes, indices)
    buckets = CROPS["buckets"]()["buckets"]
    assignment = buckets.assign(sizes)
    bucketed = np.zeros_like(cover)
    for k in range(len(buckets.sizes)):
        rows = assignment == k
        bucketed[rows] = BucketCrop(buckets, bucket=k).boxes(sizes[rows], indices[rows])
    return {
        "fixed cover crop": float(np.mean(cover[:, 2] * cover[:, 3])),
        "buckets": float(np.mean(bucketed[:, 2] * bucketed[:, 3])),
    }


def main() -> None:
    if sys.argv[1:2] == ["child-resume"]:
        return child_resume()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=FOLDER)
    parser.add_argument("--work", type=Path, default=WORK / "mixture")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--passes", type=int, default=8, help="timed epochs per child (an epoch: ~0.3 s)"
    )
    args = parser.parse_args()
    info = machine_info()
    print_machine(info)
    one, parts = datasets(args.folder, args.work)
    passes = ["--passes", str(args.passes)]
    read = ["--reader", "make-loader", *passes, "--crop", "random"]
    plain = ["--reader", "make-loader", *passes, "--crop"]
    contenders = {
        "one source": [str(one), *read],
        "mixture of 3": [*map(str, parts), *read],
        "fixed cover crop": [str(one), *plain, "cover"],
        "buckets": [str(one), *plain, "buckets"],
        "one bucket": [str(one), *plain, "one-bucket"],  # the cover crop's pixels, bucketed
    }
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    cpu_rates: dict[str, list[float]] = {name: [] for name in contenders}  # per CPU-second
    for k in range(args.rounds):
        for name in list(contenders)[:: 1 if k % 2 == 0 else -1]:
            result = run_child(ROOT, "read_rate", contenders[name])
            rates[name].append(result["rate"])
            cpu_rates[name].append(result["cpu_rate"])
            print(f"  round {k}: {name} {rates[name][-1]:.0f}/s", flush=True)
    ratios = [m / o for m, o in zip(rates["mixture of 3"], rates["one source"], strict=True)]
    bucketed = [b / f for b, f in zip(rates["buckets"], rates["fixed cover crop"], strict=True)]
    machinery = [b / f for b, f in zip(rates["one bucket"], rates["fixed cover crop"], strict=True)]
    bucketed_cpu = [
        b / f for b, f in zip(cpu_rates["buckets"], cpu_rates["fixed cover crop"], strict=True)
    ]
    pixels = decoded_pixels(one)
    per_pixel = statistics.median(bucketed) * pixels["buckets"] / pixels["fixed cover crop"]
    resumes = [run_child(ROOT, "mixture", ["child-resume"]) for _ in range(3)]
    results = {
        "machine": info,
        "rates": rates,
        "median_ratio": statistics.median(ratios),
        "ratios": ratios,
        "buckets_median_ratio": statistics.median(bucketed),
        "buckets_ratios": bucketed,
        "cpu_rates": cpu_rates,
        "buckets_cpu_median_ratio": statistics.median(bucketed_cpu),
        "one_bucket_median_ratio": statistics.median(machinery),
        "decoded_pixels": pixels,
        "buckets_per_pixel_median_ratio": per_pixel,
        "resume_1b": resumes,
    }
    print(f"mixture / one source: median {results['median_ratio']:.3f} ({ratios})")
    print(f"buckets / fixed cover crop: median {statistics.median(bucketed):.3f} ({bucketed})")
    print(f"  per CPU-second: median {statistics.median(bucketed_cpu):.3f}")
    print(f"  per decoded pixel: {per_pixel:.3f} (a sample: {pixels})")
    print(f"one 224x224 bucket / fixed cover crop: median {statistics.median(machinery):.3f}")
    for r in resumes:
        print(f"resume 1 B: {r['seconds'] * 1000:.1f} ms, {r['extra_mib']:.1f} MiB extra")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
