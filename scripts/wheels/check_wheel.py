"""A release wheel's smoke test (``scripts/wheels/cibuildwheel.toml``): the installed crop
kernel loads, reads a JPEG's header and crops it to the pixels of Pillow's full decode, and
the batch CRC-32 gives zlib's numbers.

It loads the compiled modules by their files, not through ``import readers`` (which would
import torch), and needs only NumPy and Pillow:

    python scripts/wheels/check_wheel.py [PATH_TO_jpegcrop.so PATH_TO_crc32.so]
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import io
import sys
import zlib
from pathlib import Path
from types import ModuleType

import numpy as np
from PIL import Image

KERNEL = "readers.images.jpegcrop"
BATCH_CRC = "readers.formats.crc32"


def installed(name: str) -> Path:
    """The compiled module ``name``'s file in the installed ``imgpack`` distribution."""
    stem = name.rsplit(".", 1)[1] + "."
    for file in importlib.metadata.files("imgpack") or []:
        if file.name.startswith(stem) and file.suffix in (".so", ".pyd"):
            return Path(file.locate())
    raise SystemExit(f"the imgpack wheel has no compiled {name}")


def load(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def check_crcs(path: Path) -> None:
    """The batch CRC-32 of values of many lengths is zlib's."""
    crc32 = load(BATCH_CRC, path)
    rng = np.random.default_rng(1)
    values = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in range(0, 2000, 7)]
    out = np.zeros(len(values), dtype=np.uint32)
    crc32.crcs(values, out)
    assert out.tolist() == [zlib.crc32(v) for v in values], "the batch CRC-32 is not zlib's"
    print(f"{path.name}: the batch CRC-32 works (carry-less multiplication: {bool(crc32.CLMUL)})")


def check_kernel(path: Path) -> None:
    """The crop kernel parses a JPEG's header and crops it as Pillow decodes it."""
    kernel = load(KERNEL, path)
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


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:3]] or [installed(KERNEL), installed(BATCH_CRC)]
    check_kernel(paths[0])
    if len(paths) > 1:
        check_crcs(paths[1])


if __name__ == "__main__":
    main()
