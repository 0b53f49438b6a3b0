"""The :class:`readers.Loader` owns the epoch: it hands its state to the sampler or stream
(``EpochSource.reset``), and through the source's iteration to the dataset's random crops.

So a loader rebuilt from a saved state, with a crop object of its own, crops exactly as the
uninterrupted run did; a stream's persistent workers follow every state the loader hands
over; a sampler used by hand with a plain DataLoader crops as the loader does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import readers

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

TAKEN = 3  # batches read before the state is saved


@pytest.fixture(scope="module")
def jpegs(converted) -> dict[str, Path]:
    return {"map": converted("pt", "jpeg"), "stream": converted("wds", "jpeg", shuffle=True)}


def crop_loader(jpegs: dict[str, Path], how: str, workers: int, **kwargs: Any) -> readers.Loader:
    """A loader of random crops, each with its own crop object (its own epoch), in the stored
    order: what differs between epochs is the crops alone."""
    stream = how == "stream"
    kwargs.setdefault("shuffle", False)
    crop = readers.RandomResizedCrop(24, flip=True, seed=5)
    return readers.make_loader(
        jpegs[how], 4, stream=stream, crop=crop, num_workers=workers, **kwargs
    )


def images(batches: Any) -> list[torch.Tensor]:
    return [image.clone() for batch in batches for image in batch[0]]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def take(loader: readers.Loader, k: int) -> list[torch.Tensor]:
    out = []
    for batch in loader:
        out.extend(image.clone() for image in batch[0])
        k -= 1
        if not k:
            break
    return out


@pytest.mark.parametrize(("how", "workers"), [("map", 0), ("map", 2), ("stream", 2)])
def test_random_crops_differ_between_epochs_and_repeat_after_load_state_dict(jpegs, how, workers):
    loader = crop_loader(jpegs, how, workers)
    first, second = images(loader), images(loader)
    assert len(first) == len(second) and not same(first, second)
    interrupted = crop_loader(jpegs, how, workers)
    interrupted.set_epoch(1)
    head = take(interrupted, TAKEN)
    state = interrupted.state_dict()
    resumed = crop_loader(jpegs, how, workers)  # a new crop object, still at epoch 0
    resumed.load_state_dict(state)
    assert same(head + images(resumed), second)
    onwards = crop_loader(jpegs, how, workers)
    onwards.set_epoch(2)
    assert resumed.epoch == 2 and same(images(resumed), images(onwards))


def test_persistent_stream_workers_reread_a_whole_epoch_after_a_resumed_one(jpegs):
    options = {"persistent_workers": True, "multiprocessing_context": "fork"}
    whole = crop_loader(jpegs, "stream", 2, **options)
    epochs = [images(whole) for _ in range(3)]
    interrupted = crop_loader(jpegs, "stream", 2, **options)
    interrupted.set_epoch(1)
    take(interrupted, TAKEN)
    loader = crop_loader(jpegs, "stream", 2, **options)
    loader.load_state_dict(interrupted.state_dict())
    assert same(images(loader), epochs[1][TAKEN * 4 :])
    assert same(images(loader), epochs[2])
    loader.set_epoch(1)  # the workers copied the state of the resumed epoch 1: not that one
    assert same(images(loader), epochs[1])


def test_a_sampler_used_by_hand_crops_as_the_loader_does(jpegs):
    crop = readers.RandomResizedCrop(24, flip=True, seed=5)
    ds = readers.open_dataset(jpegs["map"], crop=crop)
    sampler = readers.EpochSampler(ds, shuffle=False, batch_size=4)
    plain = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=readers.collate)
    loader = crop_loader(jpegs, "map", 0)
    by_loader = [images(loader) for _ in range(2)]
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert same(images(plain), by_loader[epoch])
    state = sampler.state_dict()  # the whole of epoch 1 is out: the start of epoch 2
    assert state["epoch"] == 2 and state["samples_consumed"] == 0
