"""``readers.make_loader({name: path, ...})``: a mixture through the one entry point, with
fields following ``sources``, under torchdata's ``StatefulDataLoader``, with persistent
workers across epochs, and with a source in object storage (the loopback S3 server).

The order itself (exact shares, no repeat inside a source, schedules, resume on another
world size) is tests/test_mixtures.py's."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import readers
from readers.mixture_dataset import make_mixture_loader, mixture_collate
from tests.conftest import SAMPLE_DATA
from tests.test_fields_sources import CAPTIONS, convert, img2dataset_shards
from tests.test_object_storage import BUCKET, s3_server  # noqa: F401 (the fixture)
from tests.test_reader_faults import flip_middle_byte_of_sample

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    # torchdata's import calls a deprecated torch function
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

RAW = {"encoding": "raw", "resize": 32, "center_crop": 32}  # one shape: batches stack


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two sources of the 6 captioned img2dataset samples (pt and lmdb) and one of
    sample_data without fields (hdf5), all 32x32 raw."""
    base = tmp_path_factory.mktemp("mixture-loader")
    tars = img2dataset_shards(base / "tars")
    made = {}
    for name, fmt in (("a", "pt"), ("b", "lmdb")):
        convert(tars, base / name, fmt, on_error="fail", shard_size=4, **RAW)
        made[name] = base / name
    convert(SAMPLE_DATA, base / "plain", "hdf5", on_error="fail", **RAW)
    made["plain"] = base / "plain"
    return made


def digest(image: Any) -> str:
    return hashlib.sha1(image.numpy().tobytes()).hexdigest()


def captions_by_image(path: Path | str, **kw: Any) -> dict[str, str]:
    """Each sample's caption, keyed by its pixels' digest (read straight from the dataset)."""
    ds = readers.open_dataset(path, fields=("txt",), **kw)
    return {digest(image): txt for image, _, txt in (ds[i] for i in range(len(ds)))}


