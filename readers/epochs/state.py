"""Who reads what in an epoch, and where an interrupted epoch goes on: exact, elastic splits.

(The order itself, which positions name which samples, is :mod:`readers.epochs.order`.)

The rule, shared by the map-style sampler and the stream:

* An epoch's **order** is a sequence of positions ``0 .. N-1``, each naming one sample; it
  depends only on the dataset, the seed and the epoch (never on ranks or workers).
* What is still to be read is a list of position **ranges** (``[start, stop)``), the whole
  epoch ``[(0, N)]`` at its start. A checkpoint stores that list.
* Ranks take **equal, contiguous slices** of the concatenated ranges: rank ``r`` of ``W``
  gets the ``r``-th slice of ``L`` positions. With ``drop_last`` ``L = T // W`` (at most
  ``W - 1`` samples dropped, and a short last batch); otherwise ``L = ceil(T / W)`` and up
  to ``W - 1`` padding positions ``N, N + 1, ...`` are appended, which read the samples at
  the start of the order again (as ``DistributedSampler`` pads). Padding positions stay in
  a saved state, so a run resumed on the same world size repeats exactly what the
  uninterrupted run would have.
* Each rank yields its slice in order, in batches (only the last one short). A stream's
  DataLoader workers read every ``num_workers``-th batch of it, and the DataLoader takes
  one batch of each worker in turn, so the order does not depend on the number of workers.

A subset of a dataset (``make_loader(path, indices=...)``, a ``Subset``) is an epoch over
its own ``N`` positions, each naming one of its samples; a state saved over it carries the
subset's fingerprint, so that a loader over other samples refuses it.

Because every rank yields the same number of batches, any rank can tell which positions
every rank has consumed after ``k`` batches (the first ``k`` batches of every slice); a
resumed run, with any world size, splits the rest the same way, and on the same world size
continues exactly as the uninterrupted run would have. Nothing here touches the data:
resuming costs O(ranks) range arithmetic (:mod:`readers.epochs.ranges`), and the order maps
only the positions read next (:class:`readers.epochs.order.FeistelOrder`).

A state names its order (``"order"``: a key of :data:`readers.epochs.order.MAP_ORDERS`, or
``"windows"`` for the stream), and the epochs after it keep that order: a run resumed from
a state saved before version 2 (which has no ``"order"``: the map-style order was then the
whole permutation, ``"permutation"``) goes on exactly as it would have.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from readers.epochs.ranges import Ranges, merge_adjacent, subtract, take, total

__all__ = [
    "EpochSource",
    "EpochState",
    "Split",
    "require_full_batches",
    "subset_digest",
]

STATE_VERSION = 2  # 2: the state names its order; 1 (read still) had one order per reader


def require_full_batches(num_samples: int, world_size: int, batch_size: int) -> None:
    """With ``drop_last``, refuse an epoch in which no rank has a full batch: every epoch
    would be empty, and a training loop would run without a step and without a word."""
    if num_samples // world_size >= batch_size:
        return
    fixes = ["drop_last=False (pads with at most world_size - 1 repeats)"]
    if num_samples >= world_size:
        fixes.append(f"batch_size={num_samples // world_size} or less")
    fixes.append("fewer ranks")
    raise ValueError(
        f"drop_last=True: {num_samples} samples cannot give each of {world_size} ranks a "
        f"full batch of {batch_size} ({world_size * batch_size} needed), so every epoch would "
        f"be empty; use {', or '.join(fixes)}"
    )


def subset_digest(indices: np.ndarray) -> str:
    """A short fingerprint of the dataset indices a subset reads, in their order."""
    return hashlib.sha1(np.ascontiguousarray(indices, "<i8").tobytes()).hexdigest()[:16]


def _reads(subset: str | None) -> str:
    return "the whole dataset" if subset is None else f"the subset {subset}"


@dataclass(frozen=True)
class EpochState:
    """Where a run stands: the epoch, its seed, the name of its order, the positions not
    yet read by any rank, and, over a subset of the dataset, that subset's
    :func:`subset_digest`.

    ``state_dict()``/``from_dict`` give the small JSON-ready dict checkpoints store.
    """

    epoch: int
    seed: int
    num_samples: int
    remaining: Ranges
    order: str
    subset: str | None = None

    @classmethod
    def start(
        cls, epoch: int, seed: int, num_samples: int, order: str, subset: str | None = None
    ) -> EpochState:
        whole = ((0, num_samples),) if num_samples else ()
        return cls(epoch, seed, num_samples, whole, order, subset)

    def start_of(self, epoch: int) -> EpochState:
        """The start of ``epoch`` in this run: the same seed, order and samples."""
        return EpochState.start(epoch, self.seed, self.num_samples, self.order, self.subset)

    @property
    def fresh(self) -> bool:
        """True when nothing of this epoch has been read yet."""
        return self.remaining == self.start_of(self.epoch).remaining

    def advanced(self, split: Split, consumed: Ranges) -> EpochState:
        """This state once ``consumed`` (from ``split``) is read: the next epoch's start
        once every rank has had its whole slice."""
        left = split.after(consumed)
        if not left:
            return self.start_of(self.epoch + 1)
        return EpochState(self.epoch, self.seed, self.num_samples, left, self.order, self.subset)

    def state_dict(self, world_size: int) -> dict[str, Any]:
        state = {
            "version": STATE_VERSION,
            "order": self.order,
            "epoch": self.epoch,
            "seed": self.seed,
            "num_samples": self.num_samples,
            "samples_consumed": self.num_samples - total(self.remaining),
            "world_size": world_size,
            "remaining": [list(r) for r in self.remaining],
        }
        if self.subset is not None:  # absent for the whole dataset, as before subsets
            state["subset"] = self.subset
        return state

    @classmethod
    def from_dict(
        cls,
        state: dict[str, Any],
        num_samples: int,
        seed: int,
        orders: tuple[str, ...],
        subset: str | None = None,
    ) -> EpochState:
        """Check a stored state against this dataset (or subset), seed and the orders this
        reader has (``orders[-1]``: the one of version 1 states); ValueError names the
        field."""
        try:
            version, epoch = state["version"], state["epoch"]
            order = state["order"] if version != 1 else orders[-1]
            stored_n, stored_seed = state["num_samples"], state["seed"]
            stored_subset = state.get("subset")
            remaining = tuple((int(lo), int(hi)) for lo, hi in state["remaining"])
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not an imgpack loader state: {e!r}") from None
        if version not in (1, STATE_VERSION):
            raise ValueError(f"loader state version {version!r}, expected {STATE_VERSION} or 1")
        if order not in orders:
            raise ValueError(f"loader state has the order {order!r}, this reader {orders}")
        if stored_n != num_samples:
            raise ValueError(
                f"loader state is for {stored_n} samples, this dataset has {num_samples}"
            )
        if stored_subset != subset:
            raise ValueError(
                f"loader state is for {_reads(stored_subset)}, this loader reads {_reads(subset)}"
            )
        if stored_seed != seed:
            raise ValueError(f"loader state has seed {stored_seed}, this loader {seed}")
        padding = total(remaining) - num_samples  # positions past the end, at most world - 1
        if not all(0 <= lo < hi for lo, hi in remaining) or padding > max(num_samples, 1024):
            raise ValueError("loader state has ranges outside the epoch")
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"loader state has an invalid epoch {epoch!r}")
        return cls(epoch, seed, num_samples, remaining, order, subset)


@dataclass(frozen=True)
class Split:
    """How one epoch's remaining positions are dealt to ranks, batches and (for a stream,
    whose DataLoader workers each read their own part) workers."""

    remaining: Ranges
    world_size: int
    drop_last: bool
    batch_size: int = 1

    @property
    def per_rank(self) -> int:
        """Samples every rank yields this epoch (after dropping a short last batch)."""
        left = total(self.remaining)
        count = left // self.world_size if self.drop_last else -(-left // self.world_size)
        if self.drop_last:
            count -= count % self.batch_size
        return count

    @property
    def batches(self) -> int:
        return -(-self.per_rank // self.batch_size)

    @cached_property
    def padded(self) -> Ranges:
        """The remaining positions and, when they do not divide, fresh padding positions."""
        missing = self.per_rank * self.world_size - total(self.remaining)
        if missing <= 0:
            return self.remaining
        end = max(hi for _, hi in self.remaining)
        return (*self.remaining, (end, end + missing))

    def rank_ranges(self, rank: int) -> Ranges:
        """The positions rank ``rank`` yields, in the order of its slice."""
        return take(self.padded, rank * self.per_rank, self.per_rank)

    def worker_ranges(self, rank: int, worker: int, num_workers: int) -> Ranges:
        """The positions worker ``worker`` of ``num_workers`` reads of its rank's slice:
        batches ``worker``, ``worker + num_workers``, ... The DataLoader takes one batch of
        each worker in turn, so the rank yields its slice in order, whatever the number of
        workers (only the last batch is short)."""
        mine = self.rank_ranges(rank)
        return merge_adjacent(
            [
                r
                for first in range(
                    worker * self.batch_size, self.per_rank, num_workers * self.batch_size
                )
                for r in take(mine, first, min(self.batch_size, self.per_rank - first))
            ]
        )

    def consumed(self, batches: int) -> Ranges:
        """Positions every rank together has yielded after ``batches`` batches each."""
        return self.consumed_samples(batches * self.batch_size)

    def consumed_samples(self, samples: int) -> Ranges:
        """Positions every rank together has yielded after ``samples`` samples each."""
        return self._on_every_rank([(0, min(samples, self.per_rank))])

    def _on_every_rank(self, offsets: list[tuple[int, int]]) -> Ranges:
        out: list[tuple[int, int]] = []
        for rank in range(self.world_size):
            mine = self.rank_ranges(rank)
            out.extend(r for lo, hi in offsets if hi > lo for r in take(mine, lo, hi - lo))
        return tuple(out)

    def after(self, consumed: Ranges) -> Ranges:
        """What remains of the epoch without ``consumed`` (from ``consumed*``); nothing once
        every rank has had its whole slice."""
        left = subtract(self.padded, consumed)
        return left if total(consumed) < self.per_rank * self.world_size else ()


class EpochSource:
    """What the map-style sampler and the stream share: the state the next iteration
    starts from and how it is dealt (subclasses set these attributes)."""

    _state: EpochState
    seed: int
    num_samples: int
    world_size: int
    drop_last: bool
    batch_size: int | None
    subset: str | None = None  # the subset_digest of the samples read, None for all
    orders: tuple[str, ...]  # the orders it reads: a new run's first, version 1's last

    def start_state(self, epoch: int) -> EpochState:
        """The start of epoch ``epoch`` of a new run over what this source reads."""
        return EpochState.start(epoch, self.seed, self.num_samples, self.orders[0], self.subset)

    def loaded_state(self, state: dict[str, Any]) -> EpochState:
        """``state`` (a ``state_dict``), checked against what this source reads."""
        return EpochState.from_dict(state, self.num_samples, self.seed, self.orders, self.subset)

    @property
    def epoch(self) -> int:
        return self._state.epoch

    @property
    def epoch_state(self) -> EpochState:
        """The state the next iteration starts from."""
        return self._state

    def split(self, state: EpochState | None = None) -> Split:
        """How ``state`` (default: the one the next iteration starts from) is dealt."""
        remaining = (state or self._state).remaining
        return Split(remaining, self.world_size, self.drop_last, self.batch_size or 1)
