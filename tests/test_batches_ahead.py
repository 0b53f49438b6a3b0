"""Batches read ahead in the training process (:mod:`readers.batches_ahead`): a loader with
``num_workers=0`` begins each batch one batch early, and what it serves is exactly what
reading each batch at its turn serves: the same images and labels in the same order, a
damaged sample's error at its own batch and no earlier, nothing under way across a fork,
and a dataset asked for other batches than were announced still right."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import readers
from convert import ConvertOptions, convert_folder
from tests.conftest import SAMPLE_DATA

BATCH = 4


@pytest.fixture(scope="module")
def stored_at_size(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sample_data as 32x32 JPEGs in pt shards of 10: the plain path, several shards."""
    dst = tmp_path_factory.mktemp("ahead") / "pt"
    options = ConvertOptions("pt", resize=40, center_crop=32, shard_size=10)
    convert_folder(SAMPLE_DATA, dst, options, workers=1, progress=False)
    return dst


def at_their_turn(
    root: Path, order: list[int], crop: readers.Crop | None = None, epoch: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each batch of ``order`` read by ``__getitems__`` when it is wanted, nothing ahead."""
    ds = readers.open_dataset(root, crop=crop)
    ds.set_epoch(epoch)
    batches = []
    for start in range(0, len(order), BATCH):
        batch = ds.__getitems__(order[start : start + BATCH])
        batches.append((batch.images.clone(), batch.labels.clone()))
    return batches


def sampler_order(loader: readers.Loader) -> list[int]:
    sampler = readers.EpochSampler(
        len(loader.dataset), shuffle=True, seed=3, batch_size=BATCH, rank=0, world_size=1
    )
    sampler.set_epoch(loader.epoch)
    return list(sampler)


CROPS = {
    "plain": lambda: None,
    "centre crop": lambda: readers.CenterCrop(24),
    "random crop": lambda: readers.RandomResizedCrop(24, flip=True),
}


@pytest.mark.parametrize("crop", CROPS)
def test_an_in_process_loader_serves_what_each_batch_read_at_its_turn_does(
    stored_at_size: Path, crop: str
) -> None:
    loader = readers.make_loader(stored_at_size, BATCH, seed=3, num_workers=0, crop=CROPS[crop]())
    for epoch in range(2):
        order = sampler_order(loader)
        expected = at_their_turn(stored_at_size, order, CROPS[crop](), epoch)
        got = [(images.clone(), labels.clone()) for images, labels in loader]
        assert len(got) == len(expected) == len(loader)
        for (images, labels), (want_images, want_labels) in zip(got, expected, strict=True):
            assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
        assert loader.epoch == epoch + 1


@pytest.mark.parametrize("crop", CROPS)
def test_the_next_batch_is_begun_while_one_is_served(stored_at_size: Path, crop: str) -> None:
    loader = readers.make_loader(stored_at_size, BATCH, num_workers=0, crop=CROPS[crop]())
    batches = iter(loader)
    next(batches)
    assert len(loader.dataset._ahead) == 1  # the second batch, begun with the first
    with_workers = readers.make_loader(stored_at_size, BATCH, num_workers=1)
    next(iter(with_workers))
    assert with_workers.source.read_ahead is None  # workers read their own batches


def test_a_damaged_sample_fails_its_own_batch_not_the_one_before(
    stored_at_size: Path, tmp_path: Path
) -> None:
    root = tmp_path / "copy"
    root.mkdir()
    for path in stored_at_size.iterdir():
        (root / path.name).write_bytes(path.read_bytes())
    loader = readers.make_loader(root, BATCH, shuffle=False, num_workers=0)
    victim = BATCH + 1  # in the second batch
    ds = readers.open_dataset(root)
    shard, local = ds.locate(victim)
    value = bytes(ds.shard(shard).read(local))
    path = readers.load_manifest(root).shard_path(shard)
    content = bytearray(path.read_bytes())
    start = content.find(value)
    content[start + len(value) // 2] ^= 0xFF
    path.write_bytes(content)
    batches = iter(loader)
    first, _ = next(batches)  # the second batch was begun (and failed) meanwhile
    assert len(first) == BATCH
    with pytest.raises(readers.DatasetError, match=rf"\[{local}\]: stored bytes fail their CRC"):
        next(batches)


def test_nothing_is_under_way_across_a_fork(stored_at_size: Path) -> None:
    loader = readers.make_loader(stored_at_size, BATCH, shuffle=False, num_workers=0)
    batches = iter(loader)
    next(batches)  # left mid-epoch with a batch begun
    ds = loader.dataset
    assert len(ds._ahead) == 1
    pid = os.fork()
    if pid == 0:  # the child: what it inherited is settled; it reads on its own
        status = 0 if len(ds._ahead) == 0 and len(ds.__getitems__([0, 1]).images) == 2 else 1
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(ds._ahead) == 0  # settled in the parent too, before the fork
    expected = at_their_turn(stored_at_size, list(range(len(ds))))
    workers = readers.make_loader(ds, BATCH, shuffle=False, num_workers=2)
    for (images, _), (want, _) in zip(workers, expected, strict=True):
        assert torch.equal(images, want)


def test_batches_asked_for_in_another_order_are_read_as_asked(stored_at_size: Path) -> None:
    ds = readers.open_dataset(stored_at_size)
    expected = at_their_turn(stored_at_size, [7, 3, 9, 0, 1, 2, 4, 5])
    ds.read_ahead([0, 1, 2, 4])
    ds.read_ahead([5, 6, 8, 9])
    asked = ds.__getitems__([7, 3, 9, 0])  # announced nothing like it: both settled
    assert len(ds._ahead) == 0
    assert torch.equal(asked.images, expected[0][0])
    assert torch.equal(asked.labels, expected[0][1])
    ds.read_ahead([1, 2, 4, 5])
    again = ds.__getitems__([1, 2, 4, 5])
    assert torch.equal(again.images, expected[1][0])


def test_a_mixture_loader_reads_ahead_and_serves_what_each_batch_read_at_its_turn_does(
    stored_at_size: Path,
) -> None:
    sources = {"a": stored_at_size, "b": stored_at_size}
    options = {"weights": {"a": 2, "b": 1}, "epoch_size": 30, "seed": 5, "num_workers": 0}
    crop = readers.RandomResizedCrop(24, flip=True)
    loader = readers.make_loader(sources, BATCH, crop=crop, **options)
    reference = readers.make_loader(
        sources, BATCH, crop=readers.RandomResizedCrop(24, flip=True), **options
    )
    for epoch in range(2):
        reference.source.set_epoch(epoch)
        order = list(reference.source)  # its sampler alone: nothing announced
        want = [
            reference.dataset.__getitems__(order[k : k + BATCH])
            for k in range(0, len(order), BATCH)
        ]
        got = []
        for images, labels, names in loader:
            got.append((images.clone(), labels.clone(), names.clone()))
            if len(got) == 1:
                assert len(loader.dataset._ahead) == 1  # the second batch begun
        assert len(got) == len(want)
        for (images, labels, names), batch in zip(got, want, strict=True):
            assert torch.equal(images, batch.images) and torch.equal(labels, batch.labels)
            assert torch.equal(names, batch.sources)
