"""A mixture's sources opened and described: what the mixture loader and the bucketed one
share (:func:`readers.mixture_dataset.make_mixture_loader`,
:func:`readers.bucket_mixture_dataset.make_bucket_mixture_loader`).

:func:`open_mixture` opens each source (a folder, a URL or a dataset already opened) with
the read options, refuses fields a source lacks or holds as another kind, and, unless each
batch gets its own shape (aspect buckets), sources whose images cannot form one batch; it
returns the datasets and their :class:`readers.epochs.mixture.Mixture`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from readers.dataset import ImageDataset
from readers.epochs.loading import opened_dataset, with_read_options
from readers.epochs.mixture import Mixture, MixtureSource, WeightsArg, make_schedule
from readers.images.crop import Crop
from readers.spec import StorageKind

__all__ = ["open_mixture"]


def open_mixture(
    paths: Mapping[str, str | os.PathLike[str] | ImageDataset],
    *,
    weights: WeightsArg,
    epoch_size: int | None,
    stratify: bool,
    shuffle: bool,
    seed: int,
    crop: Crop | None,
    fields: Sequence[str] | None,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    one_shape: bool = True,
) -> tuple[dict[str, ImageDataset], Mixture]:
    """The sources opened with ``crop`` and ``fields``, by name, and their mixture.

    Args:
        one_shape: refuse sources whose images cannot be stacked in one batch (False: the
            crop gives each batch its own shape, as aspect buckets do).
        The rest: as :func:`readers.mixture_dataset.make_mixture_loader`.

    Raises:
        ValueError: no source, a source with no sample, fields missing or of other kinds,
            images of different sizes (with ``one_shape``), weights naming other sources.
    """
    if not paths:
        raise ValueError("a mixture needs at least one source")
    opened = {str(k): opened_dataset(p, storage_options, cache_dir) for k, p in paths.items()}
    _require_fields(opened, fields)
    datasets = {
        name: with_read_options(d, None, None, True, crop, fields) for name, d in opened.items()
    }
    if one_shape:
        _require_one_shape(datasets)
    sources = tuple(
        MixtureSource(name, len(d), d.manifest.content_sha256) for name, d in datasets.items()
    )
    if not all(s.samples for s in sources):
        raise ValueError(
            f"mixture sources with no sample: {[s.name for s in sources if not s.samples]}"
        )
    size = sum(s.samples for s in sources) if epoch_size is None else int(epoch_size)
    if size < 1:
        raise ValueError(f"epoch_size={epoch_size!r}: at least 1")
    mixture = Mixture(sources, make_schedule(weights, sources), size, seed, stratify, shuffle)
    return datasets, mixture


def _require_fields(datasets: Mapping[str, ImageDataset], fields: Sequence[str] | None) -> None:
    """Refuse fields a source lacks or holds as another kind, naming the sources."""
    for name in fields or ():
        lacking = [k for k, d in datasets.items() if name not in d.manifest.fields]
        if lacking:
            raise ValueError(f"mixture sources without the field {name!r}: {', '.join(lacking)}")
        kinds = {k: d.manifest.fields[name] for k, d in datasets.items()}
        if len(set(kinds.values())) > 1:
            shown = ", ".join(f"{k} {spec.to_json()}" for k, spec in kinds.items())
            raise ValueError(f"mixture sources hold the field {name!r} as different kinds: {shown}")


def _require_one_shape(datasets: Mapping[str, ImageDataset]) -> None:
    """Refuse sources whose images cannot be stacked in one batch, naming each's size."""
    shapes = {name: _shape(d) for name, d in datasets.items()}
    if len(set(shapes.values())) > 1:
        shown = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(
            f"mixture sources whose images cannot form one batch: {shown}; pass crop= "
            "(readers.CenterCrop or RandomResizedCrop) to give them one size"
        )


def _shape(dataset: ImageDataset) -> str:
    """A dataset's image size as served: the crop's, the stored one, or "various"."""
    if dataset.crop is not None:
        return "{}x{}".format(*dataset.crop.size)
    layout = dataset.manifest.layout
    if layout.kind is StorageKind.FIXED_PIXELS and layout.shape:  # no shard opened
        return "{}x{}".format(*layout.shape[:2])
    shapes: set[tuple[int, int]] = set()
    for shard in dataset.each_shard():  # a shard's sizes at a time: none kept
        shapes.update(map(tuple, np.unique(shard.sizes(), axis=0).tolist()))
        if len(shapes) > 1:
            break
    return "{}x{}".format(*shapes.pop()) if len(shapes) == 1 else "various sizes"
