"""The map-style epoch order (:class:`readers.epochs.order.FeistelOrder`): a bijection with
no measurable correlation, the same global order on any world size, states saved before it
(version 1, the whole permutation) resumed exactly as they were, and a billion-sample
state resumed on another world size in a real process, timed and its memory read from
``/proc``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

import readers
from readers.epochs.order import FeistelOrder, epoch_permutation
from readers.epochs.sampler import EpochSampler
from tests.conftest import ROOT
from tests.dist_rank import digest

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

Z_LIMIT = 4.5  # |z| beyond this has probability < 1e-5 for a truly random order
CELLS = 16  # buckets per axis of the contingency tables


def chi2_limit(df: int) -> float:
    """The chi-square value exceeded with probability ~1e-5 (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + Z_LIMIT * math.sqrt(2 / (9 * df))) ** 3


def pearson_z(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's r of ``a`` and ``b`` scaled to a standard normal under independence."""
    return float(np.corrcoef(a, b)[0, 1]) * math.sqrt(len(a))


def contingency_chi2(a: np.ndarray, b: np.ndarray, n: int) -> float:
    """Chi-square of independence of the buckets of ``a`` and ``b`` (values in [0, n))."""
    table = np.zeros((CELLS, CELLS))
    np.add.at(table, (a * CELLS // n, b * CELLS // n), 1)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    return float(((table - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 1000, 65537, 1_000_003])
def test_feistel_order_names_every_index_exactly_once(n):
    order = FeistelOrder(n, seed=7, epoch=2).indices(np.arange(n))
    assert order.dtype == np.int64
    assert np.array_equal(np.sort(order), np.arange(n))


@pytest.mark.parametrize(("seed", "epoch"), [(0, 0), (0, 1), (12345, 7)])
@pytest.mark.parametrize("n", [200_000, 300_007])  # a power-of-4 domain and a walked one
def test_feistel_order_has_no_correlation_between_position_source_and_neighbour(n, seed, epoch):
    positions = np.arange(n)
    order = FeistelOrder(n, seed, epoch).indices(positions)
    pairs = {
        "position vs index": (positions, order),
        "index vs next index": (order[:-1], order[1:]),
        "index vs index two on": (order[:-2], order[2:]),
    }
    limit = chi2_limit((CELLS - 1) ** 2)
    for what, (a, b) in pairs.items():
        assert abs(pearson_z(a, b)) < Z_LIMIT, what
        assert contingency_chi2(a, b, n) < limit, what
    # The statistics catch what they should: a lightly perturbed identity, a stride.
    near_identity = np.minimum(positions + np.random.default_rng(0).integers(0, 9, n), n - 1)
    assert abs(pearson_z(positions, near_identity)) > 100
    stride = (positions * 7919) % n
    assert contingency_chi2(stride[:-1], stride[1:], n) > limit
    # Another epoch or seed: another order, unrelated to this one.
    other = FeistelOrder(n, seed, epoch + 1).indices(positions)
    assert abs(pearson_z(order, other)) < Z_LIMIT
    assert contingency_chi2(order, other, n) < limit


def test_feistel_order_at_a_position_needs_nothing_before_it():
    order = FeistelOrder(10**9, seed=1, epoch=0)
    far = np.arange(999_999_000, 10**9)
    assert np.array_equal(order.indices(far)[500:], order.indices(far[500:]))
    assert len(np.unique(order.indices(far))) == 1000


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_deal_one_global_order_whatever_the_world_size(drop_last):
    n, batch = 1003, 4
    single = list(EpochSampler(n, seed=5, batch_size=batch, world_size=1, rank=0))
    assert sorted(single) == list(range(n))
    for world in (2, 3, 7):
        shares = [
            list(
                EpochSampler(
                    n, seed=5, batch_size=batch, rank=r, world_size=world, drop_last=drop_last
                )
            )
            for r in range(world)
        ]
        assert len({len(s) for s in shares}) == 1
        together = [i for share in shares for i in share]
        read = len(together) if drop_last else n
        assert together[:read] == single[:read]  # rank slices of the one order, in order


# --- states saved before version 2 ---------------------------------------------------------
def version_1_state(epoch: int, seed: int, n: int, world: int, remaining: list) -> dict:
    """What the loader's ``state_dict`` wrote before the order had a name (imgpack 6f7a554)."""
    return {
        "version": 1,
        "epoch": epoch,
        "seed": seed,
        "num_samples": n,
        "samples_consumed": n - sum(hi - lo for lo, hi in remaining),
        "world_size": world,
        "remaining": remaining,
    }


def test_a_version_1_state_resumes_in_the_permutation_order_it_was_saved_with(converted):
    root = converted("pt", "raw-fixed")
    ds = readers.open_dataset(root)
    n = len(ds)

    def read(loader: readers.Loader) -> list[str]:
        return [
            digest(x, int(y))
            for images, labels in loader
            for x, y in zip(images, labels, strict=True)
        ]

    def expected(epoch: int, positions: range) -> list[str]:
        permutation = epoch_permutation(n, 9, epoch)
        return [digest(*ds[int(permutation[p])]) for p in positions]

    # Saved on 2 ranks after 2 batches of 3 each: positions 0-5 and 16-21 read.
    state = version_1_state(3, 9, n, 2, [[6, 16], [22, 32]])
    for rank in range(2):
        loader = readers.make_loader(root, 3, seed=9, rank=rank, world_size=2)
        loader.load_state_dict(json.loads(json.dumps(state)))
        loader.set_epoch(3)
        assert read(loader) == expected(3, range(6, 16) if rank == 0 else range(22, 32))
        assert loader.state_dict()["order"] == "permutation"  # the run keeps its order
        assert read(loader) == expected(4, range(0, 16) if rank == 0 else range(16, 32))
    # On another world size: the rest of the epoch, once, in the same order of positions.
    rest = []
    for rank in range(3):
        loader = readers.make_loader(root, 3, seed=9, rank=rank, world_size=3)
        loader.load_state_dict(state)
        rest.extend(read(loader))
    assert rest[:20] == expected(3, [*range(6, 16), *range(22, 32)])
    # A new run records the order it uses.
    fresh = readers.make_loader(root, 3, seed=9).state_dict()
    assert fresh["version"] == 2 and fresh["order"] == "feistel"
    assert read(readers.make_loader(root, 3, seed=9, shuffle=True)) != expected(0, range(n))


def test_a_state_naming_an_unknown_order_or_version_is_refused():
    sampler = EpochSampler(100, rank=0, world_size=1)
    state = sampler.state_dict()
    with pytest.raises(ValueError, match="order 'windows'"):
        sampler.load_state_dict({**state, "order": "windows"})
    with pytest.raises(ValueError, match="version 3"):
        sampler.load_state_dict({**state, "version": 3})
    with pytest.raises(ValueError, match="not an imgpack loader state"):
        sampler.load_state_dict({k: v for k, v in state.items() if k != "order"})


# --- a billion samples ---------------------------------------------------------------------
BILLION_RESUME = """
import itertools, json, sys, time
import numpy as np
from readers.epochs.order import FeistelOrder
from readers.epochs.ranges import take, wrapped
from readers.epochs.sampler import EpochSampler

def rss_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))

N, BATCH = 10**9, 256
saved = EpochSampler(N, seed=3, batch_size=BATCH, rank=5, world_size=8)
saved.set_epoch(2)
it = iter(saved)
first = list(itertools.islice(it, 40 * BATCH))  # 40 steps on each of 8 ranks
state = json.dumps(saved.state_dict())
del it, saved
times, peaks = [], []
for _ in range(5):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS to the current RSS
    base = rss_kib("VmRSS")
    t = time.perf_counter()
    resumed = EpochSampler(N, seed=3, batch_size=BATCH, rank=11, world_size=12)
    resumed.load_state_dict(json.loads(state))
    batch = list(itertools.islice(iter(resumed), BATCH))
    times.append(time.perf_counter() - t)
    peaks.append(rss_kib("VmHWM") - base)
split = resumed.split()
lo, hi = wrapped(take(split.rank_ranges(11), 0, BATCH), N)[0]
expected = FeistelOrder(N, 3, 2).indices(np.arange(lo, hi)).tolist()
print(json.dumps({
    "seconds": sorted(times)[2], "extra_mib": sorted(peaks)[2] / 1024,
    "batch_ok": batch == expected, "state": json.loads(state), "first": first[:3],
    "per_rank": split.per_rank,
}))
"""


def test_a_billion_sample_state_resumes_on_another_world_size_in_100ms_and_50mb():
    done = subprocess.run(
        [sys.executable, "-c", BILLION_RESUME],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    state = result["state"]
    assert state["samples_consumed"] == 8 * 40 * 256 and state["num_samples"] == 10**9
    assert len(json.dumps(state)) < 1000  # eight ranges, not a permutation
    assert result["batch_ok"]
    assert result["per_rank"] == -(-(10**9 - 8 * 40 * 256) // 12)
    assert result["seconds"] < 0.1, result
    assert result["extra_mib"] < 50, result
