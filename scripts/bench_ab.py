"""A/B the conversion speed of this working tree against an earlier commit, side by side.

Checks REV out into a temporary git worktree, then alternates the two trees, one fresh
process per run, so that both see the same machine noise; prints each run and the medians.

    .venv/bin/python scripts/bench_ab.py --rev d097a57 --format pt --workers 2 --rounds 8
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run inside each tree: import that tree's convert package, convert, print images/s.
RUN = """
import shutil, sys, time
from convert import ConvertOptions, convert_folder
src, dst, fmt, workers, resize = sys.argv[1:6]
options = ConvertOptions(format=fmt, encoding="jpeg", resize=int(resize))
shutil.rmtree(dst, ignore_errors=True)
start = time.perf_counter()
result = convert_folder(src, dst, options, workers=int(workers), progress=False)
print(result.written / (time.perf_counter() - start))
"""


def images_per_second(tree: Path, args: argparse.Namespace, dst: Path) -> float:
    command = [sys.executable, "-c", RUN, str(args.folder), str(dst), args.format]
    command += [str(args.workers), str(args.resize)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", required=True, help="the commit to compare against")
    parser.add_argument("--folder", type=Path, default=ROOT / "bench-data" / "folder")
    parser.add_argument("--format", default="pt")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--resize", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="imgpack-ab-") as scratch:
        old = Path(scratch) / "old"
        subprocess.run(["git", "worktree", "add", "-q", str(old), args.rev], cwd=ROOT, check=True)
        try:
            rates: dict[str, list[float]] = {args.rev: [], "working tree": []}
            for round_ in range(args.rounds):
                for name, tree in ((args.rev, old), ("working tree", ROOT)):
                    rate = images_per_second(tree, args, Path(scratch) / "out")
                    rates[name].append(rate)
                    print(f"round {round_ + 1}: {name:>14} {rate:7.0f} images/s", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT)
            shutil.rmtree(old, ignore_errors=True)
    for name, values in rates.items():
        print(f"median {name:>14} {statistics.median(values):7.0f} images/s")


if __name__ == "__main__":
    main()
