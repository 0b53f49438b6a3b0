"""What every format's shard reader is: one open shard of one process, read by local index."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from readers.formats.checks import SampleCrcs, stored_crcs
from readers.formats.field_columns import FieldColumn
from readers.images.decode import image_size
from readers.spec import DatasetError

if TYPE_CHECKING:  # the type of `out` only: the converter imports this, without torch
    import torch

__all__ = ["ShardReader", "check_fetched", "read_checked"]


class ShardReader(ABC):
    """One open shard. Every read checks the sample as :mod:`readers.formats.checks` says
    and raises ``DatasetError`` naming ``shard[index]`` for a damaged one."""

    labels: np.ndarray  # int64 [n]
    crcs: SampleCrcs  # what every read of an encoded sample is checked against
    # The layout schema's fields by name (readers.formats.field_columns), each format
    # reader's from its own parts; empty for a dataset without fields (and version 1).
    fields: Mapping[str, FieldColumn] = MappingProxyType({})
    _path: str  # the shard's file or URL, as its errors name it

    @property
    def verified(self) -> bool:
        """Whether every encoded sample this shard serves is checked against the CRC-32
        the converter recorded for the bytes it had just encoded or fully decoded: a reader
        may then decode only the part of a sample it needs, as no damage can hide in the
        rest. False for raw pixels and for shards written before CRCs were recorded."""
        return self.crcs.recorded

    def read(self, i: int) -> bytes | memoryview | np.ndarray:
        """Stored value of local sample ``i``, checked: encoded bytes or uint8 HWC pixels."""
        value = self.fetch(i)
        if not isinstance(value, np.ndarray):
            self.crcs.check(i, value)
        return value

    @abstractmethod
    def fetch(self, i: int) -> bytes | memoryview | np.ndarray:
        """Local sample ``i`` as :meth:`read` serves it, before the CRC-32 check of encoded
        bytes (raw pixels are checked here, against their shape). Only :meth:`read` and
        :func:`read_checked` call it."""

    def release_pages(self) -> None:
        """Let this process's mapping of the shard drop the pages read so far (the kernel
        keeps them in its page cache; a later read maps them again): what a pass over
        every shard (``ds.metadata()``) calls once it has copied what it needs from one,
        so that the passed shards do not stay resident. A no-op where nothing is mapped."""
        return

    def recorded_sizes(self) -> np.ndarray | None:
        """``[n, 2]`` (height, width) as a version 2 shard records them, read when asked
        rather than held from the open (a reading process keeps a few words per sample);
        None: a version 1 shard, whose sizes come from its samples."""
        return None

    def sizes(self) -> np.ndarray:
        """int64 ``[n, 2]``: each sample's stored (height, width). Version 2 shards record
        them; a version 1 shard's come from its samples: raw pixels' shapes, encoded
        images' headers (every sample read once)."""
        n = len(self.labels)
        recorded = self.recorded_sizes()
        if recorded is not None:
            if recorded.shape != (n, 2):
                raise DatasetError(f"{self._path}: sizes of shape {recorded.shape}, not ({n}, 2)")
            return recorded.astype(np.int64)
        out = np.empty((len(self.labels), 2), dtype=np.int64)
        for i in range(len(self.labels)):
            value = self.read(i)
            if isinstance(value, np.ndarray):
                out[i] = value.shape[:2]
            else:
                out[i] = image_size(value, f"{self._path}[{i}]")
        return out

    @abstractmethod
    def read_pixels(self, idx: np.ndarray, out: torch.Tensor) -> None:
        """Copy raw fixed-shape samples ``idx`` into ``out`` ([k, H, W, 3] uint8)."""

    @abstractmethod
    def path(self, i: int) -> str:
        """Source path of local sample ``i``, relative to the converted folder."""

    def read_many(self, indices: list[int]) -> list[bytes | memoryview | np.ndarray]:
        """Samples ``indices`` as :meth:`read` gives each (ascending order reads fastest;
        a reader of remote byte ranges fetches them in one round)."""
        return read_checked([(self, i) for i in indices])


def read_checked(
    located: Sequence[tuple[ShardReader, int]],
) -> list[bytes | memoryview | np.ndarray]:
    """The samples ``(shard reader, local index)``, from any shards, each as its
    :meth:`ShardReader.read` gives it, their CRC-32s computed in one call (what a decode
    thread reads for its part of a batch). Raises the ``DatasetError`` of the first sample,
    in order, that cannot be read or fails its check."""
    values: list[bytes | memoryview | np.ndarray] = []
    try:
        for reader, i in located:
            values.append(reader.fetch(i))
    finally:  # a sample before one that cannot be fetched is judged first
        check_fetched(located[: len(values)], values)
    return values


def check_fetched(
    located: Sequence[tuple[ShardReader, int]], values: Sequence[bytes | memoryview | np.ndarray]
) -> None:
    """Check the :meth:`ShardReader.fetch` ``values`` of the samples ``located`` against their
    shards' CRC-32s (one :func:`readers.formats.checks.stored_crcs` call): the
    ``DatasetError`` of the first that fails."""
    checked = [
        k
        for k, (value, (reader, _)) in enumerate(zip(values, located, strict=True))
        if reader.crcs.recorded and not isinstance(value, np.ndarray)
    ]
    if not checked:
        return
    actual = stored_crcs([values[k] for k in checked])  # type: ignore[misc]
    first = located[checked[0]][0]
    if all(located[k][0] is first for k in checked):  # one shard: one comparison
        first.crcs.check_many([located[k][1] for k in checked], actual)
        return
    for k, crc in zip(checked, actual.tolist(), strict=True):
        reader, i = located[k]
        reader.crcs.check(i, values[k], crc)  # type: ignore[arg-type]
