"""An image folder as a sample source: :func:`convert.scan.scan_source` finds the samples
(:func:`convert.file_list.scan_file_list` with ``--file-list``), and each is read from its
file, with its fields: sidecar files and ``--metadata`` columns
(:mod:`convert.sources.folder_fields`), read in the worker beside the image."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convert.file_list import scan_file_list
from convert.options import ConvertOptions
from convert.scan import Sample, Scan, scan_source
from convert.sources.base import Stored, WithFields, position
from convert.sources.folder_fields import folder_fields
from convert.sources.metadata import FieldTable
from readers.fields import canonical

__all__ = ["FolderReader", "FolderSource"]


@dataclass(frozen=True)
class FolderReader:
    """Reads each sample's file below ``root`` (an absolute path: a worker's working
    directory may not be the caller's)."""

    root: str
    fields: FieldTable | None = None  # each sample's fields, by its position in the scan

    def read(self, samples: Sequence[Sample]) -> list[Stored]:
        images = [self._read(s.relpath) for s in samples]
        if self.fields is None:
            return images
        table = self.fields
        positions = [position(s) for s in samples]
        values = table.metadata(positions)
        for k, (sample, image) in enumerate(zip(samples, images, strict=True)):
            if isinstance(image, str):
                continue
            try:
                for f, ext, kind in table.sidecars:
                    if table.has(positions[k], f):
                        values[k][f] = self._sidecar(sample.relpath, ext, kind)
            except (OSError, ValueError) as e:
                images[k] = str(e)
                continue
            images[k] = WithFields(image, tuple(values[k]))
        return images

    def _sidecar(self, relpath: str, ext: str, kind: str) -> bytes:
        """The canonical bytes of the image's sidecar with ``ext``; the error names it."""
        name = f"{os.path.splitext(relpath)[0]}.{ext}"
        where = f"{relpath}: its sidecar {name}"
        try:
            with open(os.path.join(self.root, name), "rb") as f:
                data = f.read()
        except OSError as e:
            raise OSError(f"{where}: cannot read: {e.strerror or e}") from None
        return canonical(kind, data, where)

    def _read(self, relpath: str) -> Stored:
        try:
            with open(os.path.join(self.root, relpath), "rb") as f:
                data = f.read()
        except OSError as e:
            return f"{relpath}: cannot read: {e.strerror or e}"
        return data if data else f"{relpath}: empty file"


@dataclass
class FolderSource:
    """An ImageNet-layout folder (or any layout, with a labels file or ``--unlabeled``)."""

    folder: Path
    kind = "folder"
    _fields: FieldTable | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def where(self) -> str:
        return str(self.folder)

    @property
    def local_folder(self) -> Path:
        return self.folder

    def scan(self, options: ConvertOptions) -> Scan:
        if options.file_list:  # the listed files, no walk of the folder
            scan = scan_file_list(self.folder, Path(options.file_list), options.classes)
        else:
            scan = scan_source(
                self.folder,
                include_hidden=options.include_hidden,
                classes=options.classes,
                labels_file=Path(options.labels_file) if options.labels_file else None,
                unlabeled=options.unlabeled,
            )
        scan, self._fields = folder_fields(self.folder, scan, options, self)
        return scan

    def reader(self) -> FolderReader:
        return FolderReader(os.path.abspath(self.folder), self._fields)

    def stored_bytes(self, samples: Sequence[Sample]) -> int:
        return sum(os.stat(self.folder / s.relpath).st_size for s in samples)

    def record(self) -> dict[str, Any] | None:
        return None  # a folder's manifest stays as it was: the options say the rest
