"""The same damage gives the same outcome on every read path, in every format and encoding.

A sample's stored bytes are damaged in place (the shard keeps its size, so only its SHA-256
changes), then the whole dataset is read through each path a training script may take:
``ds[i]``, ``__getitems__`` (the batch path of DataLoader and make_loader), ``decode=False``
(bytes for GPU decoding), ``crop=`` (decoded straight into the batch), the stream
(``wds``), and make_loader with a DataLoader worker. The outcome must be what ``ds[i]`` gives:

- an encoded sample (``jpeg``, ``original``) whose bytes changed fails its CRC-32 (recorded
  at conversion) with the same ``DatasetError`` naming ``shard[index]`` on every path, even
  where the damaged JPEG would still decode;
- a ``.npy`` member (``wds`` raw) whose header changed fails the same way on every path;
- raw pixels whose bytes changed cannot be told (no per-sample check on raw reads, see
  docs/FORMATS.md): every path serves the same damaged pixels, and only that sample's;
  except in an HDF5 gzip chunk, whose own checksum fails the same way on every path.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import readers
from readers import spec
from tests.test_reader_faults import copy_dataset

DAMAGED = 16  # local index of the damaged sample, in shard 0
BATCH = 8
CROP = 32  # CenterCrop(32): inside every stored image here, so a plain copy of its centre

Read = Callable[[Path], list[torch.Tensor]]


# --- the damage -----------------------------------------------------------------------------
def _locate_sample(root: Path) -> tuple[Path, bytearray, int, int]:
    """Shard 0's bytes and where sample DAMAGED's stored bytes (for raw: its pixels; for
    compressed HDF5 chunks: its chunk) lie."""
    value = readers.open_dataset(root).shard(0).read(DAMAGED)
    sample = value.tobytes() if isinstance(value, np.ndarray) else bytes(value)
    shard = readers.load_manifest(root).shard_path(0)
    content = bytearray(shard.read_bytes())
    start = content.find(sample)
    if start < 0 and shard.suffix == ".h5":  # compressed: the chunk holds it
        with h5py.File(shard) as f:
            chunk = f[spec.H5_IMAGES].id.get_chunk_info_by_coord((DAMAGED, 0, 0, 0))
        return shard, content, chunk.byte_offset, chunk.size
    assert start >= 0 and content.find(sample, start + 1) < 0, "sample not stored once"
    return shard, content, start, len(sample)


def flip_payload(root: Path) -> None:
    """Invert three bytes in the middle of the sample's stored bytes."""
    shard, content, start, size = _locate_sample(root)
    for position in range(start + size // 2, start + size // 2 + 3):
        content[position] ^= 0xFF
    shard.write_bytes(content)


def _npy_header(content: bytearray, pixels_start: int) -> int:
    """Offset of the ``.npy`` header whose pixels start at ``pixels_start``."""
    start = content.rfind(b"\x93NUMPY", 0, pixels_start)
    assert 0 <= pixels_start - start <= 256
    return start


def flip_npy_magic(root: Path) -> None:
    """Invert the first byte of the sample's ``.npy`` header (the pixels stay intact)."""
    shard, content, start, _ = _locate_sample(root)
    content[_npy_header(content, start)] ^= 0xFF
    shard.write_bytes(content)


def change_npy_shape(root: Path) -> None:
    """Make the ``.npy`` header say one column fewer, its length unchanged: NumPy alone
    would load it as a narrower image from the same bytes."""
    shard, content, start, _ = _locate_sample(root)
    header = _npy_header(content, start)
    text = content[header:start].decode("latin-1")
    height, width = re.search(r"\((\d+), (\d+), 3\)", text).groups()
    narrower = f"({height}, {int(width) - 1:0{len(width)}d}, 3)"
    assert len(narrower) == len(f"({height}, {width}, 3)")
    content[header:start] = text.replace(f"({height}, {width}, 3)", narrower).encode("latin-1")
    shard.write_bytes(content)


DAMAGES: dict[str, Callable[[Path], None]] = {
    "payload": flip_payload,
    "npy-magic": flip_npy_magic,
    "npy-shape": change_npy_shape,
}
CASES = ("raw-fixed", "raw-variable", "jpeg", "original")
# Every format, and hdf5 with gzip chunks (whose checksum tells raw pixels of one shape).
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    **{fmt: (fmt, {}) for fmt in readers.DATASETS},
    "hdf5-gzip": ("hdf5", {"compression": "gzip"}),
}
COMBINATIONS = [
    (fmt, case, damage)
    for fmt in VARIANTS
    for case in CASES
    for damage in DAMAGES
    if damage == "payload" or (fmt == "wds" and case.startswith("raw"))
]


# --- the read paths ---------------------------------------------------------------------------
def _crop() -> readers.CenterCrop:
    return readers.CenterCrop(CROP)


def by_index(root: Path, **kwargs) -> list[torch.Tensor]:
    ds = readers.open_dataset(root, **kwargs)
    return [ds[i][0] for i in range(len(ds))]


