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

Captions and other fields ride along when asked for; the metadata table reads no image:

>>> ds = readers.open_dataset("/data/laion-pt", fields=("txt",))  # ds[i]: (image, label, txt)
>>> keep = ds.metadata()["index"].to_numpy()                  # pyarrow: filter, then
>>> loader = readers.make_loader("/data/laion-pt", 256, indices=keep, fields=("txt",))

Training code imports this package only; it never pulls in the converter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time each name is imported on first use
    from readers.batch import Sample, SampleBatch, collate, collate_any
    from readers.bucket_dataset import BucketLoader
    from readers.bucket_mixture_dataset import BucketMixtureLoader
    from readers.dataset import (
        DATASETS,
        Hdf5Dataset,
        ImageDataset,
        LmdbDataset,
        PtDataset,
        WdsDataset,
        open_dataset,
    )
    from readers.epochs.buckets import AspectBuckets
    from readers.epochs.loader import make_loader
    from readers.epochs.loading import Loader
    from readers.epochs.sampler import EpochSampler
    from readers.epochs.stream import WdsStream
    from readers.feeding.device import DevicePrefetcher
    from readers.feeding.tune import tune_loader
    from readers.feeding.wait import WaitMeter, measure_wait
    from readers.fields import FieldSpec
    from readers.images.crop import CenterCrop, Crop, RandomResizedCrop
    from readers.images.decode import ImageTooLargeError, decode_image, decoder_name
    from readers.manifest import Manifest, load_manifest
    from readers.mixture_dataset import MixtureLoader
    from readers.spec import DatasetError
    from readers.storage.remote import StorageError

# Each public name and the module that defines it. Imported lazily, so that `import readers`
# (which `import readers.spec` runs first) costs no torch: the `imgpack` command starts in
# a tenth of the time. tests/test_cli_startup.py checks this table against the block above.
_EXPORTS = {
    "Sample": "readers.batch",
    "SampleBatch": "readers.batch",
    "collate": "readers.batch",
    "collate_any": "readers.batch",
    "DATASETS": "readers.dataset",
    "Hdf5Dataset": "readers.dataset",
    "ImageDataset": "readers.dataset",
    "LmdbDataset": "readers.dataset",
    "PtDataset": "readers.dataset",
    "WdsDataset": "readers.dataset",
    "open_dataset": "readers.dataset",
    "BucketLoader": "readers.bucket_dataset",
    "BucketMixtureLoader": "readers.bucket_mixture_dataset",
    "AspectBuckets": "readers.epochs.buckets",
    "make_loader": "readers.epochs.loader",
    "Loader": "readers.epochs.loading",
    "EpochSampler": "readers.epochs.sampler",
    "WdsStream": "readers.epochs.stream",
    "DevicePrefetcher": "readers.feeding.device",
    "tune_loader": "readers.feeding.tune",
    "WaitMeter": "readers.feeding.wait",
    "measure_wait": "readers.feeding.wait",
    "FieldSpec": "readers.fields",
    "CenterCrop": "readers.images.crop",
    "Crop": "readers.images.crop",
    "RandomResizedCrop": "readers.images.crop",
    "ImageTooLargeError": "readers.images.decode",
    "decode_image": "readers.images.decode",
    "decoder_name": "readers.images.decode",
    "Manifest": "readers.manifest",
    "MixtureLoader": "readers.mixture_dataset",
    "load_manifest": "readers.manifest",
    "DatasetError": "readers.spec",
    "StorageError": "readers.storage.remote",
}

__all__ = [
    "DATASETS",
    "AspectBuckets",
    "BucketLoader",
    "BucketMixtureLoader",
    "CenterCrop",
    "Crop",
    "DatasetError",
    "DevicePrefetcher",
    "EpochSampler",
    "FieldSpec",
    "Hdf5Dataset",
    "ImageDataset",
    "ImageTooLargeError",
    "LmdbDataset",
    "Loader",
    "Manifest",
    "MixtureLoader",
    "PtDataset",
    "RandomResizedCrop",
    "Sample",
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


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562); a subpackage or
    module of ``readers`` by its name too, as an eager import would have bound it."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__version__ = "0.2.0"
