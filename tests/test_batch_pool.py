"""Reused batch buffers (``readers.batch_pool``): real DataLoader workers and the training
process, batches compared byte for byte with a loader whose buffers are all fresh, and held
batches never overwritten however they are kept, copied or passed on."""

from __future__ import annotations

import gc
import os
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import readers
from readers import batch_pool
from readers.batch import SampleBatch, collate
from readers.batch_pool import SLOTS, BatchPool
from tests.spawning import spawn_context

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

BATCH = 3
CROP = 176  # 279 KB batches: over batch_pool.MIN_PRIVATE, so in-process batches use slots too


@pytest.fixture(scope="module")
def root(converted) -> Path:
    return converted("pt", "jpeg")


def loader(root: Path, workers: int, **options: Any) -> readers.Loader:
    crop = readers.RandomResizedCrop(CROP, flip=True)
    return readers.make_loader(root, BATCH, num_workers=workers, seed=3, crop=crop, **options)


def pairs(batches: list[Any]) -> list[tuple[bytes, list[int]]]:
    return [(images.contiguous().numpy().tobytes(), labels.tolist()) for images, labels in batches]


@pytest.fixture(scope="module")
def expected(root: Path) -> list[tuple[bytes, list[int]]]:
    """Epoch 0 read in-process, each batch copied before the next is built: what every
    epoch 0 must equal however its batches are kept."""
    return pairs([(images.clone(), labels) for images, labels in loader(root, 0)])


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_kept_by_the_loop_are_never_overwritten(root: Path, expected, workers) -> None:
    """``list(loader)`` keeps every batch: more than the slots, so the rest are allocated
    the usual way, and no slot is reused while a batch in it is alive."""
    batches = list(loader(root, workers))
    assert len(batches) > 2 * SLOTS
    assert pairs(batches) == expected


def test_in_process_batches_reuse_private_slots(root: Path, expected) -> None:
    seen, addresses = [], set()
    for images, labels in loader(root, 0):
        if len(images) == BATCH:  # not the smaller last batch, which is under MIN_PRIVATE
            addresses.add(images.untyped_storage().data_ptr())
        seen.append((images.contiguous().numpy().tobytes(), labels.tolist()))
        del images, labels
    assert seen == expected
    assert len(addresses) <= 3  # the batch in use, the one begun ahead, the one being begun
    pools = batch_pool._pools[os.getpid()]
    assert pools and not any(pool.shared for pool in pools)


def mapped_since(before: set[str]) -> set[str]:
    """The worker pools mapped here now that were not in ``before`` (other tests' workers may
    still be mapped, or end meanwhile)."""
    batch_pool.release_ended_pools()
    return set(batch_pool._mapped) - before


def test_a_loop_that_drops_its_batches_reuses_the_same_slots(root: Path, expected) -> None:
    seen, addresses, before = [], set(), set(batch_pool._mapped)
    persistent = loader(root, 2, persistent_workers=True)
    for images, labels in persistent:
        addresses.add(images.untyped_storage().data_ptr())
        seen.append((images.contiguous().numpy().tobytes(), labels.tolist()))
        del images, labels
    assert seen == expected
    assert len(addresses) <= 2 * SLOTS < len(seen)
    assert len(mapped_since(before)) == 2  # persistent workers: still mapped


def test_the_pools_of_ended_workers_are_unmapped(root: Path) -> None:
    before = set(batch_pool._mapped)
    kept = next(iter(loader(root, 1)))  # the worker ends with the abandoned iterator
    gc.collect()
    assert len(mapped_since(before)) == 1  # its worker has ended, but a batch is in use here
    del kept
    gc.collect()
    assert mapped_since(before) == set()


