"""Soak test: several epochs over a converted dataset of thousands of samples in two
DataLoader workers, for every reader (the map-style class of each format and WdsStream).

Each epoch must serve every sample exactly once, with the pixels and label a direct read
gives; the open file descriptors and file mappings of the main process and of each worker
must be the same in the last epoch as in the first (on shard files: as many per shard
file, since a stream's worker may read shards new to it later), and their RSS about the
same: a handle
kept per batch, per epoch or per worker start shows up as growth. Workers run once
persistent (their own leaks add up across epochs) and once restarted every epoch (the main
process's leaks add up).

CI runs a short version (3,000 samples, 3 epochs). A long run, on more data and epochs:

    .venv/bin/pytest -m soak -s --soak-samples 50000 --soak-epochs 10

``-s`` prints one summary line per case: per epoch its time, and the fds, file mappings and
RSS of the main process and of each worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, get_worker_info

import readers
from convert import ConvertOptions, convert_folder
from tests.photos import wheel_photo

pytestmark = [
    pytest.mark.soak,
    # only raised on machines with fewer than 2 usable CPUs; not what these tests check
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

PHOTOS = ("astronaut", "chelsea", "coffee", "rocket")  # one class each
SHARD_SIZE = 500  # small, so that each process holds many shard handles
SIDE = 32  # every sample is resized and center-cropped to SIDE x SIDE, so batches stack
BATCH_SIZE = 64
WORKERS = 2
# One encoding per format (both would double the time): JPEG bytes decoded in the worker
# for pt (sliced from an mmap) and wds (pread); raw pixels gathered straight into the batch
# for hdf5 (through a memory map of the file, beside h5py's handle) and lmdb.
ENCODINGS = {"pt": "jpeg", "hdf5": "raw", "lmdb": "raw", "wds": "jpeg"}
STREAM = "wds-stream"
READERS = [*readers.DATASETS, STREAM]
# RSS may grow between the first and the last epoch by allocator noise: measured at most
# 0.3 MiB over 3 epochs of 3,000 samples, and over 10 epochs of 10,000 one step of at most
# 1.4 MiB in a persistent worker. A worker keeping one 200 KiB batch (64 x 3 x 32 x 32) per
# batch it makes grows 4.6 MiB per 3,000-sample epoch; a leaked handle fails the exact checks.
RSS_SLACK = 4 * 2**20
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcessState:
    """What one process holds at one moment."""

    worker: int  # DataLoader worker id; -1 for the main process
    pid: int
    fds: int  # open file descriptors, but for those on shard files
    shard_fds: int  # open file descriptors on shard files
    shard_files: int  # the distinct shard files those name
    mappings: int  # memory-mapped regions of files (an mmap'd shard holds no fd)
    rss: int  # bytes
    names: frozenset[str] = frozenset()  # what the fds (but shard files) point at


TRANSPORT = ("/dev/shm/torch_", "socket:")


def release_free_heap() -> None:
    """glibc's ``malloc_trim(0)``: the pages of freed memory that malloc keeps (in the heap
    and each thread's arena) go back to the system, so RSS counts what is alive. Without it
    a training process with restarted workers measured 6 MiB more in its last epoch than in
    its first, once in a clean-clone run of the whole suite, with its fds and maps unchanged."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL(None).malloc_trim(0)


def process_state(busy: bool) -> ProcessState:
    """This process's handles and RSS. ``busy``: batches may be on their way to the main
    process, so leave out torch's shared-memory segments and the sockets that hand their fds
    over: how many are open depends on how far ahead the workers are, not on leaks."""
    excluded = TRANSPORT if busy else ()
    fd_dir = "/proc/self/fd"
    targets = []
    for name in os.listdir(fd_dir):
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile, as listdir's own is
            targets.append(os.readlink(f"{fd_dir}/{name}"))
    targets = [t for t in targets if not t.startswith(excluded)]
    shards = [t for t in targets if "/shard-" in t]
    with open("/proc/self/maps", encoding="utf-8") as f:
        mapped = [fields[5] for fields in map(str.split, f) if len(fields) > 5]
    mappings = sum(path.startswith("/") and not path.startswith(excluded) for path in mapped)
    release_free_heap()
    with open("/proc/self/statm", encoding="ascii") as f:
        rss = int(f.read().split()[1]) * PAGE_SIZE
    info = get_worker_info()
    fds = len(targets) - len(shards)
    worker = -1 if info is None else info.id
    names = frozenset(t for t in targets if "/shard-" not in t)
    return ProcessState(
        worker, os.getpid(), fds, len(shards), len(set(shards)), mappings, rss, names
    )


