"""Readers for ``wds`` (WebDataset) tar shards: random access by index, and streaming.

On-disk layout (names in ``readers.spec``): standard WebDataset tars ``shard-NNNNNN.tar``
whose members are ``KEY.<ext>`` (``jpg``/``png``/... encoded image, or ``npy`` raw pixels),
``KEY.cls`` (label, ASCII digits) and ``KEY.path.txt`` (source path), KEY being the
10-digit sample index. Beside each tar, ``shard-NNNNNN.tar.idx.json`` lists per sample the
data offset and size of its image member, the extension, label and path: with it the same
tars serve ``WdsDataset[i]`` by one ``pread``, while :class:`WdsStream` reads them
sequentially through the ``webdataset`` library (shard and buffer shuffle, worker and rank
split). Only the extensions above are accepted; anything else (``.pyd``, ``.pickle``) is
refused, never decoded.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import tarfile
from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np
import torch
import webdataset
from torch.utils.data import IterableDataset
from webdataset.tariterators import group_by_keys, tar_file_expander
from webdataset.utils import pytorch_worker_info

from readers import spec
from readers.base import ImageDataset, Transform
from readers.decode import decode_image
from readers.spec import DatasetError, Manifest, ShardInfo, load_manifest

__all__ = ["WdsDataset", "WdsStream", "read_index"]

_ALLOWED_EXTS = frozenset((*spec.WDS_IMAGE_EXTS, spec.WDS_LABEL_EXT, spec.WDS_PATH_EXT))
_INDEX_COLUMNS = ("offsets", "sizes", "exts", "labels", "paths")


def read_index(tar_path: str, tar_size: int) -> dict[str, list[Any]]:
    """Load the random-access index that sits beside ``tar_path`` and check every entry,
    including that it points inside the tar's ``tar_size`` bytes."""
    path = tar_path + spec.WDS_INDEX_SUFFIX
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
        columns = [index[k] for k in _INDEX_COLUMNS]
        if not all(isinstance(c, list) and len(c) == len(columns[0]) for c in columns):
            raise ValueError("columns of different lengths")
        for k, entry in enumerate(zip(*columns, strict=True)):
            _check_index_entry(k, *entry, tar_size)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DatasetError(f"{path}: missing or invalid tar index: {e}") from e
    return index


def _check_index_entry(
    k: int, offset: Any, size: Any, ext: Any, label: Any, path: Any, tar_size: int
) -> None:
    """Raise ValueError for an entry the writer would not write: a damaged or hand-made
    index must not make a read return bytes from beyond the tar, nor a label of any type."""
    in_tar = type(offset) is int and type(size) is int and 0 <= offset <= offset + size <= tar_size
    if not in_tar:
        raise ValueError(
            f"sample {k}: {size!r} bytes at {offset!r} are not inside the {tar_size}-byte tar"
        )
    if ext not in spec.WDS_IMAGE_EXTS or type(label) is not int or not isinstance(path, str):
        raise ValueError(f"sample {k}: invalid extension, label or path")


def _npy_to_array(data: bytes, name: str) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as e:
        raise DatasetError(f"{name}: invalid .npy sample: {e}") from e
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise DatasetError(f"{name}: .npy sample is {array.dtype}{array.shape}, not uint8 HxWx3")
    return array


