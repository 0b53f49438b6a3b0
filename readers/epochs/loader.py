"""``make_loader``: the right DataLoader for any imgpack dataset, on one process or many.

It picks :class:`readers.EpochSampler` for the map-style readers (over the whole dataset or
a subset of it) or :class:`readers.WdsStream` for streaming, places the process by
``torch.distributed`` (or ``RANK``/``WORLD_SIZE``, or explicit arguments), and wraps the
DataLoader in a :class:`Loader` that counts the batches it hands out, so that
``state_dict()`` says exactly where the epoch stands on every rank.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Subset

from readers.batch import collate, collate_any
from readers.batch_pool import release_ended_pools
from readers.dataset import ImageDataset, Transform, open_dataset
from readers.epochs.mixture import WeightsArg
from readers.epochs.placement import Placement
from readers.epochs.sampler import EpochSampler, selected_indices
from readers.epochs.split import Split
from readers.epochs.state import EpochState
from readers.epochs.stream import WdsStream
from readers.images.crop import Crop
from readers.manifest import load_manifest
from readers.storage.location import Location

__all__ = ["Loader", "make_loader", "with_read_options"]

_OWN_ARGUMENTS = ("sampler", "batch_sampler", "shuffle")


class Loader:
    """A DataLoader over an imgpack dataset with exact epochs and mid-epoch resume.

    Iterate it for this rank's batches of one epoch; ``len()`` is their number, the same on
    every rank and known before the epoch starts. A finished pass moves on to the next
    epoch by itself; :meth:`set_epoch` picks one explicitly. :meth:`state_dict` is small
    and JSON-ready; :meth:`load_state_dict` continues the epoch it describes, with the same
    or another world size, without reading what was already consumed.
    """

    def __init__(
        self,
        source: EpochSampler | WdsStream,
        make_dataloader: Callable[[], DataLoader],
    ) -> None:
        self.source = source
        self._make_dataloader = make_dataloader
        self.dataloader = make_dataloader()
        self._state = source.start_state(0)
        self._split: Split | None = None  # of the iteration in progress
        self._batches = 0  # yielded by it
        self._generation = 0  # bumped to detach an abandoned iterator

    @property
    def dataset(self) -> Any:
        """What the DataLoader reads: over a subset, the whole dataset under it (the sampler
        hands out the subset's indices of it), so ``classes`` and the like are there."""
        return self.dataloader.dataset

    @property
    def epoch(self) -> int:
        """The epoch the next (or current) iteration reads."""
        return self._current().epoch

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` next, from its start; keeps a loaded state of the same epoch."""
        if epoch != self._current().epoch:
            self._restart(self._current().start_of(epoch))

    def state_dict(self) -> dict[str, Any]:
        """Epoch, seed, samples consumed, world size and the position ranges left."""
        return self._current().state_dict(self.source.world_size)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the rest of its epoch on this world size, then onwards."""
        self._restart(self.source.loaded_state(state))

    def __len__(self) -> int:
        return self._plan(self._current()).batches

    def __iter__(self) -> Iterator[Any]:
        state = self._current()
        self._start_source(state)
        split = self._plan(state)
        self._generation += 1
        generation = self._generation
        self._state, self._split, self._batches = state, split, 0
        batches = iter(self.dataloader)
        try:
            for batch in batches:
                if generation == self._generation:
                    self._batches += 1
                yield batch
        except Exception as error:
            if not self.dataloader.num_workers:
                raise
            # A worker's error (its traceback is in the message): torch's iterator, held by
            # the traceback's frames, would stop its workers only when a later garbage
            # collection finds it, its queues closed first, 5 s late. Dropped now, it stops
            # them at once.
            del batches
            raise error.with_traceback(None) from None
        release_ended_pools()  # this epoch's workers have ended, unless persistent
        if generation == self._generation:
            if self._batches != split.batches:
                raise RuntimeError(
                    f"the DataLoader yielded {self._batches} batches where the epoch plan "
                    f"has {split.batches}: was the dataset or sampler replaced?"
                )
            self._state, self._split, self._batches = self._current(), None, 0

    # --- internals ----------------------------------------------------------------------
    def _plan(self, state: EpochState) -> Split:
        """How ``state`` is dealt: a stream's to this DataLoader's workers (each reads whole
        read windows), a sampler's in the training process."""
        workers = self.dataloader.num_workers if isinstance(self.source, WdsStream) else 1
        return self.source.split(state, max(workers, 1))

    def _current(self) -> EpochState:
        split, batches = self._split, self._batches
        if split is None:
            return self._state
        return self._state.advanced(split, split.consumed(batches), split.progress(batches))

    def _restart(self, state: EpochState) -> None:
        self._state, self._split, self._batches = state, None, 0
        self._generation += 1

    def _start_source(self, state: EpochState) -> None:
        """Hand ``state`` to the sampler or stream before the DataLoader iterates."""
        if state.fresh:
            self.source.set_epoch(state.epoch)
        if self.source.epoch_state != state:
            self.source.resume(state)
            if isinstance(self.source, WdsStream) and self.dataloader.persistent_workers:
                self.dataloader = self._make_dataloader()  # running workers hold a copy


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
            byte ranges and caches nothing.
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
        **dataloader_kwargs: anything else ``DataLoader`` takes (``pin_memory``,
            ``persistent_workers``, ``prefetch_factor``, ``multiprocessing_context``...);
            ``collate_fn`` defaults to :func:`readers.collate`.
    """
    taken = [name for name in _OWN_ARGUMENTS if name in dataloader_kwargs]
    if taken:
        raise ValueError(f"make_loader chooses {', '.join(taken)} itself; do not pass it")
    mixing = {"weights": weights, "epoch_size": epoch_size, "stratify": stratify}
    if isinstance(path, Mapping):
        single = {
            "indices": indices is not None,
            "stream": stream,
            "transform": transform is not None,
            "decode_threads": decode_threads is not None,
            "decode": not decode,
        }
        if any(single.values()):
            named = ", ".join(f"{k}=" for k, v in single.items() if v)
            raise ValueError(f"{named} read one dataset; a mixture's sources are read decoded")
        from readers.mixture_dataset import make_mixture_loader  # it builds on this module

        return make_mixture_loader(
            path,
            batch_size,
            **mixing,
            reweight=reweight,
            shuffle=shuffle,
            seed=seed,
            num_workers=num_workers,
            distributed=distributed,
            drop_last=drop_last,
            crop=crop,
            fields=fields,
            rank=rank,
            world_size=world_size,
            storage_options=storage_options,
            cache_dir=cache_dir,
            **dataloader_kwargs,
        )
    mixed = [f"{k}=" for k, v in {**mixing, "reweight": reweight}.items() if v not in (None, False)]
    if mixed:
        raise ValueError(f"{', '.join(mixed)} weigh a mixture: pass {{name: path, ...}} as path")
    placement = Placement.for_loader(distributed, rank, world_size)
    path, indices = _unwrap_subset(path, indices)
    if isinstance(path, ImageDataset):
        path = with_read_options(path, transform, decode_threads, decode, crop, fields)
        transform, decode_threads, decode, crop, fields = (
            path.transform,
            path.decode_threads,
            path.decode,
            path.crop,
            path.field_names,
        )
    dataloader_kwargs.setdefault("collate_fn", collate if decode else collate_any)
    source: EpochSampler | WdsStream
    if stream:
        if indices is not None:
            raise ValueError(
                "stream=True reads whole passes over a wds dataset's shards: read a subset "
                "map-style (stream=False)"
            )
        if isinstance(path, ImageDataset):
            manifest = path.manifest
        else:
            location = Location.of(path, storage_options=storage_options, cache_dir=cache_dir)
            manifest = load_manifest(location)
        if manifest.format != "wds":
            raise ValueError(f"{manifest.location}: stream=True reads wds datasets only")
        if decode_threads not in (None, 1):
            raise ValueError(
                f"decode_threads={decode_threads}: stream=True decodes on one thread per "
                "DataLoader worker; drop decode_threads= and raise num_workers="
            )
        source = WdsStream(
            manifest,
            storage_options=storage_options,
            transform=transform,
            decode=decode,
            crop=crop,
            shuffle_buffer=shuffle_buffer if shuffle else 0,
            seed=seed,
            batch_size=batch_size,
            drop_last=drop_last,
            placement=placement,
            fields=fields,
        )
        dataset: Any = source
        sampler = None
    else:
        if isinstance(path, ImageDataset):
            dataset = path
        else:
            dataset = open_dataset(
                path,
                transform=transform,
                decode_threads=decode_threads,
                decode=decode,
                crop=crop,
                storage_options=storage_options,
                cache_dir=cache_dir,
                fields=fields,
            )
        source = sampler = EpochSampler(
            dataset,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            batch_size=batch_size,
            placement=placement,
            indices=indices,
        )

    def make_dataloader() -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=num_workers,
            **dataloader_kwargs,
        )

    return Loader(source, make_dataloader)


def with_read_options(
    dataset: ImageDataset,
    transform: Transform | None,
    decode_threads: int | None,
    decode: bool,
    crop: Crop | None,
    fields: Sequence[str] | None = None,
) -> ImageDataset:
    """``dataset`` as :func:`make_loader` reads it: with the read options given to
    ``make_loader`` as well as its own, on a new dataset over the same manifest (the one
    passed is left as it is). Each option is taken from whichever of the two sets it
    (``fields``: a dataset opened without ``fields=`` sets none).

    Raises:
        ValueError: naming the option that ``make_loader`` and the dataset both set,
            differently; or as :class:`ImageDataset` for ``transform``/``crop`` without
            decoding.
    """
    given = {
        "transform": transform,
        "decode_threads": decode_threads,
        "crop": crop,
        "fields": None if fields is None else tuple(fields),
    }
    owns = {name: getattr(dataset, name) for name in ("transform", "decode_threads", "crop")}
    owns.update(fields=dataset.field_names or None, decode=dataset.decode)
    chosen: dict[str, Any] = {}
    for name, value in given.items():
        own = owns[name]
        if value is not None and own is not None and value is not own and value != own:
            shown = [
                repr(v) if isinstance(v, int | tuple) else type(v).__name__ for v in (value, own)
            ]
            raise ValueError(
                f"make_loader({name}={shown[0]}) over a dataset opened with another {name}= "
                f"({shown[1]}): pass {name}= to one of them"
            )
        chosen[name] = value if own is None else own
    chosen["decode"] = dataset.decode and decode
    if all(owns[name] is value for name, value in chosen.items()):
        return dataset
    return type(dataset)(dataset.manifest, opener=dataset.opener, **chosen)


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
