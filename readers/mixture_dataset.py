"""Several datasets read as one weighted mixture: ``make_mixture_loader({name: path}, ...)``.

The order (which sample of which source each position of an epoch names, with exact
shares) is :mod:`readers.epochs.mixture`; the dealing, ``set_epoch`` and elastic resume are
the single dataset's (:class:`readers.EpochSampler` and :class:`readers.Loader`), the
sampler handing out indices of the sources laid end to end (:class:`MixtureDataset`).
Batches are ``(images, labels, sources)``, ``sources`` an int64 tensor indexing
``loader.sources``.
"""

from __future__ import annotations

import itertools
import os
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from functools import partial
from itertools import accumulate
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from readers.batch import SampleBatch, new_batch
from readers.batch_pool import hand_over
from readers.batches_ahead import BatchesAhead, Begun
from readers.dataset import ImageDataset
from readers.dataset_reads import StoredBatch
from readers.epochs.loading import Loader, build_loader
from readers.epochs.mixture import Mixture, MixtureOrder, WeightsArg
from readers.epochs.sampler import EpochSampler
from readers.epochs.state import EpochState
from readers.fields import FieldSpec
from readers.images.crop import Crop
from readers.images.fused import CropsUnderWay, start_crops
from readers.images.pool import DecodePool
from readers.mixture_sources import open_mixture
from readers.placement import Placement, default_decode_threads

__all__ = [
    "MixtureBatch",
    "MixtureDataset",
    "MixtureLoader",
    "make_mixture_loader",
    "mixture_collate",
]


class MixtureBatch(SampleBatch):
    """A :class:`SampleBatch` that also says each sample's source (its index in the names)."""

    def __init__(
        self,
        images: Any,
        labels: torch.Tensor,
        sources: torch.Tensor,
        field_values: Sequence[list[Any]] = (),
        specs: Sequence[FieldSpec] = (),
    ) -> None:
        super().__init__(images, labels, field_values, specs)
        self.sources = sources

    def __getitem__(self, i):  # type: ignore[override]
        values = (column[i] for column in self.field_values)
        return self.images[i], int(self.labels[i]), int(self.sources[i]), *values


