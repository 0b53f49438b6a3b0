"""The tools see fields (issue 30 §4): ``info`` and ``inspect`` show the schema and a few
values, ``inspect --grid --caption`` writes a text field under each tile, ``diff`` compares
fields and names the samples and fields that differ, ``verify --deep`` reads every field
value and names the shard, sample and field of a damaged one.

The datasets are conversions of real img2dataset-style tars (``webdataset.ShardWriter``:
jpg, a txt caption with non-ASCII text and newlines, json metadata); an edited copy is
re-converted from tars whose one caption was rewritten with ``tarfile``.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result
from PIL import Image

from convert.cli import main
from convert.diff import diff_datasets
from convert.field_diff import same_value
from convert.field_views import schema_lines
from convert.inspection import CAPTION_LINES, GAP, LABEL_HEIGHT
from convert.tile_text import ELLIPSIS, label_font, wrap_caption
from readers import spec
from readers.fields import FieldSpec
from readers.manifest import load_manifest
from readers.storage.remote import RemoteFolder
from tests.test_fields_sources import (
    CAPTIONS,
    PHOTOS,
    TAG_NAMES,
    convert,
    hub_parquet,
    img2dataset_shards,
)
from tests.test_object_storage import BUCKET, s3_server  # noqa: F401 (the fixture)
from tests.test_verify import flip_byte, reseal

FIELD_FORMATS = spec.FORMATS  # every writer stores fields (issue 30)
CAPTION_INK = (200, 200, 150)  # the colour convert.inspection writes captions in
EDITED = 3  # the sample whose caption the edited tars change
EDITED_CAPTION = "Ein ganz anderes Foto\nneue Zeile"


def imgpack(*args: str) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def tars(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return img2dataset_shards(tmp_path_factory.mktemp("tars") / "src")


@pytest.fixture(scope="module")
def edited_tars(tars: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tars with sample ``EDITED``'s caption rewritten, every other member kept."""
    out = tmp_path_factory.mktemp("edited") / "src"
    out.mkdir()
    key = f"{EDITED:09d}.txt"
    for path in sorted(tars.glob("*.tar")):
        with tarfile.open(path) as old, tarfile.open(out / path.name, "w") as new:
            for member in old.getmembers():
                data = old.extractfile(member).read()
                if member.name == key:
                    data = EDITED_CAPTION.encode("utf-8")
                    member.size = len(data)
                new.addfile(member, io.BytesIO(data))
    return out


@pytest.fixture(scope="module")
def datasets(tars: Path, tmp_path_factory: pytest.TempPathFactory):
    """``datasets(fmt, name="a", src=tars, **options)``: a conversion, made once."""
    made: dict[tuple, Path] = {}

    def build(fmt: str, name: str = "a", src: Path | None = None, **options: Any) -> Path:
        key = (fmt, name)
        if key not in made:
            dst = tmp_path_factory.mktemp(f"{fmt}-{name}") / "dst"
            convert(src or tars, dst, fmt, **options)
            made[key] = dst
        return made[key]

    return build


def test_info_shows_the_schema_and_the_format_version(datasets):
    result = imgpack("info", datasets("pt"))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"(format version {spec.FORMAT_VERSION}," in result.output
    start = lines.index("fields     2")
    assert lines[start + 1 : start + 3] == ["  json  json", "  txt   text"]


def test_info_says_a_dataset_without_fields_has_none(datasets):
    result = imgpack("info", datasets("pt", "none", fields=()))
    assert result.exit_code == 0, result.output
    assert "fields     none" in result.output.splitlines()


def test_schema_lines_spell_dtype_shape_and_names():
    schema = {
        "emb": FieldSpec("array", "<f4", (2, 512)),
        "tags": FieldSpec("json", names=tuple(f"c{n}" for n in range(10))),
    }
    assert schema_lines(schema) == [
        "  emb   array <f4 [2, 512]",
        "  tags  json names: c0, c1, c2, c3, c4, c5, c6, c7, and 2 more",
    ]


