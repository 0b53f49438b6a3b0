"""Memory that does not grow with the data: a conversion's main process holds no shard, a
reading process holds no Python object per sample, and the streamed ``pt`` shard is still
exactly what ``torch.save`` writes."""

from __future__ import annotations

import gc
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

import readers
from convert import ConvertOptions, convert_folder
from convert.writers import Layout, Record
from convert.writers.pt import PtWriter
from readers import spec
from readers.fields import FieldSpec
from readers.formats.field_columns import column_crc
from tests.conftest import ROOT
from tests.photos import encode, photo_crop

# Peak RSS (KiB) of conversions SRC -> DST (argv[2:], pairs) to FORMAT (argv[1]), each in
# a child forked from a fresh process that has imported convert (and torch) and done nothing
# else, so each starts as a user's `imgpack convert` does, without paying torch's import
# again: VmHWM, since ru_maxrss also counts the RSS of the process that forked it (pytest).
_PEAK_RSS = """
import os, sys
from convert import ConvertOptions, convert_folder
options = ConvertOptions(format=sys.argv[1], encoding="raw")
for src, dst in zip(sys.argv[2::2], sys.argv[3::2]):
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            convert_folder(src, dst, options, workers=1, progress=False)
            with open("/proc/self/status") as f:
                print(next(line.split()[1] for line in f if line.startswith("VmHWM:")), flush=True)
            status = 0
        finally:
            os._exit(status)
    assert os.waitpid(pid, 0)[1] == 0, f"the conversion of {src} failed"
"""


def make_folder(root: Path, count: int, size: int) -> Path:
    """``count`` JPEGs of ``size``x``size`` real-photo crops in two class folders."""
    for i in range(count):
        folder = root / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img{i:05d}.jpg").write_bytes(encode(photo_crop(size, size, seed=i)))
    return root


