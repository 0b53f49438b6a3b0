"""The plain read path's targets (issue 29, section 3), measured side by side in one run.

A dataset stored at its training size (``imgpack convert FOLDER DST --format pt --resize
256 --center-crop 224``) read by ``make_loader`` without ``crop=`` ("plain") against the same
data through ``crop=CenterCrop(224)`` (a no-op crop through the kernel's crop path), each
in-process and with 2 workers, and the pure decode rate of the same JPEG bytes on one
thread and on two.
Every contender runs in its own child process (:mod:`scripts.bench.read_rate`,
:mod:`scripts.bench.decode_rate`), in interleaved rounds whose order reverses each round;
medians are quoted, with the load average before each round.

    .venv/bin/python -m scripts.bench.plain_read DATASET --rounds 6 [--json F]

Targets: plain >= 0.85 x twice the one-core decode rate, and within 5 % of the no-op crop;
the two-thread decode rate says what two cores give the decoder alone here.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from scripts.bench.ab import run_child
from scripts.bench.common import ROOT, machine_info, print_machine, write_json

WORKERS = (0, 2)


def contenders(dataset: str) -> dict[str, tuple[str, list[str]]]:
    """Name -> (child module, its arguments)."""
    named = {
        "decode, 1 core": ("decode_rate", [dataset]),
        "decode, 2 threads": ("decode_rate", [dataset, "--threads", "2"]),
    }
    for workers in WORKERS:
        for crop in ("none", "noop"):
            args = [dataset, "--reader", "make-loader", "--crop", crop, "--workers", str(workers)]
            named[f"{'plain' if crop == 'none' else 'no-op crop'} w={workers}"] = (
                "read_rate",
                args,
            )
    return named


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path, help="a JPEG dataset stored at 224x224")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args()
    info = machine_info()
    print_machine(info)
    named = contenders(str(args.dataset.resolve()))
    rates: dict[str, list[float]] = {name: [] for name in named}
    loads = []
    for round_ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        order = list(named) if round_ % 2 == 0 else list(named)[::-1]
        for name in order:
            child, child_args = named[name]
            rates[name].append(run_child(ROOT, child, child_args)["rate"])
        print(
            f"round {round_ + 1} (load {loads[-1]:.2f}):",
            {n: round(v[-1]) for n, v in rates.items()},
        )
    median = {name: statistics.median(values) for name, values in rates.items()}
    for name, values in rates.items():
        print(f"{name:16} {median[name]:8,.0f} /s   {' / '.join(f'{v:,.0f}' for v in values)}")
    decode = median["decode, 1 core"]
    ratios = {}
    for workers in WORKERS:
        plain = median[f"plain w={workers}"]
        ratios[f"plain / no-op crop, w={workers}"] = plain / median[f"no-op crop w={workers}"]
        ratios[f"plain / 2 x one-core decode, w={workers}"] = plain / (2 * decode)
        ratios[f"plain / 2-thread decode, w={workers}"] = plain / median["decode, 2 threads"]
    for name, ratio in ratios.items():
        print(f"{name:36} {ratio:.3f}")
    write_json(args.json, {"machine": info, "rates": rates, "loads": loads, "ratios": ratios})


if __name__ == "__main__":
    main()
