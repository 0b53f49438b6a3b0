"""How a measurement is taken: a timed run (``Measurement``), whole epochs after a warm-up,
the page cache made warm first, and interleaved rounds that wait for a quiet machine and
retake a run during which other processes kept cores busy; medians of the rounds."""

from __future__ import annotations

import math
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from scripts.bench.settings import CROP, MAX_FOREIGN_CORES, MIN_SECONDS, QUIET_WAIT_S, RETRIES


def warm_page_cache(paths: list[Path]) -> int:
    """Read every file once so later reads come from the page cache; return bytes read."""
    total = 0
    for path in paths:
        total += len(path.read_bytes())
    return total


@dataclass
class Measurement:
    """One timed run: a rate (items/s) and optional extra figures for the JSON."""

    rate: float
    extra: dict[str, float] = field(default_factory=dict)


Factory = Callable[[], Callable[[], Measurement]]


def timed(
    batches: Callable[[], Iterable[Any]], files: list[Path], min_seconds: float = MIN_SECONDS
) -> Callable[[], Measurement]:
    """Warm ``batches`` up (its first batch checked to be uint8 ``[B, 3, CROP, CROP]``, an
    untimed epoch, then one timed to size the passes) and return its measurement over whole
    epochs lasting at least ``min_seconds``. ``batches()`` is called once per epoch (a place
    to set the epoch); each measurement first rereads ``files`` (this VM evicts page-cache
    pages left untouched for a minute)."""

    def epochs(passes: int) -> Measurement:
        warm_page_cache(files)
        seen, start = 0, time.perf_counter()
        for _ in range(passes):
            for _images, labels in batches():
                seen += len(labels)
        seconds = time.perf_counter() - start
        return Measurement(seen / seconds, {"passes": passes, "seconds": seconds})

    images, _ = next(iter(batches()))
    if tuple(images.shape[1:]) != (3, CROP, CROP) or images.dtype != torch.uint8:
        raise RuntimeError(f"unexpected batch {images.dtype}{tuple(images.shape)}")
    epochs(1)
    passes = math.ceil(min_seconds / epochs(1).extra["seconds"])
    return lambda: epochs(passes)


def warm_up(factories: dict[str, Factory]) -> dict[str, Callable[[], Measurement]]:
    """Build (and so warm up) every contender, in order, before any is timed."""
    contenders = {}
    for name, factory in factories.items():
        print(f"  warming up {name}", flush=True)
        contenders[name] = factory()
    return contenders


def best(runs: dict[str, list[Measurement]], prefix: str | tuple[str, ...]) -> tuple[str, float]:
    """The contender (name, median rate) with the highest median among names with prefix."""
    name = max((k for k in runs if k.startswith(prefix)), key=lambda k: median_rate(runs[k]))
    return name, median_rate(runs[name])


_TICK = 1 / os.sysconf("SC_CLK_TCK")


def _system_busy_s() -> float:
    """CPU seconds all cores spent busy (steal included) since boot, from /proc/stat."""
    fields = Path("/proc/stat").read_text(encoding="ascii").split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) * _TICK


def _own_cpu_s() -> float:
    """CPU seconds of this process, its reaped children and its live descendants."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text(encoding="ascii", errors="replace").rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        pid = int(stat.parent.name)
        parents[pid], ticks[pid] = int(fields[1]), int(fields[11]) + int(fields[12])
    mine, frontier = set(), [os.getpid()]
    while frontier:
        pid = frontier.pop()
        mine.add(pid)
        frontier += [child for child, parent in parents.items() if parent == pid]
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return sum(ticks.get(pid, 0) for pid in mine) * _TICK + reaped.ru_utime + reaped.ru_stime


def foreign_load(measure: Callable[[], Measurement]) -> Measurement:
    """Run ``measure`` and record in its extra ``foreign_cores``: the average number of
    cores that processes other than this benchmark (and the hypervisor) kept busy meanwhile."""
    system, own, start = _system_busy_s(), _own_cpu_s(), time.perf_counter()
    m = measure()
    seconds = time.perf_counter() - start
    foreign = (_system_busy_s() - system) - (_own_cpu_s() - own)
    m.extra["foreign_cores"] = max(0.0, foreign / seconds)
    return m


def _idle_second() -> Measurement:
    time.sleep(1)
    return Measurement(0.0)


def wait_for_quiet(max_foreign: float, max_wait_s: float = QUIET_WAIT_S) -> float:
    """Sample other processes' load in 1 s windows until it is at most ``max_foreign`` cores
    or ``max_wait_s`` have passed; return the last sample."""
    deadline = time.perf_counter() + max_wait_s
    while True:
        load = foreign_load(_idle_second).extra["foreign_cores"]
        if load <= max_foreign or time.perf_counter() > deadline:
            return load
        print(f"  (other processes busy {load:.2f} cores: waiting)", flush=True)


def interleaved(
    contenders: dict[str, Callable[[], Measurement]],
    repeats: int,
    max_foreign: float = MAX_FOREIGN_CORES,
) -> dict[str, list[Measurement]]:
    """Run ``repeats`` rounds, each calling every contender once in order, so that slow
    phases of a noisy machine hit all of them alike; return each one's measurements.

    Each measurement starts once other processes keep at most ``max_foreign`` cores busy
    (waiting up to ``QUIET_WAIT_S``), and one during which they kept more busy is taken
    again, up to ``RETRIES`` times; the quietest is kept."""
    runs: dict[str, list[Measurement]] = {name: [] for name in contenders}
    for round_ in range(repeats):
        for name, measure in contenders.items():
            tries: list[Measurement] = []
            for _ in range(RETRIES + 1):
                wait_for_quiet(max_foreign)
                tries.append(foreign_load(measure))
                if tries[-1].extra["foreign_cores"] <= max_foreign:
                    break
            m = min(tries, key=lambda t: t.extra["foreign_cores"])
            m.extra["discarded"] = len(tries) - 1
            runs[name].append(m)
            extra = "  ".join(f"{k} {v:.2f}" for k, v in m.extra.items())
            print(
                f"  round {round_ + 1}/{repeats}  {name:<36} {m.rate:9.0f} /s  {extra}", flush=True
            )
    return runs


def median_rate(runs: list[Measurement]) -> float:
    """The median rate of one contender's repeats."""
    return statistics.median(m.rate for m in runs)
