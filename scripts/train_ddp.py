"""A complete multi-GPU (or multi-process CPU) training loop on an imgpack dataset, with
checkpoints that resume mid-epoch: the example docs/DISTRIBUTED.md walks through.

    torchrun --nproc-per-node 2 scripts/train_ddp.py DATASET --epochs 3 --checkpoint ckpt.pt

Run the same command again after a crash or preemption: it continues from the last
checkpoint, in the middle of its epoch, on any number of processes. ``--stop-after N``
stops after N steps, to try exactly that.

It shuts down as docs/DISTRIBUTED.md ("Shut down cleanly") explains: ``destroy_process_group()``
must drop the group's last reference, so that gloo's worker threads are joined while the
interpreter is alive; a worker still dropping the last gradient all-reduce when the
interpreter finalizes aborts the process (``terminate called without an active exception``).
So the DDP model (its reducer holds the group) is gone first, ``train`` having returned, and
``torch.distributed.nn`` is imported before the group exists: imported later (DDP does it),
its functions keep the default group as default arguments for good.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.nn  # before init_process_group: see "It shuts down" above
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import readers


def main() -> None:
    args = parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        train(args)  # returns with the DDP model, its reducer and their group references gone
    finally:
        dist.destroy_process_group()  # the group's last reference: joins its threads


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="an imgpack dataset folder (any format)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8, help="per process")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per process")
    parser.add_argument("--stream", action="store_true", help="WdsStream (wds datasets)")
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoint.pt"))
    parser.add_argument("--every", type=int, default=2, help="checkpoint every N steps")
    parser.add_argument("--stop-after", type=int, help="stop after N steps (a preemption)")
    return parser.parse_args()


def train(args: argparse.Namespace) -> None:
    """Train on every rank until ``--epochs`` (or ``--stop-after``); all state stays local."""
    cuda = torch.cuda.is_available()
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else None

    # Everything about splitting, shuffling and resuming is in the loader.
    loader = readers.make_loader(
        args.dataset,
        args.batch_size,
        seed=0,
        num_workers=args.workers,
        stream=args.stream,
        persistent_workers=args.workers > 0,
        pin_memory=cuda,
    )
    classes = len(loader.dataset.classes)
    model = nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(3 * 64, classes))
    model = DistributedDataParallel(model.to(device) if cuda else model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    step = 0
    if args.checkpoint.exists():  # every rank reads the same checkpoint
        saved = torch.load(args.checkpoint, weights_only=True)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(json.loads(saved["loader"]))
        step = saved["step"]
        if rank == 0:
            done = json.loads(saved["loader"])["samples_consumed"]
            print(f"resumed at step {step}, epoch {loader.epoch}, {done} samples into it")

    for epoch in range(loader.epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a resumed position of this epoch
        seen = torch.zeros(1)
        for images, labels in loader:
            if cuda:
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
            x = images.float().div_(255)  # uint8 travels; normalise where the model runs
            loss = nn.functional.cross_entropy(model(x), labels)
            optimizer.zero_grad()
            loss.backward()  # DDP all-reduces the gradients: every rank must take this step
            optimizer.step()
            step += 1
            seen += len(labels)
            if step % args.every == 0 and rank == 0:
                save(args.checkpoint, model, optimizer, loader, step)
            if args.stop_after is not None and step >= args.stop_after:
                return
        dist.all_reduce(seen)
        if rank == 0:
            print(f"epoch {epoch}: {int(seen.item())} samples on {dist.get_world_size()} ranks")
    if rank == 0:
        save(args.checkpoint, model, optimizer, loader, step)


def save(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, loader, step: int):
    """Atomically: a checkpoint cut short by a kill must not replace a good one."""
    state = {
        "model": model.module.state_dict(),
        "optimizer": optimizer.state_dict(),
        "loader": json.dumps(loader.state_dict()),  # the same on every rank
        "step": step,
    }
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


if __name__ == "__main__":
    main()
