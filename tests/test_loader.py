"""make_loader, EpochSampler and WdsStream in one process: exact shares for explicit ranks,
epochs that reach persistent workers, mid-epoch resume (workers 0 and 2), a relative root
after chdir, StatefulDataLoader, and the plan's arithmetic on many random cases.

The real multi-process runs (gloo, torchrun, mp.spawn) are in tests/test_distributed.py.
"""

from __future__ import annotations

import json
import multiprocessing
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Subset, random_split

import readers
from readers.epochs.order import BlockOrder
from readers.epochs.ranges import positions, total
from readers.epochs.split import Split
from readers.epochs.state import EpochState
from readers.placement import Placement
from tests.dist_rank import digest
from tests.spawning import spawn_context
from tests.test_reader_faults import copy_dataset, flip_middle_byte_of_sample

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    # torchdata's import calls a deprecated torch function
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

N = 32  # samples in sample_data
READERS = ["pt", "hdf5", "lmdb", "wds", "stream"]


@pytest.fixture(scope="module")
def roots(converted) -> dict[str, Path]:
    wds = converted("wds", "raw-fixed", shard_size=4, shuffle=True, seed=1)
    return {
        "pt": converted("pt", "raw-fixed"),
        "hdf5": converted("hdf5", "raw-fixed", shard_size=10),
        "lmdb": converted("lmdb", "raw-fixed"),
        "wds": wds,
        "stream": wds,
    }


def build(roots: dict[str, Path], name: str, batch_size: int = 3, **kwargs: Any):
    if name == "stream":
        kwargs.setdefault("shuffle_buffer", 8)
    return readers.make_loader(roots[name], batch_size, stream=name == "stream", **kwargs)


def digests(batches: Any) -> list[list[str]]:
    return [
        [digest(i, int(y)) for i, y in zip(images, labels, strict=True)]
        for images, labels in batches
    ]


def flat(batches: list[list[str]]) -> list[str]:
    return [d for batch in batches for d in batch]


def every_sample(root: Path) -> set[str]:
    ds = readers.open_dataset(root)
    return {digest(*ds[i]) for i in range(len(ds))}


def take_batches(loader: Any, k: int) -> list[list[str]]:
    """The first ``k`` batches, leaving the loop as a training loop's ``break`` does."""
    out: list[list[str]] = []
    for batch in loader if k else ():
        out.extend(digests([batch]))
        if len(out) == k:
            break
    return out


# --- the plan ---------------------------------------------------------------------------------
def simulate(split: Split, batches: int) -> Counter:
    """Positions yielded by every rank after ``batches`` batches, the DataLoader's way: one
    batch of each worker that has one left, in turn (independently of ``Split.consumed``)."""
    seen: Counter = Counter()
    for rank in range(split.world_size):
        seen.update(p for b in rank_order(split, rank)[:batches] for p in b)
    return seen


def rank_order(split: Split, rank: int) -> list[list[int]]:
    """Rank ``rank``'s batches (lists of positions) in the order its DataLoader yields them."""
    batch = split.batch_size
    streams = []
    for worker in range(split.num_workers):
        read = positions(split.worker_ranges(rank, worker)).tolist()
        streams.append([read[i : i + batch] for i in range(0, len(read), batch)])
    out = []
    for turn in range(max(len(s) for s in streams)):
        out.extend(s[turn] for s in streams if turn < len(s))
    return out


