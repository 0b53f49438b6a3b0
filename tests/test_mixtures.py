"""Weighted mixtures of datasets: exact shares every epoch, no repeat inside a source
before it is exhausted, stratified batches, a mid-epoch state resumed on another world size
and worker count, weights changed (refused, then recorded with reweight=True), a schedule
resumed across its step, and sources that cannot form one batch refused by name.

Sources are small datasets converted from sample_data (pt, hdf5, lmdb; raw and jpeg)."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import readers
from convert import ConvertOptions, convert_folder
from readers.epochs.mixture import Mixture, MixtureSource, largest_remainder, make_schedule
from readers.mixture_dataset import make_mixture_loader
from tests.conftest import ENCODING_CASES, SAMPLE_DATA

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

FIXED = ENCODING_CASES["raw-fixed"]  # 64x64 pixels
CROP = 64


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three sources of 32, 16 and 8 samples in three formats, all 64x64 raw, and one of
    JPEGs of varied sizes."""
    base = tmp_path_factory.mktemp("mixture-sources")

    def convert(name: str, classes: tuple[str, ...], fmt: str, case: dict[str, Any]) -> Path:
        src = base / f"src-{name}"
        src.mkdir()
        for cls in classes:
            (src / cls).symlink_to(SAMPLE_DATA / cls)
        dst = base / name
        options = ConvertOptions(format=fmt, **case)
        convert_folder(src, dst, options, workers=1, overwrite=True, progress=False)
        return dst

    return {
        "big": convert("big", ("nature", "people", "scenes", "space"), "pt", FIXED),
        "mid": convert("mid", ("nature", "people"), "hdf5", FIXED),
        "small": convert("small", ("space",), "lmdb", FIXED),
        "photos": convert("photos", ("scenes", "space"), "wds", ENCODING_CASES["jpeg"]),
    }


def mixture(lengths: dict[str, int], weights: Any, epoch_size: int, **kw: Any) -> Mixture:
    srcs = tuple(MixtureSource(name, n) for name, n in lengths.items())
    return Mixture(srcs, make_schedule(weights, srcs), epoch_size, **kw)


