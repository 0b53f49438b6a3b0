"""Feeding the GPU: uint8 batches copied ahead on a side stream, converted and normalised
on the device.

uint8 crosses PCIe at a quarter of float32's bytes, and the conversion costs the GPU next
to nothing. Without CUDA the same object runs on the CPU as a pass-through that still
converts and normalises, so training code is the same on both.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

__all__ = ["DevicePrefetcher"]

Batch = tuple[torch.Tensor, torch.Tensor]


class DevicePrefetcher:
    """Iterate ``(images, labels)`` batches on ``device``, the next one already copying.

    Args:
        batches: any iterable of ``(uint8 [B, 3, H, W], labels)``, e.g. a DataLoader with
            ``pin_memory=True`` (a pageable batch's copy cannot overlap anything).
        device: default ``cuda`` when available, else ``cpu``.
        mean, std: per-channel, on the 0-1 scale (``(0.485, 0.456, 0.406)`` ...);
            ``None`` only scales to 0-1.
        channels_last: return images in ``torch.channels_last`` memory (else contiguous).
        dtype: of the returned images.

    On CUDA, batch ``k + 1`` is copied (``non_blocking``) and converted on a side stream
    while batch ``k`` is in use; the training stream waits on that copy before it sees the
    batch, and the tensors are ``record_stream``-ed so their memory is not reused early.
    """

    def __init__(
        self,
        batches: Iterable[Batch],
        device: str | torch.device | None = None,
        *,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        channels_last: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if (mean is None) != (std is None):
            raise ValueError("pass both mean= and std=, or neither")
        self.batches = batches
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self._mean = self._std = None
        if mean is not None and std is not None:
            self._mean = torch.tensor(mean, dtype=dtype, device=self.device).view(1, -1, 1, 1)
            self._std = torch.tensor(std, dtype=dtype, device=self.device).view(1, -1, 1, 1)

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (already on the device) to normalised ``dtype``."""
        x = images.to(self.dtype).div_(255)
        if self._mean is not None:
            x = x.sub_(self._mean).div_(self._std)
        return x.contiguous(memory_format=self.memory_format)

    def __iter__(self) -> Iterator[Batch]:
        if self.device.type != "cuda":
            for images, labels in self.batches:
                yield self.prepare(images.to(self.device)), labels.to(self.device)
            return
        side = torch.cuda.Stream(self.device)
        batches = iter(self.batches)
        ahead = self._copy(batches, side)
        while ahead is not None:
            training = torch.cuda.current_stream(self.device)
            training.wait_stream(side)  # the copy and conversion of this batch are done
            images, labels = ahead
            images.record_stream(training)  # allocated on `side`, used on `training`
            labels.record_stream(training)
            ahead = self._copy(batches, side)
            yield images, labels

    def _copy(self, batches: Iterator[Batch], side: Any) -> Batch | None:
        try:
            images, labels = next(batches)
        except StopIteration:
            return None
        with torch.cuda.stream(side):
            images = images.to(self.device, non_blocking=True)
            labels = labels.to(self.device, non_blocking=True)
            return self.prepare(images), labels
