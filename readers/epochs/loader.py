"""``make_loader``: the right DataLoader for any imgpack dataset, on one process or many.

It picks :class:`readers.EpochSampler` for the map-style readers (over the whole dataset or
a subset of it) or :class:`readers.WdsStream` for streaming, places the process by
``torch.distributed`` (or ``RANK``/``WORLD_SIZE``, or explicit arguments), and wraps the
DataLoader in a :class:`Loader` that counts the batches it hands out, so that
``state_dict()`` says exactly where the epoch stands on every rank.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Subset

from readers.batch import collate, collate_any
from readers.dataset import ImageDataset, Transform, open_dataset
from readers.epochs.buckets import AspectBuckets
from readers.epochs.loading import Loader, build_loader, refuse_chosen, with_read_options
from readers.epochs.mixture import WeightsArg
from readers.epochs.sampler import EpochSampler, selected_indices
from readers.epochs.stream import WdsStream
from readers.formats import STREAM_FORMATS
from readers.images.crop import Crop
from readers.manifest import load_manifest
from readers.placement import Placement
from readers.storage.location import Location

__all__ = ["Loader", "make_loader", "with_read_options"]  # Loader, with_read_options: loading.py

_OWN_ARGUMENTS = ("sampler", "batch_sampler", "shuffle")


def make_loader(
    path: str | os.PathLike[str] | ImageDataset | Subset | Mapping[str, Any],
    batch_size: int,
    *,
    indices: Sequence[int] | np.ndarray | None = None,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    distributed: bool | None = None,
    drop_last: bool = False,
    stream: bool = False,
    shuffle_buffer: int = 1000,
    transform: Transform | None = None,
    decode_threads: int | None = None,
    decode: bool = True,
    crop: Crop | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    fields: Sequence[str] | None = None,
    weights: WeightsArg = None,
    epoch_size: int | None = None,
    stratify: bool = False,
    reweight: bool = False,
    buckets: AspectBuckets | None = None,
    **dataloader_kwargs: Any,
) -> Loader:
    """Build a :class:`Loader` for the imgpack dataset at ``path`` (any format), or for a
    weighted mixture of several.

    Args:
        path: a dataset folder or URL (``s3://bucket/prefix``), a map-style dataset
            already opened, or a ``torch.utils.data.Subset`` of one (what ``random_split``
            returns; nested subsets too): then only its samples are read. A mapping
            ``{name: path or dataset}`` reads a mixture of them (``weights=``...): batches
            are ``(images, labels, sources, *fields)``, see
            :func:`readers.mixture_dataset.make_mixture_loader` and docs/DISTRIBUTED.md.
        batch_size: samples per batch on each rank.
        indices: read only these samples (of the subset, when ``path`` is one): epochs,
            shares, ``len()`` and the resumable state are over them, and a state saved over
            other samples is refused. Map-style only.
        shuffle: a new seeded order every epoch (the same on every rank).
        seed: base of every epoch's order; use the same on every rank.
        num_workers: DataLoader worker processes.
        distributed: ``None`` splits the data when ``torch.distributed`` (or
            ``RANK``/``WORLD_SIZE``, or ``rank=``/``world_size=``) says there are several
            processes; ``True`` requires that; ``False`` gives every process everything.
        drop_last: drop what does not divide evenly (at most ``world_size - 1`` samples, and
            each rank's short last batch) instead of repeating up to ``world_size - 1``
            samples so that every sample is read. With fewer samples than ``world_size *
            batch_size`` every epoch would be empty: that is a ``ValueError``.
        stream: read a ``wds`` dataset with :class:`WdsStream` (sequential passes, for slow
            or remote storage) instead of by random access.
        shuffle_buffer: the stream's shuffle window, in samples.
        transform, decode_threads, decode, crop: passed to the dataset (see
            :class:`ImageDataset`; to one already opened too, see
            :func:`with_read_options`); ``decode=False`` serves encoded samples undecoded, for
            ``DevicePrefetcher(loader, gpu_decode=True)``, batched as lists; ``crop`` (a
            :class:`readers.RandomResizedCrop` or :class:`readers.CenterCrop`) is done
            inside the decode, with new random crops every epoch.
        rank, world_size: explicit placement, overriding what the process can see.
        storage_options, cache_dir: for a URL: fsspec's options, and where map-style
            readers cache the shards they open (:mod:`readers.storage.cache`); the stream reads
            byte ranges and caches nothing. Beside a dataset opened already they are a
            ``ValueError`` unless they are the ones it was opened with (pass them to
            :func:`readers.open_dataset`).
        fields: names of the dataset's fields each batch also carries, in this order:
            batches are then ``(images, labels, *fields)``, int and float fields as
            tensors, fixed-shape arrays stacked, text, json, bytes and other arrays as lists
            (:func:`readers.collate`); crops and transforms touch the images only. Pick
            the samples by their fields with ``readers.open_dataset(path).metadata()`` and
            pass the ``index`` of the rows kept as ``indices=``.
        weights, epoch_size, stratify, reweight: a mixture's (``path`` a mapping):
            ``{name: weight}`` or ``[(first epoch, {name: weight}), ...]`` (default: the
            sources' lengths), the samples an epoch holds (default: their total), every
            batch holding each source's share, and taking a state saved with other weights.
        buckets: :class:`readers.AspectBuckets`: every batch of one aspect-ratio bucket,
            its images resized to cover the bucket's shape and cropped to it
            (:func:`readers.bucket_dataset.make_bucket_loader`, docs/DISTRIBUTED.md); in
            place of ``crop=``, over one map-style dataset or a mixture (``path`` a
            mapping: the mixture's samples grouped into buckets,
            :func:`readers.bucket_mixture_dataset.make_bucket_mixture_loader`).
        **dataloader_kwargs: anything else ``DataLoader`` takes (``pin_memory``,
            ``persistent_workers``, ``prefetch_factor``, ``multiprocessing_context``...);
            ``collate_fn`` defaults to :func:`readers.collate`.
    """
    refuse_chosen("make_loader", _OWN_ARGUMENTS, dataloader_kwargs)
    if buckets is not None:
        return _bucketed(path, batch_size, buckets, locals(), dataloader_kwargs)
    if isinstance(path, Mapping):
        return _mixed(path, batch_size, locals(), dataloader_kwargs)
    mixing = {"weights": weights, "epoch_size": epoch_size, "stratify": stratify}
    mixed = [f"{k}=" for k, v in {**mixing, "reweight": reweight}.items() if v not in (None, False)]
    if mixed:
        raise ValueError(f"{', '.join(mixed)} weigh a mixture: pass {{name: path, ...}} as path")
    path, indices = _unwrap_subset(path, indices)
    reads = {"transform": transform, "decode_threads": decode_threads, "decode": decode}
    opens = {"storage_options": storage_options, "cache_dir": cache_dir}
    path, reads = _with_reads(path, {**reads, "crop": crop, "fields": fields}, opens)
    dataloader_kwargs.setdefault("collate_fn", collate if reads["decode"] else collate_any)
    dealing = {"seed": seed, "drop_last": drop_last, "batch_size": batch_size}
    dealing["placement"] = Placement.for_loader(distributed, rank, world_size)
    source: EpochSampler | WdsStream
    if stream:
        window = shuffle_buffer if shuffle else 0
        dataset = source = _stream_source(path, indices, window, reads, opens, dealing)
    else:
        dataset = path if isinstance(path, ImageDataset) else open_dataset(path, **reads, **opens)
        source = EpochSampler(dataset, shuffle=shuffle, indices=indices, **dealing)
    return build_loader(Loader, source, dataset, batch_size, num_workers, dataloader_kwargs)


def _with_reads(
    path: str | os.PathLike[str] | ImageDataset, reads: dict[str, Any], opens: dict[str, Any]
) -> tuple[str | os.PathLike[str] | ImageDataset, dict[str, Any]]:
    """``path`` and the read options to read it with: a dataset opened already, with those
    given applied (:func:`with_read_options`), and then its own; ``opens``, the storage
    options and cache folder, refused beside it unless they are the ones it holds."""
    if not isinstance(path, ImageDataset):
        return path, reads
    path.manifest.location.check_options(**opens)
    dataset = with_read_options(path, **reads)
    own = ("transform", "decode_threads", "decode", "crop")
    return dataset, {**{k: getattr(dataset, k) for k in own}, "fields": dataset.field_names}


def _stream_source(
    path: str | os.PathLike[str] | ImageDataset,
    indices: np.ndarray | None,
    window: int,
    reads: dict[str, Any],
    opens: dict[str, Any],
    dealing: dict[str, Any],
) -> WdsStream:
    """The :class:`WdsStream` of ``make_loader(stream=True)``, or what it cannot read named."""
    if indices is not None:
        raise ValueError(
            "stream=True reads whole passes over a wds dataset's shards: read a subset "
            "map-style (stream=False)"
        )
    if isinstance(path, ImageDataset):
        manifest = path.manifest
    else:
        manifest = load_manifest(Location.of(path, **opens))
    if manifest.format not in STREAM_FORMATS:
        shown = ", ".join(STREAM_FORMATS)
        raise ValueError(f"{manifest.location}: stream=True reads {shown} datasets only")
    threads = reads["decode_threads"]
    if threads not in (None, 1):
        raise ValueError(
            f"decode_threads={threads}: stream=True decodes on one thread per "
            "DataLoader worker; drop decode_threads= and raise num_workers="
        )
    keep = ("transform", "decode", "crop", "fields")
    return WdsStream(manifest, shuffle_buffer=window, **{k: reads[k] for k in keep}, **dealing)


def _mixed(
    paths: Mapping[str, Any], batch_size: int, given: dict[str, Any], dataloader_kwargs: dict
) -> Loader:
    """:func:`make_loader` over a mapping: the mixture loader, or what it cannot take named."""
    single = {
        "indices": given["indices"] is not None,
        "stream": given["stream"],
        "transform": given["transform"] is not None,
        "decode_threads": given["decode_threads"] is not None,
        "decode": not given["decode"],
    }
    if any(single.values()):
        named = ", ".join(f"{k}=" for k, v in single.items() if v)
        raise ValueError(f"{named} read one dataset; a mixture's sources are read decoded")
    from readers.mixture_dataset import make_mixture_loader  # it builds on this module

    keep = ("weights", "epoch_size", "stratify", "reweight", "shuffle", "seed", "num_workers")
    keep += ("distributed", "drop_last", "crop", "fields", "rank", "world_size")
    keep += ("storage_options", "cache_dir")
    options = {name: given[name] for name in keep}
    return make_mixture_loader(paths, batch_size, **options, **dataloader_kwargs)


def _unwrap_subset(
    path: Any, indices: Sequence[int] | np.ndarray | None
) -> tuple[str | os.PathLike[str] | ImageDataset, np.ndarray | None]:
    """The imgpack dataset (or its location) under any ``Subset`` layers, and the indices
    of it to read: ``indices`` taken within the outermost subset, through every layer."""
    chosen = None if indices is None else np.asarray(indices)
    layers = 0
    while isinstance(path, Subset):
        layer = np.asarray(path.indices)
        chosen = layer if chosen is None else layer[selected_indices(chosen, len(layer))]
        path, layers = path.dataset, layers + 1
    if not isinstance(path, str | os.PathLike | ImageDataset):
        what = "a Subset of " * layers + type(path).__name__
        raise TypeError(
            "make_loader reads an imgpack dataset: a folder or URL, a dataset opened by "
            f"readers.open_dataset, or a torch Subset of one; not {what}"
        )
    return path, chosen


def _bucketed(
    path: Any,
    batch_size: int,
    buckets: AspectBuckets,
    given: dict[str, Any],
    dataloader_kwargs: dict[str, Any],
) -> Loader:
    """:func:`make_loader` with ``buckets=``: the bucket loader (over one dataset, or over
    a mixture when ``path`` is a mapping), or what it cannot take named."""
    mixing = isinstance(path, Mapping)
    refused = {
        "stream=": given["stream"],
        "transform=": given["transform"] is not None,
        "crop= (the buckets crop)": given["crop"] is not None,
        "decode=False": not given["decode"],
        "stratify= (a batch holds one bucket)": given["stratify"],
    }
    if mixing:
        refused["indices=, decode_threads= (one dataset's)"] = (
            given["indices"] is not None or given["decode_threads"] is not None
        )
    else:
        refused["weights=, epoch_size=, reweight= (a mixture's)"] = any(
            given[k] not in (None, False) for k in ("weights", "epoch_size", "reweight")
        )
    if any(refused.values()):
        named = "; ".join(k for k, v in refused.items() if v)
        raise ValueError(f"buckets= reads map-style datasets decoded: not with {named}")
    keep = ("shuffle", "seed", "num_workers", "distributed", "drop_last", "fields", "rank")
    keep += ("world_size", "storage_options", "cache_dir")
    options = {name: given[name] for name in keep}
    if mixing:
        from readers.bucket_mixture_dataset import make_bucket_mixture_loader  # as below

        mixture = {name: given[name] for name in ("weights", "epoch_size", "reweight")}
        return make_bucket_mixture_loader(
            path, batch_size, buckets, **mixture, **options, **dataloader_kwargs
        )
    from readers.bucket_dataset import make_bucket_loader  # it builds on readers.epochs.loading

    dataset, indices = _unwrap_subset(path, given["indices"])
    options["decode_threads"] = given["decode_threads"]
    return make_bucket_loader(
        dataset, batch_size, buckets, indices=indices, **options, **dataloader_kwargs
    )
