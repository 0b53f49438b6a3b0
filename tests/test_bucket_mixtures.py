"""Aspect-ratio buckets over a mixture (``make_loader({name: path}, bs, buckets=...)``), and
fields through bucketed batches: every batch of one bucket; each epoch exactly the samples
the same mixture without buckets reads (its exact shares, its carry-over, a schedule's
step), in a batch count of that epoch's own; every slot once across 2 ranks x 2 workers; a
state of 2 x 2 resumed on 3 ranks x 1 worker with exactly the rest, and the next epoch's
other count; drop_last; reweighting; other states refused; each caption with its own
image, over one dataset and over a mixture.

Sources are converted from real photo crops of varied aspect, as tests/test_buckets.py
makes them: "a" 37 photos (original JPEG and PNG files, pt), "b" 23 others (re-encoded
JPEG, lmdb); each photo its own class, so that a label names its sample, and a caption
``"<source> <label>"`` beside each."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import readers
from convert import ConvertOptions, convert_folder
from readers.bucket_dataset import make_bucket_loader
from readers.bucket_mixture_dataset import BucketMixtureLoader, make_bucket_mixture_loader
from readers.epochs.buckets import AspectBuckets
from readers.epochs.mixture import largest_remainder
from readers.mixture_dataset import make_mixture_loader, mixture_collate
from tests.photos import captioned_photos

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

BUCKETS = AspectBuckets.around(area=64 * 64, step=8, max_ratio=2.0)
LENGTHS = {"a": 37, "b": 23}
SCHEDULE = [(0, {"a": 2, "b": 1}), (1, {"a": 1, "b": 3})]  # a step at epoch 1
EPOCH = 30  # slots an epoch: a 20 + b 10, then a 8 + b 22 (largest remainder, tie to a)


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, fmt, encoding, seed in (("a", "pt", "original", 3), ("b", "lmdb", "jpeg", 100)):
        src = captioned_photos(tmp_path_factory.mktemp(f"src-{name}"), name, LENGTHS[name], seed)
        dst = tmp_path_factory.mktemp(name)
        options = ConvertOptions(format=fmt, encoding=encoding, shard_size=10)
        convert_folder(src, dst, options, workers=1, overwrite=True, progress=False)
        out[name] = dst
    return out


@pytest.fixture(scope="module")
def shapes(paths: dict[str, Path]) -> dict[tuple[str, int], tuple[int, int]]:
    """Each sample's bucket shape, by (source, label), from its stored size."""
    out = {}
    for name, path in paths.items():
        ds = readers.open_dataset(path)
        assert len(ds) == LENGTHS[name] and list(ds.classes) == sorted(ds.classes)
        for i, k in enumerate(BUCKETS.assign(ds.sizes).tolist()):
            out[name, i] = BUCKETS.sizes[k]
    assert len(set(out.values())) == 5  # every bucket has samples
    return out


def mixed(paths: dict[str, Path], batch_size: int = 4, **kw: Any) -> BucketMixtureLoader:
    options = {"weights": SCHEDULE, "epoch_size": EPOCH, "seed": 3, **kw}
    loader = readers.make_loader(paths, batch_size, buckets=BUCKETS, **options)
    assert isinstance(loader, BucketMixtureLoader)
    assert readers.BucketMixtureLoader is BucketMixtureLoader  # the public name
    assert isinstance(loader, readers.MixtureLoader) and isinstance(loader, readers.BucketLoader)
    datasets = loader.dataset.mixture.datasets.values()
    assert not any("sizes" in vars(d) for d in datasets)  # read a shard at a time, not kept
    return loader


def named(loader: Any, sources: torch.Tensor, labels: torch.Tensor) -> list[tuple[str, int]]:
    return [(loader.sources[k], i) for k, i in zip(sources.tolist(), labels.tolist(), strict=True)]


def ids(loader: Any, shapes: dict, limit: int | None = None) -> list[tuple[str, int]]:
    """(source, label) of this rank's samples, in order; each batch checked to be of one
    bucket, every sample in its own."""
    out: list[tuple[str, int]] = []
    for n, (images, labels, sources, *_) in enumerate(loader):
        got = named(loader, sources, labels)
        assert {shapes[g] for g in got} == {tuple(images.shape[2:])}, got
        assert images.dtype == torch.uint8 and len(images) == len(got) <= 4
        out += got
        if limit is not None and n + 1 == limit:
            break
    return out


