"""Batches of one aspect-ratio bucket each: ``make_bucket_loader(path, batch_size, buckets)``.

The epoch is :class:`readers.epochs.buckets.BucketPlan`'s: each position one batch of one
bucket. Dealing, ``set_epoch`` and elastic resume are the single dataset's
(:class:`readers.EpochSampler` over the batch count, with ``batch_size=1``, and
:class:`readers.Loader`); the sampler hands out ``(epoch, batch)`` pairs and the DataLoader
(``batch_size=None``) passes each to :class:`BucketDataset`, which reads the whole batch in
one :meth:`readers.ImageDataset.begin` of the dataset, its images resized to cover the
bucket's shape and cropped to it inside the decode (the batch's own :class:`BucketCrop`,
made when the batch is begun: the kernel and the Python path alike). In the training
process (``num_workers=0``) the sampler announces each key one batch early and the batch is
begun then, its crops decoding on the decode threads (:mod:`readers.batches_ahead`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from readers.batch import SampleBatch, collate
from readers.batches_ahead import BatchesAhead, Begun
from readers.dataset import ImageDataset
from readers.epochs.buckets import AspectBuckets, BucketPlan
from readers.epochs.loading import (
    Loader,
    build_loader,
    opened_dataset,
    refuse_chosen,
    with_read_options,
)
from readers.epochs.sampler import EpochSampler, selected_indices
from readers.epochs.state import EpochState, subset_digest
from readers.images.crop import Crop, uniforms
from readers.placement import Placement

__all__ = [
    "BucketCrop",
    "BucketDataset",
    "BucketLoader",
    "BucketSampler",
    "make_bucket_loader",
    "stored_buckets",
]


class BucketCrop(Crop):
    """Resize to cover bucket ``bucket``'s shape (aspect kept), crop to it: centred, or at
    an offset drawn from ``(seed, epoch, sample index)`` with ``jitter``; mirrored with
    probability 1/2 with ``flip``, drawn alike.

    The shape is the batch's: the dataset is opened with one :class:`BucketCrop` (so that
    one dataset, with one set of open shards, serves every bucket), and each batch is read
    with its own, :meth:`for_batch` (made when the batch is begun, never changed after: a
    batch begun ahead keeps its bucket while the one before it finishes).
    """

    def __init__(
        self, buckets: AspectBuckets, seed: int = 0, bucket: int = 0, epoch: int = 0
    ) -> None:
        self.buckets = buckets
        self.seed = seed
        self.flip = buckets.flip
        self.bucket, self.epoch = bucket, epoch
        self.size = buckets.sizes[bucket]

    def for_batch(self, bucket: int, epoch: int) -> BucketCrop:
        """This crop for a batch of bucket ``bucket`` with epoch ``epoch``'s draws (a new
        crop; this one is left as it is)."""
        return BucketCrop(self.buckets, self.seed, bucket, epoch)

    def boxes(self, sizes: np.ndarray, indices: np.ndarray) -> np.ndarray:
        """The largest box of the bucket's aspect in each image (what resizing to cover
        and cropping keeps), centred as :class:`readers.CenterCrop` centres, or jittered."""
        h, w = np.asarray(sizes, dtype=np.int64).T
        oh, ow = self.size
        fit = np.minimum(h / oh, w / ow)
        bh = np.clip(np.rint(oh * fit), 1, h).astype(np.int64)  # rint: 224.0 - 1e-14
        bw = np.clip(np.rint(ow * fit), 1, w).astype(np.int64)
        u = uniforms(self.seed, self.epoch, indices, 3)
        if self.buckets.jitter:
            top = np.floor(u[:, 0] * (h - bh + 1)).astype(np.int64)
            left = np.floor(u[:, 1] * (w - bw + 1)).astype(np.int64)
        else:
            top = np.rint((h - bh) / 2).astype(np.int64)
            left = np.rint((w - bw) / 2).astype(np.int64)
        flip = (u[:, 2] < 0.5) if self.flip else np.zeros(len(h), dtype=bool)
        return np.stack([top, left, bh, bw, flip.astype(np.int64)], axis=1)

    def __repr__(self) -> str:
        where = f", bucket={self.bucket}, epoch={self.epoch}" if self.bucket or self.epoch else ""
        return f"BucketCrop({self.buckets!r}, seed={self.seed}{where})"


class BucketDataset(Dataset):
    """Batch ``(epoch, batch)`` of a :class:`BucketPlan`, read from ``dataset`` (opened
    with a :class:`BucketCrop`) as one :class:`readers.SampleBatch` of one shape.

    ``indices``: the dataset indices the plan's samples stand for (a subset), else all."""

    def __init__(
        self, dataset: ImageDataset, plan: BucketPlan, indices: np.ndarray | None = None
    ) -> None:
        if not isinstance(dataset.crop, BucketCrop):
            raise ValueError("BucketDataset reads a dataset opened with crop=BucketCrop(...)")
        self.dataset = dataset
        self.crop: BucketCrop = dataset.crop
        self.plan = plan
        self.indices = indices
        self._ahead = BatchesAhead()

    @property
    def classes(self) -> list[str]:
        return list(self.dataset.classes)

    def samples(self, epoch: int, batch: int) -> tuple[int, np.ndarray]:
        """The bucket and the dataset indices of layout batch ``batch`` of ``epoch``."""
        bucket, members = self.plan.batch_at(epoch, batch)
        return bucket, members if self.indices is None else self.indices[members]

    def __getitem__(self, key: tuple[int, int]) -> SampleBatch:
        """Batch ``key``, ``(epoch, batch)``: as begun by :meth:`read_ahead`, else now."""
        return self._ahead.serve(key, self.begin)

    def read_ahead(self, key: tuple[int, int]) -> None:
        """Begin batch ``key`` now, to serve it when :meth:`__getitem__` asks for it, its
        crops decoding on the decode threads meanwhile (:class:`readers.Loader` announces
        each key one batch early in the training process)."""
        self._ahead.begin(key, partial(self.begin, ahead=True))

    def begin(self, key: Sequence[int], ahead: bool = False) -> Begun:
        """Batch ``key`` begun with its own :class:`BucketCrop` (the bucket and epoch
        fixed now): :meth:`readers.ImageDataset.begin`."""
        epoch, batch = key
        bucket, indices = self.samples(epoch, batch)
        crop = self.crop.for_batch(bucket, epoch)
        return self.dataset.begin(indices.tolist(), ahead, crop)


