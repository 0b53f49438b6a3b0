"""The batch CRC-32 (``readers/formats/crc32.c``) that checks a decode thread's part of a
batch in one call: zlib's numbers for every length and alignment, with or without the
compiled module (``IMGPACK_KERNEL=0``: the Makefile runs this file again that way), and the
same first error as one read at a time."""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import zlib
from pathlib import Path

import numpy as np
import pytest

import readers
from readers.formats import checks
from readers.formats.reader import read_checked
from tests.test_reader_faults import copy_dataset, flip_middle_byte_of_sample

CRC_C = Path(__file__).resolve().parent.parent / "readers" / "formats" / "crc32.c"
FEISTEL_C = CRC_C.parent.parent / "epochs" / "feistel.c"  # the other module without a library

try:
    from readers.formats import crc32
except ImportError:
    crc32 = None

needs_module = pytest.mark.skipif(crc32 is None, reason="readers.formats.crc32 is not built")


def values_of_every_shape() -> list[bytes | bytearray | memoryview]:
    """Every length up to 300 (the folding's 16- and 64-byte steps and the bytes after
    them), larger ones, bytearrays and memoryviews starting at every offset of a word."""
    rng = random.Random(17)
    values: list[bytes | bytearray | memoryview] = [rng.randbytes(n) for n in range(301)]
    values += [rng.randbytes(n) for n in (1023, 1024, 4099, 28_000, 1 << 20)]
    values += [bytes(64), b"\xff" * 200, bytearray(rng.randbytes(777))]
    block = rng.randbytes(600)
    values += [memoryview(block)[k : 600 - k] for k in range(1, 17)]
    return values


@needs_module
def test_the_compiled_crcs_are_zlibs_for_every_length_and_alignment() -> None:
    values = values_of_every_shape()
    out = np.zeros(len(values), dtype=np.uint32)
    crc32.crcs(values, out)
    assert out.tolist() == [zlib.crc32(v) for v in values]
    assert [crc32.crc(v) for v in values] == out.tolist()
    # a running CRC, piece by piece, as zlib.crc32(piece, crc) keeps one
    assert [crc32.crc(v, 0xDEADBEEF) for v in values] == [zlib.crc32(v, 0xDEADBEEF) for v in values]
    with pytest.raises(TypeError):
        crc32.crc(42)


def test_stored_crcs_are_zlibs_whichever_path_computes_them() -> None:
    values = values_of_every_shape()
    assert checks.stored_crcs(values).tolist() == [zlib.crc32(v) for v in values]
    assert [checks.stored_crc(v) for v in values] == [zlib.crc32(v) for v in values]
    whole, crc = b"".join(values), 0
    for v in values:
        crc = checks.stored_crc(v, crc)
    assert crc == zlib.crc32(whole)
    assert checks.stored_crcs([]).shape == (0,)


@needs_module
def test_the_compiled_crcs_refuse_what_is_not_bytes_or_a_wrong_output() -> None:
    out = np.zeros(2, dtype=np.uint32)
    with pytest.raises(TypeError):
        crc32.crcs([b"abc", 42], out)
    with pytest.raises(ValueError, match="out has 8 bytes, not 12"):
        crc32.crcs([b"a", b"b", b"c"], out)
    with pytest.raises(TypeError):
        crc32.crcs([b"a", b"b"], bytes(8))  # read-only
    assert out.tolist() == [0, 0]


def test_a_batch_read_fails_on_the_first_bad_sample_in_its_order(converted, tmp_path) -> None:
    # read_checked fetches a part first and checks it in one call: a damaged sample before
    # one that cannot be read at all is still the error, as one read at a time gives it
    root = copy_dataset(converted("lmdb", "jpeg"), tmp_path)
    flip_middle_byte_of_sample(root, 5)
    shard = readers.open_dataset(root).shard(0)
    with pytest.raises(readers.DatasetError, match=r"\[5\]: .*CRC-32"):
        read_checked([(shard, 4), (shard, 5), (shard, 10**6)])
    with pytest.raises(readers.DatasetError, match="missing key '1000000000'"):
        read_checked([(shard, 4), (shard, 10**9), (shard, 5)])
    good = read_checked([(shard, 4), (shard, 6)])
    assert [bytes(v) for v in good] == [bytes(shard.read(4)), bytes(shard.read(6))]


def test_the_batch_crc_is_built_wherever_a_compiler_is() -> None:
    """It needs no library: wherever gcc and Python's headers are (CI), it must be built."""
    if shutil.which("gcc") is None or not Path(sysconfig.get_paths()["include"]).exists():
        pytest.skip("no gcc or no Python headers")
    assert importlib.util.find_spec("readers.formats.crc32") is not None, (
        "readers.formats.crc32 was not built: pip install -e . and read its warning"
    )


@pytest.mark.parametrize("source", [CRC_C, FEISTEL_C], ids=lambda path: path.name)
def test_the_batch_crc_and_the_feistel_network_compile_without_warnings(
    tmp_path: Path, source: Path
) -> None:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed")
    include = ["-I", sysconfig.get_paths()["include"]]
    for level in ("-O0", "-O3"):
        result = subprocess.run(
            [
                gcc,
                "-Wall",
                "-Wextra",
                "-Werror",
                level,
                *include,
                "-c",
                str(source),
                "-o",
                str(tmp_path / "module.o"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr


@needs_module
def test_imgpack_kernel_0_turns_the_batch_crc_off_too() -> None:
    code = "from readers.formats import checks; print(checks._compiled_crcs() is not None)"
    for switch, compiled in (("0", False), ("1", bool(crc32.CLMUL))):
        run = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "IMGPACK_KERNEL": switch},
            capture_output=True,
            text=True,
            check=True,
        )
        assert run.stdout.strip() == str(compiled)
