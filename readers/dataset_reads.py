"""What a map-style dataset reads without decoding: samples as stored
(:meth:`StoredReads.read_stored`), its schema (:attr:`StoredReads.fields`, issue 30), the
fields chosen with ``fields=`` (:meth:`StoredReads.read_fields`), every sample's stored image
size (:attr:`StoredReads.sizes`) and the metadata table (:meth:`StoredReads.metadata`,
built by :mod:`readers.metadata`); the last two read each shard that
:meth:`StoredReads.each_shard` opens, a remote ``wds`` tar by byte ranges.

A mixin of :class:`readers.ImageDataset`, as :mod:`readers.imagefolder` is. Each read goes
shard by shard in ascending order (:func:`by_shard`); field values come from each shard's
:attr:`readers.formats.ShardReader.fields` columns, which check them as image bytes are
checked, and never through the images.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from itertools import groupby
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from readers.batch import Sample
from readers.fields import FieldSpec
from readers.formats import (
    FORMAT_READERS,
    ShardOpener,
    ShardReader,
    open_by_ranges,
    open_checked,
    open_local_shard,
)
from readers.formats.field_columns import FieldColumn
from readers.manifest import Manifest
from readers.spec import SIZES_VERSION, DatasetError

if TYPE_CHECKING:
    import pyarrow

__all__ = ["StoredBatch", "StoredReads", "by_shard", "chosen_fields"]


def chosen_fields(schema: Mapping[str, FieldSpec], fields: Any, where: object) -> tuple[str, ...]:
    """The names ``fields=`` chooses, checked against ``schema`` (None: none).

    Raises:
        ValueError: naming ``where`` (the dataset), for a name the schema lacks (listing
            the names it has), a name given twice, or a lone string.
    """
    if fields is None:
        return ()
    if isinstance(fields, str | bytes):
        raise ValueError(f"{where}: fields= takes a sequence of names: fields=({fields!r},)")
    names = tuple(fields)
    unknown = [name for name in names if name not in schema]
    if unknown:
        have = ", ".join(schema) if schema else "none (a dataset converted without fields)"
        raise ValueError(f"{where}: no field {unknown[0]!r} in this dataset; its fields: {have}")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"{where}: fields= names {twice[0]!r} twice")
    return names


def by_shard(
    located: Sequence[tuple[int, int]], read: Callable[[int, list[int]], Sequence[Any]]
) -> list[Any]:
    """``read(shard, local indices)`` of the samples ``(shard, local index)`` of each shard
    in turn, ascending, its values put back in ``located``'s order."""
    order = sorted(range(len(located)), key=located.__getitem__)
    values: list[Any] = [None] * len(located)
    for shard, group in groupby(order, key=lambda row: located[row][0]):
        rows = list(group)
        for row, value in zip(rows, read(shard, [located[r][1] for r in rows]), strict=True):
            values[row] = value
    return values


@dataclass(frozen=True)
class StoredBatch:
    """A batch's samples as stored (:meth:`ImageDataset.stored_batch`): values, labels and
    the fields chosen; ``where(row)`` names a sample in errors; ``verified``: every value
    passed the CRC-32 recorded at conversion (the kernel may stop decoding after a box)."""

    values: list[Any]
    labels: torch.Tensor
    field_values: tuple[list[Any], ...]
    where: Callable[[int], str]
    verified: bool


