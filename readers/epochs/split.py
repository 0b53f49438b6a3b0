"""How one epoch's remaining positions are dealt: equal, contiguous slices to ranks, in
batches, and for a stream with several DataLoader workers, one contiguous part of a rank's
slice per worker, cut where read windows start (the rule: :mod:`readers.epochs.state`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import pairwise

import numpy as np

from readers.epochs.ranges import Ranges, subtract, take, total

__all__ = ["Split"]


@dataclass(frozen=True)
class Split:
    """How one epoch's remaining positions are dealt to ranks, batches and (for a stream,
    whose DataLoader workers each read their own part) workers: with several workers, each
    reads one contiguous part of its rank's slice (:meth:`part_sizes`), so that a rank
    reads every read window in one round of requests."""

    remaining: Ranges
    world_size: int
    drop_last: bool
    batch_size: int = 1
    num_workers: int = 1  # a stream's DataLoader workers, each reading one part a rank
    window: int = 1  # positions per read window, where parts are best cut
    parts: tuple[tuple[int, ...], ...] = ()  # per rank, batches per part (see part_sizes)
    turns: tuple[int, ...] = ()  # per rank, the part worker 0 reads (see worker_ranges)

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

    def worker_ranges(self, rank: int, worker: int) -> Ranges:
        """The positions worker ``worker`` reads of rank ``rank``'s slice, in order: part
        ``(worker + turn) % num_workers`` of it (see :meth:`part_sizes`)."""
        part = (worker + self._turn(rank)) % self.num_workers
        lo, hi = self._part_offsets(rank)[part]
        return take(self.rank_ranges(rank), lo, hi - lo)

    def part_sizes(self, rank: int) -> tuple[int, ...]:
        """Batches in each of the ``num_workers`` contiguous parts of rank ``rank``'s slice,
        in the order of the slice; each part is one worker's, so that a worker reads whole
        read windows. Given (``parts``, from a state saved mid-epoch) or cut here: each cut
        at the batch starting a read window nearest ``p / num_workers`` of the slice (the
        parts then differ by about a window), and the part holding a short last batch
        at least as large as any, so that the DataLoader yields that batch last, on every
        rank as on every other."""
        if self.parts:
            return self.parts[rank]
        if rank not in self._sizes:
            self._sizes[rank] = self._cut(rank)
        return self._sizes[rank]

    @cached_property
    def _sizes(self) -> dict[int, tuple[int, ...]]:
        return {}

    def _cut(self, rank: int) -> tuple[int, ...]:
        batches, workers = self.batches, self.num_workers
        base, extra = divmod(batches, workers)
        even = [base + (p >= workers - extra) for p in range(workers)]  # the last ones larger
        if workers == 1 or not batches:
            return tuple(even)
        starts = self._window_starts(rank)
        cuts = [0]
        for target in np.cumsum(even)[:-1].tolist():  # the window start nearest each even cut
            inside = [b for b in starts if cuts[-1] < b < batches]
            cut = min(inside, key=lambda b: abs(b - target)) if inside else target
            cuts.append(max(cut, cuts[-1]))
        cuts.append(batches)
        if self.per_rank % self.batch_size:  # the part with the short batch must end last
            before, last = cuts[-3], cuts[-2]
            others = max((b - a for a, b in pairwise(cuts[:-2])), default=0)
            fits = [
                b for b in starts if before < b <= last and batches - b >= max(others, b - before)
            ]
            if not fits:
                return tuple(even)
            cuts[-2] = max(fits)
        return tuple(b - a for a, b in pairwise(cuts))

    def _window_starts(self, rank: int) -> list[int]:
        """The batches of rank ``rank``'s slice that are the first to start in their read
        window (positions ``p // window``): where a part may begin without sharing a
        window with the part before (but for the few positions of a batch that straddles
        the window's start)."""
        mine = self.rank_ranges(rank)
        lows = np.array([lo for lo, _ in mine], np.int64)
        ends = np.cumsum([hi - lo for lo, hi in mine], dtype=np.int64)
        offsets = np.arange(0, self.per_rank, self.batch_size, dtype=np.int64)
        range_of = np.searchsorted(ends, offsets, side="right")
        first = lows[range_of] + offsets - np.r_[0, ends[:-1]][range_of]
        return (np.flatnonzero(np.diff(first // self.window)) + 1).tolist()

    def _part_offsets(self, rank: int) -> list[tuple[int, int]]:
        """``[start, stop)`` of each part, as offsets into rank ``rank``'s slice."""
        edges = [0, *np.cumsum(self.part_sizes(rank)).tolist()]
        return [
            (min(a * self.batch_size, self.per_rank), min(b * self.batch_size, self.per_rank))
            for a, b in pairwise(edges)
        ]

    def _turn(self, rank: int) -> int:
        return self.turns[rank] if self.turns else 0

    def _yields(self, rank: int, batches: int) -> tuple[list[int], int | None]:
        """Batches yielded from each part of rank ``rank``'s slice after the rank's first
        ``batches``, and the part yielding next (None: none left). The DataLoader takes one
        batch of each worker that has one left, in turn, from worker 0; worker ``j`` reads
        part ``(j + turn) % num_workers``."""
        sizes, workers, turn = self.part_sizes(rank), self.num_workers, self._turn(rank)
        turns = [(j + turn) % workers for j in range(workers)]  # the parts, in turn
        low, high = 0, max(sizes)  # whole rounds: every part with batches left gave one
        while low < high:
            middle = (low + high + 1) // 2
            if sum(min(c, middle) for c in sizes) <= batches:
                low = middle
            else:
                high = middle - 1
        done = [min(c, low) for c in sizes]
        live = [p for p in turns if sizes[p] > low]
        left = batches - sum(done)
        for part in live[:left]:
            done[part] += 1
        return done, live[left] if left < len(live) else None

    def consumed(self, batches: int) -> Ranges:
        """Positions every rank together has yielded after ``batches`` batches each."""
        if self.num_workers == 1:
            return self.consumed_samples(batches * self.batch_size)
        out: list[tuple[int, int]] = []
        for rank in range(self.world_size):
            mine = self.rank_ranges(rank)
            done, _ = self._yields(rank, batches)
            for (lo, hi), count in zip(self._part_offsets(rank), done, strict=True):
                out.extend(take(mine, lo, min(count * self.batch_size, hi - lo)))
        return tuple(out)

    def progress(self, batches: int) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
        """What a resumed run needs to deal the rest as this one would have, after
        ``batches`` batches on every rank: per rank, the batches left in each part and the
        part that yields next (nothing with one worker: the rest is the slice, in order)."""
        if self.num_workers == 1:
            return (), ()
        parts, turns = [], []
        for rank in range(self.world_size):
            done, following = self._yields(rank, batches)
            sizes = self.part_sizes(rank)
            parts.append(tuple(c - d for c, d in zip(sizes, done, strict=True)))
            turns.append(0 if following is None else following)
        return tuple(parts), tuple(turns)

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
