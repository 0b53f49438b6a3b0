"""Batches read ahead of their turn in the training process, so that the decode threads
never wait for the training thread's per-batch Python.

With ``num_workers=0`` a DataLoader asks for a batch only once the one before it is done.
Each batch's Python (locating its samples, reading and checking their stored bytes, planning
the decode, taking a batch buffer) then ran while the decode threads idled (a measurable
share of a batch's time on two cores: docs/BENCHMARKS.md). So :class:`readers.Loader` has
its sampler announce each batch one batch early (:meth:`readers.EpochSampler.__iter__` with
``read_ahead``): the dataset begins it then (:meth:`BatchesAhead.begin`), its decode running
on the decode threads while the training thread plans the next, and serves it when the
DataLoader asks (:meth:`BatchesAhead.serve`). A batch asked for that was not announced (a
hand-built loop, another order) is read as before, once those begun are settled. A batch is
keyed by what the DataLoader hands the dataset for it: its indices, or a bucket loader's one
key (``(epoch, batch)``; :mod:`readers.bucket_dataset`), which names the bucket, so that
each batch carries its own crop from the moment it is begun.

Decode threads must not run across a fork (the child would inherit their half-written
buffers and locks): every batch begun is settled first (``os.register_at_fork``).
"""

from __future__ import annotations

import os
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchesAhead", "Begun"]


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class Begun:
    """A batch begun: ``finish()`` returns it (waiting for the decode threads, raising what
    reading it raised); ``settle()`` only waits for them, for a batch no one will ask for."""

    finish: Callable[[], Any]
    settle: Callable[[], None] = field(default=_nothing)


def _failed(error: Exception) -> Begun:
    def finish() -> Any:
        raise error

    return Begun(finish)


class BatchesAhead:
    """A dataset's batches begun ahead, oldest first, keyed by their indices (a sequence of
    ints, or of a bucket batch's parts), compared as tuples."""

    def __init__(self) -> None:
        self._begun: deque[tuple[tuple[Any, ...], Begun]] = deque()
        _LIVE.add(self)

    def begin(self, indices: Sequence[Any], start: Callable[[Sequence[Any]], Begun]) -> None:
        """``start(indices)`` now; what it raises is raised when the batch is asked for."""
        try:
            begun = start(indices)
        except Exception as error:  # the batch's own error, at its turn
            begun = _failed(error)
        self._begun.append((tuple(indices), begun))

    def take(self, indices: Sequence[Any]) -> Begun | None:
        """The batch ``indices`` if it was begun (those begun before it are settled and
        dropped), else None with every batch begun settled."""
        wanted = tuple(indices)
        while self._begun:
            key, begun = self._begun.popleft()
            if key == wanted:
                return begun
            begun.settle()
        return None

    def serve(self, indices: Sequence[Any], start: Callable[[Sequence[Any]], Begun]) -> Any:
        """The batch ``indices``, finished: as begun ahead (:meth:`take`), else begun now by
        ``start(indices)``, every batch begun before it settled first."""
        return (self.take(indices) or start(indices)).finish()

    def settle(self) -> None:
        """Wait for every batch begun, and drop them."""
        while self._begun:
            self._begun.popleft()[1].settle()

    def __len__(self) -> int:
        return len(self._begun)

    def __getstate__(self) -> dict[str, Any]:
        return {}  # a batch under way never crosses processes

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


_LIVE: weakref.WeakSet[BatchesAhead] = weakref.WeakSet()


def _settle_all() -> None:
    for ahead in list(_LIVE):
        ahead.settle()


os.register_at_fork(before=_settle_all)
