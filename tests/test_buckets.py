"""Aspect-ratio buckets: the grid, each sample in its nearest bucket (against a brute-force
reference with exact fractions), batches of one bucket's shape, every sample once per
epoch across ranks and workers, crops equal between the kernel and the Python path and
close to a Pillow reference, a mid-epoch state on 2 ranks x 2 workers resumed on 3 ranks x
1 worker, drop_last, jitter and flip drawn per seed and epoch, other buckets refused.

Datasets are converted from real photo crops of varied aspect (JPEG and PNG files) in
four formats, stored as the original files, as raw pixels or re-encoded as JPEG; each
image is its own class, so that a label names its sample."""

from __future__ import annotations

import math
import random
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import readers
from convert import ConvertOptions, convert_folder
from readers.bucket_dataset import BucketCrop, make_bucket_loader
from readers.epochs.buckets import AspectBuckets, BucketPlan, bucket_counts, group_by_bucket
from readers.images import kernel
from tests.photos import encode, photo_crop

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

BUCKETS = AspectBuckets.around(area=64 * 64, step=8, max_ratio=2.0)
N = 37  # photos


def photo_sizes() -> list[tuple[int, int]]:
    """(height, width) of about 150x150 at aspects from 0.4 to 2.5, spread at random."""
    rng = random.Random(3)
    out = []
    for _ in range(N):
        aspect = math.exp(rng.uniform(math.log(0.4), math.log(2.5)))
        out.append((round(150 / math.sqrt(aspect)), round(150 * math.sqrt(aspect))))
    return out


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    src = tmp_path_factory.mktemp("bucket-src")
    for i, (h, w) in enumerate(photo_sizes()):
        folder = src / f"c{i:02d}"
        folder.mkdir()
        pixels = photo_crop(h, w, seed=i)
        if i % 5 == 4:
            (folder / "img.png").write_bytes(encode(pixels, "PNG"))
        else:
            (folder / "img.jpg").write_bytes(encode(pixels, quality=90))
    cases = {
        "pt-original": ("pt", "original"),
        "hdf5-raw": ("hdf5", "raw"),
        "lmdb-jpeg": ("lmdb", "jpeg"),
        "wds-original": ("wds", "original"),
    }
    out = {}
    for name, (fmt, encoding) in cases.items():
        dst = tmp_path_factory.mktemp(name)
        options = ConvertOptions(format=fmt, encoding=encoding, shard_size=10)
        convert_folder(src, dst, options, workers=1, overwrite=True, progress=False)
        out[name] = dst
    return out


def nearest(h: int, w: int, sizes: tuple[tuple[int, int], ...]) -> int:
    """Brute force, exact: the bucket minimising |log(r / a)| (compared as max(r/a, a/r)),
    ties to the one nearer square (max(a, 1/a)), then to the landscape one."""
    r = Fraction(w, h)

    def key(k: int) -> tuple[Fraction, Fraction, int]:
        a = Fraction(sizes[k][1], sizes[k][0])
        return max(r / a, a / r), max(a, 1 / a), 0 if a >= 1 else 1

    return min(range(len(sizes)), key=key)


def sample_ids(loader: readers.Loader, limit: int | None = None) -> list[int]:
    """The labels (one class per photo: the sample) of this rank's batches, in order."""
    out: list[int] = []
    for i, (images, labels) in enumerate(loader):
        h, w = images.shape[2:]
        assert (h, w) in loader.buckets.sizes
        out += labels.tolist()
        if limit is not None and i + 1 == limit:
            break
    return out


def test_around_gives_the_kohya_grid_of_about_one_area():
    grid = AspectBuckets.around(area=512 * 512, step=64, max_ratio=2.0)
    assert grid.sizes == ((640, 384), (576, 448), (512, 512), (448, 576), (384, 640))
    for h, w in AspectBuckets.around(area=1024 * 1024, step=32, max_ratio=3).sizes:
        assert h % 32 == 0 and w % 32 == 0 and h * w <= 1024 * 1024
        assert h * w > (1024 * 1024) * 0.9 and max(h, w) <= 3 * min(h, w)
    assert BUCKETS.sizes == ((80, 48), (72, 56), (64, 64), (56, 72), (48, 80))


