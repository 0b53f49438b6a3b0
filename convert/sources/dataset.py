"""An imgpack dataset of any format, local or at a URL, as a sample source: its manifest
gives the classes, its shards the samples (source path and label carried over), and each
worker reads stored values through :meth:`readers.ImageDataset.read_stored`. Fields are
carried as they are: the manifest's schema (``--fields`` choosing), each value's canonical
bytes read from its shard (``ShardReader.fields[name].raw``), never decoded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import readers
from convert.options import ConvertOptions
from convert.samples import Sample, SampleTable
from convert.scan import Scan
from convert.sources.base import (
    Stored,
    WithFields,
    position,
    refuse_folder_options,
    select_fields,
)
from readers import spec
from readers.storage.location import Location

__all__ = ["DatasetReader", "DatasetSource"]

_OPEN: dict[tuple[Location, str | None], readers.ImageDataset] = {}
"""The source dataset each worker process has open, reused by every chunk it prepares (a
chunk is a few samples; reopening a shard's index for each would cost more than the
samples): the last one only. ``ImageDataset`` reopens its handles itself after a fork."""


@dataclass(frozen=True)
class DatasetReader:
    """Reads samples of the dataset ``manifest`` describes by their positions in it."""

    manifest: readers.Manifest
    fields: tuple[str, ...] = ()  # the fields carried, schema order

    def read(self, samples: Sequence[Sample]) -> list[Stored]:
        ds = self._dataset()
        indices = [position(s) for s in samples]
        try:
            images = [_plain(v) for v in ds.read_stored(indices)]
        except (ValueError, OSError):  # one bad sample: read each alone, to name it
            images = [self._read_one(ds, s, i) for s, i in zip(samples, indices, strict=True)]
        if not self.fields:
            return images
        by_shard: dict[int, list[tuple[int, int]]] = {}  # shard -> (position in chunk, local)
        for k, index in enumerate(indices):
            shard, local = ds.locate(index)
            by_shard.setdefault(shard, []).append((k, local))
        out = list(images)
        for shard, rows in by_shard.items():
            for k, values in self._fields_of(ds, shard, [local for _, local in rows]):
                at = rows[k][0]
                if isinstance(values, str):
                    out[at] = f"{samples[at].relpath}: {values}"
                elif not isinstance(out[at], str):
                    out[at] = WithFields(out[at], values)  # type: ignore[arg-type]
        return out

    def _fields_of(
        self, ds: readers.ImageDataset, shard: int, locals_: list[int]
    ) -> list[tuple[int, tuple[bytes | None, ...] | str]]:
        """Each of ``locals_``' field values in ``shard`` (canonical bytes, schema order),
        read a column at a time; on damage each is read alone, its error naming it."""
        try:
            columns = ds.shard(shard).fields
            read = [columns[name].raw(locals_) for name in self.fields]
            return [(k, tuple(column[k] for column in read)) for k in range(len(locals_))]
        except (ValueError, OSError, KeyError):
            pass
        out: list[tuple[int, tuple[bytes | None, ...] | str]] = []
        for k, local in enumerate(locals_):
            try:
                columns = ds.shard(shard).fields
                out.append((k, tuple(columns[name].raw([local])[0] for name in self.fields)))
            except (ValueError, OSError, KeyError) as e:
                out.append((k, f"cannot read the fields of shard {shard}[{local}]: {e}"))
        return out

    @staticmethod
    def _read_one(ds: readers.ImageDataset, sample: Sample, index: int) -> Stored:
        try:
            return _plain(ds.stored(index))
        except (ValueError, OSError) as e:
            return f"{sample.relpath}: cannot read sample {index} of {ds.manifest.location}: {e}"

    def _dataset(self) -> readers.ImageDataset:
        key = (self.manifest.location, self.manifest.content_sha256)
        ds = _OPEN.get(key)
        if ds is None:
            _OPEN.clear()  # one source at a time: a long-lived process keeps no old handles
            ds = _OPEN[key] = readers.open_dataset(self.manifest, decode_threads=1)
        return ds


def _plain(value: bytes | memoryview | np.ndarray) -> bytes | np.ndarray:
    """A stored value that outlives its shard's mapping and pickles: bytes, or pixels."""
    return value if isinstance(value, np.ndarray) else bytes(value)


@dataclass
class DatasetSource:
    """The imgpack dataset whose manifest is ``manifest``."""

    manifest: readers.Manifest
    kind = "imgpack"
    fields: tuple[str, ...] = field(default=(), init=False)  # the scan's choice of them

    @classmethod
    def at(cls, root: str | Path) -> DatasetSource:
        """The dataset at ``root`` (a folder or a URL), its manifest read once."""
        return cls(readers.load_manifest(root))

    @property
    def where(self) -> str:
        return str(self.manifest.location)

    @property
    def local_folder(self) -> Path | None:
        return None if self.manifest.url else self.manifest.root

    def scan(self, options: ConvertOptions) -> Scan:
        """Every sample of the dataset, in index order, with its source path and label;
        ``options.classes`` renumbers the labels by class name."""
        refuse_folder_options(self.where, options)
        if options.encoding == "original" and self.manifest.encoding == "raw":
            raise ValueError(
                f"{self.where}: stores raw pixels, which have no original bytes to keep: "
                "use --encoding raw or jpeg"
            )
        ds = readers.open_dataset(self.manifest, decode_threads=1)
        classes = list(self.manifest.classes)
        relabel = _relabel(self.where, classes, options.classes)
        samples = SampleTable.of(
            Sample(path, relabel[label] if label != spec.UNLABELED else label, index)
            for index, (path, label) in enumerate(ds.samples)
        )
        if not samples:
            raise FileNotFoundError(f"{self.where}: the dataset holds no samples")
        fields = select_fields(self.where, self.manifest.fields, options)
        self.fields = tuple(fields)
        return Scan(
            list(options.classes) if options.classes else classes,
            samples,
            fixed_shape=self.manifest.layout.shape,  # raw pixels of one shape
            fields=fields,
        )

    def reader(self) -> DatasetReader:
        return DatasetReader(self.manifest, self.fields)

    def stored_bytes(self, samples: Sequence[Sample]) -> int:
        return sum(s.bytes for s in self.manifest.shards)

    def record(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "kind": self.kind,
            "location": str(m.location),
            "format": m.format,
            "encoding": m.encoding,
            "content_sha256": m.content_sha256,
        }


def _relabel(where: str, classes: list[str], wanted: Sequence[str] | None) -> list[int]:
    """New label of each of the source's labels: the same, or the position of its class
    name in ``wanted`` (a class the list lacks is an error)."""
    if wanted is None:
        return list(range(len(classes)))
    missing = [c for c in classes if c not in wanted]
    if missing:
        raise ValueError(
            f"{where}: class {missing[0]!r} is not in the class list "
            f"({len(wanted)} classes): add it to the list"
        )
    return [list(wanted).index(c) for c in classes]