def ids(batches: Any, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """(source name, image digest) of every sample of ``batches``, in order."""
    return [
        (names[k], digest(image))
        for images, _, srcs, *_ in batches
        for image, k in zip(images, srcs.tolist(), strict=True)
    ]


def test_make_loader_reads_a_mapping_as_a_mixture_with_its_fields(sources):
    args = dict(weights={"a": 2, "b": 1}, epoch_size=12, fields=("txt",), seed=3)
    loader = readers.make_loader({"a": sources["a"], "b": sources["b"]}, 3, num_workers=2, **args)
    assert isinstance(loader, readers.MixtureLoader) and loader.sources == ("a", "b")
    captions = {name: captions_by_image(sources[name]) for name in loader.sources}
    assert set(captions["a"].values()) == set(CAPTIONS)
    batches = list(loader)
    assert len(batches) == len(loader) == 4
    counts: Counter[str] = Counter()
    for images, labels, srcs, txt in batches:
        assert tuple(images.shape) == (3, 3, 32, 32) and len(labels) == len(txt) == 3
        for image, k, caption in zip(images, srcs.tolist(), txt, strict=True):
            name = loader.sources[k]
            assert captions[name][digest(image)] == caption  # the caption of that very image
            counts[name] += 1
    assert counts == {"a": 8, "b": 4}
    direct = make_mixture_loader({"a": sources["a"], "b": sources["b"]}, 3, **args)
    assert ids(batches, loader.sources) == ids(direct, direct.sources)


def test_a_field_a_source_lacks_and_single_dataset_options_are_refused(sources):
    with pytest.raises(ValueError, match=r"mixture sources without the field 'txt': plain"):
        readers.make_loader({"a": sources["a"], "plain": sources["plain"]}, 2, fields=["txt"])
    with pytest.raises(ValueError, match=r"indices=, stream= read one dataset"):
        readers.make_loader({"a": sources["a"]}, 2, indices=[0, 1], stream=True)
    with pytest.raises(ValueError, match=r"weights=, reweight= weigh a mixture: pass \{name"):
        readers.make_loader(sources["a"], 2, weights={"a": 1}, reweight=True)


def test_persistent_workers_read_each_epoch_in_its_own_order_with_exact_shares(sources):
    loader = readers.make_loader(
        {"a": sources["a"], "plain": sources["plain"]},
        4,
        weights={"a": 1, "plain": 3},
        epoch_size=16,
        num_workers=2,
        persistent_workers=True,
    )
    epochs = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        epochs.append(ids(loader, loader.sources))
        assert Counter(name for name, _ in epochs[-1]) == {"a": 4, "plain": 12}
    assert epochs[0] != epochs[1] != epochs[2]
    # a's share is 4 of its 6 samples: its draws carry over, so epoch 1 brings the 2 that
    # epoch 0 left out (and 2 of the next pass)
    first, second = ({d for name, d in e if name == "a"} for e in epochs[:2])
    assert len(first) == 4 and len(first | second) == 6


@pytest.mark.parametrize("workers", [0, 2], ids=["main", "fork2"])
def test_a_mixture_resumes_under_statefuldataloader(sources, workers):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    paths = {"a": sources["a"], "b": sources["b"], "plain": sources["plain"]}

    def make(**kw: Any) -> Any:
        mixed = readers.make_loader(paths, 3, epoch_size=18, seed=1, rank=1, world_size=2, **kw)
        return stateful.StatefulDataLoader(
            mixed.dataset,
            batch_size=3,
            sampler=mixed.source,
            num_workers=workers,
            collate_fn=mixture_collate,
            multiprocessing_context="fork" if workers else None,
        )

    names = ("a", "b", "plain")
    whole = ids(make(), names)
    assert len(whole) == 9  # rank 1's half of 18
    loader = make()
    first = ids([next(iter(loader))], names)
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert first + ids(resumed, names) == whole
    reweighed = make(weights={"a": 1, "b": 1, "plain": 1})
    reweighed.load_state_dict(state)
    with pytest.raises(ValueError, match=r"weights .* reweight=True"):
        next(iter(reweighed))


@pytest.mark.usefixtures("s3_server")
def test_a_source_in_object_storage_mixes_with_a_local_one(sources, tmp_path):
    url = f"s3://{BUCKET}/mixture/b-wds"
    tars = img2dataset_shards(tmp_path / "tars")
    convert(tars, url, "wds", on_error="fail", shard_size=4, **RAW)
    loader = readers.make_loader(
        {"a": sources["a"], "remote": url},
        4,
        weights={"a": 1, "remote": 1},
        epoch_size=12,
        fields=("txt",),
        num_workers=2,
        cache_dir=tmp_path / "cache",
    )
    remote = captions_by_image(url, cache_dir=tmp_path / "cache")
    got = [
        (loader.sources[k], digest(image), caption)
        for images, _, srcs, txt in loader
        for image, k, caption in zip(images, srcs.tolist(), txt, strict=True)
    ]
    from_remote = [(d, caption) for name, d, caption in got if name == "remote"]
    assert len(from_remote) == 6 and {d for d, _ in from_remote} == set(remote)  # each once
    assert all(remote[d] == caption for d, caption in from_remote)


def test_a_damaged_sample_is_named_by_its_own_source_in_a_cropped_batch(sources, tmp_path):
    tars = img2dataset_shards(tmp_path / "tars")
    convert(tars, tmp_path / "jpeg", "pt", on_error="fail", encoding="jpeg", resize=32)
    flip_middle_byte_of_sample(tmp_path / "jpeg", 2)
    loader = readers.make_loader(
        {"a": sources["a"], "bad": tmp_path / "jpeg"},
        12,
        crop=readers.CenterCrop(16),
        weights={"a": 1, "bad": 1},
        epoch_size=12,  # bad's share is its 6 samples: all read in the one batch
    )
    shard = readers.load_manifest(tmp_path / "jpeg").shard_path(0)
    with pytest.raises(readers.DatasetError, match=rf"{shard.name}\[2\]"):
        list(loader)
