"""sample_data/ is what the issue asks for, and its script regenerates it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from PIL import Image

from convert.scan import scan_folder
from tests.conftest import ROOT, SAMPLE_DATA


def _images(root: Path) -> dict[str, tuple[str, tuple[int, int], str]]:
    """relative path -> (format, size, mode) of every image under ``root``."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.suffix in (".jpg", ".png"):
            with Image.open(path) as img:
                out[str(path.relative_to(root))] = (img.format, img.size, img.mode)
    return out


def test_sample_data_is_small_real_and_varied() -> None:
    scan = scan_folder(SAMPLE_DATA)
    classes, samples = scan.classes, scan.samples
    assert len(classes) >= 3 and 20 <= len(samples) <= 40
    assert sum(p.stat().st_size for p in SAMPLE_DATA.rglob("*") if p.is_file()) < 3_000_000
    images = _images(SAMPLE_DATA)
    assert any(fmt == "PNG" and mode == "RGB" for fmt, _, mode in images.values())
    assert any(mode == "L" for _, _, mode in images.values())
    assert any(w != h for _, (w, h), _ in images.values())
    readme = (SAMPLE_DATA / "README.md").read_text(encoding="utf-8")
    assert all(rel in readme for rel in images)  # every file is credited


def test_make_sample_data_regenerates_the_same_folder(tmp_path) -> None:
    out = tmp_path / "sample"
    subprocess.run(
        [sys.executable, "scripts/make_sample_data.py", "--out", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert _images(out) == _images(SAMPLE_DATA)
