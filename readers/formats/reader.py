"""What every format's shard reader is: one open shard of one process, read by local index."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
import torch

__all__ = ["ShardReader"]


class ShardReader(ABC):
    """One open shard. Every read checks the sample as :mod:`readers.formats.checks` says
    and raises ``DatasetError`` naming ``shard[index]`` for a damaged one."""

    labels: np.ndarray  # int64 [n]

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
