"""PyTorch datasets over imgpack folders: pick the backend by path, not by code.

>>> ds = readers.open_dataset("/data/imagenet-pt")            # whatever format it holds
>>> loader = DataLoader(ds, batch_size=256, shuffle=True, collate_fn=readers.collate)

Training code imports this package only; it never pulls in the converter.
"""

from __future__ import annotations

import os
from typing import Any

from readers.base import ImageDataset, SampleBatch, collate
from readers.decode import decode_image, decoder_name
from readers.hdf5 import Hdf5Dataset
from readers.lmdb import LmdbDataset
from readers.pt import PtDataset
from readers.spec import DatasetError, Manifest, load_manifest
from readers.wds import WdsDataset, WdsStream

__all__ = [
    "DATASETS",
    "DatasetError",
    "Hdf5Dataset",
    "ImageDataset",
    "LmdbDataset",
    "Manifest",
    "PtDataset",
    "SampleBatch",
    "WdsDataset",
    "WdsStream",
    "collate",
    "decode_image",
    "decoder_name",
    "load_manifest",
    "open_dataset",
]

__version__ = "0.1.0"

DATASETS: dict[str, type[ImageDataset]] = {
    "pt": PtDataset,
    "hdf5": Hdf5Dataset,
    "lmdb": LmdbDataset,
    "wds": WdsDataset,
}


def open_dataset(root: str | os.PathLike[str], **kwargs: Any) -> ImageDataset:
    """Open the imgpack dataset at ``root`` with the map-style reader its manifest names.

    Keyword arguments go to the dataset class (``transform``, ``decode_threads``). For
    streaming reads of ``wds`` tars use :class:`WdsStream` directly.
    """
    manifest = load_manifest(root)
    return DATASETS[manifest.format](root, **kwargs)
