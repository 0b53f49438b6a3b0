"""Append-only scratch files that hold a shard's columns until the shard is closed.

Some layouts can only be written once the shard's sample count is known (``pt``'s zip
records, ``wds``'s JSON index, ``lmdb``'s metadata values). Their writers append each
column here as samples arrive and copy it into place at close, in fixed-size pieces, so
the converter's memory does not grow with the shard. A spool is an unnamed temporary file
beside the shard: the kernel frees it when it is closed or the process dies, so neither an
error nor a kill leaves one behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from readers.formats.checks import stored_crc

__all__ = ["JsonList", "Spool"]

_PIECE = 1 << 20  # bytes copied at a time


class Spool:
    """One column of a shard being written: bytes appended, then copied out once."""

    def __init__(self, beside: Path) -> None:
        self._file = tempfile.TemporaryFile(dir=beside.parent)  # noqa: SIM115 (closed in close)
        self.nbytes = 0

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data``."""
        self.nbytes += self._file.write(data)

    def copy_to(self, fd: int, offset: int, keep: int | None = None) -> int:
        """Write the first ``keep`` bytes (default all) at ``offset`` of ``fd``; return
        their CRC-32, which zip records need."""
        self._file.flush()
        remaining = self.nbytes if keep is None else keep
        piece = bytearray(min(_PIECE, max(remaining, 1)))
        crc, position = 0, 0
        while remaining:
            view = memoryview(piece)[: min(len(piece), remaining)]
            got = os.preadv(self._file.fileno(), [view], position)
            if got != len(view):
                raise OSError(f"scratch file of {self.nbytes} bytes ended at {position + got}")
            crc = stored_crc(view, crc)
            written = 0
            while written < got:
                written += os.pwrite(fd, view[written:], offset + position + written)
            position += got
            remaining -= got
        return crc

    def pieces(self) -> Iterator[tuple[int, bytes]]:
        """``(offset, bytes)`` of the column in fixed-size pieces, for a format that writes
        it through a library (h5py) rather than a file descriptor."""
        self._file.flush()
        for offset in range(0, self.nbytes, _PIECE):
            yield offset, os.pread(self._file.fileno(), min(_PIECE, self.nbytes - offset), offset)

    def read(self) -> bytes:
        """The whole column, for a format that stores it as one value."""
        self._file.flush()
        return os.pread(self._file.fileno(), self.nbytes, 0) if self.nbytes else b""

    def close(self) -> None:
        """Discard the column. Never raises: a flush that fails (a full disk) has closed the
        file all the same, and must not keep a writer from closing its other spools."""
        with contextlib.suppress(OSError):
            self._file.close()


class JsonList(Spool):
    """A JSON list spooled one value at a time: the bytes ``json.dumps(values,
    separators=(separator, ...))`` gives (ASCII, ``\\u`` escapes carry any string)."""

    def __init__(self, beside: Path, separator: str = ",") -> None:
        super().__init__(beside)
        self._separator = separator.encode("ascii")
        self.count = 0

    def append(self, value: object) -> None:
        # an int's JSON is its repr (cheaper than json.dumps; bool is not an int here)
        text = repr(value) if type(value) is int else json.dumps(value)
        self.write(text.encode("ascii") + self._separator)
        self.count += 1

    def _body(self) -> int:
        """Bytes of the values without the last separator."""
        return self.nbytes - len(self._separator) if self.count else 0

    def dumps(self) -> bytearray:
        """The whole list, for a format that stores it as one value."""
        out = bytearray(self._body() + 2)
        out[0], out[-1] = ord("["), ord("]")
        self._file.flush()
        os.preadv(self._file.fileno(), [memoryview(out)[1:-1]], 0)
        return out

    def dump(self, f: BinaryIO) -> None:
        """Write the whole list at ``f``'s position, leaving ``f`` after it."""
        f.write(b"[")
        f.flush()
        body = self._body()
        self.copy_to(f.fileno(), f.tell(), body)
        f.seek(body, os.SEEK_CUR)
        f.write(b"]")
