"""What users hit first (issue "One description of a dataset", part 2, the reader side and
the CLI): ImageFolder parity (``targets``, ``samples``), clear errors for indices and for
batches of images that do not stack, a path to the manifest accepted as its folder, and a
dataset whose conversion is still running."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter

import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DataLoader

import readers
from convert.cli import main
from readers import spec
from tests.conftest import ROOT


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_targets_and_samples_are_lists_like_imagefolders(converted, fmt):
    ds = readers.open_dataset(converted(fmt, "raw-fixed"))
    assert isinstance(ds.targets, list) and len(ds.targets) == 32
    assert Counter(ds.targets) == {0: 8, 1: 8, 2: 8, 3: 8}  # what failed as a method
    assert ds.targets == [ds[i][1] for i in range(len(ds))]
    assert ds.samples[5] == (ds.source_path(5), ds.targets[5])
    assert ds.samples[0][0].startswith(ds.classes[0] + "/")


def test_slices_and_other_non_integer_indices_are_a_type_error(converted):
    ds = readers.open_dataset(converted("pt", "raw-fixed"))
    for bad in (slice(0, 4), 1.0, "3", True):
        with pytest.raises(TypeError, match=r"indices must be integers.*Subset"):
            ds[bad]
    assert torch.equal(ds[torch.tensor(3).item()][0], ds[3][0])


def test_a_batch_that_cannot_stack_says_why_and_what_to_do(converted):
    ds = readers.open_dataset(converted("lmdb", "jpeg"))  # sizes vary: no crop
    loader = DataLoader(ds, batch_size=4, collate_fn=readers.collate)
    with pytest.raises(
        ValueError, match=r"different shapes.*--center-crop.*transform=.*collate_any"
    ):
        next(iter(loader))
    images, labels = next(iter(DataLoader(ds, batch_size=4, collate_fn=readers.collate_any)))
    assert isinstance(images, list) and len(images) == len(labels) == 4


def test_a_path_to_the_manifest_stands_for_its_folder(converted):
    root = converted("hdf5", "raw-fixed")
    ds = readers.open_dataset(root / spec.MANIFEST_NAME)
    assert ds.root == root and len(ds) == 32
    result = CliRunner().invoke(main, ["info", str(root / spec.MANIFEST_NAME)])
    assert result.exit_code == 0 and "hdf5" in result.output
    result = CliRunner().invoke(main, ["info", str(root / "shard-000000.h5")])
    assert result.exit_code == 1 and "not a dataset folder" in result.output
    assert "Traceback" not in result.output


def test_opening_a_dataset_being_converted_says_so(tmp_path):
    dst = tmp_path / "dst"
    dst.mkdir()
    holder = subprocess.Popen(  # holds the converter's lock, as a running conversion does
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from convert.destination import DestinationLock; "
            "DestinationLock(Path(sys.argv[1])).acquire(); print('locked', flush=True); "
            "time.sleep(60)",
            str(dst),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        (dst / f"{spec.TMP_PREFIX}shard-000000.pt").write_bytes(b"")
        with pytest.raises(readers.DatasetError, match=r"still running.*wait for it"):
            readers.open_dataset(dst)
    finally:
        holder.kill()
        holder.communicate()
    time.sleep(0.1)
    with pytest.raises(readers.DatasetError, match=r"incomplete conversion.*--resume"):
        readers.open_dataset(dst)  # the converter died: now it is resumable
