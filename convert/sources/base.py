"""What every sample source is: the :class:`SampleSource` a conversion scans and the
:class:`SampleReader` its workers read stored values through.

A source is chosen once, from what SRC is (:func:`convert.sources.open_source`): an image
folder, an imgpack dataset, WebDataset tars made by another tool, or Parquet files in the
Hugging Face image layout. The pipeline then sees only a list of
:class:`~convert.scan.Sample` (source path, label, and for a dataset its position) and a
reader that turns a chunk of them into stored values: encoded bytes, raw ``[H, W, 3]``
pixels, or a one-line error naming the sample, which ``--on-error`` then judges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from convert.options import ConvertOptions
from convert.scan import Sample, Scan
from readers.fields import FieldSpec, check_name

__all__ = [
    "SampleReader",
    "SampleSource",
    "Stored",
    "WithFields",
    "kind_clash",
    "position",
    "refuse_folder_options",
    "select_fields",
]


@dataclass(frozen=True, slots=True)
class WithFields:
    """A sample's image (encoded bytes or raw pixels) and its fields' canonical bytes, in
    the scan's schema order (None: missing), read in the worker that reads the image, so
    that field values never cross the main process one sample at a time."""

    image: bytes | np.ndarray
    fields: tuple[bytes | None, ...]


Stored = bytes | np.ndarray | WithFields | str
"""One sample as a reader gives it: encoded bytes, raw uint8 ``[H, W, 3]`` pixels, either
with its fields (:class:`WithFields`), or the message saying why it could not be read
(naming the sample)."""


class SampleReader(Protocol):
    """Reads samples in a worker process: small and picklable (it travels with each chunk),
    opening what it reads on first use in that process."""

    def read(self, samples: Sequence[Sample]) -> list[Stored]:
        """The stored values of ``samples``, in order; a bad one gives its error."""
        ...


class SampleSource(Protocol):
    """Where a conversion's samples come from (see the module docstring)."""

    kind: str  # "folder", "imgpack", "webdataset", "parquet": the manifest's source kind

    @property
    def where(self) -> str:
        """How messages name the source: its path or URL."""
        ...

    @property
    def local_folder(self) -> Path | None:
        """The local folder the source lives in (a DST inside it is refused), or None."""
        ...

    def scan(self, options: ConvertOptions) -> Scan:
        """The classes and samples, in source order, and what had to be passed over."""
        ...

    def reader(self) -> SampleReader:
        """What the workers read the samples through."""
        ...

    def stored_bytes(self, samples: Sequence[Sample]) -> int:
        """The bytes ``samples`` (all of a scan's) take where the source stores them."""
        ...

    def record(self) -> dict[str, Any] | None:
        """What the new manifest records of the source (``source``), or None."""
        ...


def select_fields(
    where: str,
    found: Mapping[str, FieldSpec],
    options: ConvertOptions,
    origins: Mapping[str, str] | None = None,
) -> dict[str, FieldSpec]:
    """The schema to store: the ``found`` fields (sorted), all of them, the ones
    ``--fields`` names or none (``--no-fields``); an unknown name is a ValueError listing
    the fields there are. Each chosen name is checked here, before anything is written
    (:func:`readers.fields.check_name`), its error naming where it was met: ``origins``
    (name -> a file, member or column) or else ``where``."""
    chosen = dict(sorted(found.items()))
    if options.fields is not None:
        unknown = [name for name in options.fields if name not in chosen]
        if unknown:
            there = ", ".join(chosen) or "none"
            raise ValueError(
                f"{where}: --fields {unknown[0]!r}: no such field (the source's fields: {there})"
            )
        chosen = {name: spec for name, spec in chosen.items() if name in options.fields}
    for name in chosen:
        check_name(name, (origins or {}).get(name, where))
    return chosen


def kind_clash(where: str, name: str, first: str, second: str) -> ValueError:
    """The error of a field whose kind differs between samples or files."""
    return ValueError(
        f"{where}: field {name!r} is {first} in some samples and {second} in others: make "
        "them agree, or leave it out with --fields"
    )


def position(sample: Sample) -> int:
    """Where a dataset or foreign source holds ``sample``: its index there."""
    if sample.index is None:
        raise RuntimeError(f"{sample.relpath}: a sample of a folder, not of a dataset source")
    return sample.index


def refuse_folder_options(where: str, options: ConvertOptions) -> None:
    """The options that describe an image folder's layout mean nothing for a dataset."""
    given = [
        flag
        for flag, value in (
            ("--labels", options.labels_file),
            ("--file-list", options.file_list),
            ("--unlabeled", options.unlabeled),
            ("--include-hidden", options.include_hidden),
            ("--metadata", options.metadata),
        )
        if value
    ]
    if given:
        raise ValueError(
            f"{where}: {', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to image "
            "folders only; a dataset brings its own labels"
        )