def test_split_gives_every_rank_an_equal_share_and_resumes_exactly_on_any_world_size():
    rng = random.Random(0)
    for _ in range(2000):
        n, world = rng.randint(1, 50), rng.randint(1, 4)
        batch, workers, drop = rng.randint(1, 6), rng.randint(1, 3), rng.random() < 0.5
        window = rng.randint(1, 12)
        start = EpochState.start(0, 0, n, "windows").remaining
        split = Split(start, world, drop, batch, workers, window)
        orders = [rank_order(split, r) for r in range(world)]
        assert [len(o) for o in orders] == [split.batches] * world
        assert all(len(b) == batch for o in orders for b in o[:-1])  # one short batch at most
        everything = Counter(p for o in orders for b in o for p in b)
        shares = [total(split.rank_ranges(r)) for r in range(world)]
        assert shares == [split.per_rank] * world
        samples = Counter(p % n for p in everything.elements())
        if drop:
            assert max(samples.values(), default=1) == 1 and n - len(samples) < world * batch
        else:
            assert set(samples) == set(range(n)) and sum(samples.values()) - n < world
        k = rng.randint(0, split.batches)
        left = split.after(split.consumed(k))
        if k == split.batches:
            assert left == ()
            continue
        # Left: every position not yet read (with drop_last, the dropped ones too).
        read = Counter(p for o in orders for b in o[:k] for p in b)
        assert set(positions(left)) == set(positions(split.padded)) - set(read)
        # The same world and workers, given the turns: exactly the rest, in order.
        same = Split(left, world, drop, batch, workers, window, *split.progress(k))
        assert [rank_order(same, r) for r in range(world)] == [o[k:] for o in orders]
        k2 = rng.randint(0, same.batches - 1)  # and resumed again from the resumed run
        rest = same.after(same.consumed(k2))
        twice = Split(rest, world, drop, batch, workers, window, *same.progress(k2))
        assert [rank_order(twice, r) for r in range(world)] == [o[k + k2 :] for o in orders]
        # Elastic: another world size continues with what is left, nothing lost.
        again = Split(left, rng.randint(1, 4), drop, batch, rng.randint(1, 3), window)
        rest = simulate(again, again.batches)
        if not drop:
            covered = {p % n for p in read} | {p % n for p in rest}
            assert covered == set(range(n))


def test_block_order_permutes_within_windows_and_depends_only_on_seed_and_epoch():
    counts = (7, 7, 7, 4)
    order = BlockOrder(counts, seed=3, epoch=1, window=10)
    chunks = order.chunks(0, 25)
    assert chunks == [(0, 10), (10, 20), (20, 25)]
    got = [i for a, b in chunks for i in order.indices(a, b).tolist()]
    assert sorted(got) == list(range(25)) and got != list(range(25))
    assert got == [i for a, b in chunks for i in BlockOrder(counts, 3, 1, 10).indices(a, b)]
    other = BlockOrder(counts, 3, 2, 10)
    assert got != [i for a, b in chunks for i in other.indices(a, b).tolist()]
    # A chunk starting mid-window reads the same samples as the whole window did there.
    assert order.indices(13, 17).tolist() == got[13:17]
    # Stored order: chunks end at shard boundaries, indices are positions.
    stored = BlockOrder(counts, 3, 1, 0)
    assert stored.chunks(3, 25) == [(3, 7), (7, 14), (14, 21), (21, 25)]
    assert stored.indices(3, 7).tolist() == [3, 4, 5, 6]