def unbucketed(paths: dict[str, Path], epoch: int, **kw: Any) -> Counter[tuple[str, int]]:
    """What the same mixture without buckets reads in ``epoch``."""
    options = {"weights": SCHEDULE, "epoch_size": EPOCH, "seed": 3, **kw}
    loader = make_mixture_loader(paths, 5, crop=readers.CenterCrop(32), **options)
    loader.set_epoch(epoch)
    return Counter(
        (loader.sources[k], i)
        for _, labels, sources in loader
        for k, i in zip(sources.tolist(), labels.tolist(), strict=True)
    )


def batch_count(read: Counter, shapes: dict, batch_size: int, drop_last: bool = False) -> int:
    """Batches an epoch of ``read`` makes: per bucket, full batches and a short one."""
    per_bucket = Counter(shapes[g] for g in read.elements())
    if drop_last:
        return sum(n // batch_size for n in per_bucket.values())
    return sum(-(-n // batch_size) for n in per_bucket.values())


def test_each_epoch_reads_the_mixtures_own_samples_in_batches_of_one_bucket(paths, shapes):
    loader = mixed(paths, num_workers=2, persistent_workers=True)
    counts = []
    for epoch in range(3):
        expected = unbucketed(paths, epoch)
        weights = SCHEDULE[min(epoch, 1)][1]
        shares = dict(zip("ab", largest_remainder(list(weights.values()), EPOCH), strict=True))
        assert Counter(name for name, _ in expected.elements()) == shares
        assert len(loader) == batch_count(expected, shapes, 4)
        counts.append(len(loader))
        got = ids(loader, shapes)
        assert Counter(got) == expected  # the same samples: the mixture picks, buckets group
        assert loader.epoch == epoch + 1
    assert shares == {"a": 8, "b": 22} and len(set(counts)) > 1  # epochs of other counts
    # b's 22 slots of epoch 1 start with the 13 of its 23 that epoch 0 left out
    first, second = (unbucketed(paths, e) for e in (0, 1))
    assert len({i for s, i in first | second if s == "b"}) == 23


def test_batches_are_shuffled_per_epoch_and_stored_order_without_shuffle(paths, shapes):
    loader = mixed(paths)
    first = [tuple(images.shape[2:]) for images, *_ in loader]
    runs = sum(a != b for a, b in itertools.pairwise(first)) + 1
    assert runs > len(set(first))  # the buckets' batches interleaved, not one after another
    loader.set_epoch(0)
    again = ids(loader, shapes)
    loader.set_epoch(0)
    assert ids(loader, shapes) == again  # a pure function of seed and epoch
    plain = mixed(paths, shuffle=False, weights=None, epoch_size=None)
    got = ids(plain, shapes)
    assert Counter(got) == Counter((s, i) for s, n in LENGTHS.items() for i in range(n))
    buckets = [BUCKETS.sizes.index(shapes[g]) for g in got]
    assert buckets == sorted(buckets)  # bucket after bucket
    for size in BUCKETS.sizes:  # each in stored order, a's samples then b's
        members = [g for g in got if shapes[g] == size]
        assert members == sorted(members)


@pytest.mark.parametrize("workers", [0, 2])
def test_every_slot_once_across_2_ranks_with_equal_batch_counts(paths, shapes, workers):
    loaders = [mixed(paths, rank=r, world_size=2, num_workers=workers) for r in range(2)]
    for epoch in range(2):
        expected = unbucketed(paths, epoch)
        batches = batch_count(expected, shapes, 4)
        assert all(len(lo) == -(-batches // 2) for lo in loaders)
        got = Counter(g for lo in loaders for g in ids(lo, shapes))
        assert not expected - got  # every slot read
        assert sum((got - expected).values()) <= 4 * (batches % 2)  # one padding batch


def test_a_2x2_state_resumes_on_3_ranks_x_1_worker_with_exactly_the_rest(paths, shapes):
    first = [mixed(paths, rank=r, world_size=2, num_workers=2) for r in range(2)]
    for loader in first:
        ids(loader, shapes)  # epoch 0 whole, then into epoch 1, past the schedule's step
    consumed = Counter(g for lo in first for g in ids(lo, shapes, limit=2))
    state = first[0].state_dict()
    assert state == first[1].state_dict() and state["epoch"] == 1
    whole = unbucketed(paths, 1)
    batches = batch_count(whole, shapes, 4)
    assert state["num_samples"] == batches and state["order"] == "mixture-buckets"
    left = sum(hi - lo for lo, hi in state["remaining"])
    assert left == -(-batches // 2) * 2 - 4
    resumed = [mixed(paths, rank=r, world_size=3) for r in range(3)]
    rest: Counter[tuple[str, int]] = Counter()
    for loader in resumed:
        loader.load_state_dict(state)
        assert len(loader) == -(-left // 3)
        rest.update(ids(loader, shapes))
    assert not whole - (consumed + rest)  # every slot of the epoch
    padding = batches % 2 + (-left) % 3
    assert sum((consumed + rest - whole).values()) <= 4 * padding
    if not padding:
        assert consumed + rest == whole
    # the next epoch: its own count, dealt to the 3 ranks
    after = unbucketed(paths, 2)
    count = batch_count(after, shapes, 4)
    assert all(lo.epoch == 2 and len(lo) == -(-count // 3) for lo in resumed)
    got = Counter(g for lo in resumed for g in ids(lo, shapes))
    assert not after - got


def test_drop_last_drops_each_buckets_short_batch_and_what_ranks_cannot_share(paths, shapes):
    single = mixed(paths, drop_last=True)
    expected = unbucketed(paths, 0)
    full = batch_count(expected, shapes, 4, drop_last=True)
    assert 0 < full < batch_count(expected, shapes, 4)
    got = []
    for images, labels, sources in single:
        assert len(labels) == len(sources) == len(images) == 4
        got += named(single, sources, labels)
    assert len(got) == 4 * full and not Counter(got) - expected
    per_bucket = Counter(shapes[g] for g in expected.elements())
    kept = {s: n // 4 * 4 for s, n in per_bucket.items() if n >= 4}
    assert Counter(shapes[g] for g in got) == kept
    ranks = [mixed(paths, drop_last=True, rank=r, world_size=2) for r in range(2)]
    assert all(len(lo) == full // 2 for lo in ranks)
    both = [g for lo in ranks for g in ids(lo, shapes)]
    assert len(both) == full // 2 * 2 * 4 and not Counter(both) - expected


def test_captions_travel_with_their_images_through_buckets(paths, shapes):
    reference = {}  # centred crops: the same image whichever loader reads it
    for name, path in paths.items():
        for images, labels in make_bucket_loader(path, 4, BUCKETS):
            reference.update({(name, i): im for i, im in zip(labels.tolist(), images, strict=True)})
    single = readers.make_loader(paths["a"], 4, buckets=BUCKETS, fields=("txt",), num_workers=2)
    seen = 0
    for images, labels, txt in single:
        assert isinstance(txt, list) and len(txt) == len(labels)
        for image, i, caption in zip(images, labels.tolist(), txt, strict=True):
            assert caption == f"a {i}" and torch.equal(image, reference["a", i])
            seen += 1
    assert seen == LENGTHS["a"]
    loader = mixed(paths, fields=("txt",), num_workers=2)
    for _ in range(2):
        for images, labels, sources, txt in loader:
            rows = zip(images, named(loader, sources, labels), txt, strict=True)
            for image, (name, i), caption in rows:
                assert caption == f"{name} {i}"  # the sources tensor names the right source
                assert torch.equal(image, reference[name, i])  # ... and the image is its own


def test_reweighting_a_saved_state_is_refused_unless_asked_then_applied_next_epoch(paths, shapes):
    loader = mixed(paths)
    consumed = Counter(ids(loader, shapes, limit=3))
    state = loader.state_dict()
    other = [(0, {"a": 1, "b": 1})]
    with pytest.raises(ValueError, match=r"weights .* reweight=True"):
        mixed(paths, weights=other).load_state_dict(state)
    again = mixed(paths, weights=other, reweight=True)
    again.load_state_dict(state)
    assert consumed + Counter(ids(again, shapes)) == unbucketed(paths, 0)  # epoch 0 as saved
    assert again.mixture.changes == ({"epoch": 1, "weights": [[0, {"a": 1.0, "b": 1.0}]]},)
    got = Counter(name for name, _ in ids(again, shapes))
    assert got == {"a": 15, "b": 15}  # epoch 1 by the new weights
    ids(loader, shapes)  # the rest of epoch 0: a state at the start of epoch 1
    fresh = loader.state_dict()
    assert fresh["epoch"] == 1
    assert fresh["num_samples"] == batch_count(unbucketed(paths, 1), shapes, 4)
    now = mixed(paths, weights=other, reweight=True)
    now.load_state_dict(fresh)  # the new weights from epoch 1 itself, in their batch count
    expected = unbucketed(paths, 1, weights=[(0, SCHEDULE[0][1]), (1, other[0][1])])
    assert len(now) == batch_count(expected, shapes, 4) != fresh["num_samples"]
    assert Counter(ids(now, shapes)) == expected


def test_states_of_other_loaders_and_batching_are_refused_naming_it(paths, shapes):
    loader = mixed(paths)
    ids(loader, shapes, limit=2)
    state = loader.state_dict()
    assert set(state["buckets"]["assignments"]) == {"a", "b"}
    with pytest.raises(ValueError, match="buckets with batch_size=4"):
        mixed(paths, batch_size=5).load_state_dict(state)
    other = AspectBuckets([(64, 64), (48, 96), (96, 48)])
    with pytest.raises(ValueError, match="buckets with sizes="):
        readers.make_loader(
            paths, 4, buckets=other, weights=SCHEDULE, epoch_size=EPOCH, seed=3
        ).load_state_dict(state)
    plain = make_mixture_loader(paths, 4, weights=SCHEDULE, epoch_size=EPOCH, seed=3,
                                crop=readers.CenterCrop(32))  # fmt: skip
    with pytest.raises(ValueError, match="records no buckets over a mixture"):
        mixed(paths).load_state_dict(plain.state_dict())
    with pytest.raises(ValueError, match="order 'mixture-buckets'"):
        plain.load_state_dict(state)
    with pytest.raises(ValueError, match="records no buckets over a mixture"):
        mixed(paths).load_state_dict(make_bucket_loader(paths["a"], 4, BUCKETS).state_dict())
    with pytest.raises(ValueError, match="stratify="):
        readers.make_loader(paths, 4, buckets=BUCKETS, stratify=True)
    with pytest.raises(ValueError, match="stratify=True"):
        make_bucket_mixture_loader(paths, 4, BUCKETS, stratify=True)


@pytest.mark.parametrize("workers", [0, 2], ids=["main", "fork2"])
def test_bucketed_mixtures_resume_under_statefuldataloader(paths, shapes, workers):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make() -> Any:
        bucketed = mixed(paths, rank=1, world_size=2)
        return stateful.StatefulDataLoader(
            bucketed.dataset,
            batch_size=None,
            sampler=bucketed.source,
            num_workers=workers,
            collate_fn=mixture_collate,
            multiprocessing_context="fork" if workers else None,
        )

    def read(batches: Any) -> list[tuple[str, int]]:
        return [
            ("ab"[k], i)
            for _, labels, sources in batches
            for k, i in zip(sources.tolist(), labels.tolist(), strict=True)
        ]

    whole = read(make())
    loader = make()
    batches = iter(loader)
    first = read([next(batches), next(batches)])
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert first + read(resumed) == whole


def plan_peak(lengths: dict[str, int]) -> tuple[int, Any]:
    """Epoch 0's plan of buckets over a simulated mixture of ``lengths`` (random buckets):
    the peak bytes traced while making it, and the plan."""
    import tracemalloc

    import numpy as np

    from readers.epochs.bucket_mixture import MixtureBuckets
    from readers.epochs.mixture import Mixture, MixtureSource, make_schedule

    sources = tuple(MixtureSource(name, n, f"sha-{name}") for name, n in lengths.items())
    weights = make_schedule(dict.fromkeys(lengths, 1), sources)
    mixture = Mixture(sources, weights, sum(lengths.values()), seed=3)
    rng = np.random.default_rng(0)
    assignments = tuple(rng.integers(0, len(BUCKETS.sizes), n) for n in lengths.values())
    buckets = MixtureBuckets(BUCKETS, mixture, assignments, batch_size=64, drop_last=False)
    assert buckets.assignments[0].itemsize == 1  # int64 given, a byte a sample kept
    tracemalloc.start()
    plan = buckets.epoch(0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, plan


def test_an_epochs_plan_takes_a_few_bytes_a_slot_more_for_each_slot() -> None:
    # what grows with the samples is held compactly: a plan's row four bytes below 2**31
    # samples, and making it needs little more (int64 everywhere and a global argsort took
    # over forty bytes a slot: tens of GB a rank at 1 B samples); what does not grow (the
    # mixture's chunks of positions) cancels out between two sizes
    import numpy as np

    small, _ = plan_peak({"a": 1_500_000, "b": 500_000})
    large, plan = plan_peak({"a": 4_500_000, "b": 1_500_000})
    per_slot = (large - small) / 4_000_000
    assert per_slot < 12, f"{per_slot:.1f} bytes a slot"
    assert plan.members.itemsize == 4
    first = int(plan.indices(np.array([0]))[0])
    _, members = plan.batch_at(first)
    assert members.dtype == np.int64 and len(members) == 64  # batches as int64, as before
