"""Shards that are there but are not what the manifest says, and source names that are not
valid UTF-8: a reader fails with a DatasetError naming the file (never a crash, a hang or
wrong pixels), and every name keeps its bytes.

tests/test_manifest.py covers what the manifest itself may get wrong, a missing shard and
indices out of range; nothing here repeats it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import random
import re
import shutil
import tarfile
import traceback
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import readers
from convert import ConvertOptions, convert_folder
from convert.process import resize_shorter
from readers import spec
from tests.photos import encode, photo_crop

FORMATS = list(readers.DATASETS)

# File names below SRC/people as the filesystem holds them: Latin-1, stray bytes that no
# encoding decodes, and a valid non-ASCII name in a non-ASCII sub-folder.
SOURCE_NAMES = (b"caf\xe9.jpg", b"\xff\xfe-photo.jpg", "Zürich/ñ.jpg".encode())
CLASS = b"people"
RESIZE = 32


# --- helpers --------------------------------------------------------------------------------
def copy_dataset(root: Path, tmp_path: Path) -> Path:
    """A private copy of a session-wide converted dataset, to damage."""
    return Path(shutil.copytree(root, tmp_path / "ds"))


def replace_shard(root: Path, index: int, data: bytes) -> Path:
    """Write ``data`` as shard ``index`` and make the manifest's size and SHA-256 match, so
    that the readers' size check passes and only the content is wrong."""
    manifest_path = root / spec.MANIFEST_NAME
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    entry = manifest["shards"][index]
    shard = root / entry["path"]
    shard.write_bytes(data)
    entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest_path.write_text(json.dumps(manifest), encoding="utf-8")
    return shard


def stored_bytes(root: Path, local: int) -> bytes:
    """Sample ``local`` of shard 0 as the shard stores it (encoded bytes or HWC pixels)."""
    value = readers.open_dataset(root).shard(0).read(local)
    return value.tobytes() if isinstance(value, np.ndarray) else bytes(value)


def flip_middle_byte_of_sample(root: Path, local: int) -> None:
    """Invert one byte in the middle of sample ``local``'s stored bytes in shard 0, in
    place: the file keeps its size, only its SHA-256 changes."""
    sample = stored_bytes(root, local)
    shard = readers.load_manifest(root).shard_path(0)
    content = shard.read_bytes()
    start = content.find(sample)
    assert start >= 0 and content.find(sample, start + 1) < 0, "sample not stored once"
    position = start + len(sample) // 2
    with open(shard, "r+b") as f:
        f.seek(position)
        f.write(bytes([content[position] ^ 0xFF]))


def rename_first_member(tar_path: Path, name: str) -> bytes:
    """The tar at ``tar_path`` rebuilt with its first member renamed to ``name``."""
    out = io.BytesIO()
    with tarfile.open(tar_path) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for k, member in enumerate(src.getmembers()):
            data = src.extractfile(member).read()
            if k == 0:
                member.name = name
            dst.addfile(member, io.BytesIO(data))
    return out.getvalue()


def files_below(folder: Path) -> set[Path]:
    return set(folder.rglob("*"))


