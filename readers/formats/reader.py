"""What every format's shard reader is: one open shard of one process, read by local index."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch

from readers.formats.checks import SampleCrcs

__all__ = ["ShardReader"]


class ShardReader(ABC):
    """One open shard. Every read checks the sample as :mod:`readers.formats.checks` says
    and raises ``DatasetError`` naming ``shard[index]`` for a damaged one."""

    labels: np.ndarray  # int64 [n]
    crcs: SampleCrcs  # what every read of an encoded sample is checked against

    @property
    def verified(self) -> bool:
        """Whether every encoded sample this shard serves is checked against the CRC-32
        the converter recorded for the bytes it had just encoded or fully decoded: a reader
        may then decode only the part of a sample it needs, as no damage can hide in the
        rest. False for raw pixels and for shards written before CRCs were recorded."""
        return self.crcs.recorded

    @abstractmethod
    def read(self, i: int) -> bytes | memoryview | np.ndarray:
        """Stored value of local sample ``i``: encoded bytes or uint8 HWC pixels."""

    @abstractmethod
    def read_pixels(self, idx: np.ndarray, out: torch.Tensor) -> None:
        """Copy raw fixed-shape samples ``idx`` into ``out`` ([k, H, W, 3] uint8)."""

    @abstractmethod
    def path(self, i: int) -> str:
        """Source path of local sample ``i``, relative to the converted folder."""

    def read_many(self, indices: list[int]) -> list[bytes | memoryview | np.ndarray]:
        """Samples ``indices`` as :meth:`read` gives each (ascending order reads fastest;
        a reader of remote byte ranges fetches them in one round)."""
        return [self.read(i) for i in indices]
