"""Where a conversion's samples come from: one :class:`SampleSource` per kind of SRC,
chosen by :func:`open_source` from what SRC is.

==========  ================================================================================
folder      an image folder (``convert.scan``'s rules): ``convert.sources.folder``
imgpack     an imgpack dataset of any format, local or a URL (its ``imgpack.json``)
webdataset  ``.tar`` shards made by other tools: a folder, a glob, a brace pattern, a URL
parquet     Parquet files in the Hugging Face ``datasets`` image layout (pyarrow)
==========  ================================================================================
"""

from __future__ import annotations

import os

from convert.sources.base import SampleReader, SampleSource, Stored
from convert.sources.dataset import DatasetReader, DatasetSource
from convert.sources.files import is_pattern
from convert.sources.folder import FolderReader, FolderSource
from convert.sources.hub_layout import holds_configs
from convert.sources.parquet import ParquetSource
from convert.sources.webdataset import TAR_SUFFIXES, TarReader, WebDatasetSource
from readers import spec
from readers.storage.remote import RemoteFolder, is_url, local_path

__all__ = [
    "DatasetReader",
    "DatasetSource",
    "FolderReader",
    "FolderSource",
    "ParquetSource",
    "SampleReader",
    "SampleSource",
    "Stored",
    "TarReader",
    "WebDatasetSource",
    "open_source",
]


def open_source(
    src: str | os.PathLike[str], label_key: str | None = None, split: str | None = None
) -> SampleSource:
    """The source SRC names (see the module docstring): ``.tar`` shards or a pattern of them
    are WebDataset, ``.parquet`` files Parquet, a folder or URL holding ``imgpack.json`` an
    imgpack dataset, a folder (or URL) of tars or Parquet files those (a Hugging Face
    download: in ``data/`` or a folder a config), anything else an image folder. Cheap:
    nothing is scanned until ``scan``. ``label_key`` names the label field of a WebDataset
    or Parquet source, ``split`` the split of a Parquet one (the Hub's file names)."""
    text = os.fspath(src)
    kind = _kind(text)
    if kind == "webdataset" and split is None:
        return WebDatasetSource(text, label_key)
    if kind == "parquet":
        return ParquetSource(text, label_key, split)
    if split is not None:
        raise ValueError(f"{text}: --split applies to Parquet sources only")
    if label_key is not None:
        raise ValueError(f"{text}: --label-key applies to WebDataset and Parquet sources only")
    if kind == "imgpack":
        return DatasetSource.at(text)
    return FolderSource(local_path(text))


def _kind(src: str) -> str:
    """What ``src`` holds, from its name and, for a folder, its top-level listing."""
    if src.endswith(TAR_SUFFIXES) or (is_pattern(src) and (".tar" in src or ".tgz" in src)):
        return "webdataset"
    if src.endswith(".parquet") or (is_pattern(src) and ".parquet" in src):
        return "parquet"
    if src.rstrip("/").endswith(spec.MANIFEST_NAME):
        return "imgpack"
    if is_url(src):
        names = RemoteFolder(src).names()
        if spec.MANIFEST_NAME in names or not names:
            return "imgpack"  # or the reader's error: no such dataset
    else:
        path = local_path(src)
        if not path.is_dir() or (path / spec.MANIFEST_NAME).is_file():
            return "imgpack" if path.is_dir() else "folder"
        names = os.listdir(path)
        if "data" in names and (path / "data").is_dir():  # the Hugging Face Hub's layout
            names += [f"data/{n}" for n in os.listdir(path / "data")]
    if any(n.endswith(TAR_SUFFIXES) for n in names):
        return "webdataset"
    if any(n.endswith(".parquet") for n in names) or (not is_url(src) and holds_configs(path)):
        return "parquet"
    return "imgpack" if is_url(src) else "folder"
