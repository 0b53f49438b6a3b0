"""Aspect-ratio buckets over a mixture: the mixture picks the samples, the buckets group them.

Epoch ``e``'s slots are exactly the mixture's (:class:`readers.epochs.mixture.MixtureOrder`:
the same samples, the same exact shares and the same carry-over from epoch to epoch as
without buckets). Each slot goes to its sample's bucket, decided from its source's recorded
sizes (:meth:`readers.epochs.buckets.AspectBuckets.assign`, once per source); each bucket's
slots, in the order of the mixture's positions (a seeded shuffle of the epoch, or stored
order with ``shuffle=False``), are chunked by ``batch_size``, the bucket's last short batch
kept or dropped with ``drop_last``; the batches are laid out bucket after bucket and their
order is a :class:`readers.epochs.order.FeistelOrder` over the epoch's batch count, new
each epoch.

Because each epoch draws other samples of a source, the number of batches changes from
epoch to epoch; it is a pure function of the mixture, the assignment, the batching and the
epoch, so every rank (and a resumed run, on any world size) computes the same
:class:`EpochBatches`: O(epoch_size) NumPy work once per epoch, none of it stored in a
state. The epoch's batches are the positions :mod:`readers.epochs.state` deals and resumes
(an :class:`readers.epochs.state.EpochState` whose ``sizes`` is :meth:`MixtureBuckets.batch_count`).
A state adds :meth:`MixtureBuckets.state_dict` (O(sources)) to the mixture's.

``stratify=True`` is refused: a batch holds one bucket, not each source's share.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from readers.epochs.buckets import (
    AspectBuckets,
    assignment_digest,
    bucket_counts,
    bucket_dtype,
    group_by_bucket,
    index_dtype,
)
from readers.epochs.mixture import Mixture
from readers.epochs.order import FeistelOrder

__all__ = ["EpochBatches", "MixtureBuckets"]

_CHUNK = 1 << 20  # positions located at a time
_KEPT = 2  # epochs' plans kept: the one read and the next, whose size the end asks for


@dataclass(frozen=True, eq=False)
class EpochBatches:
    """One epoch's batches: ``members`` (indices of the sources laid end to end, in
    :func:`readers.epochs.buckets.index_dtype`) bucket after bucket, ``counts`` per bucket;
    batch ``g`` of the layout is batch ``g - first[k]`` of bucket ``k``, and position ``p``
    of the epoch reads layout batch ``indices([p])``."""

    members: np.ndarray
    counts: np.ndarray
    batch_size: int
    drop_last: bool
    order: FeistelOrder | None  # positions -> layout batches (None: as laid out)

    @cached_property
    def first(self) -> np.ndarray:
        """The layout's first batch of each bucket, and the total at the end."""
        b = self.batch_size
        batches = self.counts // b if self.drop_last else -(-self.counts // b)
        return np.concatenate([[0], np.cumsum(batches)])

    @cached_property
    def starts(self) -> np.ndarray:
        """Each bucket's first row of ``members``."""
        return np.concatenate([[0], np.cumsum(self.counts)])

    @property
    def num_batches(self) -> int:
        return int(self.first[-1])

    def indices(self, positions: np.ndarray) -> np.ndarray:
        """The layout batches that ``positions`` of the epoch read."""
        return positions if self.order is None else self.order.indices(positions)

    def batch_at(self, batch: int) -> tuple[int, np.ndarray]:
        """Layout batch ``batch``: its bucket and its samples' mixture indices (int64)."""
        if not 0 <= batch < self.num_batches:
            raise IndexError(f"batch {batch} outside the epoch's {self.num_batches}")
        k = int(np.searchsorted(self.first, batch, side="right")) - 1
        lo = int(self.starts[k]) + (batch - int(self.first[k])) * self.batch_size
        hi = min(lo + self.batch_size, int(self.starts[k + 1]))
        return k, self.members[lo:hi].astype(np.int64)


