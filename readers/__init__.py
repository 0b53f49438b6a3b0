"""PyTorch datasets over imgpack folders: pick the backend by path, not by code.

>>> loader = readers.make_loader("/data/imagenet-pt", batch_size=256, num_workers=4)
>>> for epoch in range(90):
...     loader.set_epoch(epoch)
...     for images, labels in loader: ...        # this rank's share, exact and resumable

or, map-style by hand:

>>> ds = readers.open_dataset("/data/imagenet-pt")            # whatever format it holds
>>> loader = DataLoader(ds, batch_size=256, shuffle=True, collate_fn=readers.collate)

Training crops are reader options, done inside the decode (no per-sample transform):

>>> crop = readers.RandomResizedCrop(224, flip=True)          # torchvision's semantics
>>> loader = readers.make_loader("/data/imagenet-pt", batch_size=256, crop=crop)

Training code imports this package only; it never pulls in the converter.
"""

from __future__ import annotations

from readers.base import ImageDataset
from readers.batch import SampleBatch, collate, collate_any
from readers.crop import CenterCrop, RandomResizedCrop
from readers.decode import decode_image, decoder_name
from readers.device import DevicePrefetcher
from readers.hdf5 import Hdf5Dataset
from readers.lmdb import LmdbDataset
from readers.loader import Loader, make_loader
from readers.manifest import Manifest, load_manifest
from readers.measure import WaitMeter, measure_wait
from readers.pt import PtDataset
from readers.registry import DATASETS, open_dataset
from readers.sampler import EpochSampler
from readers.spec import DatasetError
from readers.storage import StorageError
from readers.stream import WdsStream
from readers.tune import tune_loader
from readers.wds import WdsDataset

__all__ = [
    "DATASETS",
    "CenterCrop",
    "DatasetError",
    "DevicePrefetcher",
    "EpochSampler",
    "Hdf5Dataset",
    "ImageDataset",
    "LmdbDataset",
    "Loader",
    "Manifest",
    "PtDataset",
    "RandomResizedCrop",
    "SampleBatch",
    "StorageError",
    "WaitMeter",
    "WdsDataset",
    "WdsStream",
    "collate",
    "collate_any",
    "decode_image",
    "decoder_name",
    "load_manifest",
    "make_loader",
    "measure_wait",
    "open_dataset",
    "tune_loader",
]

__version__ = "0.1.0"
