"""Streaming reads of ``wds`` tars: exact, equal shares per rank and worker, resumable.

:class:`WdsStream` reads each DataLoader worker's share of an epoch in ascending passes over
the tars (through each tar's offset index, see :mod:`readers.formats.wds`), one shuffle window at a
time, and serves the window's samples in a seeded permuted order. Which samples each rank
and worker reads, and how an interrupted epoch goes on, follow :mod:`readers.epochs.state`: every
rank gets the same number of samples and batches, known before the epoch starts, even with
fewer shards than ranks x workers (shares are sample ranges, not whole shards).

What travels to the workers: the epoch, whether it starts fresh, rank and world size live in
a small shared-memory tensor written in the training process (at construction and at each
:meth:`WdsStream.reset`, which ``set_epoch`` and ``load_state_dict`` call), so persistent
workers see each new epoch and no worker ever guesses its rank; a mid-epoch state travels in
the workers' copy of the stream, and a state they cannot see bumps the version they check.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from readers.dataset import Transform, WdsDataset
from readers.epochs.order import BlockOrder
from readers.epochs.ranges import take, total, wrapped
from readers.epochs.state import EpochSource, EpochState, require_full_batches
from readers.fields import FieldSpec
from readers.formats import open_by_ranges
from readers.images.crop import Crop
from readers.manifest import Manifest
from readers.placement import Placement, current_worker, visible_world_size

__all__ = ["WdsStream"]

_EPOCH, _FRESH, _RANK, _WORLD, _VERSION = range(5)
_warned_unshuffled: set[str] = set()


class WdsStream(EpochSource, IterableDataset):
    """Streaming reader over imgpack ``wds`` tars, for slow or remote storage.

    Each epoch, shards are taken in a seeded order and the samples inside every window of
    ``shuffle_buffer`` consecutive samples come out permuted; the order depends only on
    ``seed`` and the epoch. Ranks take equal contiguous slices of it (see
    :mod:`readers.epochs.state`). Each DataLoader worker reads one contiguous part of its
    rank's slice, cut where a read window starts (``read_window``: whole shuffle windows,
    1,000 samples at least), so that a rank fetches each window once, in one round; the
    DataLoader takes one batch of each worker in turn, so with several workers a rank
    yields its ``num_workers`` parts interleaved (the same in every run, and after a resume
    with as many ranks and workers).

    Args:
        root: the dataset folder (the one holding ``imgpack.json``), or its URL
            (``s3://bucket/prefix``): remote tars are read by byte ranges, a worker
            fetching its read window in one round of merged, concurrent requests; no shard
            is copied whole.
        transform: applied to each ``[3, H, W]`` uint8 image tensor.
        shuffle_buffer: samples per shuffle window; 0 reads in stored order (no shuffle).
        seed: base seed of the shard order and the window permutations (same on all ranks).
        batch_size: the DataLoader's; with it, workers split on whole batches, so a rank's
            epoch has one short batch at most (and none with ``drop_last``). Without it the
            workers split sample by sample and each may end with a short batch.
        drop_last: drop what does not divide evenly between ranks (and a short last batch)
            instead of repeating up to ``world_size - 1`` samples.
        rank, world_size: explicit placement; by default from ``torch.distributed`` or
            ``RANK``/``WORLD_SIZE``, read in the training process at construction,
            :meth:`set_epoch`, :meth:`load_state_dict` and each in-process ``__iter__``.
        placement: the same as a :class:`readers.placement.Placement` resolved
            once (what :func:`readers.make_loader` passes).
        decode: False yields encoded samples undecoded (see :class:`readers.ImageDataset`).
        crop: a crop done inside the decode (see :class:`readers.ImageDataset`); random
            crops depend on the seed, epoch and sample index only.
        storage_options: for a URL, passed to fsspec (credentials, ``endpoint_url``...).
        fields: names of the dataset's fields each sample also carries, in this order:
            samples are then ``(image, label, *values)`` and, with
            ``collate_fn=readers.collate``, batches ``(images, labels, *fields)`` (see
            :class:`readers.ImageDataset`).

    Call :meth:`set_epoch` before each epoch (:func:`readers.make_loader` does).
    """

    orders = ("windows",)  # BlockOrder, the stream's only order (version 1 states too)

    def __init__(
        self,
        root: str | os.PathLike[str] | Manifest,
        transform: Transform | None = None,
        shuffle_buffer: int = 1000,
        seed: int = 0,
        *,
        batch_size: int | None = None,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        placement: Placement | None = None,
        decode: bool = True,
        crop: Crop | None = None,
        storage_options: dict[str, Any] | None = None,
        fields: Sequence[str] | None = None,
    ) -> None:
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be >= 0, not {shuffle_buffer}")
        self._dataset = WdsDataset(
            root,
            transform=transform,
            decode_threads=1,
            decode=decode,
            crop=crop,
            storage_options=storage_options,
            opener=open_by_ranges,
            fields=fields,
        )
        self.manifest = self._dataset.manifest
        self.transform = transform
        self.shuffle_buffer = shuffle_buffer
        # Positions read in one round from object storage: whole shuffle windows, 1,000
        # samples at least. A rank's DataLoader workers each read a part of its slice cut
        # where a read window starts (readers.epochs.split.Split), so a rank fetches each
        # window once.
        self.read_window = shuffle_buffer * -(-1000 // shuffle_buffer) if shuffle_buffer else 1000
        self.seed = seed
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._placement = Placement.fixed(
            rank, world_size, placement
        )  # None: detected at each placement point
        self.rank, self.world_size = self._place()
        if drop_last:  # without a batch size, a rank's share is dropped below one sample
            require_full_batches(self.manifest.num_samples, self.world_size, batch_size or 1)
        self._state = self.start_state(0)
        self._version = 0  # of the loaded state, to tell a worker holding an older copy
        self._shared = torch.tensor([0, 1, self.rank, self.world_size, 0]).share_memory_()
        self._iterating = self._state  # the state the current iteration started from
        self._yielded = 0  # samples of it yielded by this process
        self._skip: int | None = None  # samples to skip, loaded in a worker
        self._warn_if_unshuffled()

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """The dataset's schema (see :attr:`readers.ImageDataset.fields`)."""
        return self._dataset.fields

    @property
    def num_samples(self) -> int:
        return self.manifest.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` next, from its beginning, on every rank and worker (a state
        loaded for this same epoch is kept). Call it in the training process."""
        self._in_training_process("set_epoch")
        self.reset(self._state if epoch == self._state.epoch else self._state.start_of(epoch))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict` or a loader's, any world size).
        Call it before the DataLoader starts its workers: persistent workers already
        running keep their copy, and refuse to serve a stale epoch. Inside a worker it
        takes back that worker's own state (what torchdata's StatefulDataLoader does)."""
        info = current_worker()
        loaded = self.loaded_state(state)
        if info is not None:
            if (state.get("worker"), state.get("num_workers")) != (info.id, info.num_workers):
                raise ValueError(
                    f"a state of worker {state.get('worker')} of {state.get('num_workers')} "
                    f"cannot resume worker {info.id} of {info.num_workers}"
                )
            self._state, self._skip = loaded, int(state["worker_samples"])
            return
        self.reset(loaded)

    def reset(self, state: EpochState) -> bool:
        self._in_training_process("reset")
        # Workers already running follow a fresh epoch (published) or the state they copied
        # (the one set at the last version bump, still in place): anything else is a new
        # version, which they refuse to serve.
        stale = state != self._state and not state.fresh
        self._state = self._iterating = state
        self._yielded = 0
        if stale:
            self._version += 1
        self._publish()
        return stale

    def state_dict(self) -> dict[str, Any]:
        """The state after what this process has yielded of the current epoch: the rank's
        (with ``num_workers=0``, or from :func:`readers.make_loader`'s loader, which also
        counts for its workers); inside a DataLoader worker, where torchdata's
        StatefulDataLoader asks for it, that worker's own position."""
        split = self.split(self._iterating)
        info = current_worker()
        if info is None:
            state = self._iterating.advanced(split, split.consumed_samples(self._yielded))
            return state.state_dict(self.world_size)
        return {
            **self._iterating.state_dict(self.world_size),
            "worker": info.id,
            "num_workers": info.num_workers,
            "worker_samples": self._yielded,
        }

    def __len__(self) -> int:
        """Samples this rank yields in the epoch about to start."""
        return self.split().per_rank

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        info = current_worker()
        skip = 0
        if info is None:
            self._publish()
            state, worker, num_workers = self._state, 0, 1
        else:
            worker, num_workers = info.id, info.num_workers
            if self._skip is None:
                state = self._worker_state()
            else:  # this worker's own state, loaded in this worker
                state, skip, self._skip = self._state, self._skip, None
        mine = self.split(state, num_workers).worker_ranges(self.rank, worker)
        mine = wrapped(take(mine, skip, total(mine) - skip), self.num_samples)
        order = BlockOrder(
            tuple(s.samples for s in self.manifest.shards),
            self.seed,
            state.epoch,
            self.shuffle_buffer,
        )
        self._iterating, self._yielded = state, skip
        self._dataset.set_epoch(state.epoch)
        chunks = [chunk for lo, hi in mine for chunk in order.chunks(lo, hi)]
        ds = self._dataset
        for group in self._read_ahead(chunks):
            indices = np.concatenate([order.indices(a, b) for a, b in group]).tolist()
            stored = ds.read_stored(indices)
            rows = zip(*ds.read_fields(indices), strict=True) if ds.field_names else None
            fields = [None] * len(indices) if rows is None else list(rows)
            for index, value, values in zip(indices, stored, fields, strict=True):
                item = ds.serve(value, index, values)
                self._yielded += 1  # before the yield: a state taken now counts it
                yield item

    # --- internals ----------------------------------------------------------------------
    def _read_ahead(self, chunks: list[tuple[int, int]]) -> Iterator[list[tuple[int, int]]]:
        """The chunks read in one go: one at a time from local disk; from object storage,
        all of this worker's chunks in one read window, so that one round of merged range
        requests serves them (see :mod:`readers.storage.remote`)."""
        if self.manifest.url is None:
            yield from ([c] for c in chunks)
            return
        group: list[tuple[int, int]] = []
        for a, b in chunks:
            if group and a // self.read_window != group[0][0] // self.read_window:
                yield group
                group = []
            group.append((a, b))
        if group:
            yield group

    def _publish(self) -> None:
        """Write epoch, placement and state version where every worker reads them."""
        self.rank, self.world_size = self._place()
        self._shared[:] = torch.tensor(
            [self._state.epoch, self._state.fresh, self.rank, self.world_size, self._version]
        )

    def _worker_state(self) -> EpochState:
        """Inside a DataLoader worker: the epoch state the training process published."""
        epoch, fresh, self.rank, self.world_size, version = self._shared.tolist()
        if version != self._version:
            raise RuntimeError(
                "WdsStream.load_state_dict was called after this DataLoader's persistent "
                "workers started, so they cannot see it: load the state before the first "
                "iteration, or use readers.make_loader, which restarts its workers"
            )
        visible = visible_world_size()
        if self._placement is None and visible not in (None, self.world_size):
            raise RuntimeError(
                f"this WdsStream was placed for a world of {self.world_size} but the worker "
                f"sees {visible} processes: build it after "
                "torch.distributed.init_process_group, or call set_epoch before iterating"
            )
        return self._state.start_of(epoch) if fresh else self._state

    def _place(self) -> tuple[int, int]:
        """Rank and world size: the placement given, else detected now."""
        placement = self._placement or Placement.detect()
        return placement.rank, placement.world_size

    def _in_training_process(self, what: str) -> None:
        if current_worker() is not None:
            raise RuntimeError(
                f"WdsStream.{what} inside a DataLoader worker would change that worker's copy "
                "only: call it in the training process"
            )

    def _warn_if_unshuffled(self) -> None:
        root = str(self.manifest.root)
        if (
            self.shuffle_buffer
            and not self.manifest.options.get("shuffle")
            and root not in _warned_unshuffled
        ):
            _warned_unshuffled.add(root)
            warnings.warn(
                f"{root} was converted without --shuffle: its shards follow the class folders, "
                f"so each {self.shuffle_buffer}-sample shuffle window holds a few classes only. "
                "Convert with --shuffle for streaming, or read it map-style "
                "(readers.make_loader without stream=True shuffles the whole dataset).",
                UserWarning,
                stacklevel=3,
            )
