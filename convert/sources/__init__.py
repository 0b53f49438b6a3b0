"""Where a conversion's samples come from: one :class:`SampleSource` per kind of SRC,
chosen by :func:`open_source` from what SRC is.

=============  ==============================================================================
folder         an image folder (``convert.scan``'s rules): ``convert.sources.folder``
imgpack        an imgpack dataset of any format, local or a URL (its ``imgpack.json``)
=============  ==============================================================================
"""

from __future__ import annotations

import os
from pathlib import Path

from convert.sources.base import SampleReader, SampleSource, Stored
from convert.sources.dataset import DatasetReader, DatasetSource
from convert.sources.folder import FolderReader, FolderSource
from readers import spec
from readers.storage.remote import is_url, local_path

__all__ = [
    "DatasetReader",
    "DatasetSource",
    "FolderReader",
    "FolderSource",
    "SampleReader",
    "SampleSource",
    "Stored",
    "open_source",
]


def open_source(src: str | os.PathLike[str]) -> SampleSource:
    """The source SRC names: an imgpack dataset (a folder holding ``imgpack.json``, or a
    URL), else an image folder. Cheap: nothing is scanned until ``scan``."""
    if is_url(src):
        return DatasetSource.at(str(src))
    path = local_path(src)
    if path.name == spec.MANIFEST_NAME or (path / spec.MANIFEST_NAME).is_file():
        return DatasetSource.at(path)
    return FolderSource(Path(path))
