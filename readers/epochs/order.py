"""The order of an epoch: which sample each position ``0 .. N-1`` names, from seed and epoch.

Orders, one per way of reading (:mod:`readers.epochs.state` deals the positions to ranks and
says where an interrupted epoch goes on, whatever the order):

* map-style readers (:class:`readers.EpochSampler`): :class:`FeistelOrder`, a keyed
  bijection of ``[0, N)`` computed position by position (O(1) memory, any position at
  once), or, for states saved before it, :class:`PermutationOrder` (the whole permutation,
  O(N)); :data:`MAP_ORDERS` names them as a saved state does;
* the stream (:class:`readers.WdsStream`): :class:`BlockOrder`, shards in a seeded order and
  samples permuted inside windows, so that a reader reads each window in one ascending pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
from typing import ClassVar, Protocol

import numpy as np

__all__ = [
    "MAP_ORDERS",
    "BlockOrder",
    "FeistelOrder",
    "MapOrder",
    "PermutationOrder",
    "epoch_permutation",
]


class MapOrder(Protocol):
    """A map-style epoch order: the dataset index at each of an array of positions."""

    def indices(self, positions: np.ndarray) -> np.ndarray: ...


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The map-style order of states saved before :class:`FeistelOrder`: a permutation of
    every index, from seed and epoch (8 bytes a sample)."""
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


@dataclass(frozen=True)
class PermutationOrder:
    """:func:`epoch_permutation` as a :class:`MapOrder`, made on first use (O(N) memory):
    kept so that a state saved before :class:`FeistelOrder` resumes exactly as it did."""

    num_samples: int
    seed: int
    epoch: int

    @cached_property
    def _permutation(self) -> np.ndarray:
        return epoch_permutation(self.num_samples, self.seed, self.epoch)

    def indices(self, positions: np.ndarray) -> np.ndarray:
        return self._permutation[positions]


@dataclass(frozen=True)
class FeistelOrder:
    """A seeded bijection of ``[0, N)``, keyed by (seed, epoch): position ``p`` names the
    sample ``f(p)``, computed for any array of positions at once without building the order.

    ``f`` is a balanced Feistel network over the smallest even number of bits ``2h`` with
    ``2**(2h) >= N`` (six rounds, each mixing the right half with a round key through a
    64-bit finaliser), which permutes ``[0, 2**(2h))``; *cycle-walking* applies it again to
    any value ``>= N`` until it lands inside, which keeps it a bijection of ``[0, N)``.
    ``2**(2h) < 4N``, so a position takes fewer than four walks on average. Memory is the
    positions asked for; the time to resume at any position is that of one batch.
    """

    num_samples: int
    seed: int
    epoch: int
    rounds: ClassVar[int] = 6

    @cached_property
    def _half_bits(self) -> int:
        bits = max(1, (self.num_samples - 1).bit_length())
        return (bits + 1) // 2

    @cached_property
    def _keys(self) -> list[np.uint64]:
        sequence = np.random.SeedSequence([self.seed, self.epoch, 0xFE15])
        return [np.uint64(k) for k in sequence.generate_state(self.rounds, np.uint64)]

    def _round(self, right: np.ndarray, key: np.uint64) -> np.ndarray:
        """The round function: the right half and the key through splitmix64's finaliser."""
        z = (right ^ key) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))

    def _network(self, x: np.ndarray) -> np.ndarray:
        """One pass of the Feistel network: a permutation of ``[0, 2**(2h))``."""
        half = np.uint64(self._half_bits)
        mask = np.uint64((1 << self._half_bits) - 1)
        left, right = x >> half, x & mask
        for key in self._keys:
            left, right = right, left ^ (self._round(right, key) & mask)
        return (left << half) | right

    def indices(self, positions: np.ndarray) -> np.ndarray:
        """The sample at each position (an int64 array of positions in ``[0, N)``)."""
        if self.num_samples <= 1:
            return np.zeros(len(positions), np.int64)
        out = self._network(np.asarray(positions, np.int64).astype(np.uint64))
        outside = np.flatnonzero(out >= self.num_samples)
        while outside.size:  # cycle-walking: the next value of the same cycle
            out[outside] = self._network(out[outside])
            outside = outside[out[outside] >= self.num_samples]
        return out.astype(np.int64)


MAP_ORDERS: dict[str, type[FeistelOrder] | type[PermutationOrder]] = {
    "feistel": FeistelOrder,
    "permutation": PermutationOrder,
}


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
