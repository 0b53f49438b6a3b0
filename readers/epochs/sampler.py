"""A distributed, resumable sampler for the map-style readers (every format).

It does what ``DistributedSampler`` does — one seeded order per epoch, the same on every
rank, each rank its own equal share — and in addition resumes mid-epoch, with the same or
another world size, by the rule in :mod:`readers.epochs.state`; over the whole dataset or a subset
of its indices.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Sized
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from readers.epochs.order import epoch_permutation
from readers.epochs.placement import Placement
from readers.epochs.ranges import positions, wrapped
from readers.epochs.state import EpochSource, require_full_batches, subset_digest

__all__ = ["EpochSampler", "selected_indices"]

_CHUNK = 1 << 16  # indices turned into Python ints at a time (a list of all: 36 B each)


class EpochSampler(EpochSource, Sampler[int]):
    """Indices of this rank's share of each epoch, resumable from :meth:`state_dict`.

    Args:
        data: the dataset (or its length).
        shuffle: a new seeded permutation every epoch; else the stored order.
        seed: base of every epoch's permutation; must be the same on every rank.
        drop_last: drop what does not divide evenly (at most ``world_size - 1`` samples and
            a short last batch) instead of padding by repeating samples.
        batch_size: the DataLoader's, so that ``drop_last`` drops only a short last batch.
        rank, world_size: explicit placement; by default taken from ``torch.distributed``
            or ``RANK``/``WORLD_SIZE`` when the sampler is built and at :meth:`set_epoch`.
        placement: the same as a :class:`readers.epochs.placement.Placement` resolved
            once (what :func:`readers.make_loader` passes).
        indices: read only these dataset indices (a subset: the epochs, shares and resume
            are over them, and the sampler yields dataset indices); default all.

    ``drop_last`` with fewer samples than ``world_size * batch_size`` is a ``ValueError``:
    no rank would have a full batch, and every epoch would be empty.

    Unlike ``DistributedSampler`` it works as a ``StatefulDataLoader`` sampler: its
    ``state_dict`` counts the indices its iterator has handed out.
    """

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
        self._order: tuple[int, np.ndarray] | None = None  # (epoch, permutation) cache
        # a dataset's set_epoch (its random crops), told each epoch it is handed out
        self._dataset_set_epoch = getattr(data, "set_epoch", None)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` at its beginning (call on every rank before iterating); a
        state loaded for this same epoch is kept, so resumed loops need no special case."""
        self._place()
        if epoch != self._state.epoch:
            self._state = self.start_state(epoch)
        self._yielded = 0

    def __len__(self) -> int:
        return self.split().per_rank

    def __iter__(self) -> Iterator[int]:
        state, self._yielded = self._state, 0
        if self._dataset_set_epoch is not None:
            self._dataset_set_epoch(state.epoch)
        split = self.split(state)
        order = self._permutation(state.epoch)
        mine = positions(wrapped(split.rank_ranges(self.rank), self.num_samples))
        indices = order[mine] if order is not None else mine
        if self.indices is not None:  # positions of the subset -> indices of the dataset
            indices = self.indices[indices]
        for start in range(0, len(indices), _CHUNK):  # ints a chunk at a time, not a list
            for index in indices[start : start + _CHUNK].tolist():
                self._yielded += 1
                yield index
        # the whole epoch is out: a state taken now starts the next one
        self._state = self.start_state(state.epoch + 1)
        self._yielded = 0

    def _place(self) -> None:
        """Resolve rank and world size (again: a group may exist by now)."""
        placement = self._placement or Placement.detect()
        self.rank, self.world_size = placement.rank, placement.world_size
        if self.drop_last:
            require_full_batches(self.num_samples, self.world_size, self.batch_size)

    def _permutation(self, epoch: int) -> np.ndarray | None:
        if not self.shuffle:
            return None
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_permutation(self.num_samples, self.seed, epoch))
        return self._order[1]

    def state_dict(self) -> dict[str, Any]:
        """Small and JSON-ready: epoch, seed, what every rank has not yet been given."""
        split = self.split()
        state = self._state.advanced(split, split.consumed_samples(self._yielded))
        return state.state_dict(self.world_size)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (any world size): the rest of its epoch, then onwards."""
        self._place()
        self._state = self.loaded_state(state)
        self._yielded = 0


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
