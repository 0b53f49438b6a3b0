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
* Each rank yields its slice in batches (only the last one short): the sampler in order;
  a stream with ``K`` DataLoader workers cuts its slice into ``K`` contiguous **parts**,
  one a worker, each cut at the batch that starts the read window nearest an even cut
  (the part with the short batch at least as large as any, so that it ends last). A
  worker reads its part in order, one round of requests a read window, and the DataLoader
  takes one batch of each worker that has one left in turn: the rank yields its ``K``
  parts interleaved (with one worker, or none, its slice in order).
* A state saved mid-epoch by a stream with ``K > 1`` workers also stores, per rank, the
  batches left in each part and the part that yields next (``parts``, ``turns``, with
  ``workers``); a run resumed with the same world size and workers deals the rest with
  them and continues exactly as the uninterrupted run would have; any other shape cuts
  the rest afresh (every sample once).

An epoch's size may depend on the epoch (a bucketed mixture's batches: the samples each
epoch draws decide them): such a state carries ``sizes``, epoch -> positions, and the next
epoch starts over ``sizes(epoch)`` positions; the rule within an epoch is unchanged.

A subset of a dataset (``make_loader(path, indices=...)``, a ``Subset``) is an epoch over
its own ``N`` positions, each naming one of its samples; a state saved over it carries the
subset's fingerprint, so that a loader over other samples refuses it.

Because every rank yields the same number of batches, any rank can tell which positions
every rank has consumed after ``k`` batches (the first ``k`` batches of every slice, or of
every worker's share of it, counted the DataLoader's way); a
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

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from readers.epochs.ranges import Ranges, total
from readers.epochs.split import Split

__all__ = [
    "EpochSource",
    "EpochState",
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
    # A stream read by several DataLoader workers, mid-epoch: their number, and per rank
    # the batches left in each worker's part and the part that yields next (Split).
    workers: int = 1
    parts: tuple[tuple[int, ...], ...] = ()
    turns: tuple[int, ...] = ()
    # epoch -> positions, where the size varies by epoch (not saved: the source knows it)
    sizes: Callable[[int], int] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def start(
        cls, epoch: int, seed: int, num_samples: int, order: str, subset: str | None = None
    ) -> EpochState:
        whole = ((0, num_samples),) if num_samples else ()
        return cls(epoch, seed, num_samples, whole, order, subset)

    def start_of(self, epoch: int) -> EpochState:
        """The start of ``epoch`` in this run: the same seed, order and samples."""
        size = self.num_samples if self.sizes is None else self.sizes(epoch)
        start = EpochState.start(epoch, self.seed, size, self.order, self.subset)
        return start if self.sizes is None else dataclasses.replace(start, sizes=self.sizes)

    @property
    def fresh(self) -> bool:
        """True when nothing of this epoch has been read yet."""
        return self.remaining == self.start_of(self.epoch).remaining

    def advanced(
        self,
        split: Split,
        consumed: Ranges,
        progress: tuple[tuple[tuple[int, ...], ...], tuple[int, ...]] = ((), ()),
    ) -> EpochState:
        """This state once ``consumed`` (from ``split``) is read, ``progress`` being where
        each rank's workers stand (:meth:`Split.progress`): the next epoch's start once
        every rank has had its whole slice."""
        left = split.after(consumed)
        if not left:
            return self.start_of(self.epoch + 1)
        parts, turns = progress
        return EpochState(
            self.epoch,
            self.seed,
            self.num_samples,
            left,
            self.order,
            self.subset,
            split.num_workers if parts else 1,
            parts,
            turns,
            self.sizes,
        )

    def progress_for(
        self, world_size: int, num_workers: int
    ) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
        """The parts and turns to deal this state with: its own where they were counted
        for this world size and number of workers; none (deal afresh) otherwise."""
        if self.workers == num_workers and len(self.parts) == world_size:
            return self.parts, self.turns
        return (), ()

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
        if self.parts:  # a stream read by several workers, mid-epoch
            parts = [list(p) for p in self.parts]
            state.update(workers=self.workers, parts=parts, turns=list(self.turns))
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
            workers = int(state.get("workers", 1))
            parts = tuple(tuple(int(c) for c in p) for p in state.get("parts", ()))
            turns = tuple(int(t) for t in state.get("turns", ()))
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
        if (
            workers < 1
            or len(parts) != len(turns)
            or not all(len(p) == workers and min(p) >= 0 for p in parts)
            or not all(0 <= t < workers for t in turns)
        ):
            raise ValueError(f"loader state has parts or turns that are not {workers} workers'")
        return cls(epoch, seed, num_samples, remaining, order, subset, workers, parts, turns)


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
    read_window: int = 1  # positions a worker reads in one round (a stream's, see Split)

    def start_state(self, epoch: int) -> EpochState:
        """The start of epoch ``epoch`` of a new run over what this source reads."""
        return EpochState.start(epoch, self.seed, self.num_samples, self.orders[0], self.subset)

    def loaded_state(self, state: dict[str, Any]) -> EpochState:
        """``state`` (a ``state_dict``), checked against what this source reads."""
        return EpochState.from_dict(state, self.num_samples, self.seed, self.orders, self.subset)

    def reset(self, state: EpochState) -> bool:
        """Start the next iteration from ``state`` (torchdata's ``reset(initial_state)``): the
        one way a state reaches a source. A :class:`readers.Loader` hands its own over
        before each iteration, never through a dict; ``set_epoch`` and ``load_state_dict``
        of a source used by hand are this call too. The iteration tells the dataset read the
        state's epoch (its random crops), so that crops follow the same state as the order.

        Returns True when DataLoader workers already running hold a copy of this source
        that cannot follow ``state`` (a stream's mid-epoch state): the Loader starts new ones.
        """
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        return self._state.epoch

    @property
    def epoch_state(self) -> EpochState:
        """The state the next iteration starts from."""
        return self._state

    def split(self, state: EpochState | None = None, num_workers: int = 1) -> Split:
        """How ``state`` (default: the one the next iteration starts from) is dealt, to
        ``num_workers`` DataLoader workers per rank (a stream's; a sampler deals in the
        training process)."""
        state = state or self._state
        fresh = Split(
            state.remaining,
            self.world_size,
            self.drop_last,
            self.batch_size or 1,
            num_workers,
            self.read_window,
        )
        parts, turns = state.progress_for(self.world_size, num_workers)
        if not all(sum(p) == fresh.batches for p in parts):
            return fresh  # parts of another split: deal the rest afresh
        return dataclasses.replace(fresh, parts=parts, turns=turns)