def test_placement_prefers_explicit_then_environment(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert Placement.detect() == Placement(2, 4)
    assert Placement.detect(1, 3) == Placement(1, 3)
    assert Placement.for_loader(False, None, None) == Placement(0, 1)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert Placement.detect() == Placement(0, 1)
    with pytest.raises(ValueError, match="rank 3 is not in a world of size 3"):
        Placement.detect(3, 3)
    with pytest.raises(ValueError, match="both"):
        Placement.detect(1, None)


# --- make_loader in one process ----------------------------------------------------------------
@pytest.mark.parametrize("name", READERS)
@pytest.mark.parametrize("drop_last", [False, True], ids=["pad", "drop"])
def test_explicit_ranks_get_equal_batches_and_together_every_sample(roots, name, drop_last):
    world = 3
    loaders = [
        build(roots, name, rank=r, world_size=world, drop_last=drop_last, seed=4)
        for r in range(world)
    ]
    lens = [len(loader) for loader in loaders]
    assert lens == [4 if not drop_last else 3] * world  # 11 (padded) or 9 (3 batches) of 32
    per_rank = [digests(loader) for loader in loaders]
    assert [len(b) for b in per_rank] == lens
    seen = Counter(d for batches in per_rank for batch in batches for d in batch)
    if drop_last:
        assert max(seen.values()) == 1 and len(seen) == 27
    else:
        assert set(seen) == every_sample(roots[name]) and sum(seen.values()) == 33


@pytest.mark.parametrize("name", READERS)
@pytest.mark.parametrize("workers", [0, 2], ids=["main", "fork2"])
def test_resume_after_k_batches_yields_exactly_the_rest_in_the_same_order(roots, name, workers):
    kwargs: dict[str, Any] = {"seed": 9, "num_workers": workers, "batch_size": 5}
    if workers:
        kwargs["multiprocessing_context"] = "fork"
    loader = build(roots, name, **kwargs)
    loader.set_epoch(3)
    whole = digests(loader)
    assert len(whole) == len(loader) == 7 and loader.epoch == 4  # moved on by itself
    for k in (0, 1, 4):
        interrupted = build(roots, name, **kwargs)
        interrupted.set_epoch(3)
        assert take_batches(interrupted, k) == whole[:k]
        state = json.loads(json.dumps(interrupted.state_dict()))
        assert state["epoch"] == 3 and state["samples_consumed"] == 5 * k
        resumed = build(roots, name, **kwargs)
        resumed.load_state_dict(state)
        resumed.set_epoch(3)  # what a resumed training loop does: keeps the position
        assert len(resumed) == 7 - k
        assert digests(resumed) == whole[k:]
        assert resumed.state_dict()["epoch"] == 4


@pytest.mark.parametrize("name", ["pt", "stream"])
def test_a_loop_broken_off_continues_where_it_stopped(roots, name):
    loader = build(roots, name, seed=2, batch_size=4)
    whole = digests(loader)
    loader.set_epoch(0)  # back to epoch 0 (the finished pass moved the loader to 1)
    first = take_batches(loader, 3)
    assert first == whole[:3]
    assert digests(loader) == whole[3:]


def test_epochs_differ_and_repeat_for_the_same_seed(roots):
    for name in READERS:
        orders = [digests(build(roots, name, seed=1)) for _ in range(2)]
        assert orders[0] == orders[1]
        loader = build(roots, name, seed=1)
        epochs = [digests(loader) for _ in range(3)]  # advances by itself
        assert epochs[0] == orders[0]
        assert epochs[0] != epochs[1] != epochs[2], name


def test_load_state_dict_refuses_another_dataset_or_seed(roots):
    state = build(roots, "pt", seed=1).state_dict()
    with pytest.raises(ValueError, match="seed 1, this loader 2"):
        build(roots, "pt", seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="for 31 samples, this dataset has 32"):
        build(roots, "pt", seed=1).load_state_dict({**state, "num_samples": 31})
    with pytest.raises(ValueError, match="not an imgpack loader state"):
        build(roots, "pt").load_state_dict({"epoch": 1})


def test_make_loader_refuses_what_it_chooses_itself_and_a_missing_group(roots, monkeypatch):
    with pytest.raises(ValueError, match="sampler"):
        readers.make_loader(roots["pt"], 4, sampler=[0, 1])
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="distributed=True"):
        readers.make_loader(roots["pt"], 4, distributed=True)
    with pytest.raises(ValueError, match="wds datasets only"):
        readers.make_loader(roots["pt"], 4, stream=True)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert len(readers.make_loader(roots["pt"], 4)) == 4  # 16 of 32 on rank 1 of 2
    assert len(readers.make_loader(roots["pt"], 4, distributed=False)) == 8


