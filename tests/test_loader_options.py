"""make_loader over a dataset already opened (or a ``Subset`` of one) applies its read
options, ``crop=``, ``transform=``, ``decode_threads=`` and ``decode=``, as it does for a
path, and refuses in one ``ValueError`` naming the option what it cannot apply: one the
dataset already has otherwise, or ``decode_threads`` for a stream. Storage options and a
cache folder beside a dataset or manifest opened already are taken when it holds them, else
refused by name."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from torch.utils.data import Subset

import readers
from readers.storage.location import Location

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


# --- storage options beside a dataset or manifest opened already: used or refused -------------


@pytest.mark.parametrize("how", ["dataset", "Subset", "stream", "mixture", "buckets"])
@pytest.mark.parametrize("given", ["storage_options", "cache_dir"])
def test_make_loader_refuses_storage_options_beside_an_opened_dataset(root, tmp_path, how, given):
    ds = readers.open_dataset(root)
    target: object = Subset(ds, [0, 1, 2]) if how == "Subset" else ds
    if how == "mixture":
        target = {"a": ds}
    options = {"storage_options": {"anon": True}, "cache_dir": tmp_path}
    kwargs = {"stream": how == "stream", given: options[given]}
    if how == "buckets":
        kwargs["buckets"] = readers.AspectBuckets([(16, 16), (16, 24)])
    if how == "mixture":
        kwargs["crop"] = readers.CenterCrop(SIDE)
    with pytest.raises(
        ValueError, match=rf"{ds.manifest.location}: {given}= .* readers.open_dataset"
    ):
        readers.make_loader(target, 4, **kwargs)


def test_options_a_dataset_holds_are_taken_beside_it(root):
    ds = readers.open_dataset(root, storage_options={})
    loader = readers.make_loader(ds, 4, shuffle=False, storage_options={})
    assert len(loader) == -(-len(ds) // 4)


def test_a_manifest_refuses_options_it_does_not_hold(root, tmp_path):
    manifest = readers.load_manifest(root)
    named = rf"{re.escape(str(root))}: storage_options= .* \(a local folder\)"
    with pytest.raises(ValueError, match=named):
        readers.WdsStream(manifest, storage_options={"anon": True})
    with pytest.raises(ValueError, match=r"cache_dir= .* readers.load_manifest"):
        readers.open_dataset(manifest, cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"storage_options="):
        readers.load_manifest(manifest.location, storage_options={"anon": True})


def test_a_remote_location_takes_its_own_options_and_refuses_others(root, tmp_path):
    url, held = "s3://bucket/data", {"endpoint_url": "http://127.0.0.1:1"}
    location = Location.of(url, storage_options=held, cache_dir=tmp_path, cache_limit="1GiB")
    location.check_options(storage_options=dict(held), cache_dir=tmp_path, cache_limit="1GiB")
    remote = dataclasses.replace(readers.load_manifest(root), location=location)
    readers.WdsStream(remote, storage_options=held)  # the same: used, as the manifest holds them
    with pytest.raises(ValueError, match=rf"{url}: storage_options= .* other options"):
        readers.WdsStream(remote, storage_options={"endpoint_url": "http://127.0.0.1:2"})
    for other in ({"cache_dir": tmp_path / "other"}, {"cache_limit": "2GiB"}):
        with pytest.raises(ValueError, match=f"{next(iter(other))}="):
            location.check_options(**other)
