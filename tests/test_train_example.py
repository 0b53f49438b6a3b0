"""scripts/train_ddp.py, the example in docs/DISTRIBUTED.md, under real torchrun: preempted
mid-epoch on 2 processes, resumed from its checkpoint on 3, every sample read once."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def torchrun(world: int, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={world}", "scripts/train_ddp.py", *args]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_preempted_run_resumes_mid_epoch_on_another_world_size(converted, tmp_path):
    dataset = str(converted("pt", "raw-fixed"))  # 32 samples
    checkpoint = str(tmp_path / "ckpt.pt")
    common = [dataset, "--batch-size", "4", "--epochs", "2", "--checkpoint", checkpoint]
    first = torchrun(2, *common, "--every", "1", "--stop-after", "3")
    assert "epoch 0:" not in first  # stopped 3 of 4 steps into epoch 0: 24 of 32 samples
    second = torchrun(3, *common, "--workers", "0")
    assert "resumed at step 3, epoch 0, 24 samples into it" in second
    # the 8 left of epoch 0 on 3 ranks: 3 each, one padded; then a whole epoch, 11 each
    assert "epoch 0: 9 samples on 3 ranks" in second
    assert "epoch 1: 33 samples on 3 ranks" in second
