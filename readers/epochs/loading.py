"""The :class:`Loader` that :func:`readers.make_loader` returns, and
:func:`with_read_options`: what the mixture and bucket loaders build on too, kept apart from
``make_loader`` so that it can hand a mapping or ``buckets=`` to them without a circle.

A :class:`Loader` wraps the DataLoader and counts the batches it hands out, so that
``state_dict()`` says exactly where the epoch stands on every rank.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

from torch.utils.data import DataLoader

from readers.batch_pool import release_ended_pools
from readers.dataset import ImageDataset, Transform, open_dataset
from readers.epochs.sampler import EpochSampler
from readers.epochs.split import Split
from readers.epochs.state import EpochState
from readers.epochs.stream import WdsStream
from readers.images.crop import Crop

__all__ = ["Loader", "build_loader", "opened_dataset", "refuse_chosen", "with_read_options"]


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
        """Hand ``state`` to the sampler or stream before the DataLoader iterates: the one
        path by which the epoch reaches the order, the stream's workers and, through the
        source's iteration, the dataset's random crops. A sampler announces each batch (a
        bucket loader's: its key) to a dataset read in this process (none in workers),
        which begins it one batch early (:mod:`readers.batches_ahead`)."""
        if isinstance(self.source, EpochSampler):
            loader = self.dataloader
            same_batches = loader.batch_size == self.source.loader_batch_size
            here = loader.num_workers == 0 and same_batches
            self.source.read_ahead = getattr(loader.dataset, "read_ahead", None) if here else None
        if self.source.reset(state) and self.dataloader.persistent_workers:
            self.dataloader = self._make_dataloader()  # running workers hold a stale copy


L = TypeVar("L", bound="Loader")


def build_loader(
    loader_cls: type[L],
    source: EpochSampler | WdsStream,
    dataset: Any,
    batch_size: int | None,
    num_workers: int,
    dataloader_kwargs: dict[str, Any],
) -> L:
    """A ``loader_cls`` over the DataLoader of ``dataset`` dealt by ``source`` (its sampler;
    a stream is its own dataset): how :func:`readers.make_loader` and the mixture and bucket
    loaders build theirs (``batch_size=None`` for a dataset that serves whole batches), and
    again when persistent workers hold a copy of a stream that cannot follow its state."""
    make_dataloader = partial(
        DataLoader,
        dataset,
        batch_size=batch_size,
        sampler=None if source is dataset else source,
        num_workers=num_workers,
        **dataloader_kwargs,
    )
    return loader_cls(source, make_dataloader)


def opened_dataset(
    path: str | os.PathLike[str] | ImageDataset,
    storage_options: dict[str, Any] | None,
    cache_dir: str | os.PathLike[str] | None,
) -> ImageDataset:
    """The dataset at ``path`` opened with the storage options and cache folder, or the one
    passed, which must hold those (:meth:`readers.storage.location.Location.check_options`:
    a ``ValueError`` for others, never dropped)."""
    if isinstance(path, ImageDataset):
        path.manifest.location.check_options(storage_options=storage_options, cache_dir=cache_dir)
        return path
    return open_dataset(path, storage_options=storage_options, cache_dir=cache_dir)


def refuse_chosen(caller: str, chosen: Sequence[str], dataloader_kwargs: dict[str, Any]) -> None:
    """ValueError naming the DataLoader arguments that ``caller`` chooses itself."""
    taken = [name for name in chosen if name in dataloader_kwargs]
    if taken:
        raise ValueError(f"{caller} chooses {', '.join(taken)} itself; do not pass it")


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
