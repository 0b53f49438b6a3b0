"""The map-style datasets: :class:`ImageDataset`, one named class per format, and
:func:`open_dataset`, which picks one by the manifest at a path.

``ImageDataset`` maps global indices to shards, opens each shard lazily in each process
through the format's reader (:data:`readers.formats.SHARD_READERS`), decodes on the decode
threads, and serves whole batches through ``__getitems__`` (which ``DataLoader`` calls
with a batch's indices). What is read without decoding (stored values, the fields chosen
with ``fields=``, ``sizes``, ``metadata()``) is :mod:`readers.dataset_reads`'s.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any, ClassVar

import numpy as np
import numpy.random  # see below
import torch
from torch.utils.data import Dataset

from readers.batches_ahead import BatchesAhead
from readers.dataset_batches import BatchReads
from readers.dataset_reads import chosen_fields
from readers.formats import ShardOpener, ShardReader, open_checked, open_local_shard
from readers.imagefolder import ImageFolderAttributes
from readers.images.crop import Crop
from readers.images.decode import decode_image
from readers.images.pool import DecodePool
from readers.index import as_index
from readers.manifest import Manifest, load_manifest
from readers.placement import default_decode_threads
from readers.spec import DatasetError
from readers.storage.location import Location

__all__ = [
    "DATASETS",
    "Hdf5Dataset",
    "ImageDataset",
    "LmdbDataset",
    "PtDataset",
    "WdsDataset",
    "open_dataset",
]

# numpy.random is imported here, in the training process, because every DataLoader worker
# calls np.random.seed first thing: under NumPy 2 that attribute is a lazy import, and an
# import in a child forked from a threaded parent (the decode threads) can die of CPython's
# import-lock KeyError (python/cpython#87712), seen here as "worker exited unexpectedly".

Transform = Callable[[torch.Tensor], Any]


class ImageDataset(BatchReads, ImageFolderAttributes, Dataset):
    """Map-style dataset over an imgpack dataset of any format (the named subclasses,
    :class:`PtDataset` and the others, accept their own format only).

    Args:
        root: the dataset folder (the one holding ``imgpack.json``), its URL
            (``s3://bucket/prefix``, anything fsspec reaches; see ``docs/FORMATS.md``), or
            its :class:`Manifest` already loaded (:func:`readers.load_manifest`), whose
            location then holds the storage options and cache.
        transform: applied to each ``[3, H, W]`` uint8 image tensor.
        decode_threads: threads decoding one batch in ``__getitems__``; default all usable
            CPUs in the main process and 1 inside a DataLoader worker.
        decode: False serves encoded samples undecoded, as 1-D uint8 tensors of their
            bytes (raw samples stay pixels), to decode on the GPU
            (``DevicePrefetcher(..., gpu_decode=True)``); batch them with
            :func:`collate_any`.
        crop: a :class:`readers.CenterCrop` or :class:`readers.RandomResizedCrop` done
            inside the decode, straight into the batch (a JPEG decodes scaled down in the
            DCT domain when the crop allows); ``transform`` then sees the cropped image.
            Call :meth:`set_epoch` each epoch for new random crops.
        storage_options: for a URL, passed to fsspec (credentials, ``endpoint_url``...).
        cache_dir, cache_limit: where a remote dataset's shards are copied when first
            opened, and the size that folder is kept under (:mod:`readers.storage.cache`;
            defaults ``$IMGPACK_CACHE_DIR`` or ``~/.cache/imgpack``, 50 GiB).
        opener: how a shard is opened (:data:`readers.formats.ShardOpener`); default
            :func:`readers.formats.open_local_shard`. ``WdsStream`` passes its own, which
            reads remote tars by byte ranges.
        fields: names of the dataset's fields (:attr:`fields`) each sample also carries,
            in this order: ``ds[i]`` is then ``(image, label, *values)`` (a
            :class:`readers.Sample`; None where a sample has no value) and a batch
            ``(images, labels, *fields)`` (:func:`readers.collate`). ``crop``,
            ``transform`` and ``decode`` apply to the image only.

    Images are ``torch.uint8`` ``[3, H, W]`` RGB views of HWC storage (channels-last
    memory); labels are ``int`` class indices as torchvision's ``ImageFolder`` gives them.
    Nothing is opened until first use in each process, and nothing open is pickled.
    Every path (``ds[i]``, ``__getitems__``, ``crop=``, ``decode=False``) checks each
    sample and field as :mod:`readers.formats.checks` says, and fails alike: a
    ``DatasetError`` naming ``shard[index]``. :attr:`sizes` (stored height, width) and
    :meth:`metadata` (a ``pyarrow`` table to filter) read no image.
    """

    format: ClassVar[str | None] = None  # a named class reads that format only

    def __init__(
        self,
        root: str | os.PathLike[str] | Manifest,
        transform: Transform | None = None,
        decode_threads: int | None = None,
        decode: bool = True,
        crop: Crop | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        opener: ShardOpener = open_local_shard,
        fields: Sequence[str] | None = None,
    ) -> None:
        if (transform is not None or crop is not None) and not decode:
            raise ValueError("transform= and crop= need decoded images: keep decode=True")
        if isinstance(root, Manifest):
            manifest = root
            manifest.location.check_options(
                storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit
            )
            if self.format is not None and manifest.format != self.format:
                raise DatasetError(
                    f"{manifest.location}: dataset is {manifest.format!r}, not "
                    f"{self.format!r}: use readers.open_dataset"
                )
        else:
            location = Location.of(
                root, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit
            )
            manifest = load_manifest(location, self.format)
        self.manifest: Manifest = manifest
        self.field_names = chosen_fields(manifest.fields, fields, manifest.location)
        self.decode = decode
        self.root = manifest.root
        self.transform = transform
        self.crop = crop
        self.decode_threads = decode_threads
        self.opener = opener
        self._ends = list(accumulate(s.samples for s in manifest.shards))
        self._pid: int | None = None
        self._shards: dict[int, ShardReader] = {}
        self._pool = DecodePool()
        self._ahead = BatchesAhead()

    # --- public API ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return self.serve(self.stored(index), index)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s random crops (``crop=``); :class:`readers.EpochSampler`
        calls it, and so :func:`readers.make_loader`."""
        if self.crop is not None:
            self.crop.set_epoch(epoch)

    def serve(self, value: Any, index: int, values: Sequence[Any] | None = None) -> tuple[Any, ...]:
        """``ds[index]`` from its stored value (from :meth:`read_stored`): the image
        decoded, cropped and transformed as this dataset serves it, the label, and the
        fields chosen (their ``values`` from :meth:`read_fields`, else read here)."""
        shard, local = self.locate(index)
        image = self._decode(value, shard, local)
        return self._sample(image, int(self.shard(shard).labels[local]), (shard, local), values)

    def source_path(self, index: int) -> str:
        """The sample's file path relative to the folder it was converted from."""
        shard, local = self.locate(index)
        return self.shard(shard).path(local)

    def locate(self, index: Any) -> tuple[int, int]:
        """Shard and local index of ``index``: an int, a NumPy integer, or a 0-d integer
        tensor or array (:func:`readers.index.as_index`)."""
        index = as_index(index, self.root)
        n = len(self)
        position = index + n if index < 0 else index
        if not 0 <= position < n:
            raise IndexError(f"{self.root}: index {index} out of range for {n} samples")
        shard = bisect_right(self._ends, position)
        return shard, position - (self._ends[shard - 1] if shard else 0)

    def cache_shard(self, index: int) -> None:
        """Copy shard ``index`` of a remote dataset (and its sidecars) into the local cache,
        as its first read does (a no-op for a local dataset): to prefetch, or to check."""
        self.manifest.location.fetch(self.manifest.shards[index], index)

    def shard(self, index: int) -> ShardReader:
        """Shard ``index``, opened through :attr:`opener` on first use in this process
        (never shared across a fork) and checked to hold the manifest's sample count."""
        pid = os.getpid()
        if self._pid != pid:  # first use, or a fork since: never share handles
            self._shards, self._pid = {}, pid
        reader = self._shards.get(index)
        if reader is None:
            reader = self._shards[index] = open_checked(self.opener, self.manifest, index)
        return reader

    # --- internals ----------------------------------------------------------------------
    def _decode(self, value: Any, shard: int, local: int, crop: Crop | None = None) -> Any:
        """A stored value of local sample ``local`` of ``shard`` as the image it serves
        (cropped by ``crop``, a batch's own, else by the dataset's)."""
        crop = self.crop if crop is None else crop
        if crop is None:
            image = self._to_tensor(value, shard, local)
        else:
            height, width = crop.size
            if crop.channels_last:
                rows = torch.empty((1, height, width, 3), dtype=torch.uint8)
            else:
                rows = torch.empty((1, 3, height, width), dtype=torch.uint8).permute(0, 2, 3, 1)
            self._start_crops(crop, [(shard, local)], [value], rows).finish()
            image = rows[0].permute(2, 0, 1)
        return self.transform(image) if self.transform is not None else image

    def _to_tensor(self, value: Any, shard: int, local: int) -> torch.Tensor:
        if not self.decode and not isinstance(value, np.ndarray):
            return torch.frombuffer(bytearray(value), dtype=torch.uint8)
        if isinstance(value, np.ndarray):
            pixels = value
        else:
            try:
                pixels = decode_image(value, verified=self.shard(shard).verified)
            except ValueError as e:  # name the sample only when it fails: this path is hot
                raise DatasetError(f"{self._where(shard, local)}: {e}") from e
        return torch.from_numpy(pixels).permute(2, 0, 1)

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``[fn(x) for x in items]`` on the decode threads."""
        return self._pool.map(fn, items, self.decode_threads or default_decode_threads())

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()  # handles and threads never cross processes
        state.update(_pid=None, _shards={})  # labels stay; the pool pickles as none
        # nor the cached `sizes` (16 bytes a sample): a worker that asks reads them again
        state.pop("sizes", None)
        return state

    def __repr__(self) -> str:
        m = self.manifest
        return (
            f"{type(self).__name__}({m.url or str(self.root)!r}, samples={len(self)}, "
            f"encoding={m.encoding!r}, classes={len(m.classes)}, shards={len(m.shards)})"
        )


class PtDataset(ImageDataset):
    """Map-style dataset over ``.pt`` shards (layout: :mod:`readers.formats.pt`)."""

    format = "pt"


class Hdf5Dataset(ImageDataset):
    """Map-style dataset over HDF5 files (layout: :mod:`readers.formats.hdf5`)."""

    format = "hdf5"


class LmdbDataset(ImageDataset):
    """Map-style dataset over LMDB files (layout: :mod:`readers.formats.lmdb`)."""

    format = "lmdb"


class WdsDataset(ImageDataset):
    """Map-style, random-access dataset over WebDataset tars, through their indexes
    (layout: :mod:`readers.formats.wds`)."""

    format = "wds"


DATASETS: dict[str, type[ImageDataset]] = {
    cls.format: cls for cls in (PtDataset, Hdf5Dataset, LmdbDataset, WdsDataset) if cls.format
}


def open_dataset(
    root: str | os.PathLike[str] | Manifest,
    transform: Transform | None = None,
    decode_threads: int | None = None,
    decode: bool = True,
    crop: Crop | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    opener: ShardOpener = open_local_shard,
    fields: Sequence[str] | None = None,
) -> ImageDataset:
    """Open the imgpack dataset at ``root`` with the map-style reader its manifest names
    (the manifest is read once). The arguments are :class:`ImageDataset`'s:
    ``fields=("txt", "json")`` serves ``(image, label, txt, json)`` (``ds.fields``
    lists the dataset's fields).

    For streaming reads of ``wds`` tars use :class:`readers.WdsStream`, or
    :func:`readers.make_loader` with ``stream=True``.
    """
    manifest = root
    if not isinstance(manifest, Manifest):
        location = Location.of(
            root, storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit
        )
        manifest = load_manifest(location)
        storage_options = cache_dir = cache_limit = None  # used: the manifest holds them
    opens = dict(storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
    return DATASETS[manifest.format](  # beside a Manifest, options it does not hold: refused
        manifest, transform, decode_threads, decode, crop, opener=opener, fields=fields, **opens
    )