class WdsShard:
    """A tar shard read by offset through its index."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd = os.open(path, os.O_RDONLY)
        index = read_index(path, os.fstat(self._fd).st_size)
        self._offsets = index["offsets"]
        self._sizes = index["sizes"]
        self._exts = index["exts"]
        self._paths = index["paths"]
        self.labels = np.asarray(index["labels"], dtype=np.int64)

    def read(self, i: int) -> bytes | np.ndarray:
        size = self._sizes[i]
        data = os.pread(self._fd, size, self._offsets[i])
        if len(data) != size:  # the index was checked at open: the tar shrank since
            raise DatasetError(f"{self._path}: sample {i} lies past the end of the file")
        if self._exts[i] == spec.WDS_RAW_EXT:
            return _npy_to_array(data, f"{self._path}[{i}]")
        return data

    def read_pixels(self, idx: np.ndarray, out: torch.Tensor) -> None:
        # The pixels are the last bytes of each .npy member: read them straight into the row.
        rows = out.numpy().reshape(len(idx), -1)
        row_bytes = rows.shape[1]
        for row, i in enumerate(idx.tolist()):
            offset, size = self._offsets[i], self._sizes[i]
            if self._exts[i] != spec.WDS_RAW_EXT or size < row_bytes:
                raise DatasetError(f"{self._path}: sample {i} is not a raw sample of this shape")
            got = os.preadv(self._fd, [rows[row]], offset + size - row_bytes)
            if got != row_bytes:
                raise DatasetError(f"{self._path}: sample {i} lies past the end of the file")

    def path(self, i: int) -> str:
        return self._paths[i]

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)


class WdsDataset(ImageDataset):
    """Map-style, random-access dataset over WebDataset tars (through their indexes)."""

    format = "wds"

    def open_shard(self, index: int) -> WdsShard:
        return WdsShard(str(self.manifest.shard_path(index)))


def sample_to_item(sample: dict[str, Any], transform: Transform | None) -> tuple[Any, int]:
    """Turn one webdataset sample dict (raw bytes per extension) into ``(image, label)``.

    Only imgpack's extensions are accepted: decoding never runs code from the data.
    """
    name = f"{sample.get('__url__', '?')}:{sample.get('__key__', '?')}"
    fields = {k for k in sample if not k.startswith("__")}
    unknown = fields - _ALLOWED_EXTS
    if unknown:
        raise DatasetError(f"{name}: refusing member(s) {sorted(unknown)} (not imgpack fields)")
    image_exts = [e for e in spec.WDS_IMAGE_EXTS if e in sample]
    if len(image_exts) != 1 or spec.WDS_LABEL_EXT not in sample:
        raise DatasetError(f"{name}: expected one image member and a .cls member")
    data = sample[image_exts[0]]
    if image_exts[0] == spec.WDS_RAW_EXT:
        pixels = _npy_to_array(data, name)
    else:
        pixels = decode_image(data, name)
    image = torch.from_numpy(pixels).permute(2, 0, 1)
    if transform is not None:
        image = transform(image)
    return image, int(sample[spec.WDS_LABEL_EXT])


class WdsStream(IterableDataset):
    """Streaming reader over imgpack tars, built on the ``webdataset`` library.

    Each epoch the shard list is shuffled with ``seed + epoch`` (the same order on every
    rank), split across ranks (``torch.distributed``) and DataLoader workers, and samples go
    through a shuffle buffer of ``shuffle_buffer`` samples (0: stored order, no shuffling).
    Use ``num_workers`` no larger than the number of shards, or some workers get nothing.

    Args:
        root: the dataset folder (the one holding ``imgpack.json``).
        transform: applied to each ``[3, H, W]`` uint8 image tensor.
        shuffle_buffer: samples held for shuffling; 0 disables both shuffles.
        seed: base seed of the shard and sample shuffles.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Transform | None = None,
        shuffle_buffer: int = 1000,
        seed: int = 0,
    ) -> None:
        self.manifest: Manifest = load_manifest(root, expect_format="wds")
        self.transform = transform
        self.shuffle_buffer = shuffle_buffer
        self.seed = seed
        self.epoch = 0

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle differently in each epoch (call before iterating, on every rank)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        urls = [str(self.manifest.shard_path(i)) for i in range(len(self.manifest.shards))]
        shards = dict(zip(urls, self.manifest.shards, strict=True))  # before any shuffle
        rank, _, worker, _ = pytorch_worker_info()
        stages: list[Any] = []
        if self.shuffle_buffer > 0:
            # The same shard order on every rank and worker, then each takes its share.
            random.Random(self.seed + self.epoch).shuffle(urls)
            rng = random.Random(f"{self.seed}/{self.epoch}/{rank}/{worker}")
            stages = [webdataset.shuffle(self.shuffle_buffer, rng=rng)]
        pipeline = webdataset.DataPipeline(
            webdataset.SimpleShardList(urls),
            webdataset.split_by_node,
            webdataset.split_by_worker,
            partial(_tar_samples, shards=shards),
            *stages,
        )
        samples = iter(pipeline)
        with contextlib.closing(samples):  # on an error too: the open tar closes now
            for sample in samples:
                yield sample_to_item(sample, self.transform)


def _tar_samples(
    urls: Iterator[dict[str, Any]], shards: dict[str, ShardInfo]
) -> Iterator[dict[str, Any]]:
    """webdataset's tar expansion and grouping, on files this stage opens and closes, held
    to what the manifest (``shards``, by path) says: a tar of another size, a member name
    that is a path, or a tar that ends early is a DatasetError naming the tar, never a
    silently shorter epoch (tarfile takes a cut at a member boundary for the end)."""
    for item in urls:
        url, expected = item["url"], shards[item["url"]]
        with open(url, "rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            if size != expected.bytes:
                raise DatasetError(
                    f"{url}: shard is {size} bytes but the manifest says {expected.bytes}: "
                    "truncated or modified since the conversion (run imgpack verify)"
                )
            members = tar_file_expander([{"url": url, "stream": stream}])
            count = 0
            try:
                for sample in group_by_keys(_plain_members(members, url)):
                    count += 1
                    yield sample
            except tarfile.TarError as e:  # webdataset appends the stream to the message
                raise DatasetError(f"{url}: damaged tar: {e.args[0] if e.args else e}") from e
        if count != expected.samples:
            raise DatasetError(
                f"{url}: holds {count} samples but the manifest says {expected.samples}"
            )


def _plain_members(members: Iterator[dict[str, Any]], url: str) -> Iterator[dict[str, Any]]:
    """Refuse any member name that is a path (``/etc/x.jpg``, ``../x.jpg``): imgpack writes
    only ``KEY.ext``. Nothing is ever extracted, but such a tar is not one of ours."""
    for member in members:
        name = member.get("fname")
        if name is not None and ("/" in name or "\\" in name):
            raise DatasetError(f"{url}: refusing member {name!r}: not a plain KEY.ext name")
        yield member