@pytest.mark.parametrize("what", ["dataset", "tars"])
def test_inspect_shows_the_schema_and_the_first_values_on_one_line(datasets, tars, what):
    path = datasets("pt") if what == "dataset" else tars
    result = imgpack("inspect", path)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = lines.index("fields     2")
    first_caption = " ".join(CAPTIONS[0].split())  # its newline made a space
    assert lines[start + 1] == "  json  json"
    assert lines[start + 2] == (
        '      {"url":"https://example.com/0.jpg","width":64,"height":48,"score":0.25}'
    )
    assert lines[start + 5 : start + 7] == ["  txt   text", f"      {first_caption}"]
    shown = json.loads(imgpack("inspect", path, "--json").output)
    assert shown["fields"] == {"json": {"kind": "json"}, "txt": {"kind": "text"}}
    assert shown["field_values"]["txt"] == [" ".join(c.split()) for c in CAPTIONS[:3]]
    assert shown["shapes"]["distinct"] > 1  # the images' headers were read past their fields


def sheet_of(result: Result) -> tuple[dict[str, Any], Image.Image]:
    assert result.exit_code == 0, result.output
    grid = json.loads(result.output)["grid"]
    return grid, Image.open(grid["path"]).convert("RGB")


@pytest.mark.parametrize("what", ["dataset", "tars"])
def test_inspect_grid_writes_the_caption_under_each_tile(datasets, tars, tmp_path, what):
    path = datasets("pt") if what == "dataset" else tars
    tile = 96
    plain, plain_png = sheet_of(imgpack("inspect", path, "--grid", tmp_path / "a.png", "--json"))
    grid, png = sheet_of(
        imgpack("inspect", path, "--grid", tmp_path / "b.png", "--caption", "txt", "--json")
    )
    assert plain_png.height == tile + LABEL_HEIGHT + GAP  # one row: the dataset is unlabeled
    assert png.height == tile + LABEL_HEIGHT * (1 + CAPTION_LINES) + GAP
    (drawn,) = grid["tiles"].values()  # the same seeded samples as without --caption
    assert drawn == next(iter(plain["tiles"].values()))
    by_path = {f"{n:09d}.jpg": caption for n, caption in enumerate(CAPTIONS)}
    assert grid["captions"] == {"(unlabeled)": [by_path[p] for p in drawn]}
    pixels = np.asarray(png)
    strip = pixels[tile + LABEL_HEIGHT + GAP // 2 :]  # the caption lines, under the labels
    for column in range(len(drawn)):  # every tile has its caption inked under it
        cell = strip[:, column * (tile + GAP) : (column + 1) * (tile + GAP)]
        assert (cell == CAPTION_INK).all(axis=-1).sum() > 20
    assert not (np.asarray(plain_png) == CAPTION_INK).all(axis=-1).any()


def test_inspect_grid_caption_of_no_field_or_a_non_text_field_is_one_error(datasets, tmp_path):
    path, png = datasets("pt"), tmp_path / "g.png"
    missing = imgpack("inspect", path, "--grid", png, "--caption", "caption")
    assert missing.exit_code == 1
    assert missing.output.strip() == (
        f"Error: {path}: no field 'caption' to caption the grid with (text fields: txt)"
    )
    not_text = imgpack("inspect", path, "--grid", png, "--caption", "json")
    assert not_text.exit_code == 1
    assert "field 'json' is json, not text" in not_text.output
    assert not png.exists()
    no_grid = imgpack("inspect", path, "--caption", "txt")
    assert no_grid.exit_code == 2 and "add --grid" in no_grid.output


def test_wrap_caption_keeps_each_line_inside_the_tile():
    font, width = label_font(), 90
    caption = "Ein Foto Nr. 1: größer als 1 zweite Zeile «ok» " + "写真" * 30
    lines = wrap_caption(caption, font, width)
    assert len(lines) == CAPTION_LINES
    assert all(0 < font.getlength(line) <= width for line in lines)
    assert lines[0].startswith("Ein Foto") and lines[-1].endswith(ELLIPSIS)
    assert "".join(lines)[:-1].replace(" ", "") in caption.replace(" ", "")
    assert wrap_caption("kurz", font, width) == ["kurz"]
    long_word = wrap_caption("写真" * 8, font, 40)  # no spaces: broken inside the word
    assert len(long_word) > 1 and all(font.getlength(line) <= 40 for line in long_word)


def test_diff_of_two_conversions_with_fields_is_equivalent(datasets):
    a, b = datasets("pt"), datasets("pt", "raw", encoding="raw")
    report = diff_datasets(a, b, progress=False)
    assert not report.checksum_match  # the pairs were compared, fields too
    assert report.fields_compared == ["json", "txt"] and report.field_mismatches == []
    assert report.equivalent, report.summary()
    result = imgpack("diff", a, datasets("pt", "again"))
    assert result.exit_code == 0, result.output
    assert "the same samples, labels, pixels and fields" in result.output


@pytest.mark.parametrize("fmt", FIELD_FORMATS)
def test_diff_names_the_sample_and_field_whose_caption_changed(datasets, edited_tars, fmt):
    a, b = datasets(fmt), datasets(fmt, "edited", src=edited_tars)
    path = f"{EDITED:09d}.jpg"
    report = diff_datasets(a, b, progress=False)
    assert [
        (m["index_a"], m["index_b"], m["path"], m["field"]) for m in report.field_mismatches
    ] == [(EDITED, EDITED, path, "txt")]
    assert report.max_diff == 0.0 and not report.label_mismatches  # only the caption
    result = imgpack("diff", a, b)
    assert result.exit_code == 1, result.output
    assert "field mismatches: 1 value(s) in 1 sample(s) (of json, txt):" in result.output
    before = "Ein Foto Nr. 3: größer als 1 zweite Zei…"  # one line, shortened
    after = "Ein ganz anderes Foto neue Zeile"
    assert f"  [{EDITED}] {path}  txt: {before} vs {after}\n" in result.output


def test_diff_reports_a_schema_difference(datasets):
    result = imgpack("diff", datasets("pt"), datasets("pt", "txt-only", fields=("txt",)))
    assert result.exit_code == 1, result.output
    assert "fields differ: json: only in A (json)" in result.output
    assert "field mismatches" not in result.output  # txt, in both, is the same


def test_field_values_compare_as_their_kinds_mean_them():
    assert same_value("json", b'{"a":1,"b":[2,3]}', b'{"b":[2,3.0],"a":1}', "json")
    assert not same_value("json", b'{"a":true}', b'{"a":1}', "json")
    assert same_value("json", b"NaN", b"NaN", "json")
    assert not same_value("text", b"caption", b"caption ", "txt")
    assert not same_value("float", b"0.25", b"0.250001", "score")
    assert not same_value("text", None, b"", "txt")  # missing is not empty
    assert same_value("bytes", None, None, "raw")
    with pytest.raises(ValueError, match="field 'json'"):
        same_value("json", b'{"cut', b"{}", "json")


@pytest.mark.parametrize("fmt", FIELD_FORMATS)
def test_verify_deep_reads_every_field_of_an_intact_dataset(datasets, fmt):
    result = imgpack("verify", "--deep", datasets(fmt))
    assert result.exit_code == 0, result.output
    assert "every sample and field decoded, content checksum matches" in result.output


@pytest.mark.parametrize("fmt", FIELD_FORMATS)
def test_verify_deep_names_the_shard_sample_and_field_of_a_flipped_caption_byte(
    datasets, tmp_path, fmt
):
    root = tmp_path / "copy"
    shutil.copytree(datasets(fmt), root)
    shard = root / spec.shard_name(fmt, 0)
    data = shard.read_bytes()
    caption = CAPTIONS[EDITED].encode("utf-8")
    assert data.count(caption) == 1  # the caption's bytes, found in the shard
    flip_byte(shard, data.index(caption) + len("Ein Foto"))
    quick = imgpack("verify", root)
    assert quick.exit_code == 1 and f"{shard}: SHA-256 does not match" in quick.output
    reseal(root, 0)  # the file checksums now agree: only the field's own CRC-32 can tell
    assert imgpack("verify", root).exit_code == 0
    deep = imgpack("verify", "--deep", root)
    assert deep.exit_code == 1, deep.output
    assert len(load_manifest(root).shards) == 1  # local index == dataset index
    named = f"{shard}[{EDITED}] (sample {EDITED}): field 'txt': stored bytes fail their CRC-32"
    assert named in deep.output
    assert deep.output.count(f"{shard}[{EDITED}]") == 1  # named once
    assert "problem(s) found" in deep.output


@pytest.fixture(scope="module")
def hubs(tmp_path_factory: pytest.TempPathFactory):
    """``hubs(fmt)``: a conversion of a ``datasets``-written Parquet file: caption (text),
    score (float: a typed column), tags (Sequence(ClassLabel): json with its names),
    labelled; made once."""
    parquet = hub_parquet(tmp_path_factory.mktemp("parquet"))
    made: dict[str, Path] = {}

    def build(fmt: str) -> Path:
        if fmt not in made:
            made[fmt] = tmp_path_factory.mktemp(f"hub-{fmt}") / "dst"
            convert(parquet, made[fmt], fmt)
        return made[fmt]

    return build


@pytest.fixture
def hub(hubs) -> Path:
    return hubs("pt")


def test_info_and_inspect_show_a_typed_column_and_a_json_field_with_names(hub):
    info = imgpack("info", hub)
    assert info.exit_code == 0, info.output
    lines = info.output.splitlines()
    start = lines.index("fields     3")
    assert lines[start + 1 : start + 4] == [
        "  caption  text",
        "  score    float",
        f"  tags     json names: {', '.join(TAG_NAMES)}",
    ]
    shown = json.loads(imgpack("inspect", hub, "--json").output)["field_values"]
    assert shown["score"] == ["0.5", "1.5", "2.5"] and shown["tags"] == ["[0,2]", "[1]", "[]"]


def test_inspect_grid_captions_each_class_row(hub, tmp_path):
    grid, _ = sheet_of(
        imgpack("inspect", hub, "--grid", tmp_path / "g.png", "--caption", "caption", "--json")
    )
    assert list(grid["captions"]) == ["cat", "dog"]
    for name, paths in grid["tiles"].items():
        expected = [CAPTIONS[[p.name for p in PHOTOS].index(Path(p).name)] for p in paths]
        assert grid["captions"][name] == expected


@pytest.mark.parametrize("fmt", ["pt", "hdf5", "lmdb"])  # wds: the index holds the column
def test_verify_deep_names_the_field_whose_typed_column_is_damaged(hubs, tmp_path, fmt):
    root = tmp_path / "copy"
    shutil.copytree(hubs(fmt), root)
    shard = root / spec.shard_name(fmt, 0)
    data = shard.read_bytes()
    score = np.float64(0.5 + EDITED).tobytes()
    assert data.count(score) == 1  # sample EDITED's score, in the typed column
    flip_byte(shard, data.index(score) + 6)
    reseal(root, 0)
    deep = imgpack("verify", "--deep", root)
    assert deep.exit_code == 1, deep.output
    assert f"{shard}: field 'score': its column fails its CRC-32" in deep.output
    assert deep.output.count("field 'score'") == 1  # once for the shard, not per sample


@pytest.mark.usefixtures("s3_server")
@pytest.mark.parametrize("fmt", ["pt", "wds"])  # a shard copied whole; ranged reads
def test_the_field_tools_on_a_dataset_in_a_bucket(datasets, edited_tars, fmt, tmp_path):
    url = f"s3://{BUCKET}/fields-tools/{fmt}"
    bucket = RemoteFolder(url)
    for path in sorted(datasets(fmt).iterdir()):
        bucket.upload(path, path.name)
    shown = json.loads(imgpack("inspect", url, "--json").output)
    assert shown["field_values"]["txt"] == [" ".join(c.split()) for c in CAPTIONS[:3]]
    grid, _ = sheet_of(
        imgpack("inspect", url, "--grid", tmp_path / "g.png", "--caption", "txt", "--json")
    )
    assert sorted(grid["captions"]["(unlabeled)"]) == sorted(CAPTIONS)
    deep = imgpack("verify", "--deep", url)
    assert deep.exit_code == 0, deep.output
    result = imgpack("diff", url, datasets(fmt, "edited", src=edited_tars), "--json")
    assert result.exit_code == 1, result.output
    (mismatch,) = json.loads(result.output)["field_mismatches"]
    assert (mismatch["index_a"], mismatch["field"]) == (EDITED, "txt")


V1 = Path(__file__).parent / "fixtures" / "v1"  # datasets written by imgpack 0.2.0


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_the_tools_read_a_version_1_dataset_as_one_without_fields(fmt, tmp_path):
    root = V1 / fmt
    info = imgpack("info", root)
    assert info.exit_code == 0, info.output
    assert "(format version 1," in info.output and "fields     none" in info.output
    shown = imgpack("inspect", root, "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["fields"] == {}
    again = tmp_path / "v2"
    convert(root, again, "pt")  # a version 2 copy, of the same samples, without fields
    report = diff_datasets(root, again, progress=False)
    assert report.equivalent and not report.schema_differences, report.summary()
    assert imgpack("verify", "--deep", root).exit_code == 0
