"""Each format's files are what a user of that library would recognise and could open."""

from __future__ import annotations

import tarfile
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest
import torch

import readers
from convert import ConvertOptions, convert_folder
from convert.writers import lmdb as lmdb_writer
from convert.writers import wds as wds_writer
from readers import spec
from tests.conftest import ENCODING_CASES, SAMPLE_DATA
from tests.photos import encode, photo_crop


def test_pt_shard_holds_only_tensors_and_loads_without_pickle(converted) -> None:
    root = converted("pt", "raw-fixed")
    tensors = torch.load(root / spec.shard_name("pt", 0), weights_only=True, mmap=True)
    assert all(isinstance(v, torch.Tensor) for v in tensors.values())
    assert tensors[spec.PT_IMAGES].shape == (32, 64, 64, 3)
    assert tensors[spec.PT_IMAGES].dtype == torch.uint8
    assert tensors[spec.PT_LABELS].dtype == torch.int64


def test_hdf5_stores_one_sample_per_chunk_and_class_names(converted) -> None:
    root = converted("hdf5", "raw-fixed")
    with h5py.File(root / spec.shard_name("hdf5", 0)) as f:
        images = f[spec.H5_IMAGES]
        assert images.shape == (32, 64, 64, 3) and images.chunks == (1, 64, 64, 3)
        assert list(f.attrs[spec.H5_ATTR_CLASSES]) == readers.open_dataset(root).classes
        assert f.attrs[spec.H5_ATTR_ENCODING] == "raw"
    with h5py.File(converted("hdf5", "jpeg") / spec.shard_name("hdf5", 0)) as f:
        assert f[spec.H5_IMAGES].dtype == h5py.vlen_dtype(np.uint8)
        assert bytes(f[spec.H5_IMAGES][0][:3]) == b"\xff\xd8\xff"


def test_lmdb_keys_sort_in_index_order_then_metadata(converted) -> None:
    path = converted("lmdb", "jpeg") / spec.shard_name("lmdb", 0)
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            keys = [bytes(k) for k in txn.cursor().iternext(values=False)]
    finally:
        env.close()
    samples = [spec.SAMPLE_KEY.format(i).encode() for i in range(32)]
    assert keys[:32] == samples
    assert set(keys[32:]) == {spec.LMDB_LABELS, spec.LMDB_PATHS, spec.LMDB_CRCS, spec.LMDB_SIZES}


def test_lmdb_map_grows_past_its_initial_size(tmp_path, monkeypatch) -> None:
    # Raw pixels of sample_data are ~13 MB: start the map at 1 MB to force growth and the
    # MapFullError retry, which no user should ever see.
    monkeypatch.setattr(lmdb_writer, "_INITIAL_MAP", 1 << 20)
    monkeypatch.setattr(lmdb_writer, "_PAGE_OVERHEAD", 1)
    monkeypatch.setattr(lmdb_writer, "_TXN_BYTES", 4 << 20)
    options = ConvertOptions(format="lmdb", encoding="raw")
    result = convert_folder(SAMPLE_DATA, tmp_path / "db", options, workers=1, progress=False)
    assert result.written == 32 and result.bytes > 10 << 20
    ds = readers.open_dataset(tmp_path / "db")
    assert len(ds) == 32
    source = readers.decode_image((SAMPLE_DATA / ds.source_path(31)).read_bytes())
    assert torch.equal(ds[31][0], torch.from_numpy(source).permute(2, 0, 1))
    assert ds.targets == sorted(ds.targets)


@pytest.mark.parametrize("case", ["jpeg", "raw-variable"])
def test_hdf5_blocks_whose_samples_all_have_one_length_are_written(tmp_path, case) -> None:
    # One sample per file makes every write block uniform, which h5py once broadcast wrongly.
    options = ConvertOptions(format="hdf5", shard_size=1, **ENCODING_CASES[case])
    convert_folder(SAMPLE_DATA, tmp_path / "h5", options, workers=1, progress=False)
    ds = readers.open_dataset(tmp_path / "h5")
    pt_options = ConvertOptions(format="pt", **ENCODING_CASES[case])
    convert_folder(SAMPLE_DATA, tmp_path / "pt", pt_options, workers=1, progress=False)
    reference = readers.open_dataset(tmp_path / "pt")
    assert len(ds) == len(reference) == 32
    for i in range(32):
        assert torch.equal(ds[i][0], reference[i][0])


@pytest.mark.parametrize(
    "name",
    ["000000000001.jpg", "7.cls", "x" * 100, "x" * 101, "é.jpg", "\udcff.path.txt", ""],
)
@pytest.mark.parametrize("size", [0, 1, 26_117, 8**11 - 1, 8**11])
def test_wds_member_headers_are_tarfiles_own(name: str, size: int) -> None:
    """The filled-in copy of one header gives what ``TarInfo.tobuf`` gives, byte for byte
    (names too long or not ASCII, and sizes past 11 octal digits, go to tarfile itself)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, wds_writer.MODE, 0
    try:
        expected: bytes | type[Exception] = info.tobuf(
            tarfile.USTAR_FORMAT, tarfile.ENCODING, "surrogateescape"
        )
    except ValueError as e:
        expected = type(e)
    if isinstance(expected, bytes):
        assert wds_writer.ustar_header(name, size) == expected
    else:
        with pytest.raises(expected):
            wds_writer.ustar_header(name, size)


def test_a_pt_shard_where_no_sample_has_a_field_writes_and_reads(tmp_path: Path) -> None:
    """A variable field's bytes empty in a shard (none of its samples has a caption):
    torch.save writes that record whole, without a data descriptor, and the writer must
    still fill the archive around it."""
    src = tmp_path / "src" / "class0"
    src.mkdir(parents=True)
    for k, name in enumerate("abcd"):
        (src / f"{name}.jpg").write_bytes(encode(photo_crop(20, 24, seed=k)))
    (src / "c.txt").write_text("a caption")
    dst = tmp_path / "pt"
    options = ConvertOptions("pt", shard_size=2)
    convert_folder(tmp_path / "src", dst, options, workers=1, progress=False)
    ds = readers.open_dataset(dst, fields=("txt",))
    assert [ds[i][2] for i in range(len(ds))] == [None, None, "a caption", None]