def by_batch(root: Path, **kwargs) -> list[torch.Tensor]:
    ds = readers.open_dataset(root, **kwargs)
    out: list[torch.Tensor] = []
    for start in range(0, len(ds), BATCH):
        out += list(ds.__getitems__(list(range(start, min(start + BATCH, len(ds))))).images)
    return out


def by_stream(root: Path, **kwargs) -> list[torch.Tensor]:
    return [image for image, _ in readers.WdsStream(root, shuffle_buffer=0, **kwargs)]


def by_loader(root: Path, **kwargs) -> list[torch.Tensor]:
    loader = readers.make_loader(
        root, BATCH, shuffle=False, num_workers=1, collate_fn=readers.collate_any, **kwargs
    )
    loader.set_epoch(0)
    return [image for images, _ in loader for image in images]


PATHS: dict[str, tuple[Read, bool]] = {  # name: (read, whether it crops)
    "ds[i]": (by_index, False),
    "__getitems__": (by_batch, False),
    "decode=False ds[i]": (lambda root: by_index(root, decode=False), False),
    "decode=False __getitems__": (lambda root: by_batch(root, decode=False), False),
    "crop ds[i]": (lambda root: by_index(root, crop=_crop()), True),
    "crop __getitems__": (lambda root: by_batch(root, crop=_crop()), True),
    "WdsStream": (by_stream, False),
    "WdsStream crop": (lambda root: by_stream(root, crop=_crop()), True),
    "make_loader worker": (by_loader, False),
    "make_loader worker crop": (lambda root: by_loader(root, crop=_crop()), True),
    "make_loader stream worker": (lambda root: by_loader(root, stream=True), False),
}
STREAM_PATHS = {name for name in PATHS if "tream" in name}
EVERY_PATH = [  # every combination with every path that format has
    (fmt, case, damage, path)
    for fmt, case, damage in COMBINATIONS
    for path in PATHS
    if fmt == "wds" or path not in STREAM_PATHS
]


def center(image: torch.Tensor) -> torch.Tensor:
    """CenterCrop(CROP) of a ``[3, H, W]`` image, torchvision's way (no resize here)."""
    h, w = image.shape[1:]
    top, left = round((h - CROP) / 2), round((w - CROP) / 2)
    return image[:, top : top + CROP, left : left + CROP]


# --- the reference: what ds[i] does with the damage -------------------------------------------
@pytest.fixture(scope="module")
def damaged(converted, tmp_path_factory) -> Callable[[str, str, str], tuple[Path, object]]:
    """``damaged(fmt, case, damage)`` -> (the damaged copy, the outcome every path must
    give): the ``DatasetError`` message of ``ds[i]``, or the images of every sample."""
    cache: dict[tuple[str, str, str], tuple[Path, object]] = {}

    def build(fmt: str, case: str, damage: str) -> tuple[Path, object]:
        key = (fmt, case, damage)
        if key not in cache:
            name, extra = VARIANTS[fmt]
            intact = converted(name, case, **extra)
            root = copy_dataset(intact, tmp_path_factory.mktemp("-".join(key)))
            DAMAGES[damage](root)
            where = f"{readers.load_manifest(root).shard_path(0)}[{DAMAGED}]"
            try:
                images = by_index(root)
            except readers.DatasetError as e:
                assert str(e).startswith(f"{where}: "), str(e)
                outcome: object = str(e)
            else:
                originals = by_index(intact)
                changed = [i for i, a in enumerate(originals) if not torch.equal(a, images[i])]
                assert changed == [DAMAGED]
                outcome = images
            cache[key] = root, outcome
        return cache[key]

    return build


@pytest.mark.parametrize(("fmt", "case", "damage"), COMBINATIONS)
def test_what_the_format_can_tell_fails_and_what_it_cannot_is_documented(
    damaged, fmt, case, damage
):
    # Encoded samples carry a CRC-32 and .npy headers are checked: those damages are errors.
    # Raw pixel bytes have no per-sample check on the read paths (docs/RELIABILITY.md),
    # unless a gzip chunk holds them (zlib's checksum fails its inflate).
    _, outcome = damaged(fmt, case, damage)
    gzip_chunk = (fmt, case) == ("hdf5-gzip", "raw-fixed")
    cannot_tell = case.startswith("raw") and damage == "payload" and not gzip_chunk
    told = isinstance(outcome, str)
    assert told != cannot_tell, outcome if told else "the damaged sample read as pixels"


@pytest.mark.parametrize(("fmt", "case", "damage", "path"), EVERY_PATH)
def test_the_same_damage_gives_the_same_outcome_on_every_path(damaged, fmt, case, damage, path):
    read, crops = PATHS[path]
    root, outcome = damaged(fmt, case, damage)
    if isinstance(outcome, str):
        with pytest.raises(readers.DatasetError) as raised:
            read(root)
        if path.startswith("make_loader"):  # re-raised by the DataLoader with the traceback
            assert f"{spec.DatasetError.__name__}: {outcome}" in str(raised.value)
        else:
            assert str(raised.value) == outcome
        return
    images = read(root)
    expected = [center(image) for image in outcome] if crops else outcome
    assert len(images) == len(expected)
    pairs = enumerate(zip(images, expected, strict=True))
    assert [i for i, (a, b) in pairs if not torch.equal(a, b)] == []
