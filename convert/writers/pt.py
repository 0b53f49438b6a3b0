"""Writer for ``pt`` shards (layout: ``readers/pt.py``, names: ``readers.spec``).

A shard is built in memory (bounded by the shard limits) and saved once with
``torch.save``: a dict of plain tensors, so it loads with ``weights_only=True``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from convert.writers.base import Layout, Record
from readers import spec
from readers.spec import StorageKind

__all__ = ["PtWriter"]


def _concat(chunks: list[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    """Bytes back to back as one uint8 tensor, with int64 offsets [N + 1]."""
    offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
    np.cumsum([len(c) for c in chunks], out=offsets[1:])
    data = torch.from_numpy(np.frombuffer(bytearray(b"".join(chunks)), dtype=np.uint8))
    return data, torch.from_numpy(offsets)


class PtWriter:
    """Collects one shard's samples and writes them with ``torch.save`` on close."""

    def __init__(self, path: Path, layout: Layout) -> None:
        self.path = path
        self.layout = layout
        self.records: list[Record] = []

    def add(self, record: Record) -> None:
        self.records.append(record)

    def close(self) -> list[str]:
        recs = self.records
        tensors: dict[str, torch.Tensor] = {
            spec.PT_LABELS: torch.tensor([r.label for r in recs], dtype=torch.int64),
        }
        tensors[spec.PT_PATHS], tensors[spec.PT_PATH_OFFSETS] = _concat(
            [r.path.encode("utf-8", "surrogateescape") for r in recs]
        )
        if self.layout.kind is StorageKind.FIXED_PIXELS:
            tensors[spec.PT_IMAGES] = torch.from_numpy(np.stack([r.data for r in recs]))
        else:
            if self.layout.kind is StorageKind.VARIABLE_PIXELS:
                shapes = [r.data.shape for r in recs]  # type: ignore[union-attr]
                tensors[spec.PT_SHAPES] = torch.tensor(shapes, dtype=torch.int64)
            tensors[spec.PT_DATA], tensors[spec.PT_OFFSETS] = _concat(
                [r.data.tobytes() if isinstance(r.data, np.ndarray) else r.data for r in recs]
            )
        torch.save(tensors, self.path)
        self.records = []
        return []
