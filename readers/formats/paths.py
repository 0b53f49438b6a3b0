"""Source paths of a shard's samples as two NumPy arrays, not one ``str`` per sample.

A list of ``str`` costs ~60 bytes of object header per sample on top of the path itself
(and every reading process keeps its own); one UTF-8 blob with int64 offsets costs the
path's bytes plus 8. A name that is not valid UTF-8 keeps its bytes (``surrogateescape``).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["PathTable"]


class PathTable:
    """Paths by local sample index: ``table[i]`` is a ``str``."""

    def __init__(self, paths: Iterable[str]) -> None:
        encoded = [p.encode("utf-8", "surrogateescape") for p in paths]  # while building only
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in encoded], out=self.offsets[1:])
        self.blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        chunk = self.blob[self.offsets[i] : self.offsets[i + 1]]
        return chunk.tobytes().decode("utf-8", "surrogateescape")

    @property
    def nbytes(self) -> int:
        return self.blob.nbytes + self.offsets.nbytes
