"""The crop section of ``scripts.bench.read``: crops inside the decode (``crop=``) against FFCV.

The folder converted with ``--encoding jpeg --resize 256`` (q90) to ``lmdb`` and ``pt`` is
read in shuffled batches of 64, each contender at ``num_workers`` 0 (2 decode threads), 1
and 2, second epoch and later timed, interleaved rounds, medians:

centre: ``crop=readers.CenterCrop(224, ratio=224/256)`` (FFCV's semantics; on short-256
        images the central 224x224, no resize), the old per-sample ``transform=`` crop,
        FFCV's ``CenterCropRGBImageDecoder((224, 224), 224/256)`` with ``ToTorchImage()``
        (channels-last, as imgpack's batches) and ``ToTorchImage(channels_last=False)``
        against imgpack's NCHW crop (``channels_last=False``: planes written by the decode
        threads), and the full decode of the same stored bytes on 2 threads.
random: ``crop=readers.RandomResizedCrop(224, flip=True)`` against FFCV's
        ``RandomResizedCropRGBImageDecoder((224, 224))`` + ``RandomHorizontalFlip()``.

The converter's default JPEGs carry a restart marker every MCU, which lets a crop decode
only the intervals around its box; a second lmdb file of the same pixels written with
``--no-restart-markers`` is read in-process by both crops and fully decoded, to show what
the markers change.

FFCV (an optional benchmark-only dependency, see docs/BENCHMARKS.md) writes its own file
from the same stored images (decoded, re-encoded by OpenCV at q90) with
``max_resolution=None``: the same pixels as imgpack's (short side 256). FFCV applies
``max_resolution`` to the *longer* side, so the ``max_resolution=256`` file that earlier
runs compared against held 256x192 images (56 % of the pixels; its "centre 224" was an
upsampled 168 px crop): it stays as a labelled extra row (``ffcv long-side-256 ...``), never
in a ratio. FFCV's ``num_workers`` are threads, with ``os_cache=True`` and
``OrderOption.RANDOM``. Without
``ffcv`` importable its contenders are skipped with a note (it is imported only when this
section runs).

    python -m scripts.bench.read --section crops [--repeats 3] [--json F]
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

import readers
from scripts.bench.common import (
    CenterCrop,
    batch_loader,
    convert_source,
    decode_contender,
    ffcv_import_error,
    markdown_table,
    rates_text,
    target_row,
)
from scripts.bench.measure import Measurement, best, interleaved, median_rate, timed, warm_up
from scripts.bench.settings import BATCH, CROP, DECODE_CORES, RESIZE

CENTER = readers.CenterCrop(CROP, ratio=CROP / RESIZE)
CENTER_NCHW = readers.CenterCrop(CROP, ratio=CROP / RESIZE, channels_last=False)
RANDOM = readers.RandomResizedCrop(CROP, flip=True)
TARGET_OVER_FFCV = {"centre": 1.3, "random": 1.6}
TARGET_OVER_DECODE = 1.15  # decoding less than the whole image must show
TARGET_WORKERS = 0.9
UNMARKED = "(--no-restart-markers)"  # the same pixels stored without restart markers


def imgpack(root: Path, workers: int, **kwargs: Any) -> Callable[[], Any]:
    """Factory of an imgpack DataLoader contender (``kwargs`` to ``open_dataset``)."""

    def factory() -> Callable[[], Measurement]:
        threads = 2 if workers == 0 else 1
        ds = readers.open_dataset(root, decode_threads=threads, **kwargs)
        loader = batch_loader(ds, workers, shuffle=True)
        return timed(lambda: loader, sorted(root.iterdir()))

    return factory


def write_beton(root: Path, path: Path, max_resolution: int | None = None) -> Path:
    """FFCV's file of the stored images of the imgpack dataset ``root`` (``max_resolution``:
    FFCV's cap on the longer side; None stores the images at their size)."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    ds = readers.open_dataset(root)

    class Decoded(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(ds)

        def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
            return readers.decode_image(ds.stored(i)), ds.targets[i]

    if not path.exists():
        field = RGBImageField(write_mode="jpg", max_resolution=max_resolution, jpeg_quality=90)
        writer = DatasetWriter(str(path), {"image": field, "label": IntField()}, num_workers=2)
        writer.from_indexed_dataset(Decoded())
    return path


def ffcv_loader(beton: Path, workers: int, random: bool, channels_last: bool = True) -> Any:
    from ffcv.fields.decoders import (
        CenterCropRGBImageDecoder,
        IntDecoder,
        RandomResizedCropRGBImageDecoder,
    )
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    size = (CROP, CROP)
    image: list[Any] = (
        [RandomResizedCropRGBImageDecoder(size), RandomHorizontalFlip()]
        if random
        else [CenterCropRGBImageDecoder(size, ratio=CROP / RESIZE)]
    )
    image += [ToTensor(), ToTorchImage(channels_last=channels_last)]
    return Loader(
        str(beton),
        batch_size=BATCH,
        num_workers=workers,
        order=OrderOption.RANDOM,
        os_cache=True,
        drop_last=False,
        pipelines={"image": image, "label": [IntDecoder(), ToTensor(), Squeeze()]},
    )


def ffcv(beton: Path, workers: int, random: bool, channels_last: bool = True) -> Any:
    """Factory of an FFCV contender: one Loader, iterated every epoch."""

    def factory() -> Callable[[], Measurement]:
        loader = ffcv_loader(beton, workers, random, channels_last)
        return timed(lambda: loader, [beton])

    return factory


def stored_images(root: Path) -> list[bytes]:
    """The stored bytes of every sample of the imgpack dataset ``root``, in order."""
    ds = readers.open_dataset(root)
    return [bytes(ds.stored(i)) for i in range(len(ds))]


def full_decode(root: Path) -> Callable[[], Callable[[], Measurement]]:
    """Pure full-image decode of the stored bytes on ``DECODE_CORES`` threads."""

    def factory() -> Callable[[], Measurement]:
        return decode_contender(ThreadPoolExecutor(DECODE_CORES), stored_images(root))

    return factory


def run_crops(src: Path, work: Path, repeats: int, max_foreign: float) -> dict[str, Any]:
    """Time every contender; return the runs, the stored sizes and why FFCV's contenders
    were skipped (``None`` if they ran). ``max_foreign``: the other processes' load (cores)
    above which a measurement waits and is taken again."""
    ffcv_missing = ffcv_import_error()
    roots = {fmt: convert_source(src, work / f"{fmt}-jpeg", fmt, "jpeg") for fmt in ("lmdb", "pt")}
    unmarked = work / "lmdb-jpeg-unmarked"
    convert_source(src, unmarked, "lmdb", "jpeg", restart_markers=False)
    factories: dict[str, Callable[[], Callable[[], Measurement]]] = {}
    # workers first: they fork before this process opens the lmdb file (see read.py)
    for w in (2, 1, 0):
        for fmt, root in roots.items():
            factories[f"imgpack {fmt} centre workers={w}"] = imgpack(root, w, crop=CENTER)
            factories[f"imgpack {fmt} random workers={w}"] = imgpack(root, w, crop=RANDOM)
    for kind, crop in (("centre", CENTER), ("random", RANDOM)):
        name = f"imgpack lmdb {kind} workers=0 {UNMARKED}"
        factories[name] = imgpack(unmarked, 0, crop=crop)
    lmdb = roots["lmdb"]
    factories["imgpack lmdb centre NCHW workers=0"] = imgpack(lmdb, 0, crop=CENTER_NCHW)
    factories["imgpack lmdb centre by transform= workers=0"] = imgpack(
        lmdb, 0, transform=CenterCrop(CROP)
    )
    beton = work / "ffcv-same-pixels.beton"  # not ffcv.beton: older runs capped it at 256
    if ffcv_missing is None:
        write_beton(roots["pt"], beton)  # pt: py-lmdb allows one open env per file
        long_side = write_beton(roots["pt"], work / "ffcv-long-side-256.beton", RESIZE)
        for w in (1, 2):
            for kind in ("centre", "random"):
                factories[f"ffcv {kind} workers={w}"] = ffcv(beton, w, kind == "random")
        factories["ffcv centre NCHW workers=2"] = ffcv(beton, 2, False, channels_last=False)
        for kind in ("centre", "random"):
            name = f"ffcv long-side-256 {kind} workers=2 (fewer pixels: not compared)"
            factories[name] = ffcv(long_side, 2, kind == "random")
    else:
        print(f"  FFCV contenders skipped: ffcv does not import ({ffcv_missing})", flush=True)
    factories[f"full decode, {DECODE_CORES} threads"] = full_decode(roots["pt"])
    factories[f"full decode, {DECODE_CORES} threads {UNMARKED}"] = full_decode(unmarked)
    runs = interleaved(warm_up(factories), repeats, max_foreign)
    sizes = [len(j) for j in stored_images(roots["pt"])]
    beton_bytes = beton.stat().st_size if beton.exists() else None
    return {
        "stored_jpeg_mean_bytes": float(np.mean(sizes)),
        "ffcv_bytes": beton_bytes,
        "ffcv_missing": ffcv_missing,
        "runs": runs,
    }


def crops_report(crops: dict[str, Any]) -> tuple[str, list[list[Any]]]:
    """Markdown table of the crop section and its target rows."""
    runs = crops["runs"]
    decode_name = f"full decode, {DECODE_CORES} threads"
    decode_rate = median_rate(runs[decode_name])
    rows = [[name, median_rate(r), rates_text(r)] for name, r in runs.items()]
    table = markdown_table(["contender", "samples/s (median)", "repeats"], rows)
    targets = []
    for kind in ("centre", "random"):
        name, rate = best(runs, (f"imgpack lmdb {kind} workers", f"imgpack pt {kind} workers"))
        if crops["ffcv_missing"] is None:
            ffcv_name, ffcv_rate = best(runs, f"ffcv {kind} workers")
            label = f"{kind}: imgpack best ({name}) / FFCV best ({ffcv_name})"
            targets.append(target_row(label, rate / ffcv_rate, TARGET_OVER_FFCV[kind]))
        if kind == "centre":
            label = f"centre: imgpack best / {decode_name}"
            targets.append(target_row(label, rate / decode_rate, TARGET_OVER_DECODE))
        best_in_process = max(
            median_rate(runs[f"imgpack {fmt} {kind} workers=0"]) for fmt in ("lmdb", "pt")
        )
        w2_name, w2_rate = best(
            runs, (f"imgpack lmdb {kind} workers=2", f"imgpack pt {kind} workers=2")
        )
        label = f"{kind}: imgpack best workers=2 ({w2_name}) / best workers=0"
        targets.append(target_row(label, w2_rate / best_in_process, TARGET_WORKERS))
    return table, targets
