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

from readers.batch import SampleBatch, collate, collate_any
from readers.dataset import (
    DATASETS,
    Hdf5Dataset,
    ImageDataset,
    LmdbDataset,
    PtDataset,
    WdsDataset,
    open_dataset,
)
from readers.epochs.loader import Loader, make_loader
from readers.epochs.sampler import EpochSampler
from readers.epochs.stream import WdsStream
from readers.feeding.device import DevicePrefetcher
from readers.feeding.tune import tune_loader
from readers.feeding.wait import WaitMeter, measure_wait
from readers.images.crop import CenterCrop, Crop, RandomResizedCrop
from readers.images.decode import ImageTooLargeError, decode_image, decoder_name
from readers.manifest import Manifest, load_manifest
from readers.spec import DatasetError
from readers.storage.remote import StorageError

__all__ = [
    "DATASETS",
    "CenterCrop",
    "Crop",
    "DatasetError",
    "DevicePrefetcher",
    "EpochSampler",
    "Hdf5Dataset",
    "ImageDataset",
    "ImageTooLargeError",
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