@dataclass
class IndexedBatch:
    """A real batch, and the dataset indices it holds."""

    indices: list[int]
    samples: readers.SampleBatch


class IndexedDataset(Dataset):
    """Runs the real ``__getitems__`` in the worker, and says which indices it served."""

    def __init__(self, dataset: readers.ImageDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: list[int]) -> IndexedBatch:
        return IndexedBatch(list(indices), self.dataset.__getitems__(indices))


@dataclass
class Batch:
    """What the loader yields: a collated batch, which samples it holds, and who made it."""

    images: torch.Tensor
    labels: torch.Tensor
    indices: list[int] | None  # None from the stream, which does not say
    made_by: ProcessState


def collate_in_worker(batch: IndexedBatch | list[Any]) -> Batch:
    """``readers.collate``, plus the state of the worker that made the batch."""
    if isinstance(batch, IndexedBatch):
        images, labels = readers.collate(batch.samples)
        return Batch(images, labels, batch.indices, process_state(busy=True))
    images, labels = readers.collate(batch)
    return Batch(images, labels, None, process_state(busy=True))


Fingerprint = tuple[int, str]  # (label, digest of the pixels)


def fingerprint(image: torch.Tensor, label: int) -> Fingerprint:
    return int(label), hashlib.sha1(image.contiguous().numpy().tobytes()).hexdigest()


@dataclass
class EpochRecord:
    seconds: float
    served: int  # samples
    miscounted: dict[int, int]  # index -> times served, for those not served exactly once
    workers: dict[int, ProcessState]  # worker id -> its peak counts during the epoch
    main: ProcessState  # after the epoch


def peak(a: ProcessState, b: ProcessState) -> ProcessState:
    """The larger of each count of one worker at two moments. Workers open shards lazily
    and keep them open: a map-style worker has opened every shard by the end of the first
    epoch; a stream's worker reads one part of its rank's slice each epoch, and may open
    shards new to it later (as many handles per shard file as before: checked instead)."""
    assert a.pid == b.pid, f"worker {a.worker} changed pid within an epoch"
    return replace(
        a,
        fds=max(a.fds, b.fds),
        shard_fds=max(a.shard_fds, b.shard_fds),
        shard_files=max(a.shard_files, b.shard_files),
        mappings=max(a.mappings, b.mappings),
        rss=max(a.rss, b.rss),
    )


def consume(
    loader: DataLoader, identify: Callable[[Batch], Sequence[int]]
) -> tuple[float, int, dict[int, int], dict[int, ProcessState]]:
    """One pass over ``loader``: seconds, samples served, indices not served exactly once,
    and each worker's peak counts. Returning drops the last batch (whose shared-memory fds
    the main process's count would include) and the per-index tally (its RSS)."""
    seen: Counter[int] = Counter()
    workers: dict[int, ProcessState] = {}
    start = time.perf_counter()
    for batch in loader:
        seen.update(identify(batch))
        state = batch.made_by
        workers[state.worker] = peak(workers.get(state.worker, state), state)
    seconds = time.perf_counter() - start
    miscounted = {i: seen[i] for i in range(len(loader.dataset)) if seen[i] != 1}
    return seconds, seen.total(), miscounted, workers


def run_epoch(
    loader: DataLoader, identify: Callable[[Batch], Sequence[int]], epoch: int
) -> EpochRecord:
    """One epoch, and the main process's counts once the DataLoader has let go of it."""
    if isinstance(loader.dataset, readers.WdsStream):
        loader.dataset.set_epoch(epoch)
    seconds, served, miscounted, workers = consume(loader, identify)
    if not loader.persistent_workers:
        # the stopped workers' index queues close their pipes from their feeder threads
        for thread in threading.enumerate():
            if thread.name == "QueueFeederThread":
                thread.join(timeout=10)
    gc.collect()
    return EpochRecord(seconds, served, miscounted, workers, process_state(busy=False))


