"""A script that holds ``wds`` datasets, loaders and streams in module globals exits
quietly: no "Exception ignored in ... __del__" on stderr (a shard's file is closed by
``weakref.finalize``, which runs before the interpreter tears its modules down)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from convert import ConvertOptions, convert_folder
from tests.conftest import SAMPLE_DATA

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import sys
import readers

root = sys.argv[1]
dataset = readers.open_dataset(root)
dataset[0]
loader = readers.make_loader(root, 8, num_workers=2, persistent_workers=True)
batches = iter(loader)
next(batches)
stream = readers.make_loader(root, 8, stream=True, shuffle_buffer=0)
samples = iter(stream)
next(samples)
in_a_cycle = [readers.WdsDataset(root)]
in_a_cycle[0][31]
in_a_cycle.append(in_a_cycle)
"""


def test_module_level_wds_readers_exit_without_a_traceback(tmp_path):
    root = tmp_path / "wds"
    options = ConvertOptions("wds", shard_size=10, resize=32, center_crop=32, shuffle=True)
    convert_folder(SAMPLE_DATA, root, options, workers=1, progress=False)
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(root)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
