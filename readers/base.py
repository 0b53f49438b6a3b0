"""The map-style Dataset shared by every format, and the per-process handle cache.

A format module supplies a :class:`ShardReader` and an ``ImageDataset`` subclass whose
``open_shard(index)`` opens one; this module maps global indices to shards, opens shards
lazily in each process, decodes, and serves whole batches through ``__getitems__`` (which
``DataLoader`` calls with a batch's indices).
"""

from __future__ import annotations

import operator
import os
from bisect import bisect_right
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.random  # see below
import torch
from torch.utils.data import Dataset, get_worker_info

from readers.batch import SampleBatch, copy_image, new_batch
from readers.cache import ShardCache
from readers.crop import Crop
from readers.decode import decode_image
from readers.fused import crop_batch
from readers.manifest import Manifest, load_manifest
from readers.spec import DatasetError, StorageKind
from readers.storage import RemoteFolder

__all__ = ["ImageDataset", "ShardReader"]

# numpy.random is imported here, in the training process, because every DataLoader worker
# calls np.random.seed first thing: under NumPy 2 that attribute is a lazy import, and an
# import in a child forked from a threaded parent (the decode threads) can die of CPython's
# import-lock KeyError (python/cpython#87712), seen here as "worker exited unexpectedly".

Transform = Callable[[torch.Tensor], Any]


class ShardReader(Protocol):
    """One open shard, as a format module returns it."""

    labels: np.ndarray  # int64 [n]

    def read(self, i: int) -> bytes | memoryview | np.ndarray:
        """Stored value of local sample ``i``: encoded bytes or uint8 HWC pixels."""

    def read_pixels(self, idx: np.ndarray, out: torch.Tensor) -> None:
        """Copy raw fixed-shape samples ``idx`` into ``out`` ([k, H, W, 3] uint8)."""

    def path(self, i: int) -> str:
        """Source path of local sample ``i``, relative to the converted folder."""


def _one_intra_op_thread() -> None:
    """Torch ops on a decode thread (a crop's resize) run on that thread alone: with its
    own intra-op team under each decode thread they oversubscribed the cores, and a resize
    took 2-10x longer. OpenMP keeps the setting per thread; torch also makes it the default
    of threads started later, which ``_map`` puts back."""
    torch.get_num_threads()  # first use on this thread: take the process default now
    torch.set_num_threads(1)


