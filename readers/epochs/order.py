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

from readers.compiled import compiled_module

__all__ = [
    "MAP_ORDERS",
    "BlockOrder",
    "FeistelOrder",
    "MapOrder",
    "PermutationOrder",
    "epoch_permutation",
]

COMPILED_NETWORK = "readers.epochs.feistel"


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

    ``f`` is a Feistel network over the ``b`` bits of ``N - 1`` (a left half of ``b // 2``
    bits, a right half of the rest): six rounds, each XOR-ing one half, in turn, with the
    other half mixed with a round key through splitmix64's 64-bit finaliser, so each round
    is undone by repeating it and the network permutes ``[0, 2**b)``. *Cycle-walking*
    sends a value ``>= N`` through the network again until it lands inside, which keeps
    ``f`` a bijection of ``[0, N)``; ``2**b < 2N``, so a position takes fewer than two
    passes on average. Memory is the positions asked for; the time to resume at any
    position is that of one batch. The compiled ``readers/epochs/feistel.c`` runs the same
    network without numpy's per-operation overhead (a bucketed loader asks for a batch's
    positions at a time); without it, or with ``IMGPACK_KERNEL=0``, numpy computes the same
    numbers.
    """

    num_samples: int
    seed: int
    epoch: int
    rounds: ClassVar[int] = 6

    @cached_property
    def _halves(self) -> tuple[np.uint64, np.uint64, np.uint64]:
        """The right half's width, and the masks of the left and right halves."""
        bits = max(1, (self.num_samples - 1).bit_length())
        right = bits - bits // 2
        left_mask = (1 << (bits // 2)) - 1
        return np.uint64(right), np.uint64(left_mask), np.uint64((1 << right) - 1)

    @cached_property
    def _keys(self) -> np.ndarray:
        """The round keys (uint64, one a round)."""
        sequence = np.random.SeedSequence([self.seed, self.epoch, 0xFE15])
        return sequence.generate_state(self.rounds, np.uint64)

    @staticmethod
    def _mix(half: np.ndarray, key: np.uint64, mask: np.uint64) -> np.ndarray:
        """The round function: ``half`` and the key through splitmix64's finaliser."""
        z = half ^ key
        z *= np.uint64(0x9E3779B97F4A7C15)
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
        z &= mask
        return z

    def _network(self, x: np.ndarray) -> np.ndarray:
        """One pass of the network: a permutation of ``[0, 2**b)``."""
        shift, left_mask, right_mask = self._halves
        left, right = x >> shift, x & right_mask
        for i, key in enumerate(self._keys):
            if i % 2:
                right ^= self._mix(left, key, right_mask)
            else:
                left ^= self._mix(right, key, left_mask)
        left <<= shift
        left |= right
        return left

    def indices(self, positions: np.ndarray) -> np.ndarray:
        """The sample at each position (an int64 array of positions in ``[0, N)``).

        Raises:
            IndexError: for a position outside ``[0, N)`` (its cycle would never come back).
        """
        positions = np.ascontiguousarray(positions, np.int64)
        if positions.size and not 0 <= positions.min() <= positions.max() < self.num_samples:
            raise IndexError(f"positions outside the epoch's [0, {self.num_samples})")
        if self.num_samples <= 1:
            return np.zeros(len(positions), np.int64)
        compiled = compiled_module(COMPILED_NETWORK, "epoch orders use numpy")
        if compiled is not None:
            out = np.empty(len(positions), np.int64)
            shift, left_mask, right_mask = map(int, self._halves)
            compiled.indices(
                positions, out, self._keys, self.num_samples, shift, left_mask, right_mask
            )
            return out
        out = self._network(positions.astype(np.uint64))
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
