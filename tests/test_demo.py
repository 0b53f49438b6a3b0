"""The README's first command: the demo converts sample_data into every format."""

from __future__ import annotations

import subprocess
import sys

from readers import spec
from tests.conftest import ROOT


def test_demo_converts_and_reads_every_format(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "scripts/demo.py", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines()]
    table = {(r[0], r[1]): r for r in rows if len(r) == 6 and r[0] in spec.FORMATS}
    assert set(table) == {(f, e) for f in spec.FORMATS for e in ("raw", "jpeg")}
    for row in table.values():
        assert row[2] == "32"  # samples read back
        assert int(row[3].replace(",", "")) > 0  # bytes on disk
        assert float(row[5]) > 0  # read rate
    assert {p.name for p in tmp_path.iterdir()} == {
        f"{f}-{e}" for f in spec.FORMATS for e in ("raw", "jpeg")
    }