def unpacked(batch: SampleBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """A collate_fn around imgpack's that builds a new tuple: torch pickles the images."""
    images, labels = collate(batch)
    return images, labels


def images_only(batch: SampleBatch) -> tuple[torch.Tensor, torch.Tensor]:
    return batch.images, batch.labels


@pytest.mark.parametrize("collate_fn", [unpacked, images_only], ids=["wrapped", "own"])
def test_other_collate_functions_get_copies_and_the_slots_come_back(
    root: Path, expected, collate_fn
) -> None:
    """A slot tensor pickled by torch's own reducer moves into a fresh segment (torch
    copies storage that is not its own shared memory), which frees the slot in the worker."""
    batches = list(loader(root, 2, collate_fn=collate_fn))
    assert pairs(batches) == expected


def test_batches_shared_onwards_move_out_of_their_slot(root: Path, expected) -> None:
    """``share_memory_()`` (what sending a batch to another process does) moves it into a
    fresh segment and gives its slot back, so the workers reuse slots under it."""
    batches = []
    for images, labels in loader(root, 2):
        images.share_memory_()
        assert images.is_shared()
        batches.append((images, labels))
    assert pairs(batches) == expected


def test_spawned_workers_receive_the_same_batches(root: Path, expected) -> None:
    batches = [(i.clone(), j) for i, j in loader(root, 2, multiprocessing_context=spawn_context())]
    assert pairs(batches) == expected


def test_views_and_arrays_of_a_batch_keep_its_slot_taken() -> None:
    """In one process: the slot is free again only once every view of the images is gone."""
    pool = BatchPool(4096 * 3, shared=True)
    flat = pool.take(100)
    images = flat.view(10, 10)
    images[:] = 5
    handed = pool.hand_over(images, torch.arange(10))
    assert handed is not None and handed[0] is images
    received, labels = ForkingPickler.loads(ForkingPickler.dumps(handed))
    del handed, flat, images
    gc.collect()
    assert pool.header[0] == 1  # handed over: the worker's copy going does not free it
    assert received.sum() == 500 and labels.tolist() == list(range(10))
    row, array = received[3], received.numpy()
    del received
    gc.collect()
    assert pool.header[0] == 1
    del row
    gc.collect()
    assert pool.header[0] == 1
    del array
    gc.collect()
    assert pool.header[0] == 0


def test_all_slots_taken_or_too_large_means_no_slot() -> None:
    pool = BatchPool(1000, shared=True)
    assert pool.take(pool.slot_bytes + 1) is None
    taken = [pool.take(1000) for _ in range(SLOTS)]
    assert all(t is not None for t in taken) and pool.take(1000) is None
    addresses = {t.data_ptr() for t in taken}
    assert len(addresses) == SLOTS
    del taken[1]
    gc.collect()
    again = pool.take(1000)
    assert again is not None and again.data_ptr() in addresses  # not handed: free at once


def test_a_late_finaliser_does_not_free_a_slot_taken_again() -> None:
    pool = BatchPool(1000, shared=True)
    first = pool.take(1000)
    generation = pool._generations[0]
    del first
    gc.collect()
    second = pool.take(1000)
    assert second is not None
    pool._dropped(0, generation)  # the first tensor's finaliser, had it run this late
    assert pool.header[0] == 1
    assert pool.take(1000).data_ptr() != second.data_ptr()


def test_batches_of_other_dtypes_keep_their_layout() -> None:
    pool = BatchPool(4096, shared=True)
    flat = pool.take(4 * 60).view(torch.float32)
    images = flat.view(3, 4, 5).permute(0, 2, 1)
    images.copy_(torch.arange(60, dtype=torch.float32).view(3, 5, 4))
    received, _ = ForkingPickler.loads(ForkingPickler.dumps(pool.hand_over(images, torch.zeros(3))))
    assert received.dtype == torch.float32 and received.stride() == images.stride()
    assert torch.equal(received, images)


def test_in_process_batches_are_handed_over_as_they_are(root: Path) -> None:
    images, _ = next(iter(loader(root, 0)))
    batch = collate(SampleBatch(images, torch.zeros(BATCH)))
    assert type(batch) is tuple and batch[0] is images


def test_a_plain_dataloader_with_imgpack_collate_uses_the_pool(root: Path) -> None:
    dataset = readers.open_dataset(root, crop=readers.CenterCrop(32))
    want = [np.asarray(dataset[i][0]) for i in range(len(dataset))]
    got = []
    for images, _ in DataLoader(dataset, batch_size=BATCH, num_workers=2, collate_fn=collate):
        got.extend(image.numpy() for image in images)
    assert len(got) == len(want)
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