class _BatchOrder:
    """Positions of the epoch -> layout batches (the plan's seeded order, or as laid out)."""

    def __init__(self, plan: BucketPlan, epoch: int) -> None:
        self.order = plan.batch_order(epoch)

    def indices(self, positions: np.ndarray) -> np.ndarray:
        return positions if self.order is None else self.order.indices(positions)


class BucketSampler(EpochSampler):
    """:class:`EpochSampler` over a :class:`BucketPlan`'s batches, one position each,
    yielding ``(epoch, batch)`` for :class:`BucketDataset`; its state adds ``"buckets"``."""

    orders = ("buckets",)
    yields_batches = True

    def __init__(self, plan: BucketPlan, **kwargs: Any) -> None:
        super().__init__(plan.num_batches, shuffle=True, seed=plan.seed, batch_size=1, **kwargs)
        self.plan = plan

    def _epoch_order(self, state: EpochState) -> _BatchOrder:
        return _BatchOrder(self.plan, state.epoch)

    def _rank_indices(  # type: ignore[override]
        self, state: EpochState
    ) -> Iterator[tuple[int, int]]:
        """This rank's batches of the epoch, as :class:`BucketDataset` keys."""
        for batch in super()._rank_indices(state):
            yield state.epoch, batch

    def state_dict(self) -> dict[str, Any]:
        """:meth:`EpochSampler.state_dict` and the plan (for ``StatefulDataLoader``)."""
        return {**super().state_dict(), "buckets": self.plan.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "buckets" in state:  # Loader hands over a plain EpochState it checked itself
            self.plan.check(state["buckets"])
        super().load_state_dict(state)


class BucketLoader(Loader):
    """A :class:`Loader` of bucketed batches: ``len()`` counts batches on this rank, and
    the state records the buckets' sizes, batching and a checksum of the assignment."""

    source: BucketSampler

    @property
    def buckets(self) -> AspectBuckets:
        return self.source.plan.buckets

    @property
    def plan(self) -> BucketPlan:
        return self.source.plan

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "buckets": self.source.plan.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (any world size or workers); a state of other buckets,
        batch size, ``drop_last`` or samples is a ``ValueError`` naming the difference."""
        if not isinstance(state, dict) or "buckets" not in state:
            raise ValueError("loader state records no buckets: it is not a bucketed loader's")
        self.source.plan.check(state["buckets"])
        super().load_state_dict(state)


def stored_buckets(buckets: AspectBuckets, dataset: ImageDataset) -> np.ndarray:
    """Each sample's bucket (:meth:`AspectBuckets.assign`) from the sizes the shards record,
    read a shard at a time: a plan never holds every sample's int64 size (16 bytes a sample,
    16 GB a rank at a billion), as :attr:`readers.ImageDataset.sizes` would for the
    dataset's life."""
    parts = [buckets.assign(shard.sizes()) for shard in dataset.each_shard()]
    return np.concatenate(parts) if parts else buckets.assign(np.empty((0, 2), np.int64))


