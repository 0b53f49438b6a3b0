"""Real multi-process training runs: gloo process groups of 2 and 3 ranks, started by
``torchrun`` (environment) and by ``torch.multiprocessing.spawn`` (no environment), with
DataLoader workers started by ``fork`` and ``spawn``, persistent and not, for every format
and for the stream. Each rank is ``tests/dist_rank.py``; these tests check what the ranks
wrote: exact epochs, equal batch counts, no hang, new orders per epoch, resumption on the
same and on another world size, and nothing left running once the group is destroyed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import readers
from tests.conftest import ROOT
from tests.dist_rank import digest

BATCH = 3
EPOCHS = 2
RESUME_AFTER = 2  # batches of the last epoch read before the "preemption"

pytestmark = [
    pytest.mark.torchrun,
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]


@pytest.fixture(scope="module")
def datasets(converted) -> dict[str, dict[str, Any]]:
    """One dataset per reader: one shard (fewer than ranks x workers), several shards,
    drop_last, map-style wds and the stream over the same shuffled tars."""
    wds = converted("wds", "raw-fixed", shard_size=4, shuffle=True, seed=1)
    return {
        "pt": {"root": converted("pt", "raw-fixed")},
        "hdf5": {"root": converted("hdf5", "raw-fixed", shard_size=10), "drop_last": True},
        "lmdb": {"root": converted("lmdb", "raw-fixed")},
        "wds": {"root": wds},
        "stream": {"root": wds, "stream": True, "shuffle_buffer": 8},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    tmp: Path,
    datasets: dict[str, dict[str, Any]],
    names: list[str],
    *,
    world: int,
    how: str,
    context: str,
    persistent: bool,
    load_states: dict[str, Path] | None = None,
) -> list[dict[str, Any]]:
    """Run tests/dist_rank.py on ``world`` ranks; return what each rank wrote."""
    cwd = Path(os.path.commonpath([str(d["root"]) for d in datasets.values()]))
    specs = []
    for name in names:
        spec = {k: v for k, v in datasets[name].items() if k != "root"}
        spec.update(name=name, path=os.path.relpath(datasets[name]["root"], cwd))
        if load_states and name in load_states:
            spec["load_state"] = str(load_states[name])
        specs.append(spec)
    out = tmp / f"{how}-{world}"
    out.mkdir()
    config = {
        "cwd": str(cwd),
        "out": str(out),
        "readers": specs,
        "batch_size": BATCH,
        "seed": 7,
        "epochs": EPOCHS,
        "resume_after": RESUME_AFTER,
        "workers": 2,
        "context": context,
        "persistent": persistent,
    }
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    module = ["-m", "tests.dist_rank", str(out / "config.json")]
    if how == "torchrun":
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={world}",
            *module,
        ]
    else:
        config["init_method"] = f"tcp://127.0.0.1:{free_port()}"
        command = [sys.executable, *module, "--spawn", str(world)]
    (out / "config.json").write_text(json.dumps(config))
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]


def expected_digests(root: Path) -> list[str]:
    ds = readers.open_dataset(root)
    return [digest(*ds[i]) for i in range(len(ds))]


def check_epoch(per_rank: list[list[list[str]]], everything: list[str], drop_last: bool):
    """Across ranks: every sample once, or the documented drop or pad."""
    world = len(per_rank)
    seen = Counter(d for batches in per_rank for batch in batches for d in batch)
    assert set(seen) <= set(everything)
    if drop_last:
        assert max(seen.values()) == 1
        assert len(everything) - len(seen) < world * BATCH  # a remainder and short batches
    else:
        assert set(seen) == set(everything)
        assert sum(seen.values()) - len(everything) < world  # padding repeats < world


def check_run(ranks: list[dict[str, Any]], datasets: dict[str, dict[str, Any]]) -> None:
    world = len(ranks)
    assert all(r["world_size"] == world for r in ranks)
    # destroy_process_group joined gloo's threads; no decode thread or DataLoader worker is
    # left for interpreter finalization to kill (docs/DISTRIBUTED.md, "Shut down cleanly")
    nothing = {"native_threads": [], "python_threads": [], "children": []}
    assert [r["after_shutdown"] for r in ranks] == [nothing] * world
    for name in ranks[0]["readers"]:
        results = [r["readers"][name] for r in ranks]
        everything = expected_digests(datasets[name]["root"])
        drop_last = datasets[name].get("drop_last", False)
        for epoch in range(EPOCHS):
            batches = [len(r["epochs"][epoch]) for r in results]
            lens = [r["lens"][epoch] for r in results]
            assert batches == lens == [lens[0]] * world, (name, epoch, batches, lens)
            check_epoch([r["epochs"][epoch] for r in results], everything, drop_last)
        yielded = sum(len(b) for r in results for epoch in r["epochs"] for b in epoch)
        assert all(r["total_samples_all_ranks"] == yielded for r in results)
        for r in results:
            assert r["epochs"][0] != r["epochs"][1], f"{name}: the same order in two epochs"
            # Same seed and epoch: the same order; resumed: exactly the rest of it.
            assert r["before_resume"] == r["epochs"][-1][:RESUME_AFTER]
            assert r["after_resume"] == r["epochs"][-1][RESUME_AFTER:]
            assert r["len_after_resume"] == r["lens"][-1] - RESUME_AFTER
        assert all(r["state"] == results[0]["state"] for r in results), "one global state"


def check_elastic(
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
    datasets: dict[str, dict[str, Any]],
) -> None:
    """A state saved by ``before`` (one world size) resumed by ``after`` (another): what
    the first run consumed and the second yields is the whole epoch, nothing lost."""
    for name in after[0]["readers"]:
        everything = expected_digests(datasets[name]["root"])
        consumed = [b for r in before for b in r["readers"][name]["before_resume"]]
        loaded = [r["readers"][name]["loaded"] for r in after]
        lens = [r["readers"][name]["len_loaded"] for r in after]
        assert [len(batches) for batches in loaded] == lens == [lens[0]] * len(after)
        seen = Counter(d for batch in consumed for d in batch)
        seen.update(d for batches in loaded for batch in batches for d in batch)
        if datasets[name].get("drop_last"):
            assert max(seen.values()) == 1, name
            assert len(everything) - len(seen) < (len(before) + len(after)) * BATCH
        else:
            assert set(seen) == set(everything), name
            assert sum(seen.values()) - len(everything) < len(before) + len(after), name


def save_states(ranks: list[dict[str, Any]], tmp: Path) -> dict[str, Path]:
    paths = {}
    for name, result in ranks[0]["readers"].items():
        paths[name] = tmp / f"state-{name}-{len(ranks)}.json"
        paths[name].write_text(json.dumps(result["state"]))
    return paths


@pytest.fixture(scope="module")
def two_ranks_torchrun(datasets, tmp_path_factory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("dist")
    return launch(
        tmp, datasets, list(datasets), world=2, how="torchrun", context="fork", persistent=False
    )


@pytest.fixture(scope="module")
def three_ranks_spawn(datasets, two_ranks_torchrun, tmp_path_factory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("dist")
    return launch(
        tmp,
        datasets,
        list(datasets),
        world=3,
        how="mp.spawn",
        context="fork",
        persistent=True,
        load_states=save_states(two_ranks_torchrun, tmp),
    )


@pytest.fixture(scope="module")
def two_ranks_spawn_workers(datasets, three_ranks_spawn, tmp_path_factory):
    """mp.spawn, no environment, workers started by spawn: a worker cannot see its rank."""
    tmp = tmp_path_factory.mktemp("dist")
    return launch(
        tmp,
        datasets,
        ["stream"],  # map-style readers are placed by the sampler, in the training process
        world=2,
        how="mp.spawn",
        context="spawn",
        persistent=True,
        load_states=save_states(three_ranks_spawn, tmp),
    )


def test_torchrun_two_ranks_fork_workers_read_exact_epochs_and_resume(two_ranks_torchrun, datasets):
    check_run(two_ranks_torchrun, datasets)


def test_mp_spawn_three_ranks_persistent_workers_read_exact_epochs_and_resume(
    three_ranks_spawn, datasets
):
    check_run(three_ranks_spawn, datasets)


def test_mp_spawn_with_spawned_workers_splits_by_the_training_process_rank(
    two_ranks_spawn_workers, datasets
):
    check_run(two_ranks_spawn_workers, datasets)


def test_state_from_two_ranks_resumes_on_three(two_ranks_torchrun, three_ranks_spawn, datasets):
    check_elastic(two_ranks_torchrun, three_ranks_spawn, datasets)


def test_state_from_three_ranks_resumes_on_two(
    three_ranks_spawn, two_ranks_spawn_workers, datasets
):
    check_elastic(three_ranks_spawn, two_ranks_spawn_workers, datasets)
