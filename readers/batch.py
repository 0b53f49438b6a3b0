"""Batches as imgpack's readers build and hand them to a DataLoader: one tensor per
batch, written in place by the decode threads (in shared memory inside a worker), and the
``collate_fn`` functions that pass such a batch through without a second copy."""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from readers.batch_pool import hand_over, take_batch
from readers.fields import FieldSpec, collate_field
from readers.placement import current_worker

__all__ = [
    "Sample",
    "SampleBatch",
    "collate",
    "collate_any",
    "copy_image",
    "new_batch",
    "stack_images",
]


class Sample(tuple):
    """``(image, label, *fields)`` as a dataset opened with ``fields=`` serves one sample:
    a plain tuple that also carries its fields' :attr:`specs`, so that :func:`collate`
    batches each field by its kind (:func:`readers.fields.collate_field`)."""

    specs: tuple[FieldSpec, ...]

    def __new__(cls, items: Sequence[Any], specs: Sequence[FieldSpec]) -> Sample:
        sample = super().__new__(cls, items)
        sample.specs = tuple(specs)
        return sample

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return Sample, (tuple(self), self.specs)


class SampleBatch(Sequence):
    """A batch that ``__getitems__`` returns: a list of ``(image, label, *fields)`` to
    anyone, and already-stacked ``images``/``labels`` tensors to :func:`collate` (no second
    copy), with each chosen field's values (``field_values``, one list per field, of the
    kinds ``specs`` give)."""

    def __init__(
        self,
        images: torch.Tensor | list[Any],
        labels: torch.Tensor,
        field_values: Sequence[list[Any]] = (),
        specs: Sequence[FieldSpec] = (),
    ) -> None:
        self.images = images
        self.labels = labels
        self.field_values = tuple(field_values)
        self.specs = tuple(specs)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):  # type: ignore[override]
        if not self.field_values:
            return self.images[i], int(self.labels[i])
        values = (column[i] for column in self.field_values)
        return Sample((self.images[i], int(self.labels[i]), *values), self.specs)

    def field_batches(self) -> tuple[Any, ...]:
        """Each field's values batched by its kind (:func:`readers.fields.collate_field`)."""
        return tuple(
            collate_field(spec, values)
            for spec, values in zip(self.specs, self.field_values, strict=True)
        )


def collate(batch: Any) -> Any:
    """DataLoader ``collate_fn``: passes imgpack's pre-stacked batches through untouched (in
    a worker, through its reused shared buffers: :mod:`readers.batch_pool`) and falls
    back to ``default_collate`` for anything else. With fields (a dataset opened with
    ``fields=``) a batch is ``(images, labels, *fields)``: int and float fields as tensors,
    fixed-shape arrays stacked, text, json, bytes and other arrays as lists
    (:func:`readers.fields.collate_field`).

    Raises:
        ValueError: for images of differing shapes, saying what to do.
    """
    if isinstance(batch, SampleBatch) and isinstance(batch.images, torch.Tensor):
        fields = batch.field_batches()
        return hand_over(batch.images, batch.labels, fields) or (
            batch.images,
            batch.labels,
            *fields,
        )
    images = batch.images if isinstance(batch, SampleBatch) else [item[0] for item in batch]
    shapes = {tuple(i.shape) for i in images if isinstance(i, torch.Tensor)}
    if len(shapes) > 1:
        raise ValueError(
            f"cannot stack a batch of images of {len(shapes)} different shapes (e.g. "
            f"{' and '.join(map(str, sorted(shapes)[:2]))}): this dataset's images vary in "
            "size. Crop at conversion (imgpack convert --center-crop), pass a cropping "
            "transform= to the dataset, or use collate_fn=readers.collate_any for lists"
        )
    rest = _labels_and_fields(batch)
    if rest is None:
        return default_collate(list(batch))
    return (default_collate(list(images)), *rest)


def collate_any(batch: Any) -> Any:
    """:func:`collate`, but images of differing shapes (a variable-size dataset without a
    crop, or undecoded bytes) come back as a list instead of failing to stack."""
    images = batch.images if isinstance(batch, SampleBatch) else [item[0] for item in batch]
    if isinstance(images, torch.Tensor) or len({tuple(i.shape) for i in images}) == 1:
        return collate(batch)
    rest = _labels_and_fields(batch)
    if rest is None:  # pairs, or samples of someone else's dataset
        labels = torch.tensor([int(item[1]) for item in batch])
        extra = [default_collate([item[k] for item in batch]) for k in range(2, len(batch[0]))]
        return (list(images), labels, *extra)
    return (list(images), *rest)


