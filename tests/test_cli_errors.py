"""The CLI's one-line errors (``convert.cli.errors``): an error a DataLoader worker raised
reaches the user as the original one line, not as torch's worker traceback."""

from __future__ import annotations

import shutil
import traceback

import pytest
from torch.utils.data import DataLoader

import readers
from convert.cli.errors import one_line


def test_an_error_raised_in_a_dataloader_worker_is_its_original_one_line(converted, tmp_path):
    root = shutil.copytree(converted("pt", "raw-fixed"), tmp_path / "ds")
    shard = readers.load_manifest(root).shard_path(0)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(readers.DatasetError) as in_process:
        readers.open_dataset(root)[0]
    loader = DataLoader(readers.open_dataset(root), batch_size=4, num_workers=1, timeout=60)
    batches = iter(loader)
    with pytest.raises(readers.DatasetError) as in_worker:
        next(batches)
    # freed here, its worker told to stop (the error's frames hold it in a cycle: collected
    # in a later test, it could wait out torch's 5 s join timeout there)
    traceback.clear_frames(in_worker.tb)
    del batches
    assert "Original Traceback" in str(in_worker.value)  # torch's wrapping, as it is today
    assert one_line(in_worker.value) == str(in_process.value)
    assert "\n" not in one_line(in_worker.value)
    assert one_line(in_process.value) == str(in_process.value)
