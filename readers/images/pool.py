"""The decode threads of one reading process: a batch's samples decoded side by side.

Decoders release the GIL (libjpeg-turbo through ctypes, PyTurboJPEG, Pillow's decode, torch's
resize), so threads scale a batch's decode over the cores without a process per core.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

__all__ = ["DecodePool", "batch_parts"]

P = TypeVar("P")
T = TypeVar("T")


def _one_intra_op_thread() -> None:
    """Torch ops on a decode thread (a crop's resize) run on that thread alone: with its
    own intra-op team under each decode thread they oversubscribed the cores, and a resize
    took 2-10x longer. OpenMP keeps the setting per thread; torch also makes it the default
    of threads started later, which :meth:`DecodePool.map` puts back."""
    torch.get_num_threads()  # first use on this thread: take the process default now
    torch.set_num_threads(1)


PARTS_PER_THREAD = 2  # enough to overlap reading with decoding; each part costs a kernel call


def batch_parts(count: int, threads: int) -> list[slice]:
    """A batch of ``count`` samples in contiguous parts for :meth:`DecodePool.pipeline`:
    ``PARTS_PER_THREAD`` per decode thread (one with a single thread), sizes within one."""
    parts = min(count, 1 if threads <= 1 else threads * PARTS_PER_THREAD)
    bounds = [count * k // parts for k in range(parts + 1)] if parts else [0]
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


class DecodePool:
    """Threads started on first use in each process (never shared across a fork), and
    dropped when pickled: a dataset carries one into its DataLoader workers as nothing."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._threads_n = 0
        self._pid: int | None = None

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any], threads: int) -> list[Any]:
        """``[fn(x) for x in items]`` on ``threads`` threads, one interleaved slice each (a
        task per sample costs measurably more in futures and wake-ups)."""
        if threads <= 1 or len(items) < 2:
            return [fn(x) for x in items]
        step = min(threads, len(items))
        slices = [items[k::step] for k in range(step)]
        results: list[Any] = [None] * len(items)
        with self._threads(threads) as pool:
            for k, part in enumerate(pool.map(lambda xs: [fn(x) for x in xs], slices)):
                results[k::step] = part
        return results

    def pipeline(
        self,
        produce: Callable[[P], T],
        consume: Callable[[P, T], Any],
        parts: Sequence[P],
        threads: int,
    ) -> None:
        """``consume(part, produce(part))`` for every part: each ``produce`` on the calling
        thread, in order, and each ``consume`` on a decode thread as soon as its part is
        produced, so that the caller reads the next part while the threads decode.

        Raises:
            The error of the first part, in order, whose produce or consume failed, once
            every consume started has finished (they write into the caller's buffers).
        """
        if threads <= 1 or len(parts) < 2:
            for part in parts:
                consume(part, produce(part))
            return
        started: list[Future[Any]] = []
        failure: Exception | None = None
        with self._threads(threads) as pool:
            for part in parts:
                try:
                    produced = produce(part)
                except Exception as e:  # raised after the parts before it
                    failure = e
                    break
                started.append(pool.submit(consume, part, produced))
            wait(started)
        for future in started:
            future.result()
        if failure is not None:
            raise failure

    @contextmanager
    def _threads(self, threads: int) -> Iterator[ThreadPoolExecutor]:
        """This process's ``threads`` decode threads, started on first use."""
        default = torch.get_num_threads()  # what threads started later default to
        if self._pool is None or self._threads_n != threads or self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(
                threads, thread_name_prefix="imgpack-decode", initializer=_one_intra_op_thread
            )
            self._threads_n, self._pid = threads, os.getpid()
        try:
            yield self._pool
        finally:
            torch.set_num_threads(default)  # a new decode thread made its own the default

    def __getstate__(self) -> dict[str, Any]:
        return {"_pool": None, "_threads_n": 0, "_pid": None}