def _labels_and_fields(batch: Any) -> tuple[Any, ...] | None:
    """``(labels, *fields)`` of a batch of samples with fields (a :class:`SampleBatch` of
    a dataset opened with ``fields=``, or a list of :class:`Sample` s), each field batched
    by its kind; None for anything else, which ``default_collate`` batches as before."""
    if isinstance(batch, SampleBatch):
        return (batch.labels, *batch.field_batches()) if batch.specs else None
    if not len(batch) or not isinstance(batch[0], Sample):
        return None
    specs = batch[0].specs
    labels = torch.tensor([int(item[1]) for item in batch])
    columns = ([item[2 + k] for item in batch] for k in range(len(specs)))
    return (labels, *map(collate_field, specs, columns))


def new_batch(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    like: torch.Tensor | None = None,
    channels_last: bool = True,
) -> torch.Tensor:
    """An empty batch tensor, channels-last when 4-D image-like (as HWC storage decodes;
    unless ``channels_last`` is False, or the image ``like`` is not): a reused buffer of
    :mod:`readers.batch_pool` where one is free, and in shared memory inside a DataLoader
    worker so that handing it to the main process costs no copy."""
    image_like = like is None or (like.dim() == 3 and like.stride(0) == 1)
    channels_last = len(shape) == 4 and channels_last and image_like
    order = (0, 2, 3, 1) if channels_last else tuple(range(len(shape)))
    storage_shape = [shape[i] for i in order]
    batch = _empty(storage_shape, dtype, shared=current_worker() is not None)
    return batch.permute(0, 3, 1, 2) if channels_last else batch


def _empty(shape: list[int], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """An empty batch in a free slot of this process's batch pools, else allocated afresh:
    ``shared`` (in a worker) by the private allocator ``default_collate`` itself uses."""
    nbytes = int(np.prod(shape)) * dtype.itemsize
    flat = take_batch(nbytes, shared) if nbytes else None
    if flat is None and not shared:
        return torch.empty(shape, dtype=dtype)
    if flat is None:
        storage = torch.UntypedStorage._new_shared(nbytes)
        prefault(storage.data_ptr(), storage.nbytes())
        flat = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,))
    return flat.view(dtype).view(shape)


_MADV_POPULATE_WRITE = 23  # Linux 5.14+
_PAGE = 4096


@cache
def _madvise() -> Any:
    """libc's ``madvise``, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    function = ctypes.CDLL(None, use_errno=True).madvise
    function.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return function


def prefault(address: int, size: int) -> bool:
    """Fault in the fresh shared-memory pages at ``address`` for writing, in one call: a
    worker's batch (9.6 MB for 64 images of 224x224) otherwise takes a page fault per 4 KiB
    as the decode first writes it. Whether it was done (not on older kernels or off Linux,
    where nothing changes but the time)."""
    madvise = _madvise()
    if madvise is None or size <= 0:
        return False
    start = address - address % _PAGE
    return madvise(start, size + address - start, _MADV_POPULATE_WRITE) == 0


def stack_images(
    load: Callable[[int], Any], count: int, map_rows: Callable[[Callable, Sequence], list]
) -> torch.Tensor | list[Any]:
    """Images ``load(0) .. load(count - 1)`` as one batch tensor, each copied into its row
    by the thread that loaded it (``map_rows``: the decode threads' map); a list when they
    are not tensors of one shape."""
    first = load(0)
    if not isinstance(first, torch.Tensor) or count == 1:
        return [first, *map_rows(load, range(1, count))]
    batch = new_batch((count, *first.shape), first.dtype, like=first)
    copy_image(batch[0], first)

    def fill(row: int) -> Any:
        image = load(row)
        if not isinstance(image, torch.Tensor) or image.shape != first.shape:
            return image
        copy_image(batch[row], image)
        return None

    misfits = map_rows(fill, range(1, count))
    if all(m is None for m in misfits):
        return batch
    return [first, *(batch[i + 1] if m is None else m for i, m in enumerate(misfits))]


def copy_image(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[...] = src`` on this thread only: torch's copy would start its own intra-op
    threads under each decode thread, which oversubscribes the cores."""
    try:
        np.copyto(dst.numpy(), src.numpy())
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16), or requires_grad
        dst.copy_(src)