class StoredReads:
    """Stored values, fields, sizes and metadata over :attr:`manifest` and the shards of
    :meth:`shard`; :attr:`field_names` are the fields each sample carries (set by the
    dataset)."""

    manifest: Manifest
    opener: ShardOpener  # how :meth:`shard` opens a shard
    field_names: tuple[str, ...] = ()

    def shard(self, index: int) -> ShardReader:
        raise NotImplementedError

    def locate(self, index: Any) -> tuple[int, int]:
        raise NotImplementedError

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """The dataset's schema: field name -> :class:`readers.fields.FieldSpec`, names
        sorted (empty for a dataset without fields, and one of format version 1)."""
        return MappingProxyType(self.manifest.fields)

    @property
    def field_specs(self) -> tuple[FieldSpec, ...]:
        """The specs of :attr:`field_names`, in their order."""
        return tuple(self.manifest.fields[name] for name in self.field_names)

    @cached_property
    def sizes(self) -> np.ndarray:
        """int64 ``[N, 2]``: every sample's stored (height, width), in index order, from
        the sizes the shards record (version 1 shards: from their images' headers). Read
        once per dataset object, on first use, shard by shard as :meth:`each_shard` opens
        them: a ``wds`` dataset in object storage from its tars' indexes alone (no tar
        copied into the cache); a remote ``pt``, ``hdf5`` or ``lmdb`` dataset, or one of
        version 1, has every shard copied into the cache, as its first read would."""
        shards = [shard.sizes() for shard in self.each_shard()]
        if not shards:
            return np.empty((0, 2), dtype=np.int64)
        return np.ascontiguousarray(np.concatenate(shards), dtype=np.int64)

    def each_shard(self) -> Iterator[ShardReader]:
        """Every shard's reader, in order, for one pass over what the shards record beside
        the images (labels, sizes, fields), as :attr:`sizes` and :meth:`metadata` make.

        A dataset in object storage opened with the default opener, whose format reads by
        byte ranges (:func:`readers.formats.open_by_ranges`: ``wds``) and records its sizes
        (format version 2, :data:`readers.spec.SIZES_VERSION`), is read so: each shard's index, then
        only the members asked for, never a copy of a shard; these readers serve the pass
        only (a later pass reads the indexes again). Any other shard is :meth:`shard`'s
        (kept open, through the opener given; a remote one copied into the cache once): a
        version 1 tar's sizes come from its images, which one copy of the tar fetches in
        fewer requests than a range each.
        """
        manifest = self.manifest
        in_place = (
            self.opener is open_local_shard
            and manifest.location.remote is not None
            and FORMAT_READERS[manifest.format].ranged is not None
            and manifest.format_version >= SIZES_VERSION
        )
        for k in range(len(manifest.shards)):
            yield open_checked(open_by_ranges, manifest, k) if in_place else self.shard(k)

    def metadata(self, columns: Sequence[str] | None = None) -> pyarrow.Table:
        """A ``pyarrow.Table`` of every sample's ``index``, ``label``, ``height``, ``width``
        and its text, json, int and float fields (``columns``: only these), read from the
        shards' columns without reading an image: filter it, and pass the ``index`` of the
        rows kept to ``readers.make_loader(path, indices=...)``. See
        :func:`readers.metadata.metadata_table`."""
        from readers.metadata import metadata_table

        return metadata_table(self, columns)

    def stored(self, index: int) -> bytes | memoryview | np.ndarray:
        """Sample ``index`` as stored, without decoding: the encoded bytes (a memoryview of
        mmap'd pages for ``pt``) or, for ``raw``, the uint8 ``[H, W, 3]`` pixel array."""
        shard, local = self.locate(index)
        return self.shard(shard).read(local)

    def read_stored(self, indices: Sequence[int]) -> list[bytes | memoryview | np.ndarray]:
        """Samples ``indices`` as :meth:`stored` gives each, in that order, read shard by
        shard in ascending order: one round of merged range requests per shard for a
        remote ``wds`` dataset read by byte ranges (what :class:`readers.WdsStream` does).
        The images only: :meth:`read_fields` reads the fields."""
        return self._read_located([self.locate(i) for i in indices])

    def _read_located(self, located: Sequence[tuple[int, int]]) -> list[Any]:
        """:meth:`read_stored` of the samples ``(shard, local index)``."""
        return by_shard(located, lambda shard, local: self.shard(shard).read_many(local))

    def stored_batch(self, indices: Sequence[int]) -> StoredBatch:
        """Samples ``indices`` before decoding, with what decoding them needs: the batches
        of several datasets join into one :func:`readers.images.fused.start_crops` call (a
        mixture's, :class:`readers.mixture_dataset.MixtureDataset`)."""
        located = [self.locate(i) for i in indices]
        return StoredBatch(
            values=self._read_located(located),
            labels=torch.tensor([int(self.shard(s).labels[k]) for s, k in located]),
            field_values=self._fields_of(located),
            where=lambda row: self._where(*located[row]),
            verified=all(self.shard(s).verified for s in {s for s, _ in located}),
        )

    def _where(self, shard: int, local: int) -> str:
        """A sample as errors name it: ``shard_path[local]``."""
        return f"{self.manifest.shard_path(shard)}[{local}]"

    def read_fields(self, indices: Sequence[int]) -> tuple[list[Any], ...]:
        """The values of :attr:`field_names` of samples ``indices``: one list per field, in
        ``indices``' order (None where a sample has no value), read shard by shard."""
        return self._fields_of([self.locate(i) for i in indices])

    def _fields_of(self, located: Sequence[tuple[int, int]]) -> tuple[list[Any], ...]:
        """:meth:`read_fields` of the samples ``(shard, local index)``."""
        return tuple(
            by_shard(located, partial(self._field_values, name)) for name in self.field_names
        )

    def _field_values(self, name: str, shard: int, local: list[int]) -> list[Any]:
        """Field ``name``'s values of samples ``local`` of ``shard``, checked."""
        column: FieldColumn | None = self.shard(shard).fields.get(name)
        if column is None:
            raise DatasetError(
                f"{self.manifest.location.where(self.manifest.shards[shard].path)}: shard "
                f"{shard} holds no field {name!r}, which the manifest lists"
            )
        return column.values(local)

    def _sample(
        self, image: Any, label: int, located: tuple[int, int], values: Sequence[Any] | None
    ) -> tuple[Any, ...]:
        """``(image, label)``, or with :attr:`field_names` a :class:`readers.Sample` with
        their ``values`` (read here when None)."""
        if not self.field_names:
            return image, label
        if values is None:
            values = [column[0] for column in self._fields_of([located])]
        return Sample((image, label, *values), self.field_specs)
