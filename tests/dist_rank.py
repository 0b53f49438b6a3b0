"""One rank of a real ``torch.distributed`` (gloo) run, for tests/test_distributed.py.

Launched either by ``torchrun`` (placement in ``RANK``/``WORLD_SIZE``) or as
``python -m tests.dist_rank --spawn N`` (``torch.multiprocessing.spawn``, a TCP store and
no environment at all, so DataLoader workers cannot guess their rank). Each rank reads
every configured dataset through ``readers.make_loader`` from a *relative* path after a
``chdir``, does one ``all_reduce`` per batch (as DDP does), and writes per epoch the
sample digests of each batch, ``len(loader)``, the resume results, and what still runs in
the process once the group is destroyed (nothing should), to ``OUT/rank-R.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import readers
from tests.at_exit import still_running

TIMEOUT = datetime.timedelta(seconds=60)


def digest(image: torch.Tensor, label: int) -> str:
    data = image.contiguous().numpy().tobytes() + int(label).to_bytes(8, "little")
    return hashlib.sha1(data).hexdigest()[:16]


def keep_gloo_thread_states() -> None:
    """Give each of gloo's worker threads a Python thread state that it keeps.

    gloo's threads take the GIL whenever they drop a tensor Python also holds (after every
    all_reduce of one). A thread without a Python thread state creates one each time, under
    CPython's runtime lock, and a DataLoader worker forked at that instant inherits the lock
    held and hangs before it starts (CPython gh-112275: fixed in 3.12 and later 3.11
    releases, not in our 3.11.7). This test hung that way about once in 50 runs: gdb showed the
    worker waiting for the lock inside ``os.fork()`` and the gloo threads in
    ``PyThreadState_New``. A gloo future's callback runs on the gloo thread that completed
    it, with the GIL: a ``PyGILState_Ensure`` there, never released, keeps that thread's
    state. A collective: every rank calls it, right after ``init_process_group``.
    """
    kept: set[int] = set()

    def keep(_: torch.futures.Future) -> None:
        if threading.get_native_id() not in kept:
            ctypes.pythonapi.PyGILState_Ensure()
            kept.add(threading.get_native_id())

    tensor = torch.ones(1)
    dist.all_reduce(tensor)  # gloo's worker threads exist, and are named, from here on
    tasks = Path("/proc/self/task")
    gloo = {int(t.name) for t in tasks.iterdir() if (t / "comm").read_text() == "pt_gloo_runloop\n"}
    done = torch.zeros(1)
    while not done.item():
        for _ in range(8):
            work = dist.all_reduce(tensor, async_op=True)
            work.get_future().then(keep)
            work.wait()
        done.fill_(float(gloo <= kept))
        dist.all_reduce(done, op=dist.ReduceOp.MIN)  # every rank loops as often


def read_batches(loader: Any, limit: int | None = None) -> list[list[str]]:
    """Digests of each batch, with the all_reduce DDP does per step."""
    out = []
    for images, labels in loader:
        step = torch.ones(1)
        dist.all_reduce(step)
        out.append([digest(i, int(y)) for i, y in zip(images, labels, strict=True)])
        if limit is not None and len(out) == limit:
            break
    return out


def run_reader(spec: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    def build() -> readers.Loader:
        kwargs: dict[str, Any] = {}
        if config["workers"]:
            kwargs = {
                "multiprocessing_context": config["context"],
                "persistent_workers": config["persistent"],
            }
        return readers.make_loader(
            spec["path"],  # relative: resolved when the dataset is opened
            config["batch_size"],
            seed=config["seed"],
            num_workers=config["workers"],
            stream=spec.get("stream", False),
            shuffle_buffer=spec.get("shuffle_buffer", 1000),
            drop_last=spec.get("drop_last", False),
            **kwargs,
        )

    cwd = os.getcwd()
    loader = build()
    os.chdir("/")  # as Hydra does between building and training
    result: dict[str, Any] = {"epochs": [], "lens": []}
    for epoch in range(config["epochs"]):
        loader.set_epoch(epoch)
        result["lens"].append(len(loader))
        result["epochs"].append(read_batches(loader))
    count = torch.tensor([sum(len(b) for batches in result["epochs"] for b in batches)])
    dist.all_reduce(count)
    result["total_samples_all_ranks"] = int(count)

    # Interrupted after k batches of the last epoch, resumed by a new loader on this world.
    last, k = config["epochs"] - 1, config["resume_after"]
    os.chdir(cwd)
    first, second = build(), build()
    os.chdir("/")
    first.set_epoch(last)
    result["before_resume"] = read_batches(first, limit=k)
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores
    second.load_state_dict(state)
    second.set_epoch(last)  # a resumed loop calls it too: the loaded position is kept
    result["len_after_resume"] = len(second)
    result["after_resume"] = read_batches(second)
    result["state"] = state

    # Resume a state saved by a run of another world size.
    if spec.get("load_state"):
        os.chdir(cwd)
        third = build()
        os.chdir("/")
        third.load_state_dict(json.loads(Path(spec["load_state"]).read_text()))
        result["len_loaded"] = len(third)
        result["loaded"] = read_batches(third)
    os.chdir(cwd)
    return result


def run_rank(rank: int, world_size: int, config: dict[str, Any]) -> None:
    if config.get("init_method"):  # mp.spawn: no environment, a TCP store
        dist.init_process_group(
            "gloo",
            init_method=config["init_method"],
            rank=rank,
            world_size=world_size,
            timeout=TIMEOUT,
        )
    else:
        dist.init_process_group("gloo", timeout=TIMEOUT)
    keep_gloo_thread_states()
    try:
        os.chdir(config["cwd"])
        results = {spec["name"]: run_reader(spec, config) for spec in config["readers"]}
        world = dist.get_world_size()
    finally:
        dist.destroy_process_group()  # the loaders are gone: this releases the group's last
        # reference and joins its threads (docs/DISTRIBUTED.md, "Shut down cleanly")
    out = Path(config["out"]) / f"rank-{rank}.json"
    report = {"world_size": world, "readers": results, "after_shutdown": still_running()}
    out.write_text(json.dumps(report))


def _spawned(local_rank: int, world_size: int, config: dict[str, Any]) -> None:
    run_rank(local_rank, world_size, config)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--spawn", type=int, default=0, help="world size for mp.spawn")
    args = parser.parse_args()
    config = json.loads(Path(args.config).read_text())
    if args.spawn:
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(name, None)
        torch.multiprocessing.spawn(_spawned, args=(args.spawn, config), nprocs=args.spawn)
    else:
        run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), config)


if __name__ == "__main__":
    sys.exit(main())