def epoch_draws(m: Mixture, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = m.order(epoch)
    positions = np.arange(m.epoch_size)
    source, slot = order.slots(positions)
    return source, slot, order.locate(positions)[1]


def test_largest_remainder_rounds_down_then_gives_the_rest_to_the_largest_remainders():
    assert largest_remainder([0.5, 0.3, 0.2], 10) == (5, 3, 2)
    assert largest_remainder([1, 1, 1], 10) == (4, 3, 3)  # ties: the source named first
    assert largest_remainder([0.8, 0.2], 7) == (6, 1)  # 5.6, 1.4: the .6 gets the spare
    assert largest_remainder([2, 1, 0], 100) == (67, 33, 0)


@pytest.mark.parametrize("stratify", [False, True])
@pytest.mark.parametrize(
    ("weights", "epoch_size"),
    [({"a": 0.8, "b": 0.2}, 1000), ({"a": 1, "b": 1, "c": 1}, 10), ({"a": 5, "b": 3, "c": 2}, 97)],
)
def test_each_epoch_holds_exactly_each_sources_share(weights, epoch_size, stratify):
    lengths = {"a": 13, "b": 7, "c": 3}
    lengths = {name: lengths[name] for name in weights}
    m = mixture(lengths, weights, epoch_size, seed=5, stratify=stratify)
    expected = largest_remainder(list(weights.values()), epoch_size)
    orders = []
    for epoch in range(3):
        source, slot, _ = epoch_draws(m, epoch)
        assert tuple(np.bincount(source, minlength=len(weights))) == expected
        for k, count in enumerate(expected):  # each of the source's slots once
            assert sorted(slot[source == k].tolist()) == list(range(count))
        orders.append(source.tolist())
    assert orders[0] != orders[1]  # interleaved afresh each epoch


def test_a_source_repeats_no_sample_before_all_of_it_was_seen_across_epochs_and_passes():
    lengths = {"a": 13, "b": 7, "c": 3}
    m = mixture(lengths, {"a": 1, "b": 1, "c": 1}, 31, seed=2)  # c: 10 a epoch, 3 samples
    draws: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for epoch in range(5):
        source, slot, sample = epoch_draws(m, epoch)
        for k in draws:
            rows = np.flatnonzero(source == k)
            draws[k] += sample[rows[np.argsort(slot[rows])]].tolist()
    for k, n in enumerate(lengths.values()):
        seq = draws[k]
        passes = [seq[i : i + n] for i in range(0, len(seq) - n + 1, n)]
        assert all(sorted(p) == list(range(n)) for p in passes)
        assert len({tuple(p) for p in passes}) > 1  # each pass its own order


@pytest.mark.parametrize("batch", [4, 10])
def test_stratify_gives_every_batch_each_sources_share_within_one_sample(batch):
    for weights in ({"a": 0.7, "b": 0.3}, {"a": 0.5, "b": 0.3, "c": 0.2}):
        lengths = {name: n for name, n in {"a": 50, "b": 20, "c": 9}.items() if name in weights}
        m = mixture(lengths, weights, 100, seed=3, stratify=True)
        counts = m.counts(0)
        source, _, _ = epoch_draws(m, 1)
        for lo in range(0, 100, batch):
            got = np.bincount(source[lo : lo + batch], minlength=len(weights))
            for k, c in enumerate(counts):
                share = batch * c / 100
                # the largest share within one sample, the next within two (see the module)
                assert abs(got[k] - share) < 1 + sorted(counts, reverse=True).index(c)


def sample_ids(loader: readers.Loader) -> list[tuple[str, str]]:
    """(source name, image digest) of every sample of this rank's epoch, in order."""
    out = []
    for images, labels, srcs in loader:
        assert srcs.dtype.is_floating_point is False and len(srcs) == len(labels)
        for image, k in zip(images, srcs.tolist(), strict=True):
            out.append((loader.sources[k], hashlib.sha1(image.numpy().tobytes()).hexdigest()))
    return out


def take(loader: readers.Loader, k: int) -> list[tuple[str, str]]:
    out = []
    for i, (images, _, srcs) in enumerate(loader):
        out += [
            (loader.sources[s], hashlib.sha1(im.numpy().tobytes()).hexdigest())
            for im, s in zip(images, srcs.tolist(), strict=True)
        ]
        if i + 1 == k:
            break
    return out


def paths(sources: dict[str, Path], *names: str) -> dict[str, Path]:
    return {name: sources[name] for name in names}


def test_batches_are_images_labels_sources_in_the_exact_shares(sources):
    loader = make_mixture_loader(
        paths(sources, "big", "mid", "small"),
        5,
        weights={"big": 0.5, "mid": 0.3, "small": 0.2},
        epoch_size=40,
        num_workers=2,
    )
    assert loader.sources == ("big", "mid", "small")
    assert loader.classes["small"] == ["space"]
    assert loader.classes["big"] == ["nature", "people", "scenes", "space"]
    assert len(loader) == 8
    for _ in range(2):
        ids = sample_ids(loader)
        assert Counter(name for name, _ in ids) == {"big": 20, "mid": 12, "small": 8}
        # small has 8 samples and a share of 8: every one of them, once
        assert len({d for name, d in ids if name == "small"}) == 8
    images, labels, srcs = next(iter(loader))
    assert tuple(images.shape) == (5, 3, 64, 64) and str(srcs.dtype) == "torch.int64"
    assert labels[srcs == 2].eq(0).all()  # small's one class


def test_a_state_on_2_ranks_x_2_workers_resumes_on_3_ranks_with_exactly_the_rest(sources):
    def make(rank: int, world: int, workers: int) -> readers.Loader:
        return make_mixture_loader(
            paths(sources, "big", "mid", "small"),
            3,
            weights={"big": 2, "mid": 1, "small": 1},
            epoch_size=60,
            seed=7,
            num_workers=workers,
            rank=rank,
            world_size=world,
        )

    whole = Counter(sample_ids(make(0, 1, 0)))
    assert sum(whole.values()) == 60
    first = [make(r, 2, 2) for r in range(2)]
    consumed = Counter()
    for loader in first:
        consumed.update(take(loader, 3))  # 9 of each rank's 30
    state = first[0].state_dict()
    assert state == first[1].state_dict() and state["samples_consumed"] == 18
    rest = Counter()
    for rank in range(3):
        loader = make(rank, 3, 1)
        loader.load_state_dict(state)
        assert len(loader) == 14 // 3 + 1  # 42 left: 14 a rank, in batches of 3
        rest.update(sample_ids(loader))
    assert consumed + rest == whole


def test_changed_weights_are_refused_then_recorded_with_reweight(sources):
    def make(weights: dict[str, float], **kw: Any) -> readers.Loader:
        return make_mixture_loader(
            paths(sources, "big", "small"), 4, weights=weights, epoch_size=20, **kw
        )

    old = make({"big": 1, "small": 1})
    head = take(old, 2)
    state = old.state_dict()
    new = {"big": 3, "small": 1}
    with pytest.raises(ValueError, match=r"weights .*big.*1\.0.*this loader.*3\.0.*reweight=True"):
        make(new).load_state_dict(state)
    loader = make(new, reweight=True)
    loader.load_state_dict(state)
    saved = loader.state_dict()["mixture"]
    assert saved["changes"] == [{"epoch": 1, "weights": [[0, {"big": 3.0, "small": 1.0}]]}]
    assert saved["schedule"] == [[0, {"big": 1.0, "small": 1.0}], [1, {"big": 3.0, "small": 1.0}]]
    rest = sample_ids(loader)  # epoch 0 ends under the weights it began with
    assert Counter(n for n, _ in head + rest) == {"big": 10, "small": 10}
    assert Counter(n for n, _ in sample_ids(loader)) == {"big": 15, "small": 5}
    with pytest.raises(ValueError, match=r"mixes big \(32 samples.*this loader big \(16"):
        other = make_mixture_loader(
            {"big": sources["mid"], "small": sources["small"]}, 4, weights=new, epoch_size=20
        )
        other.load_state_dict(state)


def test_a_schedule_resumed_across_its_step_continues_as_the_uninterrupted_run(sources):
    def make() -> readers.Loader:
        return make_mixture_loader(
            paths(sources, "mid", "small"),
            4,
            weights=[(0, {"mid": 1, "small": 1}), (1, {"mid": 3, "small": 1})],
            epoch_size=16,
            seed=3,
        )

    straight = make()
    epochs = [sample_ids(straight) for _ in range(3)]
    assert [Counter(n for n, _ in e) for e in epochs] == [
        {"mid": 8, "small": 8},
        {"mid": 12, "small": 4},
        {"mid": 12, "small": 4},
    ]
    interrupted = make()
    head = take(interrupted, 3)
    resumed = make()
    resumed.load_state_dict(interrupted.state_dict())
    assert head + sample_ids(resumed) == epochs[0]
    assert [sample_ids(resumed), sample_ids(resumed)] == epochs[1:]


def test_sources_of_different_sizes_are_refused_by_name_unless_cropped(sources):
    with pytest.raises(ValueError, match=r"cannot form one batch: big 64x64, photos various"):
        make_mixture_loader(paths(sources, "big", "photos"), 4)
    loader = make_mixture_loader(
        paths(sources, "big", "photos"), 4, crop=readers.CenterCrop(CROP), epoch_size=8
    )
    images, _, srcs = next(iter(loader))
    assert tuple(images.shape) == (4, 3, CROP, CROP) and len(srcs) == 4
