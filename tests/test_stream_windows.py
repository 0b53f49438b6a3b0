"""WdsStream with several DataLoader workers over several read windows: each worker reads
one contiguous part of its rank's slice, cut where a read window starts (one round a
window from object storage), the real DataLoader yields exactly the order the plan says,
and an epoch interrupted at any batch resumes to exactly the rest (same world and
workers) or to every sample once (another).

The request count against a real S3 server is in tests/test_object_storage.py.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

import readers
from convert import ConvertOptions, convert_folder
from readers.epochs.order import BlockOrder
from readers.epochs.ranges import positions
from readers.epochs.split import Split
from tests.dist_rank import digest

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

N = 2403  # three read windows of 1,000 and a short last batch of 3
BATCH, BUFFER, SEED = 8, 250, 4


@pytest.fixture(scope="module")
def tiles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("tiles")
    for i in range(N):
        folder = source / f"class{i % 3}"
        folder.mkdir(exist_ok=True)
        Image.new("RGB", (8, 8), (i % 256, i // 256, 9)).save(folder / f"{i:05d}.png")
    dst = tmp_path_factory.mktemp("wds") / "dst"
    # raw pixels: what is tested is the dealing, and a read then decodes nothing
    options = ConvertOptions("wds", encoding="raw", shard_size=300, shuffle=True)
    convert_folder(source, dst, options, workers=1, progress=False)
    return dst


@pytest.fixture(scope="module")
def by_index(tiles: Path) -> list[str]:
    ds = readers.open_dataset(tiles)
    return [digest(*ds[i]) for i in range(len(ds))]


@pytest.fixture(scope="module")
def whole(tiles: Path) -> list[list[str]]:
    """The batches of an uninterrupted epoch with two workers (deterministic: read once for
    the tests that compare with it)."""
    return batches_of(stream(tiles, 2))


def stream(tiles: Path, workers: int, rank: int = 0, world: int = 1) -> readers.Loader:
    return readers.make_loader(
        tiles,
        BATCH,
        stream=True,
        shuffle_buffer=BUFFER,
        seed=SEED,
        num_workers=workers,
        rank=rank,
        world_size=world,
        **({"multiprocessing_context": "fork"} if workers else {}),
    )


def batches_of(loader: Any, limit: int | None = None) -> list[list[str]]:
    out: list[list[str]] = []
    for images, labels in loader:
        out.append([digest(x, int(y)) for x, y in zip(images, labels, strict=True)])
        if len(out) == limit:
            break
    return out


def planned(tiles: Path, by_index: list[str], workers: int, rank: int, world: int) -> list:
    """The rank's batches as the plan deals them: each worker's part, one batch of each
    worker that has one left in turn, positions mapped through the stream's order."""
    manifest = readers.load_manifest(tiles)
    order = BlockOrder(tuple(s.samples for s in manifest.shards), SEED, 0, BUFFER)
    split = Split(((0, N),), world, False, BATCH, workers, 1000)
    streams = []
    for worker in range(workers):
        read = positions(split.worker_ranges(rank, worker)) % N
        digests = [by_index[int(order.indices(int(p), int(p) + 1)[0])] for p in read]
        streams.append([digests[i : i + BATCH] for i in range(0, len(digests), BATCH)])
    return [s[turn] for turn in range(max(map(len, streams))) for s in streams if turn < len(s)]


def test_two_workers_each_read_whole_windows_and_the_dataloader_yields_the_plan(
    tiles, by_index, whole
):
    split = Split(((0, N),), 1, False, BATCH, 2, 1000)
    assert split.part_sizes(0) == (125, 176)  # cut where window 1 starts; the short batch last
    assert [split.worker_ranges(0, w) for w in range(2)] == [((0, 1000),), ((1000, N),)]
    got = whole
    assert got == planned(tiles, by_index, 2, 0, 1)
    assert [len(b) for b in got[:-1]] == [BATCH] * (len(got) - 1) and len(got[-1]) == 3
    assert sorted(d for b in got for d in b) == sorted(by_index)
    one = batches_of(stream(tiles, 0))
    assert one == planned(tiles, by_index, 1, 0, 1)  # one worker: the rank's slice in order
    assert one != got


@pytest.mark.parametrize("k", [1, 2, 125, 249, 250, 251, 300])
def test_two_workers_resume_after_any_batch_to_exactly_the_rest(tiles, whole, k):
    interrupted = stream(tiles, 2)
    assert batches_of(interrupted, k) == whole[:k]
    state = json.loads(json.dumps(interrupted.state_dict()))
    assert state["samples_consumed"] == BATCH * k
    resumed = stream(tiles, 2)
    resumed.load_state_dict(state)
    assert len(resumed) == len(whole) - k
    assert batches_of(resumed) == whole[k:]


def test_three_ranks_with_two_workers_resume_on_two_ranks_and_one_worker(tiles, by_index):
    epochs = [batches_of(stream(tiles, 2, rank, 3)) for rank in range(3)]
    assert [len(e) for e in epochs] == [101] * 3  # 801 a rank, the last batch of 1
    assert epochs == [planned(tiles, by_index, 2, rank, 3) for rank in range(3)]
    seen = Counter(d for e in epochs for b in e for d in b)
    assert set(seen) == set(by_index) and sum(seen.values()) == N  # 3 x 801: no padding
    interrupted = [stream(tiles, 2, rank, 3) for rank in range(3)]
    first = [batches_of(loader, 60) for loader in interrupted]
    state = interrupted[0].state_dict()
    assert all(loader.state_dict() == state for loader in interrupted)
    rest = []
    for rank in range(2):
        resumed = stream(tiles, 0, rank, 2)
        resumed.load_state_dict(state)
        rest.extend(batches_of(resumed))
    seen = Counter(d for part in (*first, rest) for b in part for d in b)
    assert set(seen) == set(by_index) and sum(seen.values()) - N < 2


@pytest.mark.parametrize("k", [3, 130])
def test_two_workers_resume_under_statefuldataloader(tiles, k):
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make() -> Any:
        ds = readers.WdsStream(tiles, shuffle_buffer=BUFFER, seed=SEED, batch_size=BATCH)
        ds.set_epoch(1)
        return stateful.StatefulDataLoader(
            ds,
            batch_size=BATCH,
            num_workers=2,
            collate_fn=readers.collate,
            multiprocessing_context="fork",
        )

    whole = batches_of(make())
    loader = make()
    first = batches_of(loader, k)
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert first + batches_of(resumed) == whole
