"""make_loader over a dataset already opened (or a ``Subset`` of one) applies its read
options, ``crop=``, ``transform=``, ``decode_threads=`` and ``decode=``, as it does for a
path, and refuses in one ``ValueError`` naming the option what it cannot apply: one the
dataset already has otherwise, or ``decode_threads`` for a stream."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import Subset

import readers

pytestmark = pytest.mark.filterwarnings("ignore:.* was converted without --shuffle:UserWarning")
SIDE = 16


class Shift:
    """``int16(image) + 1``, counting its calls (picklable)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return image.to(torch.int16) + 1


@pytest.fixture(scope="module")
def root(converted) -> Path:
    """sample_data's photos as stored, in sizes that vary: no batch stacks uncropped."""
    return converted("wds", "original")


def expected(root: Path, indices: list[int]) -> list[torch.Tensor]:
    ds = readers.open_dataset(root, crop=readers.CenterCrop(SIDE), transform=Shift())
    return [ds[i][0] for i in indices]


@pytest.mark.parametrize("how", ["dataset", "Subset", "stream"])
def test_make_loader_applies_crop_transform_and_threads_to_an_opened_dataset(root, how):
    ds = readers.open_dataset(root)
    indices = list(range(len(ds)))
    target = Subset(ds, indices[::2]) if how == "Subset" else ds
    if how == "Subset":
        indices = indices[::2]
    shift = Shift()
    options = {"crop": readers.CenterCrop(SIDE), "transform": shift, "decode_threads": 1}
    if how != "stream":
        options["decode_threads"] = 2
    loader = readers.make_loader(target, 4, shuffle=False, stream=how == "stream", **options)
    images = [image for batch, _ in loader for image in batch]
    assert all(image.shape == (3, SIDE, SIDE) and image.dtype == torch.int16 for image in images)
    assert shift.calls == len(indices)
    want = expected(root, indices)
    if how == "stream":  # stored order, not the map-style one: compare as sets
        digest = lambda image: image.numpy().tobytes()  # noqa: E731
        assert sorted(map(digest, images)) == sorted(map(digest, want))
    else:
        assert all(torch.equal(a, b) for a, b in zip(images, want, strict=True))
        assert loader.dataset.decode_threads == 2
    assert ds.crop is None and ds.transform is None  # the dataset passed is left alone


def test_a_dataset_keeps_its_own_options_under_make_loader(root):
    ds = readers.open_dataset(root, crop=readers.CenterCrop(SIDE), transform=Shift())
    for stream in (False, True):
        loader = readers.make_loader(ds, 4, shuffle=False, stream=stream)
        shapes = {tuple(batch.shape[1:]) for batch, _ in loader}
        assert shapes == {(3, SIDE, SIDE)}


def test_decode_false_applies_to_an_opened_dataset(root):
    ds = readers.open_dataset(root)
    images, _ = next(iter(readers.make_loader(ds, 3, shuffle=False, decode=False)))
    assert [bytes(image.numpy()) for image in images] == [bytes(ds.stored(i)) for i in range(3)]


def test_make_loader_names_an_option_it_cannot_apply(root):
    cropped = readers.open_dataset(root, crop=readers.CenterCrop(SIDE), decode_threads=2)
    with pytest.raises(ValueError, match=r"make_loader\(crop=CenterCrop\) .* another crop="):
        readers.make_loader(cropped, 4, crop=readers.CenterCrop(SIDE + 8))
    with pytest.raises(ValueError, match=r"make_loader\(decode_threads=3\) .* \(2\)"):
        readers.make_loader(Subset(cropped, [0, 1]), 4, decode_threads=3)
    readers.make_loader(cropped, 4, crop=cropped.crop, decode_threads=2)  # the same: fine
    with pytest.raises(ValueError, match="need decoded images"):
        readers.make_loader(cropped, 4, decode=False)
    with pytest.raises(ValueError, match=r"decode_threads=4: stream=True decodes on one"):
        readers.make_loader(root, 4, stream=True, decode_threads=4)
