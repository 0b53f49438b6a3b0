"""Is the data pipeline the bottleneck? A stall meter for a real training loop.

>>> meter = readers.measure_wait(loader)
>>> for images, labels in meter:
...     train_step(images, labels)
>>> print(meter.report())
waited for data 3.1 % of 41.2 s (p50 0.2 ms, p99 9.8 ms per batch; 24.3 batches/s): ...

One rule says whether loading is the bottleneck, here and in :mod:`readers.feeding.tune`: the
measured wait, at most ``WAIT_SHARE`` (5 %) of the time the loop spent on its own work.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

__all__ = ["WAIT_SHARE", "WaitMeter", "WaitReport", "keeps_up", "measure_wait"]

WAIT_SHARE = 0.05  # waiting at most this share of the compute time: not the bottleneck


def keeps_up(wait: float | None, compute: float) -> bool:
    """Whether loading is not the bottleneck for a loop that waited ``wait`` for data
    against ``compute`` of its own work (per batch or in total, in any one unit): the wait
    is at most ``WAIT_SHARE`` of the compute, whatever the loader's rate (without workers,
    a loader 3.8x as fast as the model still leaves it waiting 26 % of every step)."""
    return wait is not None and wait <= WAIT_SHARE * compute


class WaitReport(dict):
    """``wait_fraction``, ``batches``, ``seconds``, ``batches_per_s``, ``wait_ms_p50``,
    ``wait_ms_p99``, ``first_batch_ms``; ``str()`` is one line for a person."""

    def __str__(self) -> str:
        if not self["batches"]:
            return "no batches yet"
        waited = self["wait_fraction"]
        verdict = (
            "the data pipeline keeps up"
            if keeps_up(waited, 1 - waited)
            else "the data pipeline is the bottleneck: see imgpack tune"
        )
        return (
            f"waited for data {100 * self['wait_fraction']:.1f} % of {self['seconds']:.1f} s "
            f"(p50 {self['wait_ms_p50']:.1f} ms, p99 {self['wait_ms_p99']:.1f} ms per batch; "
            f"{self['batches_per_s']:.1f} batches/s; first batch after "
            f"{self['first_batch_ms']:.0f} ms): {verdict}"
        )


class WaitMeter:
    """Wraps an iterable of batches and times how long each ``next()`` blocks.

    The first batch (worker start-up, file opening) is reported on its own and left out of
    the rest, which describes the steady state: the fraction of wall time spent waiting,
    and the median and 99th percentile wait per batch.
    """

    def __init__(self, batches: Iterable[Any]) -> None:
        self.batches = batches
        self.waits: list[float] = []  # seconds, every batch after the first
        self.first: float | None = None
        self._start: float | None = None  # when the first batch arrived
        self._stop: float | None = None  # when the loop asked past the last batch

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.batches)
        while True:
            asked = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                self._stop = asked
                return
            got = time.perf_counter()
            if self.first is None:
                self.first, self._start = got - asked, got
            else:
                self.waits.append(got - asked)
            yield batch

    def report(self) -> WaitReport:
        """The figures so far (call it at the end, or at any time during the loop)."""
        end = self._stop if self._stop is not None else time.perf_counter()
        seconds = end - self._start if self._start is not None else 0.0
        waits = np.asarray(self.waits) * 1000
        count = len(self.waits) + (self.first is not None)
        return WaitReport(
            batches=count,
            seconds=seconds,
            wait_fraction=float(waits.sum() / 1000 / seconds) if seconds > 0 else 0.0,
            batches_per_s=len(self.waits) / seconds if seconds > 0 else 0.0,
            wait_ms_p50=float(np.percentile(waits, 50)) if len(waits) else 0.0,
            wait_ms_p99=float(np.percentile(waits, 99)) if len(waits) else 0.0,
            first_batch_ms=1000 * (self.first or 0.0),
        )


def measure_wait(batches: Iterable[Any]) -> WaitMeter:
    """Wrap any loader: iterate the result instead, then ``report()``."""
    return WaitMeter(batches)
