"""A release wheel's smoke test (``scripts/wheels/cibuildwheel.toml``): the installed crop
kernel loads, reads a JPEG's header and crops it to the pixels of Pillow's full decode.

It loads the compiled module by its file, not through ``import readers`` (which would
import torch), and needs only NumPy and Pillow:

    python scripts/wheels/check_wheel.py [PATH_TO_jpegcrop.so]
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import io
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
from PIL import Image

NAME = "readers.images.jpegcrop"


def installed_kernel() -> Path:
    """The kernel's file in the installed ``imgpack`` distribution."""
    for file in importlib.metadata.files("imgpack") or []:
        if file.name.startswith("jpegcrop.") and file.suffix in (".so", ".pyd"):
            return Path(file.locate())
    raise SystemExit("the imgpack wheel has no compiled crop kernel")


def load(path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else installed_kernel()
    kernel = load(path)
    rng = np.random.default_rng(0)
    photo = rng.integers(0, 256, (96, 128, 3), dtype=np.uint8).repeat(2, 0).repeat(2, 1)
    buffer = io.BytesIO()
    Image.fromarray(photo).save(buffer, "JPEG", quality=90)
    data = buffer.getvalue()
    headers = np.zeros((1, kernel.HEADER_FIELDS), dtype=np.int64)
    kernel.headers([data], headers)
    assert headers[0, :3].tolist() == [1, 256, 192], headers  # parsed, width, height
    top, left, size = 40, 56, 64
    out = np.zeros((1, size, size, 3), dtype=np.uint8)
    status = np.zeros(1, dtype=np.int32)
    box = np.array([[top, left, size, size, 0]], dtype=np.int64)
    kernel.crop([data], np.zeros(1, np.int64), box, np.array([[192, 256]]), out, status, size, size)
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert status[0] == 0, status
    difference = np.abs(out[0].astype(int) - full[top : top + size, left : left + size]).max()
    assert difference <= 1, f"the kernel's crop differs from Pillow's decode by {difference}"
    print(f"{path.name}: the crop kernel works (max difference from Pillow {difference})")


if __name__ == "__main__":
    main()