class MixtureBuckets:
    """The epochs of batches of ``mixture`` in ``buckets`` (see the module docstring).

    Args:
        buckets: the :class:`AspectBuckets`.
        mixture: the :class:`Mixture` (its sources in the order they are laid end to end).
        assignments: each source's samples' buckets, in source order.
        batch_size, drop_last: the batching of each bucket.
    """

    def __init__(
        self,
        buckets: AspectBuckets,
        mixture: Mixture,
        assignments: tuple[np.ndarray, ...],
        batch_size: int,
        drop_last: bool,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: at least 1")
        if mixture.stratify:
            raise ValueError(
                "buckets= with stratify=True: a bucketed batch holds one bucket, not each "
                "source's share; drop stratify="
            )
        lengths = [s.samples for s in mixture.sources]
        if [len(a) for a in assignments] != lengths:
            raise ValueError(f"bucket assignments of {[len(a) for a in assignments]} samples, "
                             f"the sources have {lengths}")  # fmt: skip
        self.buckets, self.mixture = buckets, mixture
        self.batch_size, self.drop_last = batch_size, drop_last
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # every source's assignment laid end to end, in the buckets' compact type; the
        # sources' are views of it
        dtype = bucket_dtype(len(buckets.sizes))
        self._all = (
            np.concatenate([np.asarray(a).astype(dtype, copy=False) for a in assignments])
            if assignments
            else np.empty(0, dtype)
        )
        self.assignments = tuple(np.split(self._all, self.offsets[1:-1]))
        self._epochs: dict[int, EpochBatches] = {}

    def with_mixture(self, mixture: Mixture) -> MixtureBuckets:
        """The same buckets and batching over ``mixture`` (a resumed, reweighted one)."""
        if mixture == self.mixture:
            return self
        return MixtureBuckets(
            self.buckets, mixture, self.assignments, self.batch_size, self.drop_last
        )

    def epoch(self, epoch: int) -> EpochBatches:
        """Epoch ``epoch``'s batches (computed once, the last few kept)."""
        if epoch not in self._epochs:
            while len(self._epochs) >= _KEPT:
                self._epochs.pop(next(iter(self._epochs)))
            self._epochs[epoch] = self._plan(epoch)
        return self._epochs[epoch]

    def batch_count(self, epoch: int) -> int:
        """Batches in epoch ``epoch``: the positions its state deals."""
        return self.epoch(epoch).num_batches

    def _plan(self, epoch: int) -> EpochBatches:
        order = self.mixture.order(epoch)
        size = self.mixture.epoch_size
        picked = np.empty(size, index_dtype(int(self.offsets[-1])))
        for lo in range(0, size, _CHUNK):
            source, sample = order.locate(np.arange(lo, min(lo + _CHUNK, size), dtype=np.int64))
            picked[lo : lo + len(source)] = self.offsets[source] + sample
        counts = bucket_counts(self._all, len(self.buckets.sizes), picked)
        members = group_by_bucket(picked, self._all, counts)  # by position within a bucket
        plan = EpochBatches(members, counts, self.batch_size, self.drop_last, None)
        if self.mixture.shuffle and plan.num_batches:
            seed = np.random.SeedSequence([self.mixture.seed, 0xBA7C]).generate_state(1, np.uint64)
            batch_order = FeistelOrder(plan.num_batches, int(seed[0]), epoch)
            plan = dataclasses.replace(plan, order=batch_order)
        return plan

    def state_dict(self) -> dict[str, Any]:
        """What a saved state must match: the buckets' sizes, the batching and each
        source's assignment (``jitter`` and ``flip`` change crops only)."""
        return {
            "sizes": [list(s) for s in self.buckets.sizes],
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "assignments": {
                s.name: assignment_digest(a)
                for s, a in zip(self.mixture.sources, self.assignments, strict=True)
            },
        }

    def check(self, state: Any) -> None:
        """Refuse ``state`` (a saved :meth:`state_dict`) unless it matches these buckets.

        Raises:
            ValueError: naming what differs.
        """
        if not isinstance(state, dict) or "assignments" not in state:
            raise ValueError("loader state records no buckets over a mixture")
        for key, value in self.state_dict().items():
            if state.get(key) != value:
                raise ValueError(
                    f"loader state is for buckets with {key}={state.get(key)!r}, this loader "
                    f"has {key}={value!r}"
                )
