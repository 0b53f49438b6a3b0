"""Aspect-ratio buckets over a mixture: ``make_loader({name: path}, bs, buckets=...)``.

The epoch is :class:`readers.epochs.bucket_mixture.MixtureBuckets`'s: the mixture's samples
(exact shares, carried over from epoch to epoch) grouped into batches of one bucket each,
the batch count that epoch's own. Dealing, ``set_epoch`` and elastic resume are the single
dataset's (:class:`readers.EpochSampler` over the epoch's batches, ``batch_size=1``, and
:class:`readers.Loader`). The sampler, in the training process, hands out ``(epoch,
bucket, indices)`` (indices of the sources laid end to end) and the DataLoader
(``batch_size=None``) passes each to :class:`BucketMixtureDataset`, which reads it as one
:class:`readers.mixture_dataset.MixtureBatch` cropped to the bucket's shape in one decode
call: batches are ``(images, labels, sources, *fields)``. In the training process
(``num_workers=0``) each batch is begun one batch early, with its own bucket's crop, as the
single dataset's are (:mod:`readers.bucket_dataset`, :mod:`readers.batches_ahead`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from readers.batches_ahead import BatchesAhead, Begun
from readers.bucket_dataset import BucketCrop, BucketLoader, stored_buckets
from readers.dataset import ImageDataset
from readers.epochs.bucket_mixture import EpochBatches, MixtureBuckets
from readers.epochs.buckets import AspectBuckets
from readers.epochs.loading import build_loader
from readers.epochs.mixture import Mixture, WeightsArg
from readers.epochs.sampler import EpochSampler
from readers.epochs.state import EpochState
from readers.mixture_dataset import MixtureBatch, MixtureDataset, MixtureLoader, mixture_collate
from readers.mixture_sources import open_mixture
from readers.placement import Placement

__all__ = [
    "BucketMixtureDataset",
    "BucketMixtureLoader",
    "BucketMixtureSampler",
    "make_bucket_mixture_loader",
]


class BucketMixtureDataset(Dataset):
    """``(epoch, bucket, indices)`` -> the :class:`MixtureBatch` of those samples (indices
    of ``mixture``'s sources laid end to end), cropped to the bucket's shape by ``crop``'s
    :meth:`BucketCrop.for_batch` (``crop``: the one :class:`BucketCrop` every source was
    opened with)."""

    def __init__(self, mixture: MixtureDataset, crop: BucketCrop) -> None:
        if any(d.crop is not crop for d in mixture.datasets.values()):
            raise ValueError("BucketMixtureDataset reads sources opened with its one BucketCrop")
        self.mixture, self.crop = mixture, crop
        self._ahead = BatchesAhead()

    @property
    def datasets(self) -> dict[str, ImageDataset]:
        return self.mixture.datasets

    def __getitem__(self, key: tuple[int, int, Sequence[int]]) -> MixtureBatch:
        """Batch ``key``: as begun by :meth:`read_ahead`, else now."""
        return self._ahead.serve(_key(key), self.begin)

    def read_ahead(self, key: tuple[int, int, Sequence[int]]) -> None:
        """Begin batch ``key`` now, to serve it when :meth:`__getitem__` asks for it, its
        crops decoding on the decode threads meanwhile (as
        :meth:`readers.bucket_dataset.BucketDataset.read_ahead`)."""
        self._ahead.begin(_key(key), partial(self.begin, ahead=True))

    def begin(self, key: Sequence[Any], ahead: bool = False) -> Begun:
        """Batch ``key`` begun with its own :class:`BucketCrop` (the bucket and epoch
        fixed now): :meth:`readers.mixture_dataset.MixtureDataset.begin`."""
        epoch, bucket, indices = key
        crop = self.crop.for_batch(bucket, epoch)
        return self.mixture.begin(list(indices), ahead, crop)


def _key(key: tuple[int, int, Sequence[int]]) -> tuple[int, int, tuple[int, ...]]:
    """A batch's key with its indices as a tuple of ints (keys compare as tuples)."""
    epoch, bucket, indices = key
    return int(epoch), int(bucket), tuple(np.asarray(indices, np.int64).tolist())


class BucketMixtureSampler(EpochSampler):
    """:class:`EpochSampler` over each epoch's batches (their count the epoch's), yielding
    ``(epoch, bucket, indices)``; its state adds ``"mixture"`` and ``"buckets"``."""

    orders = ("mixture-buckets",)
    yields_batches = True

    def __init__(self, plan: MixtureBuckets, reweight: bool = False, **kwargs: Any) -> None:
        self.plan = plan
        self.reweight = reweight
        super().__init__(
            plan.batch_count(0), shuffle=True, seed=plan.mixture.seed, batch_size=1, **kwargs
        )

    @property
    def mixture(self) -> Mixture:
        return self.plan.mixture

    def _sizes(self, epoch: int) -> int:
        return self.plan.batch_count(epoch)

    def start_state(self, epoch: int) -> EpochState:
        start = EpochState.start(epoch, self.seed, self._sizes(epoch), self.orders[0])
        return dataclasses.replace(start, sizes=self._sizes)

    def _saved(self, state: Any) -> EpochState:
        """``state``'s epoch state, its fields checked against its own batch count."""
        try:
            count = int(state["num_samples"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not an imgpack loader state: {e!r}") from None
        return EpochState.from_dict(state, count, self.seed, self.orders)

    def loaded_state(self, state: dict[str, Any]) -> EpochState:
        """``state`` checked against this plan: its epoch's batch count must be the plan's
        (a fresh epoch restarts with the plan's, as a reweighted one may differ)."""
        saved = self._saved(state)
        if saved.fresh:
            return self.start_state(saved.epoch)
        count = self._sizes(saved.epoch)
        if saved.num_samples != count:
            raise ValueError(
                f"loader state has {saved.num_samples} batches in epoch {saved.epoch}, this "
                f"loader's buckets over the mixture make {count}"
            )
        return dataclasses.replace(saved, sizes=self._sizes)

    def take_mixture(self, state: Any) -> None:
        """Adopt the mixture ``state`` records (:meth:`readers.epochs.mixture.Mixture.resumed`)
        and check its buckets (:meth:`MixtureBuckets.check`)."""
        if not isinstance(state, dict) or "mixture" not in state or "buckets" not in state:
            raise ValueError(
                "loader state records no buckets over a mixture: it is another loader's"
            )
        saved = self._saved(state)
        mixture = self.plan.mixture.resumed(
            state["mixture"], saved.epoch, saved.fresh, self.reweight
        )
        plan = self.plan.with_mixture(mixture)
        plan.check(state["buckets"])
        self.plan = plan

    def reset(self, state: EpochState) -> bool:
        self.num_samples = state.num_samples  # this epoch's batch count
        return super().reset(state)

    def _epoch_order(self, state: EpochState) -> EpochBatches:
        return self.plan.epoch(state.epoch)

    def __iter__(self) -> Iterator[tuple[int, int, np.ndarray]]:  # type: ignore[override]
        self.num_samples = self._state.num_samples  # padding positions wrap to this epoch's
        yield from super().__iter__()
        self.num_samples = self._state.num_samples

    def _rank_indices(  # type: ignore[override]
        self, state: EpochState
    ) -> Iterator[tuple[int, int, np.ndarray]]:
        """This rank's batches of the epoch, as :class:`BucketMixtureDataset` keys."""
        batches = self.plan.epoch(state.epoch)
        for batch in super()._rank_indices(state):
            bucket, members = batches.batch_at(batch)
            yield state.epoch, bucket, members

    def state_dict(self) -> dict[str, Any]:
        """:meth:`EpochSampler.state_dict`, the mixture and the buckets (for
        ``StatefulDataLoader``)."""
        own = {"mixture": self.mixture.state_dict(), "buckets": self.plan.state_dict()}
        return {**super().state_dict(), **own}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.take_mixture(state)
        super().load_state_dict(state)


class BucketMixtureLoader(MixtureLoader, BucketLoader):
    """A :class:`MixtureLoader` and a :class:`BucketLoader`: ``sources``, ``buckets`` and
    ``plan`` (a :class:`MixtureBuckets`); ``len()`` counts this rank's batches of the
    current epoch (epochs differ); the state records the mixture and the buckets."""

    source: BucketMixtureSampler  # type: ignore[assignment]


def make_bucket_mixture_loader(
    paths: Mapping[str, str | os.PathLike[str] | ImageDataset],
    batch_size: int,
    buckets: AspectBuckets,
    *,
    weights: WeightsArg = None,
    epoch_size: int | None = None,
    stratify: bool = False,
    reweight: bool = False,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    distributed: bool | None = None,
    drop_last: bool = False,
    fields: Sequence[str] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **dataloader_kwargs: Any,
) -> BucketMixtureLoader:
    """A :class:`BucketMixtureLoader` over the datasets ``paths`` names: batches
    ``(images, labels, sources, *fields)`` of one bucket each, over exactly the samples the
    mixture without buckets reads (:mod:`readers.epochs.bucket_mixture`).

    Args:
        buckets: the :class:`AspectBuckets`.
        stratify: refused (a batch holds one bucket, not each source's share).
        drop_last: drop each bucket's short last batch, and the at most ``world_size - 1``
            batches that do not divide among the ranks (else those are repeated).
        The rest: as :func:`readers.mixture_dataset.make_mixture_loader`.
    """
    for name in ("sampler", "batch_sampler", "batch_size", "crop", "transform"):
        if name in dataloader_kwargs:
            raise ValueError(f"buckets over a mixture choose {name} themselves; do not pass it")
    placement = Placement.for_loader(distributed, rank, world_size)
    crop = BucketCrop(buckets, seed)
    datasets, mixture = open_mixture(
        paths,
        weights=weights,
        epoch_size=epoch_size,
        stratify=stratify,
        shuffle=shuffle,
        seed=seed,
        crop=crop,
        fields=fields,
        storage_options=storage_options,
        cache_dir=cache_dir,
        one_shape=False,
    )
    assignments = tuple(stored_buckets(buckets, d) for d in datasets.values())
    plan = MixtureBuckets(buckets, mixture, assignments, batch_size, drop_last)
    if plan.batch_count(0) == 0:
        raise ValueError(
            f"buckets over the mixture {', '.join(datasets)}: no batch in any bucket in epoch "
            f"0 (batch_size={batch_size}, drop_last={drop_last}, epoch_size={mixture.epoch_size})"
        )
    sampler = BucketMixtureSampler(plan, reweight, drop_last=drop_last, placement=placement)
    bucketed = BucketMixtureDataset(MixtureDataset(datasets), crop)
    dataloader_kwargs.setdefault("collate_fn", mixture_collate)
    kwargs = dataloader_kwargs
    return build_loader(BucketMixtureLoader, sampler, bucketed, None, num_workers, kwargs)
