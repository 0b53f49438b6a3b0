"""Worker safety: DataLoader workers (fork and spawn), pickling, per-process shard handles,
and the streaming WebDataset reader.

Every check compares a multiset of per-sample checksums (label, shape, pixel digest) with
what ``ds[i]`` gives for every ``i``: each sample must be seen exactly once per epoch.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import resource
import warnings
from collections import Counter
from collections.abc import Iterable
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import readers
from readers import spec
from readers.batch import prefault
from readers.formats import open_local_shard
from tests.spawning import spawn_context

pytestmark = pytest.mark.filterwarnings(
    # only raised on machines with fewer than 2 usable CPUs; not what these tests check
    "ignore:This DataLoader will create:UserWarning"
)

NUM_IMAGES = 32
SHARD_SIZE = 7  # 5 shards: 7, 7, 7, 7, 4
FORMATS = [pytest.param(fmt, id=fmt) for fmt in spec.FORMATS]
CASES = ("raw-fixed", "jpeg")


def crop32(image: torch.Tensor) -> torch.Tensor:
    """Gives JPEG samples (whose shapes vary) one shape, so batches stack."""
    return image[:, :32, :32]


def transform_for(case: str) -> Any:
    return crop32 if case == "jpeg" else None


def counting_opener(log: str, manifest: readers.Manifest, index: int) -> Any:
    """A shard opener (``opener=``) that logs ``"<pid> <shard>"`` to ``log`` on every open;
    a ``partial`` of it pickles into spawned workers."""
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()} {index}\n")
    return open_local_shard(manifest, index)


def counting_dataset(root: Path, case: str, log: Path) -> readers.ImageDataset:
    opener = functools.partial(counting_opener, str(log))
    return readers.open_dataset(root, transform=transform_for(case), opener=opener)


def read_opens(log: Path) -> list[tuple[int, int]]:
    if not log.exists():
        return []
    lines = log.read_text(encoding="utf-8").split()
    return [(int(pid), int(shard)) for pid, shard in zip(lines[::2], lines[1::2], strict=True)]


def checksum(image: torch.Tensor, label: int) -> tuple[int, tuple[int, ...], str]:
    digest = hashlib.sha1(image.contiguous().numpy().tobytes()).hexdigest()
    return int(label), tuple(image.shape), digest


def dataset_checksums(ds: Any) -> Counter:
    return Counter(checksum(*ds[i]) for i in range(len(ds)))


def expected_checksums(root: Path, case: str) -> Counter:
    """From a throwaway instance, closed again before the caller opens its own."""
    ds = readers.open_dataset(root, transform=transform_for(case))
    counts = dataset_checksums(ds)
    del ds
    return counts


def batch_checksums(batches: Iterable[Any]) -> Counter:
    seen: Counter = Counter()
    for images, labels in batches:
        assert isinstance(images, torch.Tensor) and images.dtype == torch.uint8
        assert images.ndim == 4 and images.shape[1] == 3
        assert len(images) == len(labels) <= 5
        seen.update(checksum(image, label) for image, label in zip(images, labels, strict=True))
    return seen


def make_loader(
    ds: Any, workers: int, context: str | BaseContext | None, **kwargs: Any
) -> DataLoader:
    return DataLoader(
        ds,
        batch_size=5,
        shuffle=True,
        num_workers=workers,
        multiprocessing_context=context if workers else None,
        collate_fn=readers.collate,
        **kwargs,
    )


# --- map-style datasets in DataLoader workers ------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2], ids=["main", "fork2"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_dataloader_yields_every_sample_once_per_epoch(
    converted, fmt: str, case: str, workers: int
) -> None:
    root = converted(fmt, case, shard_size=SHARD_SIZE)
    expected = expected_checksums(root, case)
    assert sum(expected.values()) == NUM_IMAGES
    ds = readers.open_dataset(root, transform=transform_for(case))
    loader = make_loader(ds, workers, "fork")
    for _ in range(2):
        assert batch_checksums(loader) == expected


@pytest.mark.parametrize("fmt", FORMATS)
def test_fork_workers_read_while_another_dataset_in_the_parent_holds_the_files(
    converted, fmt: str
) -> None:
    # A validation view, a probe or a copy of the dataset keeps the shards open in the
    # parent; forked workers of a second dataset on the same files must still open them.
    root = converted(fmt, "jpeg", shard_size=SHARD_SIZE)
    expected = expected_checksums(root, "jpeg")
    probe = readers.open_dataset(root, transform=crop32)
    probe[0], probe[len(probe) - 1]
    train = readers.open_dataset(root, transform=crop32)
    assert batch_checksums(make_loader(train, 2, "fork")) == expected
    assert dataset_checksums(probe) == expected


# spawn workers take seconds to start on 2 cores: one case per format, and this one test
# checks both what they yield and how often they open shards
SPAWN_CASES = [
    pytest.param("pt", "raw-fixed", id="pt-raw-fixed"),
    pytest.param("hdf5", "jpeg", id="hdf5-jpeg"),
    pytest.param("lmdb", "raw-fixed", id="lmdb-raw-fixed"),
    pytest.param("wds", "jpeg", id="wds-jpeg"),
]


@pytest.mark.parametrize(("fmt", "case"), SPAWN_CASES)
def test_spawn_workers_yield_every_sample_and_open_each_shard_once(
    converted, tmp_path: Path, fmt: str, case: str
) -> None:
    root = converted(fmt, case, shard_size=SHARD_SIZE)
    expected = expected_checksums(root, case)
    log = tmp_path / "opens.log"
    ds = counting_dataset(root, case, log)
    loader = make_loader(ds, 2, spawn_context(), persistent_workers=True)
    try:
        for _ in range(2):
            assert batch_checksums(loader) == expected
    finally:
        del loader  # shut the persistent workers down
    opens = read_opens(log)
    pids = {pid for pid, _ in opens}
    assert os.getpid() not in pids, "the parent opened shards it never read"
    assert len(pids) == 2, "both workers should have read (and opened) shards"
    twice = [k for k, n in Counter(opens).items() if n > 1]
    assert not twice, f"(pid, shard) opened more than once across epochs: {twice}"
    assert {shard for _, shard in opens} == set(range(len(ds.manifest.shards)))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_fork_workers_after_parent_use_reopen_and_read_correctly(
    converted, tmp_path: Path, fmt: str, case: str
) -> None:
    root = converted(fmt, case, shard_size=SHARD_SIZE)
    log = tmp_path / "opens.log"
    ds = counting_dataset(root, case, log)
    n_shards = len(ds.manifest.shards)
    # use it in the parent first: every shard open, and (JPEG) the decode thread pool up
    expected = dataset_checksums(ds)
    ds.__getitems__(list(range(0, NUM_IMAGES, 3)))
    parent = os.getpid()
    assert sorted(read_opens(log)) == [(parent, k) for k in range(n_shards)]

    loader = make_loader(ds, 2, "fork")
    for _ in range(2):  # fresh workers each epoch
        assert batch_checksums(loader) == expected

    opens = read_opens(log)
    in_parent = [shard for pid, shard in opens if pid == parent]
    in_workers = [(pid, shard) for pid, shard in opens if pid != parent]
    assert sorted(in_parent) == list(range(n_shards)), "the parent reopened a shard"
    assert len({pid for pid, _ in in_workers}) >= 2, "workers reused the parent's handles"
    twice = [k for k, n in Counter(in_workers).items() if n > 1]
    assert not twice, f"a worker opened a shard twice: {twice}"
    # the parent's own handles still work after the workers are gone
    assert dataset_checksums(ds) == expected


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_pickle_after_use_carries_no_handle(converted, fmt: str, case: str) -> None:
    root = converted(fmt, case, shard_size=SHARD_SIZE)
    ds = readers.open_dataset(root, transform=transform_for(case))
    expected = [checksum(*ds[i]) for i in range(len(ds))]
    batch = ds.__getitems__([0, 9, 30, 9])  # JPEG: starts the decode thread pool
    assert [checksum(*item) for item in batch] == [expected[i] for i in (0, 9, 30, 9)]
    assert ds.source_path(8)
    assert len(ds._shards) == len(ds.manifest.shards)  # the handles really are open

    data = pickle.dumps(ds)  # must not fail on any handle, mmap or thread pool
    assert len(data) < 64 * 1024, "pixel data or a shard went into the pickle"
    paths = [ds.source_path(i) for i in range(len(ds))]
    del ds, batch  # LMDB refuses a second live handle to one file in a process

    copy = pickle.loads(data)
    assert type(copy) is readers.DATASETS[fmt]
    assert copy._shards == {}
    assert copy._pool._pool is None  # no threads came along
    assert [checksum(*copy[i]) for i in range(len(copy))] == expected
    assert [copy.source_path(i) for i in range(len(copy))] == paths
    batch = copy.__getitems__([31, 0, 14, 14])
    assert [checksum(*item) for item in batch] == [expected[i] for i in (31, 0, 14, 14)]


# --- the streaming reader --------------------------------------------------------------------
@pytest.fixture(scope="module")
def wds_root(converted) -> Path:
    """Converted with --shuffle, as streaming wants (stored order mixes the classes)."""
    root = converted("wds", "raw-fixed", shard_size=4, shuffle=True, seed=1)
    assert len(readers.load_manifest(root).shards) == 8
    return root


def stream_checksums(stream: Any, **loader_kwargs: Any) -> list[tuple[int, tuple[int, ...], str]]:
    loader = DataLoader(stream, batch_size=None, **loader_kwargs)
    return [checksum(image, label) for image, label in loader]


def stored_order(root: Path) -> list[tuple[int, tuple[int, ...], str]]:
    ds = readers.WdsDataset(root)
    return [checksum(*ds[i]) for i in range(len(ds))]


@pytest.mark.parametrize("workers", [0, 2], ids=["main", "fork2"])
def test_wds_stream_yields_every_sample_once_per_epoch(wds_root: Path, workers: int) -> None:
    expected = Counter(stored_order(wds_root))
    stream = readers.WdsStream(wds_root, shuffle_buffer=16, seed=5)
    assert len(stream) == NUM_IMAGES
    assert stream.classes == readers.WdsDataset(wds_root).classes
    context = "fork" if workers else None
    for epoch in range(2):
        stream.set_epoch(epoch)
        seen = stream_checksums(stream, num_workers=workers, multiprocessing_context=context)
        assert Counter(seen) == expected
    # batched through readers.collate as well
    loader = DataLoader(
        stream,
        batch_size=5,
        num_workers=workers,
        multiprocessing_context=context,
        collate_fn=readers.collate,
    )
    assert batch_checksums(loader) == expected


def test_wds_stream_without_shuffle_reads_in_stored_order(converted) -> None:
    root = converted("wds", "raw-fixed", shard_size=4)
    expected = stored_order(root)
    stream = readers.WdsStream(root, shuffle_buffer=0)  # no warning: nothing to shuffle
    assert stream_checksums(stream, num_workers=0) == expected
    # labels are ImageFolder's: 8 of each class, in class order
    assert [label for label, _, _ in expected] == [c for c in range(4) for _ in range(8)]


def test_wds_stream_warns_once_when_the_dataset_was_converted_without_shuffle(converted):
    root = converted("wds", "raw-fixed", shard_size=4)
    with pytest.warns(UserWarning, match=r"converted without --shuffle.*--shuffle"):
        readers.WdsStream(root, shuffle_buffer=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        readers.WdsStream(root, shuffle_buffer=16)  # once per dataset and process


def test_wds_stream_set_epoch_changes_the_order(wds_root: Path) -> None:
    stream = readers.WdsStream(wds_root, shuffle_buffer=100, seed=1)
    first = stream_checksums(stream)
    assert stream_checksums(stream) == first, "same seed and epoch: same order"
    assert first != stored_order(wds_root)
    stream.set_epoch(1)
    second = stream_checksums(stream)
    assert second != first
    assert Counter(second) == Counter(first)
    assert stream_checksums(readers.WdsStream(wds_root, shuffle_buffer=100, seed=1)) == first


def test_prefaulted_shared_batches_are_written_without_a_fault_per_page() -> None:
    # what new_batch does inside a worker: the batch's fresh shared-memory pages mapped in
    # one madvise call, not one page fault per 4 KiB as the decode first writes them
    size = 8 << 20
    pages = size // 4096
    faults = []
    for populate in (False, True):
        storage = torch.UntypedStorage._new_shared(size)
        if populate and not prefault(storage.data_ptr(), storage.nbytes()):
            pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.empty(0, dtype=torch.uint8).set_(storage, 0, (size,)).fill_(7)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    assert faults[0] >= 0.9 * pages and faults[1] <= 0.05 * pages, faults
