"""A weighted mixture of datasets as one epoch order: slot -> (source, sample), exact shares.

A mixture epoch is ``epoch_size`` positions, dealt to ranks and workers and resumed by the
rule of :mod:`readers.epochs.state` like any epoch; this module says which sample of which
source each position names, position by position (O(1) memory, any position at once):

* **Shares.** Epoch ``e``'s weights (a schedule of ``(first epoch, weights)`` steps) give
  each source ``k`` exactly ``c_k`` of the epoch's slots: ``w_k / sum(w) * epoch_size``
  rounded down, the slots left over going one each to the largest remainders (ties to the
  source named first): Hamilton's largest-remainder rounding, so ``sum(c) == epoch_size``.
* **Interleaving.** Source ``k`` holds slots ``[C_k, C_k + c_k)`` (``C`` the cumulative
  shares) and position ``p`` reads slot ``FeistelOrder(epoch_size, seed, e)(p)``: the
  sources interleaved in a seeded shuffle of the epoch. With ``stratify=True`` position
  ``p`` is given to sources in turn, largest share first, by a Bresenham line each over
  the positions the sources before it left (seeded phases): any run of ``B`` consecutive
  positions, a batch, holds ``B * c_k / epoch_size`` of the first source within one
  sample, of each later one within one more per source before it.
* **Samples.** The ``j``-th slot of source ``k`` in epoch ``e`` is its draw number
  ``g = D_k(e) + j``, ``D_k(e)`` the draws of all epochs before (the schedule's sum, O(steps)):
  pass ``g // n_k`` of the source, position ``g % n_k`` of that pass's seeded order
  (:class:`FeistelOrder` keyed by the source's name), so a source repeats no sample before
  all of it was seen, whatever the epochs, and a share larger than the source starts a
  fresh order for each pass.

:class:`Mixture` is that description (sources by name, length and content checksum, the
schedule, the epoch size, the seed, ``stratify``) and its state: small, JSON-ready, and
checked on resume (:meth:`Mixture.resumed`).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from readers.epochs.order import FeistelOrder

__all__ = ["Mixture", "MixtureOrder", "MixtureSource", "Schedule", "largest_remainder"]

Schedule = tuple[tuple[int, tuple[float, ...]], ...]  # (first epoch, weights in source order)
WeightsArg = Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]] | None


def largest_remainder(weights: Sequence[float], total: int) -> tuple[int, ...]:
    """``total`` split in proportion to ``weights``: each share rounded down, the rest one
    each to the largest remainders (ties to the earlier weight); sums to ``total``."""
    w = np.asarray(weights, dtype=np.float64)
    quotas = w / w.sum() * total
    shares = np.floor(quotas).astype(np.int64)
    left = total - int(shares.sum())
    order = sorted(range(len(w)), key=lambda k: (-(quotas[k] - shares[k]), k))
    for k in order[:left]:
        shares[k] += 1
    return tuple(int(s) for s in shares)


@dataclass(frozen=True)
class MixtureSource:
    """One source as a state records it: its name, samples and content checksum."""

    name: str
    samples: int
    checksum: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "samples": self.samples, "checksum": self.checksum}


def make_schedule(weights: WeightsArg, sources: Sequence[MixtureSource]) -> Schedule:
    """``weights=`` as a schedule: None (shares by the sources' lengths), one mapping of
    names to weights, or a list of ``(first epoch, mapping)`` steps starting at epoch 0;
    ValueError names what is wrong."""
    names = [s.name for s in sources]
    if weights is None:
        return ((0, tuple(float(s.samples) for s in sources)),)
    steps = [(0, weights)] if isinstance(weights, Mapping) else list(weights)
    out: list[tuple[int, tuple[float, ...]]] = []
    for step in steps:
        try:
            epoch, mapping = step
        except (TypeError, ValueError):
            raise ValueError(f"weights= step {step!r}: an (epoch, {{name: weight}}) pair") from None
        if not isinstance(mapping, Mapping) or set(mapping) != set(names):
            given = sorted(mapping) if isinstance(mapping, Mapping) else mapping
            raise ValueError(f"weights= {given!r}: one weight for each source of {names}")
        values = tuple(float(mapping[name]) for name in names)
        if not all(v >= 0 for v in values) or not sum(values) > 0:
            raise ValueError(f"weights= {dict(mapping)!r}: weights >= 0, not all 0")
        if not isinstance(epoch, int) or epoch < 0 or (out and epoch <= out[-1][0]):
            raise ValueError(f"weights= step epochs increase from 0, not {epoch!r}")
        out.append((epoch, values))
    if not out or out[0][0] != 0:
        raise ValueError("weights= schedule: its first step is epoch 0")
    return tuple(out)


@dataclass(frozen=True)
class Mixture:
    """Sources, schedule, epoch size, seed and ``stratify``: the whole of a mixture's order,
    and the reweights a resumed run recorded (``changes``)."""

    sources: tuple[MixtureSource, ...]
    schedule: Schedule
    epoch_size: int
    seed: int = 0
    stratify: bool = False
    shuffle: bool = True
    changes: tuple[dict[str, Any], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sources)

    def weights_at(self, epoch: int) -> tuple[float, ...]:
        """The weights of the schedule's step that ``epoch`` falls in."""
        return [w for first, w in self.schedule if first <= epoch][-1]

    def counts(self, epoch: int) -> tuple[int, ...]:
        """Slots of each source in ``epoch`` (largest-remainder rounding)."""
        return largest_remainder(self.weights_at(epoch), self.epoch_size)

    def drawn_before(self, epoch: int) -> np.ndarray:
        """Draws of each source in all epochs before ``epoch`` (O(schedule steps))."""
        drawn = np.zeros(len(self.sources), dtype=np.int64)
        bounds = [first for first, _ in self.schedule[1:]] + [epoch]
        for (first, _), stop in zip(self.schedule, bounds, strict=True):
            if first >= epoch:
                break
            span = min(stop, epoch) - first
            drawn += np.asarray(self.counts(first), np.int64) * span
        return drawn

    def order(self, epoch: int) -> MixtureOrder:
        return MixtureOrder(self, epoch)

    def state_dict(self) -> dict[str, Any]:
        return {
            "sources": [s.to_json() for s in self.sources],
            "schedule": [[e, dict(zip(self.names, w, strict=True))] for e, w in self.schedule],
            "epoch_size": self.epoch_size,
            "stratify": self.stratify,
            "shuffle": self.shuffle,
            "changes": [dict(c) for c in self.changes],
        }

    def resumed(self, state: Any, epoch: int, fresh: bool, reweight: bool = False) -> Mixture:
        """The mixture to go on with from a loader state's ``"mixture"`` saved at ``epoch``
        (``fresh``: nothing of it read yet). Its sources, epoch size and ``stratify`` must
        be this one's; its schedule too, unless ``reweight``: then this mixture's weights
        apply from ``epoch`` (fresh) or the next one, the epochs before keep the saved
        schedule (so no source repeats early), and the change is recorded in ``changes``.

        Raises:
            ValueError: naming the difference (and ``reweight=True`` for weights).
        """
        try:
            sources = tuple(
                MixtureSource(str(s["name"]), int(s["samples"]), s.get("checksum"))
                for s in state["sources"]
            )
            names = tuple(s.name for s in sources)
            schedule = tuple(
                (int(e), tuple(float(w[name]) for name in names)) for e, w in state["schedule"]
            )
            epoch_size, stratify = int(state["epoch_size"]), bool(state["stratify"])
            shuffle = bool(state.get("shuffle", True))
            changes = tuple(dict(c) for c in state.get("changes", ()))
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not an imgpack mixture state: {e!r}") from None
        if sources != self.sources:
            raise ValueError(
                f"loader state mixes {_shown(sources)}, this loader {_shown(self.sources)}"
            )
        for name, saved, own in (
            ("epoch_size", epoch_size, self.epoch_size),
            ("stratify", stratify, self.stratify),
            ("shuffle", shuffle, self.shuffle),
        ):
            if saved != own:
                raise ValueError(f"loader state has {name}={saved!r}, this loader {name}={own!r}")
        saved = dataclasses.replace(self, schedule=schedule, changes=changes)
        if schedule == self.schedule:
            return saved
        if not reweight:
            raise ValueError(
                f"loader state has the weights {_steps(names, schedule)}, this loader "
                f"{_steps(names, self.schedule)}: pass reweight=True to apply the new ones "
                "from the saved position on"
            )
        start = epoch if fresh else epoch + 1
        merged = [step for step in schedule if step[0] < start]
        merged.append((start, self.weights_at(start)))
        merged += [step for step in self.schedule if step[0] > start]
        change = {"epoch": start, "weights": _steps(names, self.schedule)}
        return dataclasses.replace(self, schedule=tuple(merged), changes=(*changes, change))


def _shown(sources: Sequence[MixtureSource]) -> str:
    return ", ".join(f"{s.name} ({s.samples} samples, checksum {s.checksum})" for s in sources)


def _steps(names: Sequence[str], schedule: Schedule) -> list[Any]:
    return [[e, dict(zip(names, w, strict=True))] for e, w in schedule]


def source_seed(seed: int, name: str) -> int:
    """The seed of a source's own orders: the mixture's seed and the source's name."""
    sequence = np.random.SeedSequence([seed, zlib.crc32(name.encode())])
    return int(sequence.generate_state(1, np.uint64)[0])


@dataclass(frozen=True)
class MixtureOrder:
    """Epoch ``epoch`` of ``mixture`` as a map order: positions -> (source, sample)."""

    mixture: Mixture
    epoch: int

    @cached_property
    def _counts(self) -> np.ndarray:
        return np.asarray(self.mixture.counts(self.epoch), np.int64)

    @cached_property
    def _drawn(self) -> np.ndarray:
        return self.mixture.drawn_before(self.epoch)

    @cached_property
    def _seeds(self) -> list[int]:
        return [source_seed(self.mixture.seed, name) for name in self.mixture.names]

    def slots(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each position's source and its slot number among that source's this epoch."""
        positions = np.asarray(positions, np.int64)
        mixture, counts = self.mixture, self._counts
        if mixture.stratify:
            return self._stratified(positions)
        slots = positions
        if mixture.shuffle:
            slots = FeistelOrder(mixture.epoch_size, mixture.seed, self.epoch).indices(positions)
        starts = np.concatenate([[0], np.cumsum(counts)])
        source = np.searchsorted(starts[1:], slots, side="right")
        return source, slots - starts[source]

    def _stratified(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bresenham lines, largest share first, each over the positions left before it."""
        counts = self._counts
        source = np.full(len(positions), -1, np.int64)
        slot = np.zeros(len(positions), np.int64)
        local, left = positions.copy(), self.mixture.epoch_size
        open_ = np.ones(len(positions), bool)
        ranked = sorted(range(len(counts)), key=lambda k: (-counts[k], k))
        phases = np.random.SeedSequence([self.mixture.seed, self.epoch, 0x57A7])
        phase_draws = phases.generate_state(len(counts), np.uint64)
        for turn, k in enumerate(ranked):
            c = int(counts[k])
            if turn == len(ranked) - 1:
                source[open_], slot[open_] = k, local[open_]
                break
            if not c:
                continue
            phase = np.int64(int(phase_draws[turn]) % left)
            q = local[open_]
            before = (q * c + phase) // left
            hit = (q + 1) * c + phase >= (before + 1) * left
            rows = np.flatnonzero(open_)
            source[rows[hit]], slot[rows[hit]] = k, before[hit]
            local[rows[~hit]] = q[~hit] - before[~hit]
            open_[rows[hit]] = False
            left -= c
        return source, slot

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each position's source and the sample of it read there."""
        source, slot = self.slots(positions)
        draw = self._drawn[source] + slot
        lengths = np.asarray([s.samples for s in self.mixture.sources], np.int64)
        passes, within = np.divmod(draw, lengths[source])
        sample = within.copy()
        if self.mixture.shuffle:
            for k, p in set(zip(source.tolist(), passes.tolist(), strict=True)):
                rows = np.flatnonzero((source == k) & (passes == p))
                order = FeistelOrder(int(lengths[k]), self._seeds[k], int(p))
                sample[rows] = order.indices(within[rows])
        return source, sample