# --- the stream in a plain DataLoader -----------------------------------------------------------
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_set_epoch_reaches_persistent_workers(roots, method):
    context = spawn_context() if method == "spawn" else method
    stream = readers.WdsStream(roots["stream"], shuffle_buffer=8, seed=0)
    loader = DataLoader(
        stream,
        batch_size=4,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=context,
        collate_fn=readers.collate,
    )
    epochs = []
    for epoch in range(3):
        stream.set_epoch(epoch)
        epochs.append(digests(loader))
    assert all(Counter(flat(e)) == Counter(flat(epochs[0])) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]
    fresh = readers.WdsStream(roots["stream"], shuffle_buffer=8, seed=0)
    fresh.set_epoch(2)
    again = DataLoader(
        fresh,
        batch_size=4,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=readers.collate,
    )
    assert digests(again) == epochs[2]


@pytest.mark.parametrize("fresh", [False, True], ids=["mid-epoch", "fresh"])
def test_running_persistent_workers_follow_a_fresh_state_and_refuse_another(roots, fresh):
    stream = readers.WdsStream(roots["stream"], shuffle_buffer=8)
    loader = DataLoader(
        stream, batch_size=4, num_workers=2, persistent_workers=True, multiprocessing_context="fork"
    )
    take_batches(loader, 1)
    other = readers.WdsStream(roots["stream"], shuffle_buffer=8)
    if fresh:
        other.set_epoch(3)
    else:
        next(iter(other))  # in this process: a state one sample into epoch 0
    stream.load_state_dict(other.state_dict())
    if not fresh:
        with pytest.raises(RuntimeError, match="persistent"):
            digests(loader)
        return
    again = DataLoader(other, batch_size=4, num_workers=2, multiprocessing_context="fork")
    assert digests(loader) == digests(again)


def test_stream_len_is_this_ranks_share(roots):
    assert len(readers.WdsStream(roots["stream"], rank=1, world_size=3)) == 11
    assert len(readers.WdsStream(roots["stream"], rank=1, world_size=3, drop_last=True)) == 10
    assert len(readers.WdsStream(roots["stream"])) == N


# --- paths ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", READERS)
def test_a_relative_root_keeps_working_after_chdir(roots, name, monkeypatch, tmp_path):
    root = roots[name]
    monkeypatch.chdir(root.parent)
    loader = build({name: Path(root.name)}, name, seed=0)
    monkeypatch.chdir(tmp_path)
    assert {d for batch in digests(loader) for d in batch} == every_sample(root)


# --- StatefulDataLoader -------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2], ids=["main", "fork2"])
def test_epoch_sampler_resumes_under_statefuldataloader(roots, workers):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    ds = readers.open_dataset(roots["lmdb"])

    def make() -> Any:
        sampler = readers.EpochSampler(ds, seed=5, batch_size=4, rank=0, world_size=2)
        sampler.set_epoch(1)
        return stateful.StatefulDataLoader(
            ds,
            batch_size=4,
            sampler=sampler,
            num_workers=workers,
            collate_fn=readers.collate,
            multiprocessing_context="fork" if workers else None,
        )

    whole = digests(make())
    assert len(whole) == 4  # 16 of 32 on rank 0 of 2
    loader = make()
    first = take_batches(loader, 1)
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert first + digests(resumed) == whole


@pytest.mark.parametrize("workers", [0, 2], ids=["main", "fork2"])
def test_stream_resumes_under_statefuldataloader(roots, workers):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make() -> Any:
        stream = readers.WdsStream(roots["stream"], shuffle_buffer=8, seed=5, batch_size=4)
        stream.set_epoch(2)
        return stateful.StatefulDataLoader(
            stream,
            batch_size=4,
            num_workers=workers,
            collate_fn=readers.collate,
            multiprocessing_context="fork" if workers else None,
        )

    whole = digests(make())
    assert len(whole) == 8
    for k in (1, 3):
        loader = make()
        first = take_batches(loader, k)
        state = loader.state_dict()
        resumed = make()
        resumed.load_state_dict(state)
        assert first + digests(resumed) == whole