def peak_rss_mib(fmt: str, *runs: tuple[Path, Path]) -> list[float]:
    """The peak RSS (MiB) of each conversion ``(src, dst)`` to ``fmt``."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, fmt, *(str(p) for run in runs for p in run)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [int(kib) / 1024 for kib in done.stdout.split()]


@pytest.fixture(scope="module")
def photo_folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """300 and 1,200 128x128 JPEGs: as raw samples of 48 KiB, a 14 MiB and a 56 MiB shard."""
    root = tmp_path_factory.mktemp("photos")
    return make_folder(root / "small", 300, 128), make_folder(root / "large", 1200, 128)


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads Linux's VmHWM")
@pytest.mark.parametrize("fmt", ["pt", "wds", "hdf5"])
def test_conversion_peak_rss_does_not_grow_with_the_shard(tmp_path, photo_folders, fmt) -> None:
    # A writer that holds its shard (the pt writer did, twice) grows by ~40-90 MiB here.
    # (lmdb commits every 64 MiB of samples: a constant these sizes would not get past.)
    small_folder, large_folder = photo_folders
    small, large = peak_rss_mib(fmt, (small_folder, tmp_path / "a"), (large_folder, tmp_path / "b"))
    assert len(readers.open_dataset(tmp_path / "b")) == 1200
    assert large - small < 20, f"peak RSS {small:.0f} MiB -> {large:.0f} MiB"


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_folder(tmp_path_factory.mktemp("tiny"), 2000, 16)


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_reader_index_is_arrays_not_python_objects_per_sample(
    tmp_path, tiny_folder: Path, fmt: str
) -> None:
    """What a reading process keeps per sample once every shard is open and its paths were
    asked for: a few NumPy words and the path's bytes (the wds index as Python lists took
    ~224 bytes)."""
    shard_size = None if fmt in ("hdf5", "lmdb") else 500
    options = ConvertOptions(format=fmt, encoding="raw", shard_size=shard_size)
    convert_folder(tiny_folder, tmp_path / "ds", options, workers=1, progress=False)
    ds = readers.open_dataset(tmp_path / "ds")
    starts = [0, *np.cumsum([s.samples for s in ds.manifest.shards])[:-1].tolist()]
    path_bytes = sum(len(ds.source_path(i)) for i in range(len(ds)))
    ds = readers.open_dataset(tmp_path / "ds")
    gc.disable()  # a collection inside the loop frees what earlier tests left, or not
    tracemalloc.start(64)  # deep enough to see readers' frames under NumPy's
    try:
        before = tracemalloc.take_snapshot()
        for start in starts:  # opens every shard and reads its paths in
            ds.source_path(start)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
        gc.enable()
    # What this loop allocated, not what another thread of this test process did meanwhile
    # (a pool or prefetch thread left by an earlier test, even one running readers' code).
    ours = [tracemalloc.Filter(True, __file__, all_frames=True)]
    changes = after.filter_traces(ours).compare_to(before.filter_traces(ours), "filename")
    held = sum(change.size_diff for change in changes)
    # Alone: 16 (hdf5), 42 (lmdb), 46 (wds) bytes a sample, NumPy columns. A cache that the
    # loop happens to fill first adds a few KiB, depending on the tests before it (50 bytes
    # in a CI run); one Python object a sample would add at least 36 (an int and its slot).
    per_sample = (held - path_bytes) / len(ds)
    assert per_sample < 64, f"{fmt}: {per_sample:.0f} bytes per sample beyond the paths"


@pytest.mark.parametrize(("encoding", "shape"), [("raw", (6, 5, 3)), ("raw", None), ("jpeg", None)])
def test_streamed_pt_shard_is_what_torch_save_writes(tmp_path, encoding: str, shape) -> None:
    rng = np.random.default_rng(0)
    records = []
    for i in range(50):
        if encoding == "jpeg":
            data: bytes | np.ndarray = rng.bytes(int(rng.integers(1, 400)))
        else:
            data = rng.integers(0, 256, shape or (*rng.integers(1, 9, 2), 3), dtype=np.uint8)
        path = f"class{i % 3}/img-é{i}\udcff.jpg"  # not UTF-8: kept as its bytes
        size = data.shape[:2] if isinstance(data, np.ndarray) else (7, 9)
        fields = {"n": None if i % 4 == 0 else b"%d" % i, "txt": f"caption {i} «é»".encode()}
        label = int(rng.integers(-1, 3))
        records.append(Record(f"{i:010d}", data, "jpg", label, path, size, fields))
    (tmp_path / "mine").mkdir()
    schema = (("n", FieldSpec("int")), ("txt", FieldSpec("text")))
    layout = Layout(encoding, shape, ("a", "b"), fields=schema)
    writer = PtWriter(tmp_path / "mine" / "shard.pt", layout)
    for record in records:
        writer.add(record)
    writer.close()

    def concat(chunks: list[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
        offsets = np.concatenate([[0], np.cumsum([len(c) for c in chunks])]).astype(np.int64)
        return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8), torch.from_numpy(
            offsets
        )

    expected = {spec.PT_LABELS: torch.tensor([r.label for r in records])}
    expected[spec.PT_PATHS], expected[spec.PT_PATH_OFFSETS] = concat(
        [r.path.encode("utf-8", "surrogateescape") for r in records]
    )
    if shape is not None:
        expected[spec.PT_IMAGES] = torch.from_numpy(np.stack([r.data for r in records]))
    else:
        if encoding == "raw":
            expected[spec.PT_SHAPES] = torch.tensor([r.data.shape for r in records])
        expected[spec.PT_DATA], expected[spec.PT_OFFSETS] = concat(
            [r.data.tobytes() if isinstance(r.data, np.ndarray) else r.data for r in records]
        )
    if encoding != "raw":
        expected[spec.PT_CRCS] = torch.tensor([spec.sample_crc(r.data) for r in records])
    expected[spec.PT_SIZES] = torch.tensor([r.size for r in records])
    n_values = torch.tensor([0 if r.fields["n"] is None else int(r.fields["n"]) for r in records])
    n_valid = torch.tensor([r.fields["n"] is not None for r in records], dtype=torch.uint8)
    expected[spec.field_key("n", spec.FIELD_VALUES)] = n_values
    expected[spec.field_key("n", spec.FIELD_VALID)] = n_valid
    crc = column_crc(n_values.numpy(), n_valid.numpy())
    expected[spec.field_key("n", spec.FIELD_CRC)] = torch.tensor([crc], dtype=torch.uint32)
    captions = [r.fields["txt"] for r in records]
    data, offsets = concat(captions)
    expected[spec.field_key("txt", spec.FIELD_DATA)] = data
    expected[spec.field_key("txt", spec.FIELD_OFFSETS)] = offsets
    crcs = torch.tensor([spec.sample_crc(c) for c in captions], dtype=torch.uint32)
    expected[spec.field_key("txt", spec.FIELD_CRCS)] = crcs
    expected[spec.field_key("txt", spec.FIELD_VALID)] = torch.ones(50, dtype=torch.uint8)
    (tmp_path / "torch").mkdir()
    torch.save(expected, tmp_path / "torch" / "shard.pt")
    assert (tmp_path / "mine" / "shard.pt").read_bytes() == (
        tmp_path / "torch" / "shard.pt"
    ).read_bytes()