def check_against(expected: list[Fingerprint]) -> Callable[[Batch], list[int]]:
    """For map-style datasets: the batch's indices, once its pixels and labels are those
    of a direct read of the same indices."""

    def identify(batch: Batch) -> list[int]:
        assert batch.indices is not None
        got = [fingerprint(*row) for row in zip(batch.images, batch.labels, strict=True)]
        assert got == [expected[i] for i in batch.indices], "a sample differs from ds[i]"
        return batch.indices

    return identify


def look_up_in(expected: list[Fingerprint]) -> Callable[[Batch], list[int]]:
    """For the stream, which yields no index or key: the index of the one sample whose
    pixels and label each image has (random crops of photos: no two are alike)."""
    index_of = {print_: i for i, print_ in enumerate(expected)}
    assert len(index_of) == len(expected), "two samples are identical: cannot tell them apart"

    def identify(batch: Batch) -> list[int]:
        prints = [fingerprint(*row) for row in zip(batch.images, batch.labels, strict=True)]
        unknown = [p for p in prints if p not in index_of]
        assert not unknown, f"{len(unknown)} samples are no ds[i]: {unknown[:3]}"
        return [index_of[p] for p in prints]

    return identify


# --- data --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SoakScale:
    samples: int
    epochs: int


@pytest.fixture(scope="module")
def soak_scale(request: pytest.FixtureRequest) -> SoakScale:
    scale = SoakScale(
        request.config.getoption("--soak-samples"), request.config.getoption("--soak-epochs")
    )
    if scale.samples < WORKERS * SHARD_SIZE or scale.epochs < 2:
        raise pytest.UsageError(
            f"--soak-samples must be at least {WORKERS * SHARD_SIZE} (a shard per worker) "
            "and --soak-epochs at least 2 (the first is compared with the last)"
        )
    return scale


def photo_crops(count: int, seed: int = 0) -> Iterator[tuple[str, Image.Image]]:
    """``count`` (photo name, small crop) pairs, the photos taking turns: squares of 32-160 px
    at random places, resized to 24-40 px a side; flat crops (sky, a wall) are drawn again."""
    photos = {name: Image.fromarray(wheel_photo(name)) for name in PHOTOS}
    rng = np.random.default_rng(seed)
    for k in range(count):
        name = PHOTOS[k % len(PHOTOS)]
        photo = photos[name]
        while True:
            side = int(rng.integers(32, 161))
            x = int(rng.integers(0, photo.width - side))
            y = int(rng.integers(0, photo.height - side))
            crop = photo.crop((x, y, x + side, y + side))
            if np.asarray(crop).std() > 12:
                break
        yield name, crop.resize((int(rng.integers(24, 41)), int(rng.integers(24, 41))))


@pytest.fixture(scope="module")
def soak_folder(tmp_path_factory: pytest.TempPathFactory, soak_scale: SoakScale) -> Path:
    """An ImageFolder of ``--soak-samples`` crops of real photos, one photo per class; every
    tenth is a PNG, the rest JPEGs."""
    root = tmp_path_factory.mktemp("soak-source")
    for name in PHOTOS:
        (root / name).mkdir()
    for k, (name, image) in enumerate(photo_crops(soak_scale.samples)):
        if k % 10 == 0:
            image.save(root / name / f"{k:06d}.png")
        else:
            image.save(root / name / f"{k:06d}.jpg", quality=90)
    return root


@dataclass(frozen=True)
class Converted:
    root: Path
    expected: list[Fingerprint]  # sample i as a direct ``ds[i]`` read gives it


