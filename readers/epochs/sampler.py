"""A distributed, resumable sampler for the map-style readers (every format).

It does what ``DistributedSampler`` does — one seeded order per epoch, the same on every
rank, each rank its own equal share — and in addition resumes mid-epoch, with the same or
another world size, by the rule in :mod:`readers.epochs.state`; over the whole dataset or a subset
of its indices. Its order is :class:`readers.epochs.order.FeistelOrder`, computed for the
positions of the next chunk only, so neither memory nor the time to resume grows with the
dataset (a state saved before it keeps the whole permutation it was saved with).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence, Sized
from itertools import islice
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import Sampler

from readers.epochs.order import MAP_ORDERS, MapOrder
from readers.epochs.ranges import wrapped
from readers.epochs.state import EpochSource, EpochState, require_full_batches, subset_digest
from readers.placement import Placement

__all__ = ["EpochSampler", "announced", "selected_indices"]

_CHUNK = 1 << 16  # positions ordered and turned into Python ints at a time


class EpochSampler(EpochSource, Sampler[int]):
    """Indices of this rank's share of each epoch, resumable from :meth:`state_dict`.

    Args:
        data: the dataset (or its length).
        shuffle: a new seeded order every epoch; else the stored order.
        seed: base of every epoch's order; must be the same on every rank.
        drop_last: drop what does not divide evenly (at most ``world_size - 1`` samples and
            a short last batch) instead of padding by repeating samples.
        batch_size: the DataLoader's, so that ``drop_last`` drops only a short last batch.
        rank, world_size: explicit placement; by default taken from ``torch.distributed``
            or ``RANK``/``WORLD_SIZE`` when the sampler is built and at :meth:`set_epoch`.
        placement: the same as a :class:`readers.placement.Placement` resolved
            once (what :func:`readers.make_loader` passes).
        indices: read only these dataset indices (a subset: the epochs, shares and resume
            are over them, and the sampler yields dataset indices); default all.

    ``drop_last`` with fewer samples than ``world_size * batch_size`` is a ``ValueError``:
    no rank would have a full batch, and every epoch would be empty.

    Unlike ``DistributedSampler`` it works as a ``StatefulDataLoader`` sampler: its
    ``state_dict`` counts the indices its iterator has handed out.
    """

    orders = tuple(MAP_ORDERS)  # "feistel" for a new run, "permutation" for version 1 states
    # each index yielded is a whole batch's key, read by one dataset[key] (a DataLoader
    # with batch_size=None: the bucket loaders); else a sample's, batch_size to a batch
    yields_batches: ClassVar[bool] = False

    def __init__(
        self,
        data: Sized | int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        batch_size: int = 1,
        rank: int | None = None,
        world_size: int | None = None,
        placement: Placement | None = None,
        indices: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        size = data if isinstance(data, int) else len(data)
        self.indices = None if indices is None else selected_indices(indices, size)
        self.subset = None if self.indices is None else subset_digest(self.indices)
        self.num_samples = size if self.indices is None else len(self.indices)
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.batch_size = batch_size
        self._placement = Placement.fixed(
            rank, world_size, placement
        )  # None: detected at each set_epoch
        self._place()
        self._state = self.start_state(0)
        self._yielded = 0  # by the current iterator, on this rank
        self._order: MapOrder | None = None  # of the last epoch iterated (a permutation's cache)
        # told each batch's indices (with yields_batches, its key) one batch before they are
        # yielded (readers.Loader sets it in the training process: the dataset begins the
        # batch then)
        self.read_ahead: Callable[[Any], None] | None = None
        # the dataset's set_epoch (its random crops): told the epoch each iteration reads
        self.tell_epoch: Callable[[int], None] | None = getattr(data, "set_epoch", None)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` at its beginning (call on every rank before iterating); a
        state loaded for this same epoch is kept, so resumed loops need no special case."""
        self.reset(self._state if epoch == self._state.epoch else self._state.start_of(epoch))

    def __len__(self) -> int:
        return self.split().per_rank

    @property
    def loader_batch_size(self) -> int | None:
        """The DataLoader's ``batch_size`` over this sampler: :attr:`batch_size`, or None
        where each index is a whole batch (:attr:`yields_batches`)."""
        return None if self.yields_batches else self.batch_size

    def __iter__(self) -> Iterator[int]:
        state, self._yielded = self._state, 0
        if self.tell_epoch is not None:  # in the training process, before any index is out
            self.tell_epoch(state.epoch)
        indices = self._rank_indices(state)
        if self.read_ahead is not None:
            indices = announced(indices, self.loader_batch_size, self.read_ahead)
        for index in indices:
            self._yielded += 1
            yield index
        # the whole epoch is out: a state taken now starts the next one
        self._state = state.start_of(state.epoch + 1)
        self._yielded = 0

    def _rank_indices(self, state: EpochState) -> Iterator[int]:
        """This rank's dataset indices of the epoch ``state`` describes, in order."""
        order = self._epoch_order(state)
        for lo, hi in wrapped(self.split(state).rank_ranges(self.rank), self.num_samples):
            for start in range(lo, hi, _CHUNK):  # a chunk at a time, never the whole share
                indices = np.arange(start, min(start + _CHUNK, hi), dtype=np.int64)
                if order is not None:
                    indices = order.indices(indices)
                if self.indices is not None:  # positions of the subset -> dataset indices
                    indices = self.indices[indices]
                yield from indices.tolist()

    def _place(self) -> None:
        """Resolve rank and world size (again: a group may exist by now)."""
        placement = self._placement or Placement.detect()
        self.rank, self.world_size = placement.rank, placement.world_size
        if self.drop_last:
            require_full_batches(self.num_samples, self.world_size, self.batch_size)

    def _epoch_order(self, state: EpochState) -> MapOrder | None:
        """The order ``state`` names, for its epoch (None: the stored order)."""
        if not self.shuffle:
            return None
        order = MAP_ORDERS[state.order](self.num_samples, self.seed, state.epoch)
        if order != self._order:  # equal orders: keep the one whose permutation is made
            self._order = order
        return self._order

    def state_dict(self) -> dict[str, Any]:
        """Small and JSON-ready: epoch, seed, what every rank has not yet been given."""
        split = self.split()
        state = self._state.advanced(split, split.consumed_samples(self._yielded))
        return state.state_dict(self.world_size)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (any world size): the rest of its epoch, then onwards."""
        self.reset(self.loaded_state(state))

    def reset(self, state: EpochState) -> bool:
        self._place()
        self._state = state
        self._yielded = 0
        return False  # the sampler runs in the training process: no worker holds a copy


def selected_indices(indices: Sequence[int] | np.ndarray, size: int) -> np.ndarray:
    """``indices`` (a list, range, NumPy or torch array of integers) as int64, each one
    checked to name a sample of a dataset of ``size``; ValueError says what is wrong."""
    array = np.asarray(indices)
    if array.dtype == bool:
        raise ValueError("subset indices: sample indices, not a boolean mask (np.flatnonzero)")
    if array.size == 0:
        raise ValueError("subset indices select no sample")
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise ValueError(f"subset indices: a flat sequence of integers, not {array.dtype}")
    outside = array[(array < 0) | (array >= size)]
    if outside.size:
        more = f" (and {outside.size - 1} more)" if outside.size > 1 else ""
        raise ValueError(
            f"subset indices: {int(outside[0])}{more} outside 0..{size - 1}, "
            f"the samples of a dataset of {size}"
        )
    return array.astype(np.int64, copy=False)


def announced(
    indices: Iterator[Any], batch_size: int | None, announce: Callable[[Any], None]
) -> Iterator[Any]:
    """``indices``, each batch of ``batch_size`` of them (as the DataLoader cuts them)
    passed to ``announce`` one batch before its first index is yielded: when the DataLoader
    asks for batch ``k``, batch ``k + 1`` is begun (:mod:`readers.batches_ahead`). With
    ``batch_size`` None each index is a batch's key (a bucket loader's), announced as is."""
    waiting: deque[list[Any]] = deque()
    while batch := list(islice(indices, 1 if batch_size is None else batch_size)):
        announce(batch[0] if batch_size is None else batch)
        waiting.append(batch)
        if len(waiting) > 1:
            yield from waiting.popleft()
    while waiting:
        yield from waiting.popleft()
