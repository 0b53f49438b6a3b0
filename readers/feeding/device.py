"""Feeding the GPU: uint8 batches copied on a side stream beside the training step,
converted and normalised on the device, optionally JPEGs decoded there.

uint8 crosses PCIe at a quarter of float32's bytes, and the conversion costs the GPU next
to nothing. Without CUDA the same object runs on the CPU as a pass-through that still
converts and normalises, so training code is the same on both.

GPU decode (``gpu_decode=True``, over a loader built with ``decode=False``) uses nvJPEG
through ``torchvision.io.decode_jpeg(..., device="cuda")`` where torchvision imports (its
image decoders are deprecated from 0.29); otherwise, or for a sample that is not a JPEG,
it decodes on the CPU with imgpack's decoder, saying so once. nvJPEG's IDCT and chroma
upsampling are not libjpeg-turbo's: its pixels differ from the CPU decode's by a few levels
(measured on an H100: docs/BENCHMARKS.md, "GPU feeding").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cache
from typing import Any

import torch

from readers.images.decode import decode_image
from readers.images.jpeg import is_jpeg

__all__ = ["DevicePrefetcher"]

log = logging.getLogger(__name__)

Batch = tuple[Any, ...]  # (images, labels, *fields)


class DevicePrefetcher:
    """Iterate ``(images, labels, *fields)`` batches on ``device``, each copied on a side
    stream while the GPU still runs the previous step.

    Args:
        batches: any iterable of ``(uint8 [B, 3, H, W], labels, *fields)``, e.g. a
            DataLoader with ``pin_memory=True`` (a pageable batch's copy cannot overlap
            anything). Fields batched as tensors (int, float, fixed-shape arrays) are
            copied to the device too; lists (captions, json) are passed as they are.
        device: default ``cuda`` when available, else ``cpu``.
        mean, std: per-channel, on the 0-1 scale (``(0.485, 0.456, 0.406)`` ...);
            ``None`` only scales to 0-1.
        channels_last: return images in ``torch.channels_last`` memory (else contiguous).
        dtype: of the returned images.
        gpu_decode: the batches hold encoded samples (``make_loader(..., decode=False)``):
            decode them on the device. Images of differing sizes come back as a list.

    On CUDA, batch ``k + 1`` is copied (``non_blocking``) and converted on a side stream
    when the loop asks for it: kernel launches return at once, so that is while the GPU
    still runs step ``k``, unless the step waits for the GPU (``loss.item()`` every step).
    The training stream waits on that copy before it sees the batch, and the tensors are
    ``record_stream``-ed so their memory is not reused early. No batch is taken from
    ``batches`` before the loop asks for it: the first step of an epoch waits for one batch
    only, and a loader's ``state_dict()`` counts exactly the batches handed out.
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
        gpu_decode: bool = False,
    ) -> None:
        if (mean is None) != (std is None):
            raise ValueError("pass both mean= and std=, or neither")
        self.batches = batches
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype
        self.gpu_decode = gpu_decode
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self._mean = self._std = None
        if mean is not None and std is not None:
            self._mean, self._std = self._per_channel(mean), self._per_channel(std)

    def _per_channel(self, values: Sequence[float]) -> torch.Tensor:
        """``values`` as a ``[1, C, 1, 1]`` tensor on the device, copied ``non_blocking``: a
        blocking copy waits for all the GPU work queued so far, so a prefetcher made at an
        epoch's start would hold the loop back until the GPU ran dry."""
        per_channel = torch.tensor(values, dtype=self.dtype).view(1, -1, 1, 1)
        return per_channel.to(self.device, non_blocking=True)

    def __len__(self) -> int:
        return len(self.batches)  # type: ignore[arg-type]

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images (already on the device) to normalised ``dtype``."""
        x = images.to(self.dtype).div_(255)
        if self._mean is not None:
            x = x.sub_(self._mean).div_(self._std)
        return x.contiguous(memory_format=self.memory_format)

    def _images(self, images: Any) -> Any:
        """A batch's images on the device, normalised (decoded first with ``gpu_decode``)."""
        if not self.gpu_decode:
            return self.prepare(images.to(self.device, non_blocking=True))
        decoded = _decode_all(list(images), self.device)
        if len({tuple(i.shape) for i in decoded}) == 1:
            return self.prepare(torch.stack(decoded))
        return [self.prepare(i[None])[0] for i in decoded]

    def _on_device(self, batch: Batch) -> Batch:
        images, *rest = batch
        moved = (
            r.to(self.device, non_blocking=True) if isinstance(r, torch.Tensor) else r for r in rest
        )
        return (self._images(images), *moved)

    def __iter__(self) -> Iterator[Batch]:
        side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        for batch in self.batches:
            if side is None:
                yield self._on_device(batch)
                continue
            with torch.cuda.stream(side):
                images, *rest = moved = self._on_device(batch)
            training = torch.cuda.current_stream(self.device)
            training.wait_stream(side)  # the copy and conversion of this batch are done
            for tensor in (*(images if isinstance(images, list) else [images]), *rest):
                if isinstance(tensor, torch.Tensor):  # allocated on `side`, used on `training`
                    tensor.record_stream(training)
            yield moved


@cache
def _notice(message: str) -> None:
    """Log ``message`` once per process."""
    log.warning(message)


@cache
def _nvjpeg() -> Callable[..., Any] | None:
    """torchvision's batched GPU JPEG decoder (RGB, EXIF orientation applied, as imgpack's
    decoder), or None when it cannot run here."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg

        def decode(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
            return decode_jpeg(
                data, mode=ImageReadMode.RGB, device=device, apply_exif_orientation=True
            )

        return decode
    except Exception as e:  # absent, or built for another torch
        _notice(f"GPU JPEG decode unavailable ({type(e).__name__}: {e}): decoding on the CPU")
        return None


def _decode_all(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Encoded samples (1-D uint8) to ``[3, H, W]`` uint8 images on ``device``."""
    gpu = _nvjpeg() if device.type == "cuda" else None
    if device.type != "cuda":
        _notice("gpu_decode without CUDA: decoding on the CPU")
    jpegs = [k for k, e in enumerate(encoded) if gpu is not None and is_jpeg(e[:3].numpy())]
    out: list[Any] = [None] * len(encoded)
    if jpegs:
        for k, image in zip(jpegs, gpu([encoded[k] for k in jpegs], device), strict=True):
            out[k] = image
    for k, e in enumerate(encoded):
        if out[k] is None:  # not a JPEG, or no GPU decoder: imgpack's CPU decoder
            pixels = torch.from_numpy(decode_image(e.numpy().tobytes()))
            out[k] = pixels.permute(2, 0, 1).to(device)
    return out
