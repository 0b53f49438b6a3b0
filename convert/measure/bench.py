"""``imgpack bench``: random-read latency and throughput of datasets and image folders, on
the user's own data and storage.

Per path (an imgpack dataset of any format, or a plain ImageNet-layout folder read the way
a training script reads files): the latency of one stored sample read without decoding and
with decoding (p50/p90/p99/p99.9 over seeded random indices), batch reads
(``__getitems__`` of ``batch_size`` random indices), sequential throughput, and DataLoader
samples/s for each worker count; ``wds`` datasets also as a stream. With ``crop``, the
DataLoader runs centre-crop through the readers' ``crop=`` (:class:`readers.CenterCrop`,
decoded straight into the batch), as training would (not a dataset stored at that size
already); the folder decodes each file whole and places the same box. Warm page cache by
default (an untimed pass first); ``cold=True`` drops the dataset's own pages before each
timed pass (``posix_fadvise(DONTNEED)``, no root needed) and reports what stayed resident.
What the library warns about while measuring (an unshuffled ``wds`` dataset read as a
stream, say) is kept as a one-line note.
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import random
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import readers
from convert.scan import scan_folder
from readers import spec
from readers.batch import collate_any
from readers.feeding.tune import loader_rate
from readers.formats import STREAM_FORMATS
from readers.images.crop import CenterCrop, Crop
from readers.images.fused import place
from readers.storage.remote import is_url

__all__ = [
    "PERCENTILES",
    "Source",
    "bench_path",
    "crop_for",
    "drop_cache",
    "library_notes",
    "open_source",
    "resident_fraction",
    "steps",
]

PERCENTILES = (50.0, 90.0, 99.0, 99.9)


class FolderDataset(Dataset):
    """What a training script reading image files does: open, read, decode, per sample
    (and with ``crop``, cut its box from the decoded image, torchvision's ``CenterCrop``)."""

    def __init__(
        self, root: Path, relpaths: list[str], labels: list[int], crop: Crop | None = None
    ) -> None:
        self.root, self.relpaths, self.labels = root, relpaths, labels
        self.crop = crop

    def __len__(self) -> int:
        return len(self.relpaths)

    def stored(self, index: int) -> bytes:
        return (self.root / self.relpaths[index]).read_bytes()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        pixels = readers.decode_image(self.stored(index), self.relpaths[index])
        if self.crop is not None:
            box = self.crop.boxes(np.array([pixels.shape[:2]]), np.array([index]))[0]
            pixels, whole = np.empty((*self.crop.size, 3), dtype=np.uint8), pixels
            place(whole, box, pixels)
        return torch.from_numpy(pixels).permute(2, 0, 1), self.labels[index]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        return [self[i] for i in indices]


@dataclass
class Source:
    """One path under test: how to (re)open it, its files, and how to load it."""

    path: Path | str  # a URL for a remote dataset
    kind: str  # a format id, or "folder"
    files: list[Path]
    open: Callable[[], Any]  # -> a map-style dataset with stored(i) and __getitems__
    loader: Callable[[int, int, Crop | None], Any]  # (workers, batch_size, crop) -> batches
    stream: Callable[[int, int, Crop | None], Any] | None = None  # wds only
    shape: tuple[int, int, int] | None = None  # (H, W, 3) when every sample has it

    @property
    def label(self) -> str:
        return f"{path_name(self.path)} ({self.kind})"


def path_name(path: Path | str) -> str:
    """The last component of a path or URL."""
    return str(path).rstrip("/").rsplit("/", 1)[-1]


def open_source(path: Path | str) -> Source:
    """An imgpack dataset (any format; a URL is first copied into the reader cache, so
    that its figures are those of local reads, but the stream's, which reads byte ranges
    remotely) or a plain image folder."""
    if is_url(path) or (Path(path) / spec.MANIFEST_NAME).is_file():
        manifest = readers.load_manifest(path)
        dataset = readers.open_dataset(path)
        for i in range(len(manifest.shards)):
            dataset.cache_shard(i)
        files = [p for i in range(len(manifest.shards)) for p in _shard_files(manifest, i)]

        def loader(workers: int, batch: int, crop: Crop | None, stream: bool = False) -> Any:
            return readers.make_loader(
                path,
                batch,
                crop=crop,
                num_workers=workers,
                distributed=False,
                collate_fn=collate_any,
                persistent_workers=workers > 0,
                decode_threads=1 if workers else None,
                stream=stream,
            )

        return Source(
            path,
            manifest.format,
            files,
            lambda: readers.open_dataset(path),
            loader,
            partial(loader, stream=True) if manifest.format in STREAM_FORMATS else None,
            manifest.shape,
        )
    path = Path(path)
    scan = scan_folder(path)
    if not scan.samples:
        raise FileNotFoundError(f"{path}: no images found below its class folders")
    relpaths = [s.relpath for s in scan.samples]
    labels = [s.label for s in scan.samples]

    def folder_loader(workers: int, batch: int, crop: Crop | None) -> Any:
        return DataLoader(
            FolderDataset(path, relpaths, labels, crop),
            batch_size=batch,
            shuffle=True,
            num_workers=workers,
            persistent_workers=workers > 0,
            collate_fn=collate_any,
        )

    return Source(
        path,
        "folder",
        [path / r for r in relpaths],
        lambda: FolderDataset(path, relpaths, labels),
        folder_loader,
    )


def crop_for(shape: tuple[int, ...] | None, size: int | None) -> CenterCrop | None:
    """``CenterCrop(size)`` as training passes it, or None when every stored image of the
    dataset (``shape``: H, W, 3) is ``size`` x ``size`` already: a crop would copy each
    unchanged, and training reads such a dataset without one."""
    if size is None or (shape is not None and tuple(shape[:2]) == (size, size)):
        return None
    return CenterCrop(size)


def _shard_files(manifest: readers.Manifest, index: int) -> list[Path]:
    shard = manifest.shard_path(index)
    return [shard, *(shard.with_name(shard.name + s) for s in manifest.shards[index].sidecars)]


# --- the page cache ---------------------------------------------------------------------------
def drop_cache(files: list[Path]) -> str | None:
    """Ask the kernel to drop these files' cached pages; the reason when it cannot."""
    if not hasattr(os, "posix_fadvise"):
        return "posix_fadvise is not available on this system"
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as e:
            return f"{path}: {e.strerror}"
        finally:
            os.close(fd)
    return None


_libc = ctypes.CDLL(None, use_errno=True)


def resident_fraction(files: list[Path]) -> float | None:
    """Share of these files' pages in the page cache (``mincore``), or None if unknown."""
    page, resident, total = mmap.PAGESIZE, 0, 0
    for path in files:
        size = path.stat().st_size
        if not size:
            continue
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            start = ctypes.c_char.from_buffer(m)  # pins the map until deleted
            ok = _libc.mincore(ctypes.byref(start), ctypes.c_size_t(size), vec) == 0
            del start
            if not ok:
                return None
            resident += sum(b & 1 for b in vec)
            total += pages
    return resident / total if total else None


# --- measurements -----------------------------------------------------------------------------
@dataclass
class Measured:
    """Every repeat of every figure, by name; medians and spreads on demand."""

    values: dict[str, list[float]] = field(default_factory=dict)
    latencies: dict[str, list[float]] = field(default_factory=dict)  # µs, every read

    def add(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(value)

    def as_json(self) -> dict[str, Any]:
        return {
            name: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}
            for name, v in self.values.items()
        }


def _latencies_us(read: Callable[[int], Any], indices: list[int]) -> np.ndarray:
    out = np.empty(len(indices))
    clock = time.perf_counter_ns
    for k, i in enumerate(indices):
        start = clock()
        read(i)
        out[k] = (clock() - start) / 1000
    return out


def _nbytes(value: Any) -> int:
    return value.nbytes if isinstance(value, (np.ndarray, memoryview)) else len(value)


@contextmanager
def library_notes() -> Iterator[list[str]]:
    """The library's ``UserWarning`` s inside the block, each once, as notes for the report
    (Python would print each with a source line); a DataLoader with more workers than CPUs
    is what the user asked to measure and says nothing. Other warnings pass through."""
    notes: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
        try:
            yield notes
        finally:
            others = [w for w in caught if not issubclass(w.category, UserWarning)]
            found = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
            notes.extend(dict.fromkeys(found))
    for w in others:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def bench_path(
    path: Path,
    *,
    samples: int = 1000,
    batch_size: int = 64,
    workers: tuple[int, ...] = (0, 2),
    repeats: int = 3,
    seed: int = 0,
    cold: bool = False,
    seconds: float = 1.0,
    crop: int | None = None,
    tick: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every figure for one path (see the module docstring), as a JSON-ready dict."""
    source = open_source(path)
    tick = tick or (lambda _what: None)
    rng = random.Random(seed)
    measured = Measured()
    n = len(source.open())
    picks = [rng.randrange(n) for _ in range(samples)]
    batches = [
        [rng.randrange(n) for _ in range(batch_size)] for _ in range(max(1, samples // batch_size))
    ]
    sequential = range(min(n, max(samples, 5000)))
    cache_notes: list[str] = []

    def fresh() -> Any:
        """The dataset reopened (nothing else holds its pages mapped), the cache dropped
        first when cold."""
        gc.collect()
        if cold:
            reason = drop_cache(source.files)
            left = resident_fraction(source.files)
            note = reason or (f"{100 * left:.1f} % still cached" if left is not None else "dropped")
            cache_notes.append(note)
        return source.open()

    def latencies(name: str, read: Callable[[Any, int], Any]) -> None:
        ds = fresh()
        lat = _latencies_us(lambda i: read(ds, i), picks)
        measured.latencies.setdefault(name, []).extend(lat.tolist())
        for p in PERCENTILES:
            measured.add(f"{name}_p{p:g}_us", float(np.percentile(lat, p)))

    def batch_reads() -> None:
        ds = fresh()
        start = time.perf_counter()
        for batch in batches:
            ds.__getitems__(batch)
        elapsed = time.perf_counter() - start
        measured.add("batch_ms", 1000 * elapsed / len(batches))
        measured.add("batch_samples_per_s", len(batches) * batch_size / elapsed)

    def sequential_reads() -> None:
        ds, total = fresh(), 0
        start = time.perf_counter()
        for i in sequential:
            total += _nbytes(ds.stored(i))
        elapsed = time.perf_counter() - start
        measured.add("sequential_samples_per_s", len(sequential) / elapsed)
        measured.add("sequential_mb_per_s", total / elapsed / 1e6)

    center_crop = crop_for(source.shape, crop)

    def loader_reads(name: str, make: Callable[[int, int, Crop | None], Any], workers: int) -> None:
        fresh()
        measured.add(name, loader_rate(make(workers, batch_size, center_crop), seconds)[0])

    if not cold:  # warm: one untimed pass over what will be read
        ds = source.open()
        for i in [*picks, *sequential]:
            ds.stored(i)
        del ds
    with library_notes() as notes:
        for _ in range(repeats):
            latencies("stored", lambda ds, i: ds.stored(i))
            latencies("decoded", lambda ds, i: ds[i])
            tick("latency")
            batch_reads()
            sequential_reads()
            tick("batches and sequential")
            for w in workers:
                loader_reads(f"loader_w{w}_samples_per_s", source.loader, w)
                if source.stream is not None:
                    loader_reads(f"stream_w{w}_samples_per_s", source.stream, w)
                tick(f"DataLoader workers={w}")
    if crop and center_crop is None:
        notes.append(f"{path}: stored at {crop}x{crop} already, so read without crop=")
    return {
        "path": str(path),
        "kind": source.kind,
        "samples": n,
        "bytes": sum(f.stat().st_size for f in source.files),
        "cache": "cold" if cold else "warm",
        "crop": crop if center_crop else None,
        "cache_notes": cache_notes,
        "notes": notes,
        "figures": measured.as_json(),
        "latency_us": measured.latencies,
    }


def steps(paths: list[Path], repeats: int, workers: tuple[int, ...]) -> int:
    """How many times ``bench_path`` calls ``tick`` over ``paths`` (for a progress bar)."""
    return len(paths) * repeats * (2 + len(workers))