# --- source names that are not valid UTF-8 ---------------------------------------------------
@pytest.fixture(scope="module")
def odd_names_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SRC with one class of photo crops under SOURCE_NAMES, created through byte paths."""
    src = tmp_path_factory.mktemp("odd-names")
    class_dir = os.path.join(os.fsencode(src), CLASS)
    for k, name in enumerate(SOURCE_NAMES):
        path = os.path.join(class_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(encode(photo_crop(160, 160, seed=k), quality=95))
    return src


@pytest.fixture(scope="module")
def odd_names_converted(
    odd_names_source: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """``odd_names_converted(fmt)``: odd_names_source converted to ``fmt``, once."""
    cache: dict[str, Path] = {}

    def build(fmt: str) -> Path:
        if fmt not in cache:
            dst = tmp_path_factory.mktemp(f"odd-names-{fmt}") / "ds"
            options = ConvertOptions(format=fmt, encoding="jpeg", resize=RESIZE)
            convert_folder(odd_names_source, dst, options, workers=1, progress=False)
            cache[fmt] = dst
        return cache[fmt]

    return build


@pytest.mark.parametrize("fmt", FORMATS)
def test_source_paths_that_are_not_utf8_round_trip_to_the_same_file(
    odd_names_source, odd_names_converted, fmt
):
    ds = readers.open_dataset(odd_names_converted(fmt))
    paths = [ds.source_path(i) for i in range(len(ds))]
    assert sorted(map(os.fsencode, paths)) == sorted(CLASS + b"/" + n for n in SOURCE_NAMES)
    for i, path in enumerate(paths):
        with open(odd_names_source / path, "rb") as f:  # the str opens the original file
            expected = resize_shorter(readers.decode_image(f.read()), RESIZE)
        image, label = ds[i]
        assert label == 0
        pixels = image.permute(1, 2, 0).numpy()
        assert pixels.shape == expected.shape == (RESIZE, RESIZE, 3)
        # JPEG q90 at 32x32 is under 6 levels off on average; another photo is over 40 off.
        assert np.abs(pixels.astype(int) - expected).mean() < 12, path


def library_paths(root: Path) -> list[bytes]:
    """Each sample's stored source path as the format's own library returns it, as bytes."""
    manifest = readers.load_manifest(root)
    shard = manifest.shard_path(0)
    if manifest.format == "pt":
        tensors = torch.load(shard, weights_only=True)
        data, ends = tensors[spec.PT_PATHS].numpy(), tensors[spec.PT_PATH_OFFSETS].tolist()
        return [data[a:b].tobytes() for a, b in pairwise(ends)]
    if manifest.format == "hdf5":
        with h5py.File(shard) as f:
            return list(f[spec.H5_PATHS][()])  # h5py gives vlen strings as bytes
    if manifest.format == "lmdb":
        env = lmdb.open(str(shard), subdir=False, readonly=True, lock=False)
        try:
            with env.begin() as txn:
                value = txn.get(spec.LMDB_PATHS)
        finally:
            env.close()
        assert value.isascii()  # any JSON parser reads it; \udcXX escapes keep odd bytes
        return [p.encode("utf-8", "surrogateescape") for p in json.loads(value)]
    with tarfile.open(shard) as tar:
        members = tar.getmembers()  # named KEY.ext: nothing of the source name leaks in
        assert all(re.fullmatch(r"\d{10}\.(jpg|cls|path\.txt)", m.name) for m in members)
        return [tar.extractfile(m).read() for m in members if m.name.endswith(".path.txt")]


@pytest.mark.parametrize("fmt", FORMATS)
def test_stored_paths_are_the_file_name_bytes_so_utf8_names_stay_plain_utf8(
    odd_names_converted, fmt
):
    root = odd_names_converted(fmt)
    ds = readers.open_dataset(root)
    stored = library_paths(root)
    assert stored == [os.fsencode(ds.source_path(i)) for i in range(len(ds))]
    assert "people/Zürich/ñ.jpg".encode() in stored


# --- shards of another size than the manifest says ------------------------------------------
SIZE_CHANGES: dict[str, Callable[[bytes], bytes]] = {
    "cut-in-half": lambda data: data[: len(data) // 2],
    "grown-by-a-block": lambda data: data + bytes(tarfile.BLOCKSIZE),
}


@pytest.mark.parametrize("change", SIZE_CHANGES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_shard_of_another_size_fails_on_first_access_naming_it_and_both_sizes(
    converted, tmp_path, fmt, change
):
    # Before the size check: LMDB died of SIGBUS, wds served the samples before the cut.
    root = copy_dataset(converted(fmt, "jpeg"), tmp_path)
    shard = readers.load_manifest(root).shard_path(0)
    listed = shard.stat().st_size
    shard.write_bytes(SIZE_CHANGES[change](shard.read_bytes()))
    ds = readers.open_dataset(root)
    with pytest.raises(readers.DatasetError) as info:
        ds[0]
    message = str(info.value)
    assert str(shard) in message
    assert f"{shard.stat().st_size} bytes" in message and str(listed) in message


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_shard_fails_a_dataloader_worker_with_its_path_in_the_main_process(
    converted, tmp_path, fmt
):
    root = copy_dataset(converted(fmt, "raw-fixed"), tmp_path)
    shard = readers.load_manifest(root).shard_path(0)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    loader = DataLoader(
        readers.open_dataset(root),
        batch_size=8,
        num_workers=1,
        timeout=60,  # a dead or stuck worker is an error, not a hang
        collate_fn=readers.collate,
    )
    batches = iter(loader)
    with pytest.raises(readers.DatasetError, match=re.escape(str(shard))) as caught:
        next(batches)
    # The error's frames hold the iterator in a reference cycle: collected later, its
    # queues could be closed before its workers were told to stop, and the next test
    # waited 5 s for torch's join timeout. Freed now, they stop at once.
    traceback.clear_frames(caught.tb)
    del batches


def test_wds_stream_over_a_truncated_tar_fails_naming_it_before_any_of_its_samples(
    converted, tmp_path
):
    root = copy_dataset(converted("wds", "jpeg", shard_size=10), tmp_path)
    shard = readers.load_manifest(root).shard_path(1)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    served = 0
    with pytest.raises(readers.DatasetError, match=re.escape(str(shard))):
        for _ in readers.WdsStream(root, shuffle_buffer=0):
            served += 1
    assert served == 10  # shard 0 only


def test_wds_stream_over_a_tar_cut_at_a_member_boundary_fails_instead_of_ending_early(
    converted, tmp_path
):
    # A clean cut between members reads as a shorter tar to tarfile: the size check is
    # passed here (manifest fixed up) to show the index check still catches it.
    root = copy_dataset(converted("wds", "jpeg"), tmp_path)
    shard = readers.load_manifest(root).shard_path(0)
    with tarfile.open(shard) as tar:
        cut = tar.getmembers()[3 * 5].offset  # the header of sample 5's first member
    replace_shard(root, 0, shard.read_bytes()[:cut])
    with pytest.raises(readers.DatasetError, match=rf"{re.escape(str(shard))}.*not inside"):
        list(readers.WdsStream(root, shuffle_buffer=0))


# --- shards of the right size with the wrong content ----------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_shard_of_random_bytes_is_an_error_naming_it(converted, tmp_path, fmt):
    root = copy_dataset(converted(fmt, "jpeg"), tmp_path)
    shard = readers.load_manifest(root).shard_path(0)
    replace_shard(root, 0, random.Random(0).randbytes(shard.stat().st_size))
    with pytest.raises(readers.DatasetError, match=re.escape(str(shard))):
        readers.open_dataset(root)[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_flipped_byte_in_a_raw_sample_reads_back_with_only_that_value_changed(
    converted, tmp_path, fmt
):
    # Raw pixels carry no per-sample checksum (imgpack verify checks SHA-256): the read
    # neither fails nor crashes, and the damage stays inside the one sample
    # (tests/test_damage_conformance.py: the same on every read path).
    root = copy_dataset(converted(fmt, "raw-fixed"), tmp_path)
    intact = [image.clone() for image, _ in readers.open_dataset(root)]
    flip_middle_byte_of_sample(root, 16)
    damaged = [image for image, _ in readers.open_dataset(root)]
    changed = [i for i in range(len(intact)) if not torch.equal(intact[i], damaged[i])]
    assert changed == [16]
    assert int((intact[16] != damaged[16]).sum()) == 1


def narrow_shape_of_sample(fmt: str, shard: Path, i: int) -> None:
    """Make the shard's metadata give raw sample ``i`` one column fewer than it stores."""
    if fmt == "pt":
        tensors = torch.load(shard, weights_only=True)
        tensors[spec.PT_SHAPES][i, 1] -= 1
        replace_shard(shard.parent, 0, save_pt(tensors))
    else:
        with h5py.File(shard, "r+") as f:
            shape = f[spec.H5_SHAPES][i]
            f[spec.H5_SHAPES][i] = [shape[0], shape[1] - 1, 3]
        replace_shard(shard.parent, 0, shard.read_bytes())


