"""What every format writer shares: the writer interface and shard rollover.

A format module provides a class satisfying :class:`ShardWriter` that writes one shard
file; :class:`ShardedOutput` decides when to start the next shard, writes each to a
temporary name and renames it into place only once it is complete, and records the
manifest's entry (samples, bytes, SHA-256) for it.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from readers import spec
from readers.spec import Layout, ShardInfo

__all__ = [
    "Layout",
    "Record",
    "ShardWriter",
    "ShardedOutput",
    "discard_shard",
    "file_sha256",
    "place_shard",
]


@dataclass(frozen=True)
class Record:
    """One sample to store: ``data`` is encoded bytes (``ext`` jpg, png...) or raw pixels;
    ``size`` the stored image's (height, width); ``fields`` every field of the layout's
    schema, in its (sorted) order, as canonical bytes (:mod:`readers.fields`) or None where
    the sample has no value."""

    key: str
    data: bytes | np.ndarray
    ext: str
    label: int
    path: str
    size: tuple[int, int]
    fields: Mapping[str, bytes | None] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return spec.sample_nbytes(self.data)


class ShardWriter(Protocol):
    """Writes one shard file; created with ``(path, layout)``."""

    def add(self, record: Record) -> None:
        """Append one sample."""

    def close(self) -> list[str]:
        """Finish the file; return the suffixes of sidecar files written as path + suffix."""


WriterFactory = Callable[[Path, Layout], ShardWriter]


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def place_shard(tmp: Path, final: Path, sidecars: list[str], samples: int) -> ShardInfo:
    """Rename a closed shard written at ``tmp`` (and its sidecars) to ``final`` and return
    its manifest entry. Sidecars go first: a shard in place is a complete shard."""
    for suffix in sidecars:
        os.replace(str(tmp) + suffix, str(final) + suffix)
    os.replace(tmp, final)
    return ShardInfo(
        path=final.name,
        samples=samples,
        bytes=final.stat().st_size,
        sha256=file_sha256(final),
        sidecars={suffix: file_sha256(Path(str(final) + suffix)) for suffix in sidecars},
    )


def discard_shard(writer: ShardWriter | None, tmp: Path) -> None:
    """Drop a shard being written at ``tmp``: close what can be closed and delete every
    file written under that name, so that a full disk gets its space back."""
    if writer is not None:
        with contextlib.suppress(Exception):
            writer.close()
    for path in tmp.parent.glob(glob.escape(tmp.name) + "*"):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


class ShardedOutput:
    """Feeds records to per-shard writers, starting a new shard at either limit.

    ``done`` holds the shards kept from an interrupted run: numbering continues after them.
    """

    def __init__(
        self,
        dst: Path,
        fmt: str,
        open_writer: WriterFactory,
        layout: Layout,
        max_samples: int | None,
        max_bytes: int | None,
        done: list[ShardInfo] | None = None,
    ) -> None:
        self.dst = dst
        self.fmt = fmt
        self.open_writer = open_writer
        self.layout = layout
        self.max_samples = max_samples
        self.max_bytes = max_bytes
        self.shards: list[ShardInfo] = list(done or [])
        self._writer: ShardWriter | None = None
        self._samples = 0
        self._bytes = 0

    def add(self, record: Record) -> ShardInfo | None:
        """Append ``record``; return the shard it made complete by starting a new one."""
        finished = None
        if self._writer is not None and self._full(record.nbytes):
            finished = self._finish_shard()
        if self._writer is None:
            self._writer = self.open_writer(self._tmp_path(), self.layout)
        self._writer.add(record)
        self._samples += 1
        self._bytes += record.nbytes
        return finished

    def close(self) -> ShardInfo | None:
        """Finish the last shard and return it (None if no record came since the last)."""
        return self._finish_shard() if self._writer is not None else None

    def abort(self) -> None:
        """Drop the shard being written (after an error or an interrupt): close what can be
        closed and delete its temporary files, so that a full disk gets its space back."""
        writer, self._writer = self._writer, None
        discard_shard(writer, self._tmp_path())

    def _full(self, next_bytes: int) -> bool:
        if self.max_samples is not None and self._samples >= self.max_samples:
            return True
        return self.max_bytes is not None and self._bytes + next_bytes > self.max_bytes

    def _tmp_path(self) -> Path:
        return self.dst / (spec.TMP_PREFIX + spec.shard_name(self.fmt, len(self.shards)))

    def _finish_shard(self) -> ShardInfo:
        writer, self._writer = self._writer, None
        tmp = self._tmp_path()
        sidecars = writer.close() if writer is not None else []
        final = self.dst / spec.shard_name(self.fmt, len(self.shards))
        info = place_shard(tmp, final, sidecars, self._samples)
        self.shards.append(info)
        self._samples, self._bytes = 0, 0
        return info
