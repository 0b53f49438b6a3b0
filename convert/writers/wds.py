"""Writer for ``wds`` tar shards (layout: ``readers/formats/wds.py``, names: ``readers.spec``).

Tars are written in USTAR format with the standard library's headers (``TarInfo.tobuf``)
and fixed owner, mode and mtime, so the same samples give byte-identical tars. The headers
are written here rather than by ``TarFile``, which keeps every member's ``TarInfo`` until it
closes (three per sample). The data offset of each image member is recorded as it is
written, in spooled JSON columns, and saved beside the tar as its random-access index: the
writer's memory does not grow with the shard.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np

from convert.writers.base import Layout, Record
from convert.writers.spool import JsonList
from readers import spec
from readers.spec import StorageKind

__all__ = ["WdsWriter"]


def _npy_bytes(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, pixels, allow_pickle=False)
    return out.getvalue()


class WdsWriter:
    """Writes one WebDataset tar and spools its index."""

    def __init__(self, path: Path, layout: Layout) -> None:
        self.path = path
        self.tar = open(path, "wb")  # noqa: SIM115 (closed in close)
        self.offset = 0
        columns = spec.WDS_INDEX_COLUMNS
        if layout.kind is StorageKind.ENCODED:
            columns += (spec.WDS_CRC_COLUMN,)
        self.index = {k: JsonList(path) for k in columns}

    def _member(self, name: str, data: bytes) -> int:
        """Append one member (what ``TarFile.addfile`` writes); return the offset of its
        data in the tar."""
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o444
        info.mtime = 0
        header = info.tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape")
        padding = -len(data) % tarfile.BLOCKSIZE
        self.tar.write(header)
        self.tar.write(data)
        self.tar.write(tarfile.NUL * padding)
        data_offset = self.offset + len(header)
        self.offset = data_offset + len(data) + padding
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
        entry = [offset, len(data), ext, record.label, record.path]
        if spec.WDS_CRC_COLUMN in self.index:
            entry.append(spec.sample_crc(data))
        for column, value in zip(self.index.values(), entry, strict=True):
            column.append(value)

    def close(self) -> list[str]:
        try:
            # The end of an archive, as TarFile.close writes it: two zero blocks, then zeros
            # up to a whole record.
            end = self.offset + 2 * tarfile.BLOCKSIZE
            self.tar.write(tarfile.NUL * (2 * tarfile.BLOCKSIZE + -end % tarfile.RECORDSIZE))
            with open(str(self.path) + spec.WDS_INDEX_SUFFIX, "wb") as f:
                for k, (name, column) in enumerate(self.index.items()):
                    f.write(b'{"' if k == 0 else b',"')
                    f.write(name.encode("ascii") + b'":')
                    column.dump(f)
                f.write(b"}")
        finally:
            for column in self.index.values():
                column.close()
            self.tar.close()
        return [spec.WDS_INDEX_SUFFIX]
