"""Fields and stored sizes through every format's writer and shard reader (issue 30 §1):
every kind, missing and edge values, each value as it went in; damage to a field's bytes is
a ``DatasetError`` naming ``shard[i]`` and the field; ``webdataset`` reads imgpack's tars
with each field's value."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from convert.writers import WRITERS, Layout, Record
from readers import spec
from readers.fields import FieldSpec, encode
from readers.formats import SHARD_READERS
from readers.spec import DatasetError
from tests.photos import encode as encode_image
from tests.photos import photo_crop

N = 9
SCHEMA = {
    "blob": FieldSpec("bytes"),
    "emb": FieldSpec("array"),
    "meta": FieldSpec("json"),
    "n": FieldSpec("int"),
    "score": FieldSpec("float"),
    "txt": FieldSpec("text"),
}
MARKED = 0x0123456789ABCDEF  # sample 5's int: 8 bytes to find in the shard file


def value_of(name: str, i: int) -> Any:
    """Sample ``i``'s value of field ``name``: edge values, and None (missing) for some."""
    if (i + len(name)) % 4 == 0:
        return None
    return {
        "blob": b"" if i == 1 else bytes(range(i, i + 7)),
        "emb": np.arange(4, dtype=np.float32) + i if i % 2 else np.full((3, 2), i, np.int16),
        "meta": {"url": f"https://example.com/{i}", "tags": ["a", i], "é": None},
        "n": [-(2**63), 2**63 - 1, 0][i % 3] if i != 5 else MARKED,
        "score": [math.nan, math.inf, -0.0, 1e-300, 0.25 * i][i % 5],
        "txt": f"caption-{i}: größer «ok»\nzweite Zeile 写真",
    }[name]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool((a == b).all())
        )
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and a == b and (not isinstance(a, float) or str(a) == str(b))


def write_shard(tmp_path: Path, fmt: str, encoding: str) -> tuple[Path, Layout, list[Record]]:
    layout = Layout(encoding, None, ("a", "b"), fields=tuple(SCHEMA.items()))
    records = []
    for i in range(N):
        pixels = photo_crop(8 + i, 12 + 2 * i, seed=i)
        data = pixels if encoding == "raw" else encode_image(pixels)
        fields = {name: encode(s.kind, value_of(name, i), name) for name, s in SCHEMA.items()}
        records.append(
            Record(f"{i:010d}", data, "jpg", i % 2, f"x/{i}.jpg", pixels.shape[:2], fields)
        )
    path = tmp_path / spec.shard_name(fmt, 0)
    writer = WRITERS[fmt](path, layout)
    for record in records:
        writer.add(record)
    writer.close()
    return path, layout, records


@pytest.mark.parametrize("fmt", spec.FORMATS)
@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_every_kind_reads_back_as_written(tmp_path, fmt, encoding):
    path, layout, records = write_shard(tmp_path, fmt, encoding)
    shard = SHARD_READERS[fmt](str(path), layout)
    assert sorted(shard.fields) == sorted(SCHEMA)
    assert shard.recorded_sizes() is not None  # read from the shard, not from the images
    assert shard.sizes().tolist() == [list(r.size) for r in records]
    for name, column in shard.fields.items():
        got = column.values(list(range(N)))
        for i, value in enumerate(got):
            assert same(value, value_of(name, i)), (name, i, value)
        assert column.raw([3, 0]) == [records[3].fields[name], records[0].fields[name]]
        assert column.valid.tolist() == [records[i].fields[name] is not None for i in range(N)]


