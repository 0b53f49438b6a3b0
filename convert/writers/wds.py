"""Writer for ``wds`` tar shards (layout: ``readers/formats/wds.py``, names: ``readers.spec``).

Tars are written in USTAR format with the standard library's headers (``TarInfo.tobuf``)
and fixed owner, mode and mtime, so the same samples give byte-identical tars. The headers
are written here rather than by ``TarFile``, which keeps every member's ``TarInfo`` until it
closes (three per sample), and :func:`ustar_header` fills in a copy of one ``tobuf`` header
for each member (three ``TarInfo`` headers a sample were most of the converter's own work
per sample). The data offset of each image member is recorded as it is
written, in spooled JSON columns, and saved beside the tar as its random-access index: the
writer's memory does not grow with the shard.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np

from convert.writers.base import Layout, Record
from convert.writers.fields import ShardColumns
from convert.writers.spool import JsonList
from readers import spec
from readers.formats.checks import stored_crc
from readers.spec import StorageKind

__all__ = ["WdsWriter", "ustar_header"]

MODE = 0o444
_BUFFER = 1 << 20  # bytes a write call takes: a syscall a MiB, not two a sample


def _member_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = MODE
    info.mtime = 0
    return info


# The header of an empty name and size; ustar_header fills in the two fields.
_TEMPLATE = _member_info("", 0).tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape")
_NAME_BYTES = 100  # a USTAR name longer than this is split into a prefix: tarfile's job
_SIZE = slice(124, 136)
_CHECKSUM = slice(148, 156)
_MAX_SIZE = 8**11  # 11 octal digits


def ustar_header(name: str, size: int) -> bytes:
    """``TarInfo.tobuf(USTAR_FORMAT)`` of a member ``name`` of ``size`` bytes with this
    writer's mode and mtime, byte for byte; a name that is not short ASCII goes to tarfile."""
    encoded = name.encode("ascii", "surrogateescape") if name.isascii() else b""
    if not encoded or len(encoded) > _NAME_BYTES or size >= _MAX_SIZE:
        info = _member_info(name, size)
        return info.tobuf(tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape")
    header = bytearray(_TEMPLATE)
    header[: len(encoded)] = encoded
    header[_SIZE] = b"%011o\0" % size
    header[_CHECKSUM] = b" " * 8  # tarfile's checksum: the bytes' sum, its field as spaces
    header[_CHECKSUM.start : _CHECKSUM.start + 7] = b"%06o\0" % sum(header)
    return bytes(header)


def _npy_bytes(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, pixels, allow_pickle=False)
    return out.getvalue()


class WdsWriter:
    """Writes one WebDataset tar and spools its index."""

    def __init__(self, path: Path, layout: Layout) -> None:
        self.path = path
        self.tar = open(path, "wb", buffering=_BUFFER)  # noqa: SIM115 (closed in close)
        self.offset = 0
        columns = spec.WDS_INDEX_COLUMNS
        if layout.kind is StorageKind.ENCODED:
            columns += (spec.WDS_CRC_COLUMN,)
        self.index = {k: JsonList(path) for k in columns}
        self.columns = ShardColumns(layout.schema, path, spooled=False)
        # each field's member extension, as webdataset's decoders read its kind
        self.field_exts = {name: spec.wds_field_ext(name, s.kind) for name, s in layout.fields}

    def _member(self, name: str, data: bytes) -> int:
        """Append one member (what ``TarFile.addfile`` writes); return the offset of its
        data in the tar."""
        header = ustar_header(name, len(data))
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
            entry.append(stored_crc(data))
        for column, value in zip(self.index.values(), entry, strict=True):
            column.append(value)
        offsets = {
            name: self._member(f"{record.key}.{ext}", value)
            for name, ext in self.field_exts.items()
            if (value := record.fields.get(name)) is not None
        }
        self.columns.add(record, offsets)

    def _recorded_columns(self) -> bytes:
        """The index's entries after the sample columns: the stored sizes, and each
        field's parts (where its members are, or an int or float field's typed values)."""
        sizes = self.columns.sizes
        heights, widths = spec.WDS_SIZE_COLUMNS
        out = {heights: sizes[:, 0].tolist(), widths: sizes[:, 1].tolist()}
        fields: dict[str, dict[str, list]] = {}
        for name, part, value in self.columns.parts():
            fields.setdefault(name, {})[part] = value.tolist()  # type: ignore[union-attr]
        if fields:
            out[spec.WDS_FIELDS_KEY] = fields  # type: ignore[assignment]
        return b"," + json.dumps(out, separators=(",", ":"))[1:-1].encode("ascii")

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
                f.write(self._recorded_columns())
                f.write(b"}")
        finally:
            for column in self.index.values():
                column.close()
            self.columns.close()
            self.tar.close()
        return [spec.WDS_INDEX_SUFFIX]