# --- subsets -------------------------------------------------------------------------------------
SUBSET = [30, 1, 2, 3, 5, 8, 13, 21, 17, 11, 0]  # 11 of the 32, out of order


def fork_workers(workers: int) -> dict[str, Any]:
    return {"num_workers": workers, **({"multiprocessing_context": "fork"} if workers else {})}


@pytest.mark.parametrize("how", ["indices", "Subset"])
def test_a_subset_is_read_exactly_every_epoch_across_ranks(roots, how):
    ds = readers.open_dataset(roots["lmdb"])

    def make(rank: int) -> readers.Loader:
        kwargs = {"seed": 3, "rank": rank, "world_size": 2, **fork_workers(2)}
        if how == "indices":
            return readers.make_loader(roots["lmdb"], 3, indices=SUBSET, **kwargs)
        return readers.make_loader(Subset(ds, SUBSET), 3, **kwargs)

    loaders = [make(rank) for rank in range(2)]
    assert [len(loader) for loader in loaders] == [2, 2]  # 6 of 11 each, one padding repeat
    subset = {digest(*ds[i]) for i in SUBSET}
    epochs = [[digests(loader) for loader in loaders] for _ in range(2)]
    for per_rank in epochs:
        seen = Counter(d for batches in per_rank for d in flat(batches))
        assert set(seen) == subset and sum(seen.values()) == 12
    assert epochs[0] != epochs[1]  # a new order of the same samples


def test_random_split_parts_are_read_disjointly_and_together_completely(roots):
    ds = readers.open_dataset(roots["pt"])
    parts = random_split(ds, [24, 8], generator=torch.Generator().manual_seed(0))
    seen = [Counter(flat(digests(readers.make_loader(p, 4, **fork_workers(2))))) for p in parts]
    assert [sum(c.values()) for c in seen] == [24, 8]
    assert not set(seen[0]) & set(seen[1])
    assert set(seen[0]) | set(seen[1]) == every_sample(roots["pt"])


def test_nested_subsets_and_indices_compose(roots):
    ds = readers.open_dataset(roots["hdf5"])
    outer = Subset(Subset(ds, list(range(4, 24))), [19, 0, 5, 7])  # samples 23, 4, 9, 11
    loader = readers.make_loader(outer, 2, indices=torch.tensor([3, 0]), shuffle=False)
    assert flat(digests(loader)) == [digest(*ds[11]), digest(*ds[23])]


@pytest.mark.parametrize("workers", [0, 2], ids=["main", "fork2"])
def test_a_subset_resumes_mid_epoch_exactly_and_on_another_world_size(roots, workers):
    ds = readers.open_dataset(roots["pt"])

    def make(rank: int, world: int) -> readers.Loader:
        subset = Subset(ds, SUBSET)
        return readers.make_loader(
            subset, 2, seed=8, rank=rank, world_size=world, **fork_workers(workers)
        )

    whole = [digests(make(rank, 2)) for rank in range(2)]  # 6 each: 3 batches
    interrupted = [make(rank, 2) for rank in range(2)]
    first = [take_batches(loader, 1) for loader in interrupted]
    assert first == [batches[:1] for batches in whole]
    state = json.loads(json.dumps(interrupted[0].state_dict()))
    assert state == interrupted[1].state_dict()
    assert state["num_samples"] == 11 and state["subset"]
    assert state["samples_consumed"] == 3  # 11 - 8 positions left (one of them padding)
    for rank in range(2):  # the same world size: exactly the rest
        resumed = make(rank, 2)
        resumed.load_state_dict(state)
        assert digests(resumed) == whole[rank][1:]
    rest = []
    for rank in range(3):  # three ranks: the rest of the subset, and nothing from outside it
        resumed = make(rank, 3)
        resumed.load_state_dict(state)
        rest.extend(flat(digests(resumed)))
    seen = Counter(flat(first[0]) + flat(first[1]) + rest)
    assert set(seen) == {digest(*ds[i]) for i in SUBSET}
    assert sum(seen.values()) == 13  # 1 padding repeat of the 2-rank split, 1 of the 3-rank one