def flip(path: Path, needle: bytes) -> None:
    """Change one byte of the one place ``needle`` is stored in ``path``."""
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0, f"{needle!r} not once in {path.name}"
    data[at + len(needle) - 1] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_a_damaged_value_names_the_sample_and_field(tmp_path, fmt):
    path, layout, _ = write_shard(tmp_path, fmt, "jpeg")
    flip(path, "caption-6: größer".encode())
    shard = SHARD_READERS[fmt](str(path), layout)
    assert shard.fields["txt"].value(5) == value_of("txt", 5)  # the others still read
    with pytest.raises(DatasetError, match=r"\[6\]: field 'txt': stored bytes fail their CRC"):
        shard.fields["txt"].values([4, 6])


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_a_damaged_typed_column_is_refused_at_its_first_read(tmp_path, fmt):
    path, layout, _ = write_shard(tmp_path, fmt, "jpeg")
    if fmt == "wds":  # the typed values are in the index, as JSON numbers
        flip(Path(str(path) + spec.WDS_INDEX_SUFFIX), str(MARKED).encode())
    else:
        flip(path, MARKED.to_bytes(8, "little"))
    shard = SHARD_READERS[fmt](str(path), layout)
    with pytest.raises(DatasetError, match=r"field 'n': its column fails its CRC-32"):
        shard.fields["n"].value(0)
    assert shard.fields["txt"].value(0) == value_of("txt", 0)


@pytest.mark.parametrize("height", [-1, 2**31, 2**70, 1.5])
def test_a_wds_index_with_no_image_size_is_refused_at_open(tmp_path, height):
    path, layout, _ = write_shard(tmp_path, "wds", "jpeg")
    index_path = Path(str(path) + spec.WDS_INDEX_SUFFIX)
    index = json.loads(index_path.read_text())
    index["heights"][2] = height
    index_path.write_text(json.dumps(index))
    with pytest.raises(DatasetError, match=rf"{index_path.name}.*'heights' holds a value"):
        SHARD_READERS["wds"](str(path), layout)


# The webdataset library leaves the tars it opens to the garbage collector (its ResourceWarning,
# as in tests/test_wds_library.py).
@pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)
def test_webdataset_reads_each_field_from_imgpack_tars(tmp_path):
    import webdataset

    path, _, _ = write_shard(tmp_path, "wds", "jpeg")
    pipeline = webdataset.WebDataset([str(path)], shardshuffle=False).decode()
    samples = list(pipeline)
    assert len(samples) == N
    for i, sample in enumerate(samples):
        for name, field_spec in SCHEMA.items():
            ext = spec.wds_field_ext(name, field_spec.kind)
            expected = value_of(name, i)
            if expected is None:
                assert ext not in sample
            elif name == "meta":  # webdataset's json decoder gives the same structure
                assert sample[ext] == expected
            else:
                assert same(sample[ext], expected), (name, i, sample[ext])


# Datasets written by imgpack 0.2.0 (format version 1: no fields, no recorded sizes), made
# by that release's `imgpack convert sample_data DST --format F --encoding jpeg|raw
# --resize 16 --center-crop 16`.
V1 = Path(__file__).parent / "fixtures" / "v1"


@pytest.mark.parametrize("name", ["pt", "pt-raw", "hdf5", "lmdb", "wds"])
def test_version_1_datasets_read_as_they_did(tmp_path, name):
    import readers
    from convert import ConvertOptions, convert_folder
    from tests.conftest import SAMPLE_DATA

    old = readers.open_dataset(V1 / name)
    assert old.manifest.format_version == 1 and old.fields == {}
    fmt, _, raw = name.partition("-")
    options = ConvertOptions(fmt, encoding="raw" if raw else "jpeg", resize=16, center_crop=16)
    convert_folder(SAMPLE_DATA, tmp_path / "new", options, workers=1, progress=False)
    new = readers.open_dataset(tmp_path / "new")
    assert len(old) == len(new) == 32 and old.classes == new.classes
    for i in range(len(old)):
        (old_image, old_label), (new_image, new_label) = old[i], new[i]
        assert old_label == new_label and old_image.equal(new_image)
    assert old.sizes.tolist() == new.sizes.tolist() == [[16, 16]] * 32  # from the images


@pytest.mark.parametrize("name", ["pt", "hdf5", "lmdb", "wds"])
def test_version_1_datasets_verify_deep(name):
    from click.testing import CliRunner

    from convert.cli import main

    result = CliRunner().invoke(main, ["verify", str(V1 / name), "--deep"])
    assert result.exit_code == 0, result.output
