"""scripts/train_ddp.py, the example in docs/DISTRIBUTED.md, under real torchrun: preempted
mid-epoch on 2 processes, resumed from its checkpoint on 3, every sample read once; and
every rank exits with nothing left running that interpreter finalization could kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.torchrun


@dataclass
class Run:
    stdout: str
    at_exit: list[dict[str, Any]]  # per rank: what still ran as its interpreter exited


def torchrun(world: int, out: Path, *args: str) -> Run:
    """scripts/train_ddp.py on ``world`` ranks, each through tests/at_exit.py."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(IMGPACK_AT_EXIT=str(out), OMP_NUM_THREADS="1")
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={world}", "-m", "tests.at_exit", "scripts/train_ddp.py", *args]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    reports = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]
    return Run(done.stdout, reports)


@pytest.fixture(scope="module")
def runs(converted, tmp_path_factory) -> tuple[Run, Run]:
    """Stopped after 3 steps on 2 ranks (2 persistent workers each), resumed on 3 ranks
    without workers (decoding on the dataset's threads in the training process)."""
    tmp = tmp_path_factory.mktemp("train")
    dataset = str(converted("pt", "raw-fixed"))  # 32 samples
    checkpoint = str(tmp / "ckpt.pt")
    common = [dataset, "--batch-size", "4", "--epochs", "2", "--checkpoint", checkpoint]
    first = torchrun(2, tmp / "first", *common, "--every", "1", "--stop-after", "3")
    second = torchrun(3, tmp / "second", *common, "--workers", "0")
    return first, second


def test_preempted_run_resumes_mid_epoch_on_another_world_size(runs):
    first, second = runs
    assert "epoch 0:" not in first.stdout  # stopped 3 of 4 steps into epoch 0: 24 of 32
    assert "resumed at step 3, epoch 0, 24 samples into it" in second.stdout
    # the 8 left of epoch 0 on 3 ranks: 3 each, one padded; then a whole epoch, 11 each
    assert "epoch 0: 9 samples on 3 ranks" in second.stdout
    assert "epoch 1: 33 samples on 3 ranks" in second.stdout


def test_every_rank_exits_with_no_thread_or_worker_left(runs):
    """Stopped mid-epoch (a DataLoader iterator with live workers) or at the end: by the
    time the interpreter finalizes, gloo's threads are joined (destroy_process_group
    released the group), the decode threads and the DataLoader workers are gone."""
    nothing = {"native_threads": [], "python_threads": [], "children": []}
    for run in runs:
        assert run.at_exit == [nothing] * len(run.at_exit)
