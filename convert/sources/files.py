"""The files a foreign source names: a folder of them, one file, a glob or a brace pattern
(``shard-{000000..000099}.tar``, ``{train,val}.parquet``), local or at a URL; and the
table of where each sample lies in them, which every worker process maps once.

The table (:class:`Spans`) is written by the scan into a temporary folder that lives as long
as the source, and travels to the workers by its path: a few hundred bytes per chunk of
samples, where the table itself holds 24 bytes per sample.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from convert.temp_folders import TempFolder
from readers.storage.remote import RemoteFolder, is_url, local_path

__all__ = [
    "FileSource",
    "Spans",
    "expand_braces",
    "file_size",
    "is_pattern",
    "list_files",
    "listed_folder",
    "open_file",
    "split_url",
]

_BRACE = re.compile(r"\{([^{}]*)\}")
_GLOB = re.compile(r"[*?\[]")


def is_pattern(src: str) -> bool:
    """True if ``src`` is a glob or brace pattern rather than one path."""
    return bool(_GLOB.search(src) or _BRACE.search(src))


def expand_braces(pattern: str) -> list[str]:
    """``{a..b}`` (numbers, zero-padded to the width written) and ``{x,y}`` expanded, in
    order, as the shell and WebDataset's ``braceexpand`` do."""
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    body, head, tail = match.group(1), pattern[: match.start()], pattern[match.end() :]
    numbers = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if numbers:
        first, last = numbers.groups()
        width = len(first) if first.startswith("0") else 0
        step = 1 if int(last) >= int(first) else -1
        choices = [f"{n:0{width}d}" for n in range(int(first), int(last) + step, step)]
    else:
        choices = body.split(",")
    return [head + c + rest for c in choices for rest in expand_braces(tail)]


def split_url(url: str) -> tuple[RemoteFolder, str]:
    """The remote folder a file's URL lies in, and its name there."""
    folder, _, name = url.rstrip("/").rpartition("/")
    return RemoteFolder(folder), name


def list_files(src: str, suffixes: tuple[str, ...]) -> list[str]:
    """The files ``src`` names, sorted within each brace choice: the files with one of
    ``suffixes`` directly in a folder (below it, for a local one), the matches of a glob, the
    expansion of a brace pattern, or the one file. FileNotFoundError names ``src`` if none."""
    found: list[str] = []
    for item in expand_braces(src):
        if _GLOB.search(item):
            found += _glob(item)
        elif is_url(item) and not item.endswith(suffixes):
            folder = RemoteFolder(item)
            names = [n for n in folder.names() if n.endswith(suffixes)]
            found += [folder.url_of(n) for n in names] if names else [item]
        elif is_url(item):
            found.append(item)
        elif os.path.isdir(local_path(item)):
            root = local_path(item)
            found += sorted(str(p) for p in root.rglob("*") if p.name.endswith(suffixes))
        else:
            found.append(str(local_path(item)))
    if not found:
        raise FileNotFoundError(f"{src}: no {' or '.join(suffixes)} files")
    return found


def _glob(pattern: str) -> list[str]:
    if not is_url(pattern):
        return sorted(glob.glob(str(local_path(pattern))))
    folder, name = split_url(pattern)
    return [folder.url_of(n) for n in folder.names() if fnmatch.fnmatchcase(n, name)]


def listed_folder(src: str) -> Path | None:
    """The local folder whose files ``src`` names by listing it (a DST inside it would join
    them the next time), or None for a file, a pattern or a URL."""
    path = local_path(src)
    return path if not is_url(src) and not is_pattern(src) and path.is_dir() else None


def file_size(path: str) -> int:
    """The size of a local file or of the object at a URL."""
    if not is_url(path):
        return os.path.getsize(path)
    folder, name = split_url(path)
    size = folder.size(name)
    if size is None:
        raise FileNotFoundError(f"{path}: no such object")
    return size


def open_file(path: str):  # -> a binary file object
    """A local file or a URL opened for reading (raises OSError naming it)."""
    if not is_url(path):
        return open(path, "rb")
    folder, name = split_url(path)
    return folder.fs.open(folder.path(name), "rb", block_size=8 << 20)


_MAPPED: dict[str, np.ndarray] = {}
"""The table a worker process has mapped, by path: the last one only (a removed table's
file keeps its disk space while it is mapped)."""


@dataclass(frozen=True)
class Spans:
    """Where each sample of a foreign source lies: an ``int64 [N, 3 + 2F]`` table of (file
    number, start, length) and, for each of F fields a WebDataset source carries, its
    member's (start, length; -1 where the sample has none), saved as ``.npy`` at
    ``path``."""

    path: str

    @classmethod
    def write(cls, rows: np.ndarray, owner: object) -> Spans:
        """Save ``rows`` into a temporary folder removed once ``owner`` is gone."""
        folder = TempFolder("source")
        weakref.finalize(owner, folder.remove)
        path = Path(folder.path) / "spans.npy"
        table = np.asarray(rows, dtype=np.int64)
        np.save(path, table if table.ndim == 2 else table.reshape(-1, 3), allow_pickle=False)
        return cls(str(path))

    def rows(self) -> np.ndarray:
        """The table, memory-mapped once per process."""
        table = _MAPPED.get(self.path)
        if table is None:
            _MAPPED.clear()
            table = _MAPPED[self.path] = np.load(self.path, mmap_mode="r", allow_pickle=False)
        return table


class FileSource:
    """What the sources read from files of their own format (WebDataset tars, Parquet
    files) share: the files ``src`` names (:func:`list_files`), local paths made absolute
    (a worker's working directory may not be the caller's) or URLs."""

    kind: str
    suffix: str  # of the files a folder or a URL is listed for
    other_suffixes: tuple[str, ...] = ()  # listed too (WebDataset's .tar.gz, .tgz)

    def __init__(self, src: str, label_key: str | None = None) -> None:
        self.src = src
        self.label_key = label_key
        listed = list_files(src, (self.suffix, *self.other_suffixes))
        self.files = tuple(f if is_url(f) else os.path.abspath(f) for f in listed)

    @property
    def where(self) -> str:
        return self.src

    @property
    def local_folder(self) -> Path | None:
        return listed_folder(self.src)

    def stored_bytes(self, samples: object) -> int:
        return sum(file_size(f) for f in self.files)

    def record(self) -> dict[str, object]:
        return {"kind": self.kind, "location": self.src, "files": len(self.files)}