def test_buckets_of_one_aspect_or_bad_sizes_are_refused():
    with pytest.raises(ValueError, match=r"\(64, 64\) and \(32, 32\) have one aspect"):
        AspectBuckets([(64, 64), (48, 96), (32, 32)])
    with pytest.raises(ValueError, match="positive integer"):
        AspectBuckets([(64, 0)])
    with pytest.raises(ValueError, match="positive integer"):
        AspectBuckets([(64.5, 32)])


def test_each_size_goes_to_its_nearest_bucket_as_a_brute_force_says():
    rng = np.random.default_rng(0)
    sizes = np.concatenate([rng.integers(1, 3000, (3000, 2)), [[1, 70000], [70000, 3]]])
    for buckets in (BUCKETS, AspectBuckets([(96, 48), (48, 96), (64, 64), (40, 100)])):
        got = buckets.assign(sizes)
        assert got.tolist() == [nearest(h, w, buckets.sizes) for h, w in sizes.tolist()]


def test_ties_go_to_the_bucket_nearer_square_then_to_the_landscape_one():
    # 1:2 lies midway (log scale) between 1:1 and 1:4, and between 2:1 and 1:2 lies 1:1
    assert AspectBuckets([(64, 64), (32, 128)]).assign(np.array([[10, 20]])).tolist() == [0]
    assert AspectBuckets([(32, 128), (64, 64)]).assign(np.array([[10, 20]])).tolist() == [1]
    assert AspectBuckets([(128, 32), (64, 64)]).assign(np.array([[20, 10]])).tolist() == [1]
    assert AspectBuckets([(128, 64), (64, 128)]).assign(np.array([[50, 50]])).tolist() == [1]
    assert AspectBuckets([(64, 128), (128, 64)]).assign(np.array([[50, 50]])).tolist() == [0]