def make_bucket_loader(
    path: str | os.PathLike[str] | ImageDataset,
    batch_size: int,
    buckets: AspectBuckets,
    *,
    indices: Sequence[int] | np.ndarray | None = None,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    distributed: bool | None = None,
    drop_last: bool = False,
    decode_threads: int | None = None,
    fields: Sequence[str] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **dataloader_kwargs: Any,
) -> BucketLoader:
    """A :class:`BucketLoader` over the dataset at ``path`` (any format, map-style):
    batches ``(images, labels, *fields)``, ``images`` uint8 ``[B, 3, h, w]`` of the batch's
    bucket (:mod:`readers.epochs.buckets` says which samples go where and the order).

    Args:
        buckets: the :class:`AspectBuckets`.
        drop_last: drop each bucket's short last batch, and the at most ``world_size - 1``
            batches that do not divide among the ranks (else those are repeated, as
            :mod:`readers.epochs.state` pads).
        shuffle: each bucket's samples and the batches' order seeded anew each epoch;
            else stored order, bucket after bucket.
        The rest: as :func:`readers.make_loader`.
    """
    chosen = ("sampler", "batch_sampler", "batch_size", "crop", "transform")
    refuse_chosen("make_bucket_loader", chosen, dataloader_kwargs)
    placement = Placement.for_loader(distributed, rank, world_size)
    opened = opened_dataset(path, storage_options, cache_dir)
    crop = BucketCrop(buckets, seed)
    dataset = with_read_options(opened, None, decode_threads, True, crop, fields)
    chosen = None if indices is None else selected_indices(indices, len(dataset))
    assignment = stored_buckets(buckets, dataset)
    assignment = assignment if chosen is None else assignment[chosen]
    subset = None if chosen is None else subset_digest(chosen)
    plan = BucketPlan(buckets, assignment, batch_size, drop_last, seed, shuffle, subset)
    if plan.num_batches == 0:
        raise ValueError(
            f"{dataset.manifest.location}: no batch in any bucket (batch_size={batch_size}, "
            f"drop_last={drop_last}, {len(assignment)} samples)"
        )
    sampler = BucketSampler(plan, drop_last=drop_last, placement=placement)
    bucketed = BucketDataset(dataset, plan, chosen)
    dataloader_kwargs.setdefault("collate_fn", collate)
    return build_loader(BucketLoader, sampler, bucketed, None, num_workers, dataloader_kwargs)
