"""An image folder as a sample source: :func:`convert.scan.scan_source` finds the samples
(:func:`convert.file_list.scan_file_list` with ``--file-list``), and each is read from its
file."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convert.file_list import scan_file_list
from convert.options import ConvertOptions
from convert.scan import Sample, Scan, scan_source
from convert.sources.base import Stored

__all__ = ["FolderReader", "FolderSource"]


@dataclass(frozen=True)
class FolderReader:
    """Reads each sample's file below ``root`` (an absolute path: a worker's working
    directory may not be the caller's)."""

    root: str

    def read(self, samples: Sequence[Sample]) -> list[Stored]:
        return [self._read(s.relpath) for s in samples]

    def _read(self, relpath: str) -> Stored:
        try:
            with open(os.path.join(self.root, relpath), "rb") as f:
                data = f.read()
        except OSError as e:
            return f"{relpath}: cannot read: {e.strerror or e}"
        return data if data else f"{relpath}: empty file"


@dataclass(frozen=True)
class FolderSource:
    """An ImageNet-layout folder (or any layout, with a labels file or ``--unlabeled``)."""

    folder: Path
    kind = "folder"

    @property
    def where(self) -> str:
        return str(self.folder)

    @property
    def local_folder(self) -> Path:
        return self.folder

    def scan(self, options: ConvertOptions) -> Scan:
        if options.file_list:  # the listed files, no walk of the folder
            return scan_file_list(self.folder, Path(options.file_list), options.classes)
        return scan_source(
            self.folder,
            include_hidden=options.include_hidden,
            classes=options.classes,
            labels_file=Path(options.labels_file) if options.labels_file else None,
            unlabeled=options.unlabeled,
        )

    def reader(self) -> FolderReader:
        return FolderReader(os.path.abspath(self.folder))

    def stored_bytes(self, samples: Sequence[Sample]) -> int:
        return sum(os.stat(self.folder / s.relpath).st_size for s in samples)

    def record(self) -> dict[str, Any] | None:
        return None  # a folder's manifest stays as it was: the options say the rest
