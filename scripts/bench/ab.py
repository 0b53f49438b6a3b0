"""A/B: a benchmark child run on this working tree and on an earlier commit, side by side.

A child is a module of this package, run as ``python -m scripts.bench.<child> ARGS`` in a
fresh process, whose last line of output is one JSON object (:mod:`scripts.bench.child`); a
rate child's has ``rate`` and ``unit``. :func:`worktree` checks REV out into a temporary git
worktree and copies this tree's ``scripts/bench/`` into it, so that both sides run the same
measuring code over their own ``readers`` and ``convert`` (and their own compiled crop kernel,
built there when this tree has one built): the child runs with the tree as its
working directory, which ``python -m`` puts first on ``sys.path``. :func:`run_child` checks
that the child did import that tree's ``readers``.

The rounds alternate which side runs first, so that a machine slowing down or speeding up
during the run hits both alike; medians are quoted. An argument naming an existing file or
folder is passed to the children as an absolute path (they run elsewhere).

    .venv/bin/python -m scripts.bench.ab --rev d097a57 --rounds 8 \\
        convert_rate --folder bench-data/folder --format pt --workers 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scripts.bench.child import CODE
from scripts.bench.common import write_json
from scripts.bench.settings import ROOT

HARNESS = Path(__file__).resolve().parent  # this tree's scripts/bench/
WORKING_TREE = "working tree"


class ChildFailed(RuntimeError):
    """A child process exited with an error, or ran another tree's code."""


def _build_kernel(tree: Path, temp: Path) -> None:
    """``tree``'s crop kernel built in place, as ``make`` builds this tree's."""
    build = [sys.executable, "setup.py", "-q", "build_ext", "--inplace", f"--build-temp={temp}"]
    done = subprocess.run(build, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0 or not any((tree / "readers" / "images").glob("jpegcrop*.so")):
        raise ChildFailed(f"{tree}: the crop kernel did not build: {done.stderr[-2000:]}")


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """``rev`` checked out (detached) in a temporary git worktree of this repository, with
    this tree's ``scripts/bench/`` in place of its own; removed on exit."""
    with tempfile.TemporaryDirectory(prefix="imgpack-ab-") as scratch:
        tree = Path(scratch) / "tree"
        add = ["git", "worktree", "add", "-q", "--detach", str(tree), rev]
        subprocess.run(add, cwd=ROOT, check=True)
        try:
            harness = tree / "scripts" / "bench"
            shutil.rmtree(harness, ignore_errors=True)
            shutil.copytree(HARNESS, harness, ignore=shutil.ignore_patterns("__pycache__"))
            if any((ROOT / "readers" / "images").glob("jpegcrop*.so")):
                _build_kernel(tree, Path(scratch) / "build")
            yield tree
        finally:
            remove = ["git", "worktree", "remove", "--force", str(tree)]
            subprocess.run(remove, cwd=ROOT, check=False)


def run_child(tree: Path, child: str, args: Sequence[str]) -> dict[str, Any]:
    """Run ``python -m scripts.bench.<child> args`` with ``tree`` as its working directory
    and return its result line (less the checkout it names); :class:`ChildFailed` if it
    fails or imported another tree's ``readers``."""
    command = [sys.executable, "-m", f"{__package__}.{child}", *args]
    done = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ChildFailed(
            f"{' '.join(command)} (in {tree}) exited with {done.returncode}:\n"
            + "\n".join(done.stderr.splitlines()[-20:])
        )
    result = json.loads(done.stdout.splitlines()[-1])
    code = Path(result.pop(CODE))
    if code != tree.resolve():
        raise ChildFailed(f"{child} in {tree} imported readers from {code}")
    return result


def side_by_side(
    rev: str, child: str, args: Sequence[str], rounds: int
) -> dict[str, list[dict[str, Any]]]:
    """``rounds`` results of ``child`` on ``rev`` and on this working tree, alternating
    (each round starts with the side the previous one ended with), printed as they come."""
    results: dict[str, list[dict[str, Any]]] = {rev: [], WORKING_TREE: []}
    with worktree(rev) as old:
        sides = [(rev, old), (WORKING_TREE, ROOT)]
        for round_ in range(rounds):
            for name, tree in sides if round_ % 2 == 0 else sides[::-1]:
                result = run_child(tree, child, args)
                results[name].append(result)
                print(f"  round {round_ + 1}: {child} {name:>14} {rate_text(result)}", flush=True)
    return results


def rate_text(result: dict[str, Any]) -> str:
    """A result line's rate with its unit: ``"   1,234 images/s"``."""
    return f"{result['rate']:8,.0f} {result.get('unit', '/s')}"


def absolute_paths(args: Sequence[str]) -> list[str]:
    """``args`` with each one that names an existing file or folder made absolute."""
    return [str(Path(a).resolve()) if Path(a).exists() else a for a in args]


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench.ab",
        description=__doc__.split("\n\n")[0],
        epilog="children: convert_rate (a conversion's images/s), read_rate (a reader's "
        "samples/s); `python -m scripts.bench.CHILD --help` lists their arguments",
    )
    parser.add_argument("--rev", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=8, help="runs of each side")
    parser.add_argument("--json", type=Path, help="also write every result to this JSON file")
    parser.add_argument("child", help="the module of scripts.bench to run, e.g. convert_rate")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the child's arguments")
    args = parser.parse_args()
    try:
        results = side_by_side(args.rev, args.child, absolute_paths(args.args), args.rounds)
    except (ChildFailed, subprocess.CalledProcessError) as e:
        sys.exit(f"ab: {e}")
    medians = {name: statistics.median(r["rate"] for r in runs) for name, runs in results.items()}
    for name, runs in results.items():
        print(f"median {name:>14} {rate_text({**runs[0], 'rate': medians[name]})}")
    print(f"working tree / {args.rev}: {medians[WORKING_TREE] / medians[args.rev]:.3f}")
    write_json(args.json, {"rev": args.rev, "child": args.child, "args": args.args, **results})


if __name__ == "__main__":
    main()