def test_a_plan_deals_each_bucket_in_full_and_short_batches_anew_each_epoch():
    assignment = np.random.default_rng(1).integers(0, 5, 103)
    for drop_last in (False, True):
        plan = BucketPlan(BUCKETS, assignment, 4, drop_last, seed=2)
        counts = np.bincount(assignment, minlength=5)
        expected = (counts // 4) if drop_last else -(-counts // 4)
        assert plan.num_batches == expected.sum()
        orders = []
        for epoch in range(2):
            seen = []
            for g in range(plan.num_batches):
                k, members = plan.batch_at(epoch, g)
                assert (assignment[members] == k).all() and 1 <= len(members) <= 4
                seen += members.tolist()
            if drop_last:
                assert len(seen) == (counts // 4 * 4).sum() == len(set(seen))
            else:
                assert sorted(seen) == list(range(103))
            orders.append(seen)
        assert orders[0] != orders[1]


@pytest.mark.parametrize("case", ["pt-original", "hdf5-raw", "lmdb-jpeg", "wds-original"])
def test_batches_hold_one_bucket_each_sample_in_its_nearest(photos, case):
    ds = readers.open_dataset(photos[case])
    assert ds.sizes.tolist() == [list(s) for s in photo_sizes()]  # what the photos were
    expected = {i: nearest(h, w, BUCKETS.sizes) for i, (h, w) in enumerate(photo_sizes())}
    assert len(set(expected.values())) == 5  # every bucket has photos
    loader = make_bucket_loader(photos[case], 4, BUCKETS, seed=1)
    assert loader.plan.assignment.tolist() == [expected[i] for i in range(N)]
    assert "sizes" not in vars(loader.dataset.dataset)  # read a shard at a time, not kept
    seen = []
    for images, labels in loader:
        shapes = {BUCKETS.sizes[expected[i]] for i in labels.tolist()}
        assert shapes == {tuple(images.shape[2:])} and images.dtype == torch.uint8
        assert images.shape[:2] == (len(labels), 3) and len(labels) <= 4
        seen += labels.tolist()
    assert sorted(seen) == list(range(N))


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_an_epoch_across_ranks_and_workers(photos, world, workers):
    def make(rank: int) -> Any:
        return make_bucket_loader(
            photos["pt-original"], 3, BUCKETS, seed=4, rank=rank, world_size=world,
            num_workers=workers,
        )  # fmt: skip

    loaders = [make(r) for r in range(world)]
    batches = loaders[0].plan.num_batches
    assert all(len(lo) == -(-batches // world) for lo in loaders)  # equal batch counts
    for epoch in range(2):
        seen = Counter(i for lo in loaders for i in sample_ids(lo))
        assert set(seen) == set(range(N))
        repeated = sum(seen.values()) - N  # padding: the first batches again, < world
        assert repeated <= 3 * ((-batches) % world)
        if batches % world == 0:
            assert repeated == 0
        assert all(lo.epoch == epoch + 1 for lo in loaders)


def test_drop_last_drops_each_buckets_short_batch_and_what_the_ranks_cannot_share(photos):
    loaders = [
        make_bucket_loader(photos["hdf5-raw"], 3, BUCKETS, drop_last=True, rank=r, world_size=2)
        for r in range(2)
    ]
    counts = np.bincount(loaders[0].plan.assignment, minlength=5)
    full = int((counts // 3).sum())
    ids = [sample_ids(lo) for lo in loaders]
    assert all(len(lo) == full // 2 for lo in loaders)
    assert all(len(i) == full // 2 * 3 for i in ids)  # every batch full
    assert len(set(ids[0]) | set(ids[1])) == full // 2 * 2 * 3
    with pytest.raises(ValueError, match="no batch in any bucket"):
        make_bucket_loader(photos["hdf5-raw"], 64, BUCKETS, drop_last=True)


def cover_crop(path: Path, size: tuple[int, int], box: np.ndarray | None = None) -> torch.Tensor:
    """The reference: decode whole with Pillow, resize to cover ``size`` (aspect kept,
    Pillow's antialiased bilinear) and crop the centre, in one exact step: Pillow resizes
    the fractional box that covering keeps (``box``: this integer box instead)."""
    image = Image.open(path).convert("RGB")
    oh, ow = size
    scale = max(oh / image.height, ow / image.width)
    bw, bh = ow / scale, oh / scale
    left, top = (image.width - bw) / 2, (image.height - bh) / 2
    edges = (left, top, left + bw, top + bh)
    if box is not None:
        top, left, bh, bw = (int(v) for v in box[:4])
        edges = (left, top, left + bw, top + bh)
    pixels = np.array(image.resize((ow, oh), Image.Resampling.BILINEAR, box=edges))
    return torch.from_numpy(pixels).permute(2, 0, 1)


def all_crops(path: Path, **kw: Any) -> dict[int, torch.Tensor]:
    loader = make_bucket_loader(path, 4, kw.pop("buckets", BUCKETS), seed=9, **kw)
    return {
        i: im for images, labels in loader for i, im in zip(labels.tolist(), images, strict=True)
    }


@pytest.mark.skipif(kernel.crop_kernel() is None, reason="no crop kernel here")
def test_crops_equal_between_the_kernel_and_the_python_path_and_near_pillows(photos, tmp_path):
    fast = all_crops(photos["pt-original"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(kernel.KERNEL_ENV, "0")
        kernel.crop_kernel.cache_clear()
        assert kernel.crop_kernel() is None
        python = all_crops(photos["pt-original"])
    kernel.crop_kernel.cache_clear()
    assert kernel.crop_kernel() is not None  # the kernel did the first pass
    assert fast.keys() == python.keys() == set(range(N))
    ds = readers.open_dataset(photos["pt-original"])
    crop = BucketCrop(BUCKETS, seed=9)
    exact, same_box = [], []
    for i in range(N):
        # kernel and Python path: the same pixels (within a level where the DCT scales)
        assert (fast[i].int() - python[i].int()).abs().float().mean() <= 0.5
        stored = tmp_path / f"{i}.img"
        stored.write_bytes(bytes(ds.stored(i)))
        size = tuple(fast[i].shape[1:])
        chosen = crop.for_batch(BUCKETS.sizes.index(size), 0)
        box = chosen.boxes(ds.sizes[i : i + 1], np.array([i]))[0]
        for diffs, reference in (
            (exact, cover_crop(stored, size)),
            (same_box, cover_crop(stored, size, box)),
        ):
            diffs.append((fast[i].int() - reference.int()).abs().float().mean().item())
    # The box is whole pixels (the kernel's): up to half a source pixel off the exact
    # covering box. Measured over these photos (~150 px to 48-80 px): mean 0.90 levels (at
    # most 3.5) from the exact reference; from Pillow resizing the same box, mean 0.05
    # (at most 0.21). (Resizing the whole image to whole pixels first, then cropping at a
    # whole pixel, is another rounding apart: mean 2.8.)
    assert np.mean(exact) < 1.5 and max(exact) < 5, exact
    assert np.mean(same_box) < 0.25 and max(same_box) < 1, same_box


def test_a_state_on_2_ranks_x_2_workers_resumes_on_3_ranks_with_exactly_the_rest(photos):
    def make(rank: int, world: int, workers: int) -> Any:
        return make_bucket_loader(
            photos["lmdb-jpeg"], 2, BUCKETS, seed=7, rank=rank, world_size=world,
            num_workers=workers,
        )  # fmt: skip

    whole = Counter(sample_ids(make(0, 1, 0)))
    first = [make(r, 2, 2) for r in range(2)]
    consumed: Counter[int] = Counter()
    for loader in first:
        consumed.update(sample_ids(loader, limit=3))
    state = first[0].state_dict()
    assert state == first[1].state_dict()
    left = sum(hi - lo for lo, hi in state["remaining"])  # batches, padding of 2 ranks too
    batches = state["num_samples"]
    assert left == -(-batches // 2) * 2 - 6
    rest: Counter[int] = Counter()
    for rank in range(3):
        loader = make(rank, 3, 1)
        loader.load_state_dict(state)
        assert len(loader) == -(-left // 3)
        rest.update(sample_ids(loader))
    # every sample, and repeated only in padding batches (of 2 ranks, then of 3)
    assert not whole - (consumed + rest) and set(consumed + rest) == set(whole)
    padding = (-batches) % 2 + (-left) % 3
    assert sum((consumed + rest - whole).values()) <= 2 * padding
    if not padding:
        assert consumed + rest == whole


def test_jitter_and_flip_are_drawn_per_seed_and_epoch(photos):
    jitter = AspectBuckets(BUCKETS.sizes, jitter=True, flip=True)

    def crops(seed: int, epoch: int) -> dict[int, torch.Tensor]:
        loader = make_bucket_loader(photos["pt-original"], 4, jitter, seed=seed, num_workers=2)
        loader.set_epoch(epoch)
        return {
            i: im
            for images, labels in loader
            for i, im in zip(labels.tolist(), images, strict=True)
        }

    a, b, c = crops(1, 0), crops(1, 0), crops(1, 1)
    assert all(torch.equal(a[i], b[i]) for i in range(N))
    assert sum(not torch.equal(a[i], c[i]) for i in range(N)) > N // 2
    crop = BucketCrop(jitter, seed=1)
    boxes = [crop.boxes(np.array([[150, 300]] * 200), np.arange(200)) for _ in range(2)]
    assert (boxes[0] == boxes[1]).all() and 0.35 < boxes[0][:, 4].mean() < 0.65
    assert len(set(boxes[0][:, 1].tolist())) > 20  # left offsets spread over the slack
    centred = AspectBuckets(BUCKETS.sizes)
    loader = make_bucket_loader(photos["pt-original"], 4, centred, seed=1)
    epochs = [
        {i: im for images, labels in loader for i, im in zip(labels.tolist(), images, strict=True)}
    ]
    epochs.append(
        {i: im for images, labels in loader for i, im in zip(labels.tolist(), images, strict=True)}
    )
    assert loader.epoch == 2  # two epochs: the same centred crops, in another order
    assert all(torch.equal(epochs[0][i], epochs[1][i]) for i in epochs[0])


def test_a_state_of_other_buckets_or_batching_is_refused_naming_it(photos):
    loader = make_bucket_loader(photos["pt-original"], 4, BUCKETS, seed=3)
    sample_ids(loader, limit=2)
    state = loader.state_dict()
    assert state["buckets"]["sizes"] == [list(s) for s in BUCKETS.sizes]
    other = AspectBuckets([(64, 64), (48, 96), (96, 48)])
    with pytest.raises(ValueError, match="buckets with sizes="):
        make_bucket_loader(photos["pt-original"], 4, other, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size=4"):
        make_bucket_loader(photos["pt-original"], 5, BUCKETS, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="records no buckets"):
        make_bucket_loader(photos["pt-original"], 4, BUCKETS).load_state_dict(
            readers.make_loader(photos["pt-original"], 4).state_dict()
        )
    with pytest.raises(ValueError, match="order 'buckets'"):
        readers.make_loader(photos["pt-original"], 4).load_state_dict(state)
    again = make_bucket_loader(photos["pt-original"], 4, BUCKETS, seed=3)
    again.load_state_dict(state)
    assert len(sample_ids(again)) + 8 >= N


def test_a_subset_is_bucketed_over_its_own_samples_and_its_state_names_them(photos):
    keep = np.arange(0, N, 2)
    loader = make_bucket_loader(photos["wds-original"], 3, BUCKETS, indices=keep, num_workers=2)
    assert sorted(sample_ids(loader)) == keep.tolist()
    state = loader.state_dict()
    other = make_bucket_loader(photos["wds-original"], 3, BUCKETS, indices=keep[1:])
    with pytest.raises(ValueError, match="buckets with samples="):
        other.load_state_dict(state)
    shifted = make_bucket_loader(photos["wds-original"], 3, BUCKETS, indices=keep[::-1])
    with pytest.raises(ValueError, match=r"buckets with (assignment|subset)="):
        shifted.load_state_dict(state)


def test_make_loader_takes_buckets_and_refuses_what_they_cannot_go_with(photos, tmp_path):
    loader = readers.make_loader(
        photos["hdf5-raw"], 3, buckets=readers.AspectBuckets(BUCKETS.sizes), seed=2, rank=1,
        world_size=2, num_workers=2, persistent_workers=True,
    )  # fmt: skip
    assert isinstance(loader, readers.BucketLoader)
    mine = make_bucket_loader(photos["hdf5-raw"], 3, BUCKETS, seed=2, rank=1, world_size=2)
    for _ in range(2):  # persistent workers, two epochs: the same batches as the function's
        assert sample_ids(loader) == sample_ids(mine)
    ds = readers.open_dataset(photos["hdf5-raw"])
    part = torch.utils.data.Subset(ds, list(range(0, N, 3)))
    assert sorted(sample_ids(readers.make_loader(part, 2, buckets=BUCKETS))) == part.indices
    for bad, named in [
        ({"crop": readers.CenterCrop(64)}, "crop="),
        ({"stream": True}, "stream="),
        ({"weights": {"a": 1}}, "weights="),
    ]:
        with pytest.raises(ValueError, match=named):
            readers.make_loader(photos["wds-original"], 2, buckets=BUCKETS, **bad)
    with pytest.raises(ValueError, match=r"stratify= \(a batch holds one bucket\)"):
        readers.make_loader({"a": photos["pt-original"]}, 2, buckets=BUCKETS, stratify=True)
    with pytest.raises(ValueError, match=r"indices=, decode_threads= \(one dataset's\)"):
        readers.make_loader({"a": photos["pt-original"]}, 2, buckets=BUCKETS, indices=[0, 1])


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.parametrize("workers", [0, 2], ids=["main", "fork2"])
def test_buckets_resume_under_statefuldataloader(photos, workers):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make() -> Any:
        bucketed = readers.make_loader(photos["pt-original"], 3, buckets=BUCKETS, seed=5)
        return stateful.StatefulDataLoader(
            bucketed.dataset,
            batch_size=None,
            sampler=bucketed.source,
            num_workers=workers,
            collate_fn=readers.collate,
            multiprocessing_context="fork" if workers else None,
        )

    def ids(batches: Any) -> list[int]:
        return [i for _, labels in batches for i in labels.tolist()]

    whole = ids(make())
    assert sorted(whole) == list(range(N))
    loader = make()
    batches = iter(loader)
    first = ids([next(batches), next(batches)])
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert first + ids(resumed) == whole


@pytest.mark.parametrize("n", [0, 1, 1000, (1 << 20) + 17, 3 * (1 << 20) + 5])
def test_grouping_by_bucket_a_chunk_at_a_time_is_a_stable_argsort(n: int) -> None:
    # the plans' compact grouping gives exactly what the global stable argsort it replaced
    # gave (saved states resume the same batches), across its chunks' bounds
    rng = np.random.default_rng(n)
    rows = rng.permutation(n).astype(np.int32)
    bucket_of = rng.integers(0, 7, n).astype(np.int8)
    counts = bucket_counts(bucket_of, 7, rows)
    assert counts.tolist() == np.bincount(bucket_of, minlength=7).tolist()
    grouped = group_by_bucket(rows, bucket_of, counts)
    assert grouped.dtype == np.int32
    np.testing.assert_array_equal(grouped, rows[np.argsort(bucket_of[rows], kind="stable")])
