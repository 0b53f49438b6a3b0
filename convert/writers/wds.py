"""Writer for ``wds`` tar shards (layout: ``readers/wds.py``, names: ``readers.spec``).

Tars are written with the standard library in USTAR format with fixed owner, mode and
mtime, so the same samples give byte-identical tars; the data offset of each image member
is recorded as it is written, and saved beside the tar as its random-access index.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np

from convert.writers.base import Layout, Record
from readers import spec

__all__ = ["WdsWriter"]


def _npy_bytes(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, pixels, allow_pickle=False)
    return out.getvalue()


class WdsWriter:
    """Writes one WebDataset tar and collects its index."""

    def __init__(self, path: Path, layout: Layout) -> None:
        self.path = path
        self.tar = tarfile.open(path, "w", format=tarfile.USTAR_FORMAT)  # noqa: SIM115
        self.index: dict[str, list] = {
            k: [] for k in ("offsets", "sizes", "exts", "labels", "paths")
        }

    def _member(self, name: str, data: bytes) -> int:
        """Append one member; return the offset of its data in the tar."""
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o444
        info.mtime = 0
        # Member names are a 10-digit key and an extension: one USTAR header block each.
        data_offset = self.tar.offset + tarfile.BLOCKSIZE
        self.tar.addfile(info, io.BytesIO(data))
        return data_offset

    def add(self, record: Record) -> None:
        if isinstance(record.data, np.ndarray):
            ext, data = spec.WDS_RAW_EXT, _npy_bytes(record.data)
        else:
            ext, data = record.ext, record.data
        if ext not in spec.WDS_IMAGE_EXTS:
            raise ValueError(f"{record.path}: cannot store .{ext} images in WebDataset shards")
        offset = self._member(f"{record.key}.{ext}", data)
        self._member(f"{record.key}.{spec.WDS_LABEL_EXT}", str(record.label).encode())
        # A name that is not valid UTF-8 keeps its bytes (str with surrogate escapes).
        path = record.path.encode("utf-8", "surrogateescape")
        self._member(f"{record.key}.{spec.WDS_PATH_EXT}", path)
        self.index["offsets"].append(offset)
        self.index["sizes"].append(len(data))
        self.index["exts"].append(ext)
        self.index["labels"].append(record.label)
        self.index["paths"].append(record.path)

    def close(self) -> list[str]:
        self.tar.close()
        index_path = str(self.path) + spec.WDS_INDEX_SUFFIX
        with open(index_path, "w", encoding="ascii") as f:  # \u escapes carry any path
            json.dump(self.index, f, separators=(",", ":"))
        return [spec.WDS_INDEX_SUFFIX]
