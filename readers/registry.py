"""The map-style reader of each format, and :func:`open_dataset`, which picks one by path."""

from __future__ import annotations

import os
from typing import Any

from readers.base import ImageDataset
from readers.hdf5 import Hdf5Dataset
from readers.lmdb import LmdbDataset
from readers.manifest import load_manifest
from readers.pt import PtDataset
from readers.wds import WdsDataset

__all__ = ["DATASETS", "open_dataset"]

DATASETS: dict[str, type[ImageDataset]] = {
    "pt": PtDataset,
    "hdf5": Hdf5Dataset,
    "lmdb": LmdbDataset,
    "wds": WdsDataset,
}


def open_dataset(root: str | os.PathLike[str], **kwargs: Any) -> ImageDataset:
    """Open the imgpack dataset at ``root`` with the map-style reader its manifest names.

    ``root`` may be a URL (``s3://bucket/prefix``). Keyword arguments go to the dataset
    class (``transform``, ``decode_threads``, ``crop``: :class:`readers.CenterCrop` or
    :class:`readers.RandomResizedCrop`; ``storage_options``, ``cache_dir``, ``cache_limit``
    for a URL). For
    streaming reads of ``wds`` tars use :class:`readers.WdsStream`, or
    :func:`readers.make_loader` with ``stream=True``.
    """
    remote = {k: kwargs[k] for k in ("storage_options", "cache_dir") if k in kwargs}
    manifest = load_manifest(root, **remote)
    return DATASETS[manifest.format](root, **kwargs)