@pytest.fixture(scope="module")
def soak_dataset(
    tmp_path_factory: pytest.TempPathFactory, soak_folder: Path, soak_scale: SoakScale
) -> Callable[[str], Converted]:
    """``soak_dataset(fmt)`` -> ``soak_folder`` converted to ``fmt``, once per module."""
    cache: dict[str, Converted] = {}

    def build(fmt: str) -> Converted:
        if fmt not in cache:
            dst = tmp_path_factory.mktemp(f"soak-{fmt}")
            options = ConvertOptions(
                format=fmt,
                encoding=ENCODINGS[fmt],
                shuffle=fmt == "wds",  # as streaming wants (WdsStream warns otherwise)
                resize=SIDE,
                center_crop=SIDE,
                shard_size=SHARD_SIZE,
            )
            convert_folder(soak_folder, dst, options, workers=2, overwrite=True, progress=False)
            direct = readers.open_dataset(dst)
            expected = [fingerprint(*direct[i]) for i in range(len(direct))]
            assert len(expected) == soak_scale.samples
            cache[fmt] = Converted(dst, expected)
        return cache[fmt]

    return build


# --- the test ----------------------------------------------------------------------------------
def describe(states: Sequence[ProcessState]) -> str:
    """``fds/fds fds, maps/maps maps, MiB/MiB MiB`` of one or more processes."""
    fds = "/".join(str(s.fds) for s in states)
    mappings = "/".join(str(s.mappings) for s in states)
    rss = "/".join(f"{s.rss / 2**20:.1f}" for s in states)
    return f"{fds} fds, {mappings} maps, {rss} MiB"


def summary(case: str, records: list[EpochRecord]) -> str:
    epochs = [
        f"epoch {n} {r.seconds:.2f} s, main {describe([r.main])}, "
        f"workers {describe([r.workers[w] for w in sorted(r.workers)])}"
        for n, r in enumerate(records, 1)
    ]
    return f"\nsoak {case}, {records[0].served} samples: " + " | ".join(epochs)


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "restarted"])
@pytest.mark.parametrize("reader", READERS)
def test_epochs_serve_each_sample_once_without_growing_fds_or_rss(
    soak_dataset: Callable[[str], Converted], soak_scale: SoakScale, reader: str, persistent: bool
) -> None:
    fmt = "wds" if reader == STREAM else reader
    converted = soak_dataset(fmt)
    if reader == STREAM:
        dataset: Dataset = readers.WdsStream(converted.root, shuffle_buffer=1000, seed=3)
        identify = look_up_in(converted.expected)
    else:
        dataset = IndexedDataset(readers.open_dataset(converted.root))
        identify = check_against(converted.expected)
    loader = DataLoader(
        dataset,
        batch_size=BATCH_SIZE,
        shuffle=reader != STREAM,
        num_workers=WORKERS,
        persistent_workers=persistent,
        multiprocessing_context="fork",
        collate_fn=collate_in_worker,
    )
    records = [run_epoch(loader, identify, epoch) for epoch in range(soak_scale.epochs)]
    del loader  # shuts persistent workers down
    mode = "persistent" if persistent else "restarted"
    print(summary(f"{reader} ({ENCODINGS[fmt]}, {mode} workers)", records))

    for n, record in enumerate(records, 1):
        assert record.served == soak_scale.samples, f"epoch {n}: {record.served} samples"
        first_ten = dict(list(record.miscounted.items())[:10])
        assert not record.miscounted, f"epoch {n}: index -> times served: {first_ten}"
        assert sorted(record.workers) == list(range(WORKERS)), f"epoch {n}: a worker idled"
    pids = {frozenset(s.pid for s in r.workers.values()) for r in records}
    assert len(pids) == (1 if persistent else len(records)), f"{mode} workers: pids {pids}"

    first, last = records[0], records[-1]
    pairs = [("main process", first.main, last.main)]
    pairs += [(f"worker {w}", first.workers[w], last.workers[w]) for w in range(WORKERS)]
    for who, before, after in pairs:
        change = f"{who}: {describe([before])} in epoch 1, {describe([after])} in the last"
        change += f" (fds new since epoch 1: {sorted(after.names - before.names)})"
        # no growth (a restarted worker is a new process: it may map a page or two less)
        assert after.fds <= before.fds and after.mappings <= before.mappings, change
        # as many handles per shard file as in epoch 1 (hdf5 keeps two: h5py's and a map's)
        per_file = after.shard_fds * before.shard_files == before.shard_fds * after.shard_files
        handles = (
            f"{before.shard_fds}/{before.shard_files}, then {after.shard_fds}/{after.shard_files}"
        )
        assert per_file, f"{change}: shard handles/files {handles}"
        assert after.rss - before.rss < RSS_SLACK, change
