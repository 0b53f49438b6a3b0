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
  a stream with ``K`` DataLoader workers deals its slice to them in **blocks**, the whole
  batches that start in one read window (``p // window``), block of window ``w`` to
  worker ``(w - turn) % K``, the short last batch to the worker that yields last. Each
  worker reads its blocks in order, one round of requests a block, and the DataLoader
  takes one batch of each worker that has one left in turn: the rank yields ``K`` windows
  interleaved (with one worker, or none, its slice in order).
* A state saved mid-epoch by a stream with ``K > 1`` workers also stores, per rank, the
  worker class that yields next (``turns``, with ``workers``); a run resumed with the same
  world size and workers deals the rest with them and continues exactly as the
  uninterrupted run would have; any other shape deals the rest afresh (every sample once).

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

import hashlib
from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise
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
    workers: int = 1  # a stream's DataLoader workers, for which ``turns`` were counted
    turns: tuple[int, ...] = ()  # per rank, see Split._deal (a stream with workers only)

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

    def advanced(self, split: Split, consumed: Ranges, turns: tuple[int, ...] = ()) -> EpochState:
        """This state once ``consumed`` (from ``split``) is read, each rank's next worker
        class being ``turns``: the next epoch's start once every rank has had its whole
        slice."""
        left = split.after(consumed)
        if not left:
            return self.start_of(self.epoch + 1)
        workers = split.num_workers if turns else 1
        return EpochState(
            self.epoch, self.seed, self.num_samples, left, self.order, self.subset, workers, turns
        )

    def split_turns(self, world_size: int, num_workers: int) -> tuple[int, ...]:
        """The turns to deal this state with: its own where they were counted for this
        world and these workers; a resumed run of another shape deals afresh."""
        fits = self.workers == num_workers and len(self.turns) == world_size
        return self.turns if fits else ()

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
        if self.turns:  # a stream read by several workers, mid-epoch
            state.update(workers=self.workers, turns=list(self.turns))
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
        if workers < 1 or not all(0 <= t < workers for t in turns):
            raise ValueError(f"loader state has turns {list(turns)} outside {workers} workers")
        return cls(epoch, seed, num_samples, remaining, order, subset, workers, turns)


@dataclass(frozen=True)
class Split:
    """How one epoch's remaining positions are dealt to ranks, batches and (for a stream,
    whose DataLoader workers each read their own part) workers: with several workers, each
    takes whole read windows of its rank's slice (:meth:`_deal`), so that a rank reads
    every window in one round of requests."""

    remaining: Ranges
    world_size: int
    drop_last: bool
    batch_size: int = 1
    num_workers: int = 1  # a stream's DataLoader workers, each reading whole blocks
    window: int = 1  # positions per read window: a block is the batches starting in one
    turns: tuple[int, ...] = ()  # per rank, the worker class yielding first (see _deal)

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

    def worker_blocks(self, rank: int, worker: int) -> list[Ranges]:
        """The blocks worker ``worker`` reads of rank ``rank``'s slice (see :meth:`_deal`),
        in the order of the slice: each one round of requests from object storage."""
        mine = self.rank_ranges(rank)
        return [take(mine, lo, hi - lo) for w, lo, hi in self._deal(rank) if w == worker]

    def worker_ranges(self, rank: int, worker: int) -> Ranges:
        """The positions worker ``worker`` reads of rank ``rank``'s slice, in order."""
        return merge_adjacent([r for b in self.worker_blocks(rank, worker) for r in b])

    @cached_property
    def _deals(self) -> dict[int, list[tuple[int, int, int]]]:
        return {}

    def _deal(self, rank: int) -> list[tuple[int, int, int]]:
        """``(worker, start, stop)``: which worker reads each block of rank ``rank``'s slice
        (offsets into the slice). A block is the whole batches that start in one read
        window (positions ``p // window`` alike), so one round of requests serves it; a
        block goes to worker ``(p // window - turn) % num_workers``, a rule of positions
        that a resumed run, given the rank's ``turn``, deals the same way. A short last
        batch is a block of its own, for the last worker with the most batches: the
        DataLoader then yields it last, as every rank does."""
        if rank not in self._deals:
            self._deals[rank] = self._blocks(rank)
        return self._deals[rank]

    def _blocks(self, rank: int) -> list[tuple[int, int, int]]:
        length, batch, workers = self.per_rank, self.batch_size, self.num_workers
        if not length:
            return []
        mine = self.rank_ranges(rank)
        lows = np.array([lo for lo, _ in mine], np.int64)
        ends = np.cumsum([hi - lo for lo, hi in mine], dtype=np.int64)
        full = length - length % batch
        offsets = np.arange(0, full, batch, dtype=np.int64)
        range_of = np.searchsorted(ends, offsets, side="right")
        first = lows[range_of] + offsets - np.r_[0, ends[:-1]][range_of]  # each batch's
        keys = first // self.window
        bounds = [0, *(np.flatnonzero(np.diff(keys)) + 1).tolist(), len(offsets)]
        turn = self.turns[rank] if self.turns else 0
        blocks = [
            (int(keys[a] - turn) % workers, a * batch, b * batch)
            for a, b in pairwise(bounds)
            if b > a
        ]
        if full < length:
            counts = self._batch_counts(blocks)
            top = max(counts)
            blocks.append((max(w for w in range(workers) if counts[w] == top), full, length))
        return blocks

    def _batch_counts(self, blocks: list[tuple[int, int, int]]) -> list[int]:
        counts = [0] * self.num_workers
        for worker, lo, hi in blocks:
            counts[worker] += -(-(hi - lo) // self.batch_size)
        return counts

    def _yields(self, rank: int, batches: int) -> tuple[list[int], int | None]:
        """Batches each worker of rank ``rank`` has yielded after the rank's first
        ``batches``, and the worker yielding next (None: none left). The DataLoader takes
        one batch of each worker that has one left, in turn."""
        counts = self._batch_counts(self._deal(rank))
        low, high = 0, max(counts)  # the last round every worker with batches took part in
        while low < high:
            middle = (low + high + 1) // 2
            if sum(min(c, middle) for c in counts) <= batches:
                low = middle
            else:
                high = middle - 1
        done = [min(c, low) for c in counts]
        live = [w for w, c in enumerate(counts) if c > low]
        left = batches - sum(done)
        for worker in live[:left]:
            done[worker] += 1
        return done, live[left] if left < len(live) else None

    def consumed(self, batches: int) -> Ranges:
        """Positions every rank together has yielded after ``batches`` batches each."""
        if self.num_workers == 1:
            return self.consumed_samples(batches * self.batch_size)
        out: list[tuple[int, int]] = []
        for rank in range(self.world_size):
            done, _ = self._yields(rank, batches)
            for worker, count in enumerate(done):
                read = self.worker_ranges(rank, worker)
                out.extend(take(read, 0, min(count * self.batch_size, total(read))))
        return tuple(out)

    def turns_after(self, batches: int) -> tuple[int, ...]:
        """Each rank's ``turn`` once it has yielded ``batches``: the worker class (see
        :meth:`_deal`) that yields next, so that a resumed run's worker 0 is that one."""
        if self.num_workers == 1:
            return ()
        turns = []
        for rank in range(self.world_size):
            _, following = self._yields(rank, batches)
            turn = self.turns[rank] if self.turns else 0
            turns.append(0 if following is None else (turn + following) % self.num_workers)
        return tuple(turns)

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
    read_window: int = 1  # positions a worker reads in one round (a stream's, see Split)

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

    def split(self, state: EpochState | None = None, num_workers: int = 1) -> Split:
        """How ``state`` (default: the one the next iteration starts from) is dealt, to
        ``num_workers`` DataLoader workers per rank (a stream's; a sampler deals in the
        training process)."""
        state = state or self._state
        return Split(
            state.remaining,
            self.world_size,
            self.drop_last,
            self.batch_size or 1,
            num_workers,
            self.read_window,
            state.split_turns(self.world_size, num_workers),
        )
