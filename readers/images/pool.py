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
from typing import Any

import torch

__all__ = ["DecodePool", "batch_parts"]


def _one_intra_op_thread() -> None:
    """Torch ops on a decode thread (a crop's resize) run on that thread alone: with its
    own intra-op team under each decode thread they oversubscribed the cores, and a resize
    took 2-10x longer. OpenMP keeps the setting per thread; torch also makes it the default
    of threads started later, which :meth:`DecodePool.map` puts back."""
    torch.get_num_threads()  # first use on this thread: take the process default now
    torch.set_num_threads(1)


def batch_parts(count: int, threads: int) -> list[slice]:
    """A batch of ``count`` samples cut into one contiguous part per decode thread (at
    least one), their sizes within one: each part is one kernel call."""
    parts = min(count, max(threads, 1))
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
        task per sample costs measurably more in futures and wake-ups).

        Returns, or raises the first failing slice's error, only once every slice has
        finished: a thread still reading or decoding after the call would race with
        whatever the caller does next (a fork for DataLoader workers copies the locks it
        holds, and the child hangs on them)."""
        if threads <= 1 or len(items) < 2:
            return [fn(x) for x in items]
        step = min(threads, len(items))
        with self._threads(threads) as pool:
            started = [
                pool.submit(lambda xs: [fn(x) for x in xs], items[k::step]) for k in range(step)
            ]
            wait(started)
        results: list[Any] = [None] * len(items)
        for k, future in enumerate(started):
            results[k::step] = future.result()
        return results

    def share(self, fn: Callable[[], None], calls: int, threads: int) -> None:
        """``fn()`` ``calls`` times at once (at most ``threads``), the calling thread making
        one of them: the kernel's shared-counter calls (each takes rows until none is
        left). The caller decoding beside the pool's threads saves a thread's wake-up and
        the caller's own per batch, measurably on two cores. ``fn`` must run no torch op
        (the calling thread keeps its intra-op threads). Returns once every call has
        returned; raises the first error, the caller's first."""
        calls = min(calls, threads)
        if calls <= 1:
            fn()
            return
        with self._threads(threads) as pool:
            started = [pool.submit(fn) for _ in range(calls - 1)]
            try:
                fn()
            finally:
                wait(started)
        for future in started:
            future.result()

    def start(self, fn: Callable[[], None], calls: int, threads: int) -> list[Future[None]]:
        """``fn()`` ``calls`` times (at most ``threads``) on the pool's threads, returning
        at once: the caller must wait for every future before anything may change what
        ``fn`` reads or writes, and before a fork (:mod:`readers.batches_ahead`)."""
        with self._threads(threads) as pool:
            return [pool.submit(fn) for _ in range(max(min(calls, threads), 1))]

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