def test_a_state_saved_over_another_subset_is_refused(roots):
    ds = readers.open_dataset(roots["pt"])
    state = readers.make_loader(Subset(ds, SUBSET), 2).state_dict()
    other = Subset(ds, list(range(11)))
    with pytest.raises(ValueError, match=r"loader state is for the subset .*, this loader reads"):
        readers.make_loader(other, 2).load_state_dict(state)
    reversed_all = Subset(ds, list(range(N))[::-1])  # as many samples as the whole dataset
    whole = readers.make_loader(roots["pt"], 2).state_dict()
    with pytest.raises(ValueError, match="for the whole dataset, this loader reads the subset"):
        readers.make_loader(reversed_all, 2).load_state_dict(whole)


def test_bad_indices_and_subsets_are_refused_naming_the_problem(roots):
    root = roots["pt"]
    with pytest.raises(ValueError, match=r"33 .*outside 0\.\.31"):
        readers.make_loader(root, 4, indices=[0, 33])
    with pytest.raises(ValueError, match=r"-1 .*outside"):
        readers.make_loader(root, 4, indices=[-1])
    with pytest.raises(ValueError, match="integers"):
        readers.make_loader(root, 4, indices=[0.5])
    with pytest.raises(ValueError, match="boolean"):
        readers.make_loader(root, 4, indices=np.ones(N, bool))
    with pytest.raises(ValueError, match="no sample"):
        readers.make_loader(root, 4, indices=[])
    with pytest.raises(ValueError, match="map-style"):
        readers.make_loader(roots["stream"], 4, stream=True, indices=[1])
    with pytest.raises(TypeError, match="imgpack dataset"):
        readers.make_loader(Subset(list(range(5)), [1]), 4)


# --- drop_last with too few samples --------------------------------------------------------------
@pytest.mark.parametrize("name", ["pt", "stream"])
def test_drop_last_refuses_an_epoch_without_a_full_batch_per_rank(roots, name):
    with pytest.raises(ValueError, match=r"32 samples .* 5 ranks .* batch of 8"):
        build(roots, name, batch_size=8, drop_last=True, rank=0, world_size=5)
    exact = build(roots, name, batch_size=8, drop_last=True, rank=3, world_size=4)
    assert len(exact) == 1 and len(flat(digests(exact))) == 8  # just enough: one batch each
    assert len(build(roots, name, batch_size=8, rank=0, world_size=5)) == 1  # padded, not dropped


def test_epoch_sampler_refuses_an_empty_drop_last_epoch_too(roots):
    with pytest.raises(ValueError, match="drop_last"):
        readers.EpochSampler(32, drop_last=True, batch_size=8, rank=0, world_size=5)
    ds = readers.open_dataset(roots["pt"])
    with pytest.raises(ValueError, match="10 samples"):  # counted in the subset
        readers.make_loader(Subset(ds, range(10)), 4, drop_last=True, rank=0, world_size=3)
    for batch_size in (8, None):  # a WdsStream used without make_loader
        with pytest.raises(ValueError, match=r"32 samples .* 40 ranks"):
            readers.WdsStream(
                roots["wds"], batch_size=batch_size, drop_last=True, rank=0, world_size=40
            )


def test_a_worker_error_stops_the_workers_at_once(converted, tmp_path: Path) -> None:
    # torch's iterator, held by the error's traceback, would stop its workers only when a
    # later garbage collection found it, 5 s late; the loader drops it as the error passes.
    root = copy_dataset(converted("pt", "jpeg"), tmp_path)
    flip_middle_byte_of_sample(root, 5)
    loader = readers.make_loader(root, 4, shuffle=False, num_workers=1, crop=readers.CenterCrop(32))
    with pytest.raises(readers.DatasetError, match=r"shard-000000\.pt\[5\]"):
        for _ in loader:
            pass
    assert multiprocessing.active_children() == []