def shorten_lmdb_sample(shard: Path, i: int) -> None:
    env = lmdb.open(str(shard), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        key = spec.SAMPLE_KEY.format(i).encode()
        txn.put(key, txn.get(key)[:-3])
    env.close()
    replace_shard(shard.parent, 0, shard.read_bytes())


@pytest.mark.parametrize(
    ("fmt", "case"),
    [
        ("pt", "raw-variable"),
        ("hdf5", "raw-variable"),
        ("lmdb", "raw-fixed"),
        ("lmdb", "raw-variable"),
    ],
)
def test_raw_sample_of_another_size_than_its_shape_fails_alike_on_every_path(
    converted, tmp_path, fmt, case
):
    # (wds: a .npy header that disagrees with its member, tests/test_damage_conformance.py)
    root = copy_dataset(converted(fmt, case), tmp_path)
    shard = readers.load_manifest(root).shard_path(0)
    if fmt == "lmdb":
        shorten_lmdb_sample(shard, 16)
    else:
        narrow_shape_of_sample(fmt, shard, 16)
    ds = readers.open_dataset(root)
    with pytest.raises(readers.DatasetError, match=rf"^{re.escape(str(shard))}\[16\]: ") as one:
        ds[16]
    assert "bytes of raw pixels stored, shape" in str(one.value)
    for batch in ([15, 16, 17], [16]):  # the gather of raw pixels of one shape, and per sample
        with pytest.raises(readers.DatasetError) as many:
            ds.__getitems__(batch)
        assert str(many.value) == str(one.value)
    with pytest.raises(readers.DatasetError) as cropped:
        readers.open_dataset(root, crop=readers.CenterCrop(16))[16]
    assert str(cropped.value) == str(one.value)


@pytest.mark.parametrize("case", ["jpeg", "original"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_flipped_byte_in_an_encoded_sample_fails_its_crc_naming_the_sample(
    converted, tmp_path, fmt, case
):
    # The damaged entropy-coded data of a JPEG often still decodes: the CRC-32 recorded at
    # conversion refuses it before any decode, and the other samples still read.
    root = copy_dataset(converted(fmt, case), tmp_path)
    flip_middle_byte_of_sample(root, 16)
    ds = readers.open_dataset(root)
    shard = ds.manifest.shard_path(0)
    with pytest.raises(readers.DatasetError, match=rf"^{re.escape(str(shard))}\[16\]: .*CRC-32"):
        ds[16]
    with pytest.raises(readers.DatasetError, match=r"CRC-32"):
        ds.stored(16)  # undecoded too (decode=False and GPU decoding read this)
    assert ds[15][0].shape[0] == ds[17][0].shape[0] == 3
    # the batch reads, whose CRC-32s are computed in one call: the same error
    with pytest.raises(readers.DatasetError, match=rf"^{re.escape(str(shard))}\[16\]: .*CRC-32"):
        ds.read_stored([15, 16, 17])
    cropped = readers.open_dataset(root, crop=readers.CenterCrop(16), decode_threads=1)
    with pytest.raises(readers.DatasetError, match=rf"^{re.escape(str(shard))}\[16\]: .*CRC-32"):
        cropped.__getitems__([17, 16, 15])
    assert cropped.__getitems__([15, 17]).images.shape == (2, 3, 16, 16)


@pytest.mark.parametrize("fmt", FORMATS)
def test_shards_without_crcs_are_read_as_before(converted, tmp_path, fmt):
    # A dataset converted before imgpack recorded CRC-32s reads as it did (the decoder is
    # then the only judge); the manifest's shard SHA-256 still lets imgpack verify tell.
    root = copy_dataset(converted(fmt, "jpeg"), tmp_path)
    shard = readers.load_manifest(root).shard_path(0)
    drop_crcs(fmt, shard)
    ds = readers.open_dataset(root)
    assert [ds[i][1] for i in range(len(ds))] == readers.open_dataset(
        converted(fmt, "jpeg")
    ).targets
    flip_middle_byte_of_sample(root, 16)
    try:
        ds = readers.open_dataset(root)
        image, _ = ds[16]
    except readers.DatasetError as e:  # the decoder refused it
        assert "CRC-32" not in str(e) and f"{shard}[16]: " in str(e)
    else:
        assert image.shape[0] == 3


def drop_crcs(fmt: str, shard: Path) -> None:
    """Remove the CRC-32s from a shard, as imgpack wrote shards before it recorded them."""
    if fmt == "pt":
        tensors = torch.load(shard, weights_only=True)
        del tensors[spec.PT_CRCS]
        replace_shard(shard.parent, 0, save_pt(tensors))
    elif fmt == "hdf5":
        with h5py.File(shard, "r+") as f:
            del f[spec.H5_CRCS]
        replace_shard(shard.parent, 0, shard.read_bytes())
    elif fmt == "lmdb":
        env = lmdb.open(str(shard), subdir=False, lock=False)
        with env.begin(write=True) as txn:
            assert txn.delete(spec.LMDB_CRCS)
        env.close()
        replace_shard(shard.parent, 0, shard.read_bytes())
    else:
        index_path = Path(str(shard) + spec.WDS_INDEX_SUFFIX)
        index = json.loads(index_path.read_text(encoding="utf-8"))
        del index[spec.WDS_CRC_COLUMN]
        index_path.write_text(json.dumps(index), encoding="utf-8")


def save_pt(tensors: dict[str, torch.Tensor]) -> bytes:
    out = io.BytesIO()
    torch.save(tensors, out)
    return out.getvalue()


# --- hand-made tars and indexes -------------------------------------------------------------
@pytest.mark.parametrize("name", ["/etc/x.jpg", "../x.jpg", "a/../../x.jpg"])
def test_wds_readers_never_extract_a_member_named_as_a_path(converted, tmp_path, monkeypatch, name):
    root = copy_dataset(converted("wds", "jpeg"), tmp_path)
    shard = readers.load_manifest(root).shard_path(0)
    replace_shard(root, 0, rename_first_member(shard, name))
    with tarfile.open(shard) as tar:
        assert tar.getnames()[0] == name  # tarfile wrote the name as given
    workdir = tmp_path / "cwd"  # where a relative extraction would land
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    before = files_below(tmp_path)
    # Both readers go by the index (offsets of image members): names are never used.
    streamed = list(readers.WdsStream(root, shuffle_buffer=0))
    ds = readers.open_dataset(root)
    assert len(streamed) == len(ds)
    assert torch.equal(streamed[0][0], ds[0][0])
    assert files_below(tmp_path) == before
    assert not Path("/etc/x.jpg").exists()


class _WritesAFile:
    """Unpickling this writes ``target``: the payload a hostile ``.pyd`` member carries."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def with_pickle_member(tar_path: Path, target: Path) -> bytes:
    """The tar at ``tar_path`` with a ``KEY.pyd`` pickle member added to its last sample
    (at the end, so that the random-access index stays right)."""
    out = io.BytesIO()
    with tarfile.open(tar_path) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member))
        payload = pickle.dumps(_WritesAFile(str(target)))
        extra = tarfile.TarInfo(member.name.split(".")[0] + ".pyd")
        extra.size = len(payload)
        dst.addfile(extra, io.BytesIO(payload))
    return out.getvalue()


def test_wds_readers_never_read_a_pickle_member(converted, tmp_path):
    root = copy_dataset(converted("wds", "jpeg"), tmp_path)
    target = tmp_path / "payload-ran"
    shard = replace_shard(
        root, 0, with_pickle_member(readers.load_manifest(root).shard_path(0), target)
    )
    # Both readers go by the index, which lists image members only.
    ds = readers.open_dataset(root)
    assert len(list(readers.WdsStream(root, shuffle_buffer=0))) == len(ds)
    assert len([ds[i] for i in range(ds.manifest.shards[0].samples)]) > 0
    assert not target.exists()
    with tarfile.open(shard) as tar:
        assert tar.getnames()[-1].endswith(".pyd")


def damaged_entry(column: str, value: Callable[[int], object]) -> Callable[[dict, int], str]:
    """An index rewrite setting sample 3's ``column`` to ``value(tar_size)``: sample 0, the
    one read, stays intact, so a refusal shows that the whole index is checked at open."""

    def rewrite(index: dict, tar_size: int) -> str:
        index[column][3] = value(tar_size)
        return json.dumps(index)

    return rewrite


INDEX_DAMAGE: dict[str, Callable[[dict, int], str]] = {
    "offset-past-the-end": damaged_entry("offsets", lambda tar_size: tar_size),
    "size-past-the-end": damaged_entry("sizes", lambda tar_size: tar_size),
    "negative-offset": damaged_entry("offsets", lambda tar_size: -512),
    "fractional-offset": damaged_entry("offsets", lambda tar_size: 1536.5),
    "label-a-string": damaged_entry("labels", lambda tar_size: "0"),
    "truncated-json": lambda index, tar_size: json.dumps(index)[:100],
}


@pytest.mark.parametrize("damage", INDEX_DAMAGE)
def test_wds_index_that_is_invalid_or_points_outside_the_tar_is_refused_at_open(
    converted, tmp_path, damage
):
    root = copy_dataset(converted("wds", "jpeg"), tmp_path)
    shard = readers.load_manifest(root).shard_path(0)
    index_path = Path(str(shard) + spec.WDS_INDEX_SUFFIX)
    index = json.loads(index_path.read_text(encoding="utf-8"))
    index_path.write_text(INDEX_DAMAGE[damage](index, shard.stat().st_size), encoding="utf-8")
    with pytest.raises(readers.DatasetError, match="invalid tar index") as info:
        readers.open_dataset(root)[0]
    assert str(index_path) in str(info.value)