def _default_decode_threads() -> int:
    if get_worker_info() is not None:
        return 1  # DataLoader workers already use the cores
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _check_size(path: Path, index: int, expected: int) -> None:
    """Checked before opening: a format library may mmap the file and die of SIGBUS on a
    page past a cut (LMDB does), or read the wrong bytes from a resized file."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise DatasetError(f"{path}: shard {index} listed in the manifest is missing") from None
    if size != expected:
        raise DatasetError(
            f"{path}: shard {index} is {size} bytes but the manifest says {expected}: "
            "truncated or modified since the conversion (run imgpack verify)"
        )


class ImageDataset(Dataset):
    """Map-style dataset over an imgpack folder of one format; subclasses set ``format``.

    Args:
        root: the dataset folder (the one holding ``imgpack.json``), or its URL
            (``s3://bucket/prefix``, anything fsspec reaches; see ``docs/FORMATS.md``).
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
            opened, and the size that folder is kept under (:mod:`readers.cache`;
            defaults ``$IMGPACK_CACHE_DIR`` or ``~/.cache/imgpack``, 50 GiB).

    Images are ``torch.uint8`` ``[3, H, W]`` RGB views of HWC storage (channels-last
    memory); labels are ``int`` class indices as torchvision's ``ImageFolder`` gives them.
    Nothing is opened until first use in each process, and nothing open is pickled.
    Every path (``ds[i]``, ``__getitems__``, ``crop=``, ``decode=False``) checks each
    sample as :mod:`readers.checks` says, and fails alike: a ``DatasetError`` naming
    ``shard[index]``.
    """

    format: ClassVar[str]
    byte_ranges: bool = False  # a remote dataset read by byte ranges, not cached shards

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Transform | None = None,
        decode_threads: int | None = None,
        decode: bool = True,
        crop: Crop | None = None,
        *,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
    ) -> None:
        if (transform is not None or crop is not None) and not decode:
            raise ValueError("transform= and crop= need decoded images: keep decode=True")
        self.manifest: Manifest = load_manifest(
            root, self.format, storage_options=storage_options, cache_dir=cache_dir
        )
        url = self.manifest.url
        self._remote = RemoteFolder(url, storage_options) if url is not None else None
        self._cache = ShardCache(cache_dir, cache_limit)
        self.decode = decode
        self.root = self.manifest.root
        self.transform = transform
        self.crop = crop
        self.decode_threads = decode_threads
        self._ends = list(accumulate(s.samples for s in self.manifest.shards))
        self._pid: int | None = None
        self._shards: dict[int, ShardReader] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pool_threads = 0
        self._targets: list[int] | None = None
        self._samples: list[tuple[str, int]] | None = None

    # --- what a subclass provides -------------------------------------------------------
    def open_shard(self, index: int) -> ShardReader:
        """Open shard ``index`` of this dataset (called once per shard per process)."""
        raise NotImplementedError

    # --- public API ---------------------------------------------------------------------
    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.manifest.classes)}

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, index: int) -> tuple[Any, int]:
        shard, local = self._locate(index)
        return self._load(shard, local), int(self._shard(shard).labels[local])

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        """Fetch a whole batch into one tensor: a gather for raw pixels of one shape, a
        threaded decode otherwise. Images of differing shapes come back as a list."""
        located = [self._locate(i) for i in indices]
        labels = torch.tensor([int(self._shard(s).labels[k]) for s, k in located])
        if not located:
            return SampleBatch([], labels)
        if self.crop is not None and self.transform is None:
            batch = new_batch((len(located), 3, *self.crop.size), torch.uint8)
            rows = batch.permute(0, 2, 3, 1)
            self._crop_into(self.crop, located, [self._shard(s).read(k) for s, k in located], rows)
            return SampleBatch(batch, labels)
        layout = self.manifest.layout
        if layout.kind is StorageKind.FIXED_PIXELS and layout.shape and self.transform is None:
            height, width, channels = layout.shape
            images = new_batch((len(located), channels, height, width), torch.uint8)
            self._gather_pixels(located, images.permute(0, 2, 3, 1))
            return SampleBatch(images, labels)
        return SampleBatch(self._load_batch(located), labels)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s random crops (``crop=``); :class:`readers.EpochSampler`
        calls it, and so :func:`readers.make_loader`."""
        if self.crop is not None:
            self.crop.set_epoch(epoch)

    def stored(self, index: int) -> bytes | memoryview | np.ndarray:
        """Sample ``index`` as stored, without decoding: the encoded bytes (a memoryview of
        mmap'd pages for ``pt``) or, for ``raw``, the uint8 ``[H, W, 3]`` pixel array."""
        shard, local = self._locate(index)
        return self._shard(shard).read(local)

    def source_path(self, index: int) -> str:
        """The sample's file path relative to the folder it was converted from."""
        shard, local = self._locate(index)
        return self._shard(shard).path(local)

    @property
    def targets(self) -> list[int]:
        """All labels in index order, a list like ``ImageFolder.targets`` (read once)."""
        if self._targets is None:
            self._targets = [
                int(x) for k in range(len(self.manifest.shards)) for x in self._shard(k).labels
            ]
        return self._targets

    @property
    def samples(self) -> list[tuple[str, int]]:
        """``(source path, label)`` per sample, like ``ImageFolder.samples`` (paths relative
        to the converted folder; read once)."""
        if self._samples is None:
            self._samples = [(self.source_path(i), y) for i, y in enumerate(self.targets)]
        return self._samples

    @property
    def imgs(self) -> list[tuple[str, int]]:
        """:attr:`samples`, under the alias ``ImageFolder`` also gives it."""
        return self.samples

    # --- internals ----------------------------------------------------------------------
    def _locate(self, index: Any) -> tuple[int, int]:
        """Shard and local index of ``index``: an int, a NumPy integer, or a 0-d integer
        tensor or array (what ``Subset`` over a tensor of indices passes)."""
        dtype = getattr(index, "dtype", None)
        boolean = isinstance(index, bool) or dtype in (torch.bool, np.bool_)
        try:
            if boolean or getattr(index, "ndim", 0) != 0:
                raise TypeError
            index = operator.index(index)
        except TypeError:
            kind = type(index).__name__ + (f" of {dtype}" if dtype is not None else "")
            raise TypeError(
                f"{self.root}: indices must be integers, not {kind} "
                "(for a subset, use torch.utils.data.Subset(ds, indices))"
            ) from None
        n = len(self)
        position = index + n if index < 0 else index
        if not 0 <= position < n:
            raise IndexError(f"{self.root}: index {index} out of range for {n} samples")
        shard = bisect_right(self._ends, position)
        return shard, position - (self._ends[shard - 1] if shard else 0)

    def cache_shard(self, index: int) -> None:
        """Copy shard ``index`` of a remote dataset (and its sidecars) into the local cache,
        as its first read does (a no-op for a local dataset): to prefetch, or to check."""
        if self._remote is None:
            return
        info = self.manifest.shards[index]
        names = {info.path: info.sha256, **{info.path + s: h for s, h in info.sidecars.items()}}
        try:
            self._cache.fetch(self._remote, names, {info.path: info.bytes})
        except FileNotFoundError:
            raise DatasetError(
                f"{self.manifest.url}/{info.path}: shard {index} listed in the manifest is missing"
            ) from None

    def _shard(self, index: int) -> ShardReader:
        pid = os.getpid()
        if self._pid != pid:  # first use, or a fork since: never share handles
            self._shards, self._pool, self._pool_threads, self._pid = {}, None, 0, pid
        reader = self._shards.get(index)
        if reader is None:
            expected = self.manifest.shards[index]
            if self._remote is None or not self.byte_ranges:
                self.cache_shard(index)
                _check_size(self.manifest.shard_path(index), index, expected.bytes)
            reader = self.open_shard(index)
            if len(reader.labels) != expected.samples:
                raise DatasetError(
                    f"{self.manifest.location}/{expected.path}: shard {index} holds "
                    f"{len(reader.labels)} samples but the manifest says {expected.samples}"
                )
            self._shards[index] = reader
        return reader

    def _load_batch(self, located: list[tuple[int, int]]) -> torch.Tensor | list[Any]:
        """Decode and transform in threads, each copying its image into the batch."""
        first = self._load(*located[0])
        if not isinstance(first, torch.Tensor) or len(located) == 1:
            return [first, *self._map(lambda sk: self._load(*sk), located[1:])]
        batch = new_batch((len(located), *first.shape), first.dtype, like=first)
        copy_image(batch[0], first)

        def fill(i: int) -> Any:
            image = self._load(*located[i])
            if not isinstance(image, torch.Tensor) or image.shape != first.shape:
                return image
            copy_image(batch[i], image)
            return None

        misfits = self._map(fill, range(1, len(located)))
        if all(m is None for m in misfits):
            return batch
        return [first, *(batch[i + 1] if m is None else m for i, m in enumerate(misfits))]

    def _load(self, shard: int, local: int) -> Any:
        return self._decode(self._shard(shard).read(local), shard, local)

    def _decode(self, value: Any, shard: int, local: int) -> Any:
        """A stored value of local sample ``local`` of ``shard`` as the image it serves."""
        if self.crop is None:
            image = self._to_tensor(value, shard, local)
        else:
            rows = torch.empty((1, *self.crop.size, 3), dtype=torch.uint8)
            self._crop_into(self.crop, [(shard, local)], [value], rows)
            image = rows[0].permute(2, 0, 1)
        return self.transform(image) if self.transform is not None else image

    def _crop_into(
        self, crop: Crop, located: list[tuple[int, int]], values: list[Any], rows: torch.Tensor
    ) -> None:
        """Decode, crop and resize each sample into its HWC row of ``rows``, on the decode
        threads (see :mod:`readers.fused`)."""
        crop_batch(
            values,
            np.array([(self._ends[s - 1] if s else 0) + k for s, k in located]),
            crop,
            rows.numpy(),
            self._map,
            lambda row: f"{self.manifest.shard_path(located[row][0])}[{located[row][1]}]",
        )

    def _to_tensor(self, value: Any, shard: int, local: int) -> torch.Tensor:
        if not self.decode and not isinstance(value, np.ndarray):
            return torch.frombuffer(bytearray(value), dtype=torch.uint8)
        if isinstance(value, np.ndarray):
            pixels = value
        else:
            try:
                pixels = decode_image(value)
            except ValueError as e:  # name the sample only when it fails: this path is hot
                where = f"{self.manifest.shard_path(shard)}[{local}]"
                raise DatasetError(f"{where}: {e}") from e
        return torch.from_numpy(pixels).permute(2, 0, 1)

    def _gather_pixels(self, located: list[tuple[int, int]], out: torch.Tensor) -> None:
        """Copy raw samples straight into their rows of ``out``: one call when the batch
        lies in one shard, else one per row (still one copy per sample, no re-shuffle)."""
        shards = {shard for shard, _ in located}
        if len(shards) == 1:
            local = np.fromiter((k for _, k in located), np.int64, len(located))
            self._shard(shards.pop()).read_pixels(local, out)
            return
        for row, (shard, k) in enumerate(located):
            self._shard(shard).read_pixels(np.array([k]), out[row : row + 1])

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``[fn(x) for x in items]`` on the decode threads, one interleaved slice each (a
        task per sample costs measurably more in futures and wake-ups)."""
        threads = self.decode_threads or _default_decode_threads()
        if threads <= 1 or len(items) < 2:
            return [fn(x) for x in items]
        default = torch.get_num_threads()  # what threads started later default to
        if self._pool is None or self._pool_threads != threads:
            self._pool = ThreadPoolExecutor(
                threads, thread_name_prefix="imgpack-decode", initializer=_one_intra_op_thread
            )
            self._pool_threads = threads
        step = min(threads, len(items))
        slices = [items[k::step] for k in range(step)]
        results: list[Any] = [None] * len(items)
        for k, part in enumerate(self._pool.map(lambda xs: [fn(x) for x in xs], slices)):
            results[k::step] = part
        torch.set_num_threads(default)  # a new decode thread made its own the default
        return results

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()  # handles and threads never cross processes
        state.update(_pid=None, _shards={}, _pool=None, _pool_threads=0)  # labels stay
        return state

    def __repr__(self) -> str:
        m = self.manifest
        return (
            f"{type(self).__name__}({m.url or str(self.root)!r}, samples={len(self)}, "
            f"encoding={m.encoding!r}, classes={len(m.classes)}, shards={len(m.shards)})"
        )