class MixtureDataset(Dataset):
    """The sources laid end to end: index ``offset[k] + i`` is sample ``i`` of source ``k``,
    served as ``(image, label, k)``; a batch reads each source's samples in one call."""

    def __init__(self, datasets: Mapping[str, ImageDataset]) -> None:
        self.datasets = dict(datasets)
        self.names = tuple(self.datasets)
        self.offsets = np.asarray([0, *accumulate(len(d) for d in self.datasets.values())])
        self._pool = DecodePool()  # the crops' threads, as each dataset has its own
        self._ahead = BatchesAhead()

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _split(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        source = np.searchsorted(self.offsets[1:], index, side="right")
        return source, index - self.offsets[source]

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        source, local = self._split(np.asarray([index]))
        image, label, *values = self.datasets[self.names[int(source[0])]][int(local[0])]
        return image, label, int(source[0]), *values

    def __getitems__(self, indices: Sequence[int]) -> MixtureBatch:
        """The samples ``indices`` names, their rows grouped by source (in the order of
        the names). With ``crop=`` every source's samples are decoded in one call, straight
        into the batch (a call per source costs each its own wait for the decode threads).
        A batch announced by :meth:`read_ahead` is served as begun then."""
        return self._ahead.serve(indices, self.begin)

    def read_ahead(self, indices: Sequence[int]) -> None:
        """Begin the batch ``indices`` now, its crops decoding on the decode threads while
        this thread goes on, as :meth:`readers.ImageDataset.read_ahead` does."""
        self._ahead.begin(indices, partial(self.begin, ahead=True))

    def begin(self, indices: Sequence[int], ahead: bool = False, crop: Crop | None = None) -> Begun:
        """The batch ``indices`` begun: with ``crop=``, every source's stored samples read
        and their crops started (on the decode threads alone with ``ahead``); else read
        whole by ``finish()``. ``crop``: this batch's, in place of the sources' own (a
        bucket's shape: :mod:`readers.bucket_mixture_dataset`)."""
        source, local = self._split(np.asarray(indices, np.int64))
        grouped = np.argsort(source, kind="stable")
        source, local = source[grouped], local[grouped]
        bounds = np.searchsorted(source, np.arange(len(self.names) + 1)).tolist()
        parts = [
            (self.datasets[self.names[k]], local[lo:hi].tolist())
            for k, (lo, hi) in enumerate(itertools.pairwise(bounds))
            if lo < hi
        ]
        first = self.datasets[self.names[0]]
        cropping = first.crop if crop is None else crop  # one decode call: the first's
        sources = torch.from_numpy(source.astype(np.int64))

        def batch(images: Any, labels: torch.Tensor, columns: list[Any]) -> MixtureBatch:
            fields = [
                [v for part in columns for v in part[k]] for k in range(len(first.field_names))
            ]
            return MixtureBatch(images, labels, sources, fields, first.field_specs)

        if cropping is not None and first.transform is None and parts:
            stored = [dataset.stored_batch(rows) for dataset, rows in parts]
            mixed = self.offsets[source] + local
            images, crops = self._start_crops(cropping, first, stored, mixed, ahead)
            labels = torch.cat([s.labels for s in stored])
            columns = [s.field_values for s in stored]

            def cropped() -> MixtureBatch:
                crops.finish()
                return batch(images, labels, columns)

            return Begun(cropped, crops.settle)

        def whole() -> MixtureBatch:  # each source's own crop, unless the batch has one
            batches = [dataset.begin(rows, crop=crop).finish() for dataset, rows in parts]
            images = _joined([b.images for b in batches])
            labels = torch.cat([b.labels for b in batches]) if batches else torch.empty(0).long()
            return batch(images, labels, [b.field_values for b in batches])

        return Begun(whole)

    def _start_crops(
        self,
        crop: Crop,
        first: ImageDataset,
        stored: list[StoredBatch],
        indices: np.ndarray,
        ahead: bool,
    ) -> tuple[torch.Tensor, CropsUnderWay]:
        """The sources' ``crop`` s begun in one batch tensor, one kernel call per decode
        thread (``ahead``: as :func:`readers.images.fused.start_crops`): the random crops
        drawn by each sample's index in the mixture (sources laid end to end)."""
        shape = (len(indices), 3, *crop.size)
        images = new_batch(shape, torch.uint8, channels_last=crop.channels_last)
        starts = list(accumulate((len(s.values) for s in stored), initial=0))

        def where(row: int) -> str:
            part = bisect_right(starts, row) - 1
            return stored[part].where(row - starts[part])

        crops = start_crops(
            [value for s in stored for value in s.values],
            indices,
            crop,
            images.permute(0, 2, 3, 1).numpy(),
            where,
            all(s.verified for s in stored),
            self._pool,
            first.decode_threads or default_decode_threads(),
            ahead,
        )
        return images, crops

    def set_epoch(self, epoch: int) -> None:
        for dataset in self.datasets.values():
            dataset.set_epoch(epoch)


def _joined(parts: list[Any]) -> Any:
    """The sources' images as one batch: a tensor when every part is a tensor of one image
    shape (one copy of each part into its rows), else a list."""
    tensors = all(isinstance(part, torch.Tensor) for part in parts)
    if not parts or not tensors or len({tuple(part.shape[1:]) for part in parts}) > 1:
        return [image for part in parts for image in part]
    out = new_batch((sum(len(part) for part in parts), *parts[0].shape[1:]), torch.uint8)
    lo = 0
    for part in parts:
        out[lo : lo + len(part)] = part
        lo += len(part)
    return out


def mixture_collate(batch: Any) -> Any:
    """``(images, labels, sources)`` of a :class:`MixtureBatch` (through a worker's shared
    batch pool when the images lie there), or of a list of ``(image, label, source)``."""
    if isinstance(batch, MixtureBatch):
        images, labels = batch.images, batch.labels
        rest = (batch.sources, *batch.field_batches())
        if isinstance(images, torch.Tensor):
            return hand_over(images, labels, rest) or (images, labels, *rest)
        return images, labels, *rest
    images = [item[0] for item in batch]
    labels = torch.tensor([int(item[1]) for item in batch])
    sources = torch.tensor([int(item[2]) for item in batch])
    fields = [[item[k] for item in batch] for k in range(3, len(batch[0]) if batch else 3)]
    if len({tuple(i.shape) for i in images}) == 1:
        return torch.stack(images), labels, sources, *fields
    return images, labels, sources, *fields


class MixtureSampler(EpochSampler):
    """:class:`EpochSampler` over a mixture's ``epoch_size`` positions, each mapped by
    :class:`MixtureOrder` to an index of the :class:`MixtureDataset`."""

    orders = ("mixture",)

    def __init__(
        self, dataset: MixtureDataset, mixture: Mixture, reweight: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(mixture.epoch_size, shuffle=True, seed=mixture.seed, **kwargs)
        self.mixture = mixture
        self.reweight = reweight
        self._offsets = dataset.offsets
        self.tell_epoch = dataset.set_epoch

    def _epoch_order(self, state: EpochState) -> _GlobalOrder:
        return _GlobalOrder(self.mixture.order(state.epoch), self._offsets)

    def take_mixture(self, state: Any) -> None:
        """Adopt the mixture ``state`` records (checked by :meth:`Mixture.resumed`)."""
        if not isinstance(state, dict) or "mixture" not in state:
            raise ValueError("loader state records no mixture: it is a single dataset's")
        epoch_state = self.loaded_state(state)
        self.mixture = self.mixture.resumed(
            state["mixture"], epoch_state.epoch, epoch_state.fresh, self.reweight
        )

    def state_dict(self) -> dict[str, Any]:
        """:meth:`EpochSampler.state_dict` and the mixture (for ``StatefulDataLoader``)."""
        return {**super().state_dict(), "mixture": self.mixture.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.take_mixture(state)
        super().load_state_dict(state)


class _GlobalOrder:
    """A :class:`MixtureOrder` giving indices of the sources laid end to end."""

    def __init__(self, order: MixtureOrder, offsets: np.ndarray) -> None:
        self.order, self.offsets = order, offsets

    def indices(self, positions: np.ndarray) -> np.ndarray:
        source, sample = self.order.locate(positions)
        return self.offsets[source] + sample


class MixtureLoader(Loader):
    """A :class:`Loader` over a mixture: ``sources`` (the names, as batches index them),
    ``classes[name]``, and a state that also records the mixture (O(schedule steps))."""

    source: MixtureSampler

    @property
    def sources(self) -> tuple[str, ...]:
        return self.source.mixture.names

    @property
    def classes(self) -> dict[str, list[str]]:
        return {name: list(d.classes) for name, d in self.dataset.datasets.items()}

    @property
    def mixture(self) -> Mixture:
        return self.source.mixture

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "mixture": self.source.mixture.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (any world size); a state of another mixture is a
        ``ValueError`` naming the difference (other weights: unless ``reweight=True``)."""
        self.source.take_mixture(state)
        super().load_state_dict(state)


def make_mixture_loader(
    paths: Mapping[str, str | os.PathLike[str] | ImageDataset],
    batch_size: int,
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
    crop: Crop | None = None,
    fields: Sequence[str] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **dataloader_kwargs: Any,
) -> MixtureLoader:
    """A :class:`MixtureLoader` over the datasets ``paths`` names (folders, URLs or opened
    datasets, any format), by :mod:`readers.epochs.mixture`'s exact shares.

    Args:
        weights: ``{name: weight}``, or ``[(first epoch, {name: weight}), ...]`` steps;
            default the sources' lengths.
        epoch_size: slots an epoch has; default the sources' total length.
        stratify: every batch holds each source's share (see :mod:`readers.epochs.mixture`).
        reweight: let :meth:`MixtureLoader.load_state_dict` take a state saved with other
            weights: these apply from its position on (its epoch if fresh, else the next).
        fields: fields every source has, batched after ``sources``.
        The rest: as :func:`readers.make_loader`.

    Raises:
        ValueError: sources whose images cannot form one batch (different sizes after
            ``crop=``), naming each with its size; sources lacking a field asked for, or
            holding it as another kind, naming them; weights that name other sources.
    """
    placement = Placement.for_loader(distributed, rank, world_size)
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
    )
    dataset = MixtureDataset(datasets)
    sampler = MixtureSampler(
        dataset,
        mixture,
        reweight,
        drop_last=drop_last,
        batch_size=batch_size,
        placement=placement,
    )
    dataloader_kwargs.setdefault("collate_fn", mixture_collate)
    return build_loader(MixtureLoader, sampler, dataset, batch_size, num_workers, dataloader_kwargs)
