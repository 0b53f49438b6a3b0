"""A release wheel's smoke test (``scripts/wheels/cibuildwheel.toml``): the installed crop
kernel loads, reads a JPEG's header and crops it to the pixels of Pillow's full decode, the
batch CRC-32 gives zlib's numbers and the Feistel network permutes a range; each exports no
symbol but its ``PyInit_*`` (a static libjpeg's would clash with another module's libjpeg in
the same process).

It loads the compiled modules by their files, not through ``import readers`` (which would
import torch), and needs only NumPy and Pillow:

    python scripts/wheels/check_wheel.py [PATH_TO_jpegcrop.so PATH_TO_crc32.so PATH_TO_feistel.so]
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import io
import struct
import sys
import zlib
from pathlib import Path
from types import ModuleType

import numpy as np
from PIL import Image

KERNEL = "readers.images.jpegcrop"
BATCH_CRC = "readers.formats.crc32"
FEISTEL = "readers.epochs.feistel"


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


def exported_symbols(path: Path) -> list[str]:
    """The names an ELF shared object defines in its dynamic symbol table with global or weak
    binding and default or protected visibility: what another library could bind to. Empty
    for a file that is not a 64-bit little-endian ELF (a macOS or Windows build)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    shoff, shentsize, shnum = (
        struct.unpack_from("<Q", data, 0x28)[0],
        *struct.unpack_from("<HH", data, 0x3A),
    )
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + k * shentsize) for k in range(shnum)
    ]
    names = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 11:  # SHT_DYNSYM
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, entsize):
            name, info, other, shndx = struct.unpack_from("<IBBH", data, at)
            bound = info >> 4 in (1, 2)  # STB_GLOBAL, STB_WEAK
            visible = other & 3 in (0, 3)  # STV_DEFAULT, STV_PROTECTED
            if shndx != 0 and bound and visible:
                end = data.index(b"\0", strings + name)
                names.append(data[strings + name : end].decode())
    return names


def check_exports(path: Path) -> None:
    """Only ``PyInit_*`` leaves the module: not its units' functions, not libjpeg's."""
    extra = sorted(n for n in exported_symbols(path) if not n.startswith("PyInit_"))
    assert not extra, f"{path.name} exports {len(extra)} more symbols: {extra[:10]}"
    print(f"{path.name}: exports only PyInit_*")


def check_crcs(path: Path) -> None:
    """The batch CRC-32 of values of many lengths is zlib's."""
    crc32 = load(BATCH_CRC, path)
    rng = np.random.default_rng(1)
    values = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in range(0, 2000, 7)]
    out = np.zeros(len(values), dtype=np.uint32)
    crc32.crcs(values, out)
    assert out.tolist() == [zlib.crc32(v) for v in values], "the batch CRC-32 is not zlib's"
    print(f"{path.name}: the batch CRC-32 works (carry-less multiplication: {bool(crc32.CLMUL)})")


def check_feistel(path: Path) -> None:
    """The Feistel network maps every position of a range to a distinct one inside it."""
    feistel = load(FEISTEL, path)
    n, shift = 1000, 5  # 10 bits: a left half of 5, a right half of 5
    positions = np.arange(n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    keys = np.arange(1, 7, dtype=np.uint64)
    feistel.indices(positions, out, keys, n, shift, (1 << 5) - 1, (1 << shift) - 1)
    assert sorted(out.tolist()) == positions.tolist(), "the Feistel network is no permutation"
    print(f"{path.name}: the Feistel network works")


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
    paths = [Path(p) for p in sys.argv[1:4]] or [  # the modules given, in this order
        installed(KERNEL),
        installed(BATCH_CRC),
        installed(FEISTEL),
    ]
    for path, check in zip(paths, (check_kernel, check_crcs, check_feistel), strict=False):
        check(path)
        check_exports(path)


if __name__ == "__main__":
    main()
