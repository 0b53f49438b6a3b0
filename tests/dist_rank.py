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
import datetime
import hashlib
import json
import os
import sys
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


class Collectives:
    """The rank's all-reduces, on tensors that outlive the process group.

    A gloo thread that drops the last reference to a Python tensor takes the GIL, creating
    a Python thread state under CPython's runtime lock; a DataLoader worker forked at that
    moment inherits the lock held and deadlocks before it starts (CPython < 3.12 without
    gh-112275's fix, our 3.11.7; seen here as a rank waiting for its worker until the other
    rank's all-reduce timed out). Tensors kept alive here leave gloo nothing to drop.
    """

    def __init__(self) -> None:
        self._step = torch.ones(1)
        self._total = torch.zeros(1, dtype=torch.int64)

    def step(self) -> None:
        """The all_reduce DDP does per step."""
        self._step.fill_(1)
        dist.all_reduce(self._step)

    def sum(self, value: int) -> int:
        self._total.fill_(value)
        dist.all_reduce(self._total)
        return int(self._total)


def read_batches(
    loader: Any, collectives: Collectives, limit: int | None = None
) -> list[list[str]]:
    """Digests of each batch, with the all_reduce DDP does per step."""
    out = []
    for images, labels in loader:
        collectives.step()
        out.append([digest(i, int(y)) for i, y in zip(images, labels, strict=True)])
        if limit is not None and len(out) == limit:
            break
    return out


def run_reader(
    spec: dict[str, Any], config: dict[str, Any], collectives: Collectives
) -> dict[str, Any]:
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
        result["epochs"].append(read_batches(loader, collectives))
    count = sum(len(b) for batches in result["epochs"] for b in batches)
    result["total_samples_all_ranks"] = collectives.sum(count)

    # Interrupted after k batches of the last epoch, resumed by a new loader on this world.
    last, k = config["epochs"] - 1, config["resume_after"]
    os.chdir(cwd)
    first, second = build(), build()
    os.chdir("/")
    first.set_epoch(last)
    result["before_resume"] = read_batches(first, collectives, limit=k)
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores
    second.load_state_dict(state)
    second.set_epoch(last)  # a resumed loop calls it too: the loaded position is kept
    result["len_after_resume"] = len(second)
    result["after_resume"] = read_batches(second, collectives)
    result["state"] = state

    # Resume a state saved by a run of another world size.
    if spec.get("load_state"):
        os.chdir(cwd)
        third = build()
        os.chdir("/")
        third.load_state_dict(json.loads(Path(spec["load_state"]).read_text()))
        result["len_loaded"] = len(third)
        result["loaded"] = read_batches(third, collectives)
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
    collectives = Collectives()  # alive until the group's threads are joined
    try:
        os.chdir(config["cwd"])
        results = {s["name"]: run_reader(s, config, collectives) for s in config["readers"]}
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
