"""The order of an epoch: which sample each position ``0 .. N-1`` names, from seed and epoch.

Two orders, one per way of reading (:mod:`readers.epochs.state` deals the positions to
ranks and says where an interrupted epoch goes on, whatever the order):

* map-style readers (:class:`readers.EpochSampler`): a seeded permutation of every index;
* the stream (:class:`readers.WdsStream`): :class:`BlockOrder`, shards in a seeded order and
  samples permuted inside windows, so that a reader reads each window in one ascending pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

import numpy as np

__all__ = ["BlockOrder", "epoch_permutation"]


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The map-style order of an epoch: a permutation of every index, from seed and epoch."""
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


@dataclass(frozen=True)
class BlockOrder:
    """The stream's order of an epoch: shards in a seeded order, one after the other, and
    the samples inside each window of ``window`` consecutive positions permuted. A window
    touches a few neighbouring shards only, so a reader reads it in one ascending pass.
    ``window=0`` keeps the stored order (no shuffle at all)."""

    shard_samples: tuple[int, ...]
    seed: int
    epoch: int
    window: int

    @cached_property
    def _starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.shard_samples, dtype=np.int64)])

    @cached_property
    def _shard_order(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.epoch, len(self.shard_samples)])
        return rng.permutation(len(self.shard_samples))

    @cached_property
    def _ends_in_order(self) -> np.ndarray:
        return np.cumsum(np.asarray(self.shard_samples, np.int64)[self._shard_order])

    def chunks(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """``[lo, hi)`` cut where a reader should read ahead in one go: at window bounds
        (a window's samples come out permuted), or at shard bounds in stored order."""
        if self.window:
            bounds = range(lo - lo % self.window + self.window, hi, self.window)
        else:
            bounds = self._starts.tolist()
        cuts = sorted({lo, hi, *(b for b in bounds if lo < b < hi)})
        return list(pairwise(cuts))

    def indices(self, lo: int, hi: int) -> np.ndarray:
        """Dataset indices at positions ``[lo, hi)``, one chunk from :meth:`chunks`."""
        if not self.window:
            return np.arange(lo, hi, dtype=np.int64)
        first = lo - lo % self.window
        size = min(self.window, int(self._starts[-1]) - first)
        rng = np.random.default_rng([self.seed, self.epoch, first])
        concatenated = first + rng.permutation(size)[lo - first : hi - first]
        slot = np.searchsorted(self._ends_in_order, concatenated, side="right")
        local = concatenated - (
            self._ends_in_order[slot] - np.asarray(self.shard_samples)[self._shard_order[slot]]
        )
        return self._starts[self._shard_order[slot]] + local
