"""How a map-style dataset serves a batch (``__getitems__``, which ``DataLoader`` calls with
a batch's indices): one tensor, by the cheapest path its samples allow.

* ``crop=``: every crop decoded straight into its row of the batch
  (:func:`readers.images.fused.start_crops`).
* Raw pixels of one fixed shape: gathered into the batch, no decode.
* JPEGs of one size without ``crop=``: decoded whole by the kernel
  (:mod:`readers.images.whole`), the plain read path.
* Anything else: a decode per sample on the decode threads, stacked (a list where the
  shapes differ).

A batch is begun (labels, fields and stored values read) and then finished; a batch that
:class:`readers.Loader` announced ahead (:meth:`BatchReads.read_ahead`) is begun then, its
decode on the decode threads while the training thread goes on
(:mod:`readers.batches_ahead`). :meth:`BatchReads.begin` takes the crop of the batch, where
it is not the dataset's: a bucket loader's batches each have their bucket's
(:mod:`readers.bucket_dataset`). A mixin of :class:`readers.ImageDataset`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from readers.batch import SampleBatch, new_batch, stack_images
from readers.batches_ahead import BatchesAhead, Begun
from readers.dataset_reads import StoredReads
from readers.images.crop import Crop
from readers.images.fused import CropsUnderWay, start_crops
from readers.images.pool import DecodePool
from readers.images.whole import WholeBatch, start_batch
from readers.placement import default_decode_threads
from readers.spec import StorageKind

__all__ = ["BatchReads"]


class BatchReads(StoredReads):
    """``__getitems__`` and :meth:`read_ahead`, built on the stored reads, over what
    :class:`readers.ImageDataset` holds: read options, shard ends and decode threads."""

    crop: Crop | None
    transform: Callable[[torch.Tensor], Any] | None
    decode: bool
    decode_threads: int | None
    _ends: list[int]
    _pool: DecodePool
    _ahead: BatchesAhead

    def _decode(self, value: Any, shard: int, local: int, crop: Crop | None = None) -> Any:
        raise NotImplementedError

    def _to_tensor(self, value: Any, shard: int, local: int) -> torch.Tensor:
        raise NotImplementedError

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        raise NotImplementedError

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        """Fetch a whole batch into one tensor: a gather for raw pixels of one shape, JPEGs
        of one size by the kernel (:mod:`readers.images.whole`), else a threaded decode.
        Images of differing shapes come back as a list; the fields chosen ride beside. A
        batch announced by :meth:`read_ahead` is served as begun then."""
        return self._ahead.serve(indices, self.begin)

    def read_ahead(self, indices: Sequence[int]) -> None:
        """Begin the batch ``indices`` now, to serve it when :meth:`__getitems__` asks for
        it: read and planned on this thread, its JPEGs decoded (whole, or cropped by
        ``crop=``) on the decode threads while this thread goes on
        (:mod:`readers.batches_ahead`; :class:`readers.Loader` announces its batches so in
        the training process)."""
        self._ahead.begin(indices, partial(self.begin, ahead=True))

    def begin(self, indices: Sequence[int], ahead: bool = False, crop: Crop | None = None) -> Begun:
        """The batch ``indices`` begun: its labels, fields and stored values read, and with
        ``ahead`` the kernel's decode (whole or cropped) started on the decode threads
        alone; the rest of the work is done by ``finish()``. ``crop``: this batch's, in
        place of the dataset's own (a bucket's shape: :mod:`readers.bucket_dataset`)."""
        crop = self.crop if crop is None else crop
        located = [self.locate(i) for i in indices]
        labels = torch.tensor([int(self.shard(s).labels[k]) for s, k in located])
        fields = self._fields_of(located)
        batch = partial(SampleBatch, labels=labels, field_values=fields, specs=self.field_specs)
        if not located:
            return Begun(partial(batch, []))
        if crop is not None and self.transform is None:
            shape = (len(located), 3, *crop.size)
            images = new_batch(shape, torch.uint8, channels_last=crop.channels_last)
            rows = images.permute(0, 2, 3, 1)
            crops = self._start_crops(crop, located, None, rows, ahead)

            def cropped() -> SampleBatch:
                crops.finish()
                return batch(images)

            return Begun(cropped, crops.settle)
        layout = self.manifest.layout
        if layout.kind is StorageKind.FIXED_PIXELS and layout.shape and self.transform is None:
            return Begun(lambda: batch(self._gathered(layout.shape, located)))
        values = self._read_located(located)
        whole = None
        if self.decode and crop is None:
            whole = self._start_whole(values, located, ahead)

        def finish() -> SampleBatch:
            images = None if whole is None else whole.result()
            if images is not None and self.transform is None:
                return batch(images)

            def load(row: int) -> Any:
                if images is None:
                    return self._decode(values[row], *located[row], crop)
                return self.transform(images[row])  # type: ignore[misc]

            return batch(stack_images(load, len(located), self._map))

        return Begun(finish) if whole is None else Begun(finish, whole.settle)

    def _gathered(self, shape: tuple[int, ...], located: list[tuple[int, int]]) -> torch.Tensor:
        """The raw pixels of ``located`` (all of ``shape``, HWC), in a batch buffer."""
        height, width, channels = shape
        images = new_batch((len(located), channels, height, width), torch.uint8)
        rows = images.permute(0, 2, 3, 1)
        shards = {shard for shard, _ in located}
        if len(shards) == 1:  # one copy into the batch; else one per row, no re-shuffle
            local = np.fromiter((k for _, k in located), np.int64, len(located))
            self.shard(shards.pop()).read_pixels(local, rows)
            return images
        for row, (shard, k) in enumerate(located):
            self.shard(shard).read_pixels(np.array([k]), rows[row : row + 1])
        return images

    def _start_crops(
        self,
        crop: Crop,
        located: list[tuple[int, int]],
        values: list[Any] | None,
        rows: torch.Tensor,
        ahead: bool = False,
    ) -> CropsUnderWay:
        """Begin decoding, cropping and resizing each sample into its HWC row of ``rows``,
        from its stored value (read here as :meth:`read_stored` reads, unless ``values``
        are given): :func:`readers.images.fused.start_crops`, ``ahead`` as there. Every
        shard is opened here first."""
        verified = all(self.shard(s).verified for s in {s for s, _ in located})
        if values is None:
            values = self._read_located(located)
        return start_crops(
            values,
            np.array([(self._ends[s - 1] if s else 0) + k for s, k in located]),
            crop,
            rows.numpy(),
            lambda row: self._where(*located[row]),
            verified,
            self._pool,
            self.decode_threads or default_decode_threads(),
            ahead,
        )

    def _start_whole(
        self, values: list[Any], located: list[tuple[int, int]], ahead: bool
    ) -> WholeBatch | None:
        """:func:`readers.images.whole.start_batch` of these samples (None: not taken); for
        ``transform``, into a batch of its own, never a pooled buffer."""
        return start_batch(
            values,
            all(self.shard(s).verified for s in {s for s, _ in located}),
            lambda row: self._to_tensor(values[row], *located[row]),
            None if self.transform is not None else partial(new_batch, dtype=torch.uint8),
            self._pool,
            self.decode_threads or default_decode_threads(),
            ahead,
        )
