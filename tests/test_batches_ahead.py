"""Batches read ahead in the training process (:mod:`readers.batches_ahead`): a loader with
``num_workers=0`` begins each batch one batch early, and what it serves is exactly what
reading each batch at its turn serves: the same images and labels in the same order, a
damaged sample's error at its own batch and no earlier, nothing under way across a fork,
and a dataset asked for other batches than were announced still right.

Bucketed batches too, over one dataset and over a mixture, centred or jittered and
flipped, with the kernel and on the Python path: each begun with its own bucket's crop.
The Python path is where a shared "selected bucket" would show: it draws the boxes of a
sample it cannot size from its markers (the PNGs here) when the batch is finished, after
the next batch was begun. Their sources are tests/test_bucket_mixtures.py's: "a" original
JPEG and PNG photos of varied aspect (pt), "b" re-encoded JPEGs (lmdb), a label naming a
sample."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import readers
from convert import ConvertOptions, convert_folder
from readers.epochs.buckets import AspectBuckets
from readers.images import kernel
from tests.conftest import SAMPLE_DATA
from tests.photos import captioned_photos

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


def damaged_copy(root: Path, tmp_path: Path, index: int) -> tuple[Path, int]:
    """A copy of the dataset ``root`` with sample ``index``'s stored bytes damaged, and
    the sample's index in its shard (as the error names it)."""
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    ds = readers.open_dataset(copy)
    shard, local = ds.locate(index)
    value = bytes(ds.shard(shard).read(local))
    path = readers.load_manifest(copy).shard_path(shard)
    content = bytearray(path.read_bytes())
    content[content.find(value) + len(value) // 2] ^= 0xFF
    path.write_bytes(content)
    return copy, local


def test_a_damaged_sample_fails_its_own_batch_not_the_one_before(
    stored_at_size: Path, tmp_path: Path
) -> None:
    root, local = damaged_copy(stored_at_size, tmp_path, BATCH + 1)  # in the second batch
    loader = readers.make_loader(root, BATCH, shuffle=False, num_workers=0)
    batches = iter(loader)
    first, _ = next(batches)  # the second batch was begun (and failed) meanwhile
    assert len(first) == BATCH
    with pytest.raises(readers.DatasetError, match=rf"\[{local}\]: stored bytes fail their CRC"):
        next(batches)


def forked_mid_epoch(loader: readers.Loader, read: Callable[[Any], bool]) -> Any:
    """Fork with ``loader`` left mid-epoch, a batch begun: the child must find what it
    inherited settled and ``read(dataset)`` on its own; the parent's dataset is settled
    too (before the fork), and returned."""
    batches = iter(loader)
    next(batches)
    ds = loader.dataset
    assert len(ds._ahead) == 1
    pid = os.fork()
    if pid == 0:  # the child: leaves with its verdict, whatever happens
        ok = False
        try:
            ok = len(ds._ahead) == 0 and read(ds)
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(ds._ahead) == 0
    return ds


def test_nothing_is_under_way_across_a_fork(stored_at_size: Path) -> None:
    loader = readers.make_loader(stored_at_size, BATCH, shuffle=False, num_workers=0)
    ds = forked_mid_epoch(loader, lambda ds: len(ds.__getitems__([0, 1]).images) == 2)
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


# --- bucketed batches ---------------------------------------------------------------
SIZES = AspectBuckets.around(area=64 * 64, step=8, max_ratio=2.0).sizes
BUCKETS = {
    "centred": AspectBuckets(SIZES),
    "jitter": AspectBuckets(SIZES, jitter=True, flip=True),
}


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    sources = (("a", "pt", "original", 37, 3), ("b", "lmdb", "jpeg", 23, 100))
    for name, fmt, encoding, n, seed in sources:
        src = captioned_photos(tmp_path_factory.mktemp(f"src-{name}"), name, n, seed)
        dst = tmp_path_factory.mktemp(name)
        options = ConvertOptions(format=fmt, encoding=encoding, shard_size=10)
        convert_folder(src, dst, options, workers=1, overwrite=True, progress=False)
        out[name] = dst
    return out


@pytest.fixture(params=["kernel", "python"])
def crop_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The crops by the compiled kernel (where built), or all on the Python path."""
    if request.param == "python":
        monkeypatch.setenv(kernel.KERNEL_ENV, "0")
    kernel.crop_kernel.cache_clear()
    yield request.param
    kernel.crop_kernel.cache_clear()


def bucket_loader(
    paths: dict[str, Path], source: str, buckets: AspectBuckets, **kw: Any
) -> readers.BucketLoader:
    """A bucket loader over source "a" alone, or over the mixture of "a" and "b"."""
    if source == "one":
        return readers.make_loader(paths["a"], BATCH, buckets=buckets, seed=5, **kw)
    mixed = {"weights": {"a": 2, "b": 1}, "epoch_size": 30}
    return readers.make_loader(paths, BATCH, buckets=buckets, seed=5, **mixed, **kw)


def as_tuple(batch: Any) -> tuple[torch.Tensor, ...]:
    """A served batch's images, labels (and sources), cloned out of the batch buffers."""
    parts = (batch.images, batch.labels, getattr(batch, "sources", batch.labels))
    return tuple(part.clone() for part in parts)


@pytest.mark.parametrize("buckets", BUCKETS)
@pytest.mark.parametrize("source", ["one", "mixture"])
def test_bucketed_batches_read_ahead_equal_those_read_at_their_turn(
    paths: dict[str, Path], source: str, buckets: str, crop_path: str
) -> None:
    loader = bucket_loader(paths, source, BUCKETS[buckets], num_workers=0)
    reference = bucket_loader(paths, source, BUCKETS[buckets], num_workers=0)
    for epoch in range(2):
        reference.source.set_epoch(epoch)
        keys = list(reference.source)  # its sampler alone: nothing announced
        want = [as_tuple(reference.dataset[key]) for key in keys]
        shapes = [images.shape[2:] for images, _, _ in want]
        assert len(set(shapes)) > 1  # batches of several buckets, one after another
        got = []
        for images, labels, *rest in loader:
            got.append((images.clone(), labels.clone(), (rest[0] if rest else labels).clone()))
            if len(got) == 1:
                assert len(loader.dataset._ahead) == 1  # the second batch, begun with the first
        assert len(got) == len(want) == len(keys)
        for k, (batch, expected) in enumerate(zip(got, want, strict=True)):
            for part, wanted in zip(batch, expected, strict=True):
                assert torch.equal(part, wanted), (epoch, k, keys[k])
        assert loader.epoch == epoch + 1
    crop = loader.dataset.crop
    assert (crop.bucket, crop.epoch) == (0, 0)  # each batch had its own crop, this one none


@pytest.mark.parametrize("source", ["one", "mixture"])
def test_a_damaged_sample_fails_its_own_bucketed_batch_not_the_one_before(
    paths: dict[str, Path], tmp_path: Path, source: str
) -> None:
    reference = bucket_loader(paths, source, BUCKETS["centred"], num_workers=0)
    keys = list(reference.source)
    members = [k[2] if source == "mixture" else reference.dataset.samples(*k)[1] for k in keys]
    length = len(readers.open_dataset(paths["a"]))  # "a" first: its indices are the mixture's
    turn, victim = next((t, int(i)) for t in range(1, len(keys)) for i in members[t] if i < length)
    copy, local = damaged_copy(paths["a"], tmp_path, victim)
    loader = bucket_loader({**paths, "a": copy}, source, BUCKETS["centred"], num_workers=0)
    batches = iter(loader)
    for _ in range(turn):  # the batches before it, each served as the next is begun
        next(batches)
    assert len(loader.dataset._ahead) == 1  # the damaged batch: begun (and failed) meanwhile
    with pytest.raises(readers.DatasetError, match=rf"\[{local}\]: stored bytes fail their CRC"):
        next(batches)


@pytest.mark.parametrize("source", ["one", "mixture"])
def test_no_bucketed_batch_is_under_way_across_a_fork(paths: dict[str, Path], source: str) -> None:
    loader = bucket_loader(paths, source, BUCKETS["jitter"], num_workers=0)
    keys = list(bucket_loader(paths, source, BUCKETS["jitter"], num_workers=0).source)
    forked_mid_epoch(loader, lambda ds: len(ds[keys[0]].labels) > 0)
    with_workers = bucket_loader(paths, source, BUCKETS["jitter"], num_workers=1)
    served = [labels.clone() for _, labels, *_ in with_workers]
    assert with_workers.source.read_ahead is None  # workers read their own batches
    assert len(served) == len(keys)
