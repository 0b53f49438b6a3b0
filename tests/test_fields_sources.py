"""Fields from every source through the conversion (issue 30 §2): what each source carries
beside the image and label reaches the records and the shards, canonical, in the schema's
order; ``--fields``/``--no-fields`` choose them; bad field input is one line.

The inputs are made by the libraries users make them with: ``webdataset.ShardWriter`` as
img2dataset writes (jpg + txt caption + json metadata), ``datasets`` Parquet, a folder with
sidecars and a ``--metadata`` CSV.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from convert import ConvertOptions, convert_folder
from convert.cli import main
from convert.executors.pool import prepare_samples
from convert.sources import open_source
from readers.fields import decode
from readers.formats import open_local_shard
from readers.manifest import load_manifest
from tests.conftest import SAMPLE_DATA
from tests.test_object_storage import BUCKET, s3_server  # noqa: F401 (the fixture)

PHOTOS = sorted(SAMPLE_DATA.rglob("*.jpg"))[:6]
CAPTIONS = [f"Ein Foto Nr. {n}: größer als 1\nzweite Zeile «ok» 写真" for n in range(len(PHOTOS))]


def img2dataset_shards(folder: Path, **extra: Any) -> Path:
    """Tars as img2dataset writes them through ``webdataset.ShardWriter``: jpg, a txt
    caption (non-ASCII, newlines) and json metadata (url, width, height, score); ``extra``
    adds members to every sample."""
    import webdataset

    folder.mkdir()
    with webdataset.ShardWriter(str(folder / "%05d.tar"), maxcount=4) as sink:
        for n, (photo, caption) in enumerate(zip(PHOTOS, CAPTIONS, strict=True)):
            meta = {"url": f"https://example.com/{n}.jpg", "width": 64, "height": 48}
            sink.write(
                {
                    "__key__": f"{n:09d}",
                    "jpg": photo.read_bytes(),
                    "txt": caption,
                    "json": {**meta, "score": 0.25 + n},
                    **extra,
                }
            )
    return folder


def convert(
    src: Path, dst: Path, fmt: str = "pt", on_error: str = "skip", workers: int = 1, **options: Any
):
    """In this process unless ``workers`` is given:
    :func:`test_every_field_source_prepares_in_the_pool_as_in_one_process` checks that the
    pool changes nothing."""
    options = {"encoding": "original", **options}
    return convert_folder(
        src, dst, ConvertOptions(fmt, **options), workers=workers, on_error=on_error, progress=False
    )


def stored(dst: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The manifest's schema and every sample's (path, size, fields) as the shards hold
    them, through each format's ShardReader."""
    manifest = load_manifest(dst)
    samples = []
    for k in range(len(manifest.shards)):
        shard = open_local_shard(manifest, k)
        sizes = shard.sizes()
        for i in range(len(shard.labels)):
            values = {name: column.value(i) for name, column in shard.fields.items()}
            samples.append({"path": shard.path(i), "size": tuple(sizes[i]), **values})
    return manifest.fields, samples


def records(src: Path | str, **options: Any) -> tuple[dict[str, Any], list[Any]]:
    """The schema a source's scan finds and its samples as the workers prepare them."""
    source = open_source(str(src), options.pop("label_key", None))
    opts = ConvertOptions("pt", encoding="original", **options)
    scan = source.scan(opts)
    return scan.fields, prepare_samples(source.reader(), opts.transform, scan.samples)


def values_of(schema: dict[str, Any], prepared: Any) -> dict[str, Any]:
    return {
        name: decode(spec.kind, data, name)
        for (name, spec), data in zip(schema.items(), prepared.fields, strict=True)
    }


def test_webdataset_members_become_fields_with_their_kinds(tmp_path):
    src = img2dataset_shards(tmp_path / "src", **{"pyd": b"\x80\x04K\x01."})
    schema, prepared = records(src)
    assert {name: spec.kind for name, spec in schema.items()} == {
        "json": "json",
        "pyd": "bytes",  # a pickle is carried as bytes, never unpickled
        "txt": "text",
    }
    first = values_of(schema, prepared[0])
    assert first["txt"] == CAPTIONS[0]
    meta = {"url": "https://example.com/0.jpg", "width": 64, "height": 48, "score": 0.25}
    assert first["json"] == meta
    assert first["pyd"] == b"\x80\x04K\x01."
    canonical_json = b'{"url":"https://example.com/0.jpg","width":64,"height":48,"score":0.25}'
    assert prepared[0].fields[0] == canonical_json  # compact, in the member's key order


FORMATS = ["pt", "hdf5", "lmdb", "wds"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_webdataset_fields_reach_every_format(tmp_path, fmt, encoding):
    src = img2dataset_shards(tmp_path / "src")
    dst = tmp_path / "dst"
    convert(src, dst, fmt, encoding=encoding, resize=32)
    schema, samples = stored(dst)
    assert {name: spec.kind for name, spec in schema.items()} == {"json": "json", "txt": "text"}
    assert [s["txt"] for s in samples] == CAPTIONS
    assert [s["json"]["score"] for s in samples] == [0.25 + n for n in range(len(PHOTOS))]
    assert all(min(s["size"]) == 32 for s in samples)


def test_fields_and_no_fields_choose_what_is_stored(tmp_path):
    src = img2dataset_shards(tmp_path / "src")
    schema, prepared = records(src, fields=("txt",))
    assert list(schema) == ["txt"]
    assert values_of(schema, prepared[1]) == {"txt": CAPTIONS[1]}
    schema, prepared = records(src, fields=())
    assert schema == {} and prepared[0].fields == ()


def test_an_unknown_field_name_lists_the_fields_there_are(tmp_path):
    src = img2dataset_shards(tmp_path / "src")
    result = CliRunner().invoke(
        main, ["convert", str(src), str(tmp_path / "dst"), "--format", "pt", "--fields", "caption"]
    )
    assert result.exit_code != 0
    assert "--fields 'caption': no such field (the source's fields: json, txt)" in result.output


def test_a_field_missing_in_some_samples_is_none(tmp_path):
    import webdataset

    src = tmp_path / "src"
    src.mkdir()
    with webdataset.TarWriter(str(src / "a.tar")) as sink:
        sink.write({"__key__": "a", "jpg": PHOTOS[0].read_bytes()})
        sink.write({"__key__": "b", "jpg": PHOTOS[1].read_bytes(), "txt": "only b"})
        sink.write({"__key__": "c", "jpg": PHOTOS[2].read_bytes()})
    schema, prepared = records(src)
    assert [values_of(schema, p)["txt"] for p in prepared] == [None, "only b", None]


def test_a_json_member_that_does_not_parse_is_that_samples_error(tmp_path):
    import webdataset

    src = tmp_path / "src"
    src.mkdir()
    with webdataset.TarWriter(str(src / "a.tar")) as sink:
        sink.write({"__key__": "a", "jpg": PHOTOS[0].read_bytes(), "json": b'{"ok": 1}'})
        sink.write({"__key__": "b", "jpg": PHOTOS[1].read_bytes(), "json": b'{"cut'})
    dst = tmp_path / "dst"
    result = convert(src, dst)
    assert (result.written, result.skipped) == (1, 1)
    (error,) = [json.loads(line) for line in (dst / "errors.jsonl").read_text().splitlines()]
    assert error["path"] == "b.jpg"
    assert error["error"].startswith("b.jpg: its .json member: not a stored json value")
    with pytest.raises(ValueError, match=r"b\.jpg: its \.json member: not a stored json"):
        convert(src, tmp_path / "dst2", on_error="fail")


def test_a_member_that_cannot_name_a_field_is_refused_before_anything_is_written(tmp_path):
    import webdataset

    src = tmp_path / "src"
    src.mkdir()
    with webdataset.TarWriter(str(src / "a.tar")) as sink:
        sink.write({"__key__": "a", "jpg": PHOTOS[0].read_bytes(), "txt": "fine"})
        sink.write({"__key__": "b", "jpg": PHOTOS[1].read_bytes(), "my caption.txt": "x"})
    dst = tmp_path / "dst"
    with pytest.raises(ValueError) as raised:
        convert(src, dst)
    assert str(raised.value).startswith(
        f"{src / 'a.tar'}: member 'b.my caption.txt': 'my caption.txt' cannot name a field"
    )
    assert not dst.exists() or not any(dst.iterdir())  # no shard, no manifest
    assert convert(src, dst, fields=("txt",)).written == 2  # left out, it is no obstacle


def test_fields_of_a_compressed_tar_are_read_from_its_staged_members(tmp_path):
    import gzip

    src = img2dataset_shards(tmp_path / "src")
    for tar in sorted(src.glob("*.tar")):
        (src / (tar.name + ".gz")).write_bytes(gzip.compress(tar.read_bytes()))
        tar.unlink()
    schema, prepared = records(src)
    assert [values_of(schema, p)["txt"] for p in prepared] == CAPTIONS


def test_resume_refuses_a_changed_field_choice(tmp_path):
    src = img2dataset_shards(tmp_path / "src")
    dst = tmp_path / "dst"
    convert(src, dst, fields=("txt",))
    with pytest.raises(ValueError, match="cannot resume: fields"):
        convert_folder(
            src, dst, ConvertOptions("pt", encoding="original"), workers=1, resume=True,
            progress=False,
        )  # fmt: skip
    assert convert_folder(
        src, dst, ConvertOptions("pt", encoding="original", fields=("txt",)), workers=1,
        resume=True, progress=False,
    ).resumed == len(PHOTOS)  # fmt: skip


# --- Parquet -------------------------------------------------------------------------------
TAG_NAMES = ["animal", "outdoor", "night"]
TAGS = [[0, 2], [1], [], [0], [2, 1], [0, 1, 2]]


def hub_parquet(folder: Path, label: bool = True) -> Path:
    """A Parquet file as ``datasets`` writes it (its own ``to_parquet``): an image, a
    ``caption`` string, a ``score`` float, ``tags`` (``Sequence(ClassLabel)``) and, with
    ``label``, a ``ClassLabel`` label."""
    import datasets

    columns = {
        "image": [{"bytes": p.read_bytes(), "path": p.name} for p in PHOTOS],
        "caption": CAPTIONS,
        "score": [0.5 + n for n in range(len(PHOTOS))],
        "tags": TAGS,
    }
    features = {
        "image": datasets.Image(),
        "caption": datasets.Value("string"),
        "score": datasets.Value("float64"),
        "tags": datasets.Sequence(datasets.ClassLabel(names=TAG_NAMES)),
    }
    if label:
        columns["label"] = [n % 2 for n in range(len(PHOTOS))]
        features["label"] = datasets.ClassLabel(names=["cat", "dog"])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train-00000-of-00001.parquet"
    datasets.Dataset.from_dict(columns, features=datasets.Features(features)).to_parquet(str(path))
    return path


def test_parquet_columns_become_fields_with_their_kinds(tmp_path):
    schema, prepared = records(hub_parquet(tmp_path / "hub"))
    assert {name: spec.kind for name, spec in schema.items()} == {
        "caption": "text",
        "score": "float",
        "tags": "json",
    }
    assert schema["tags"].names == tuple(TAG_NAMES)  # the class names kept in the schema
    values = [values_of(schema, p) for p in prepared]
    assert [v["caption"] for v in values] == CAPTIONS
    assert [v["score"] for v in values] == [0.5 + n for n in range(len(PHOTOS))]
    assert [v["tags"] for v in values] == TAGS


def test_parquet_fields_are_read_with_staged_images(tmp_path, monkeypatch):
    from convert.sources import parquet

    monkeypatch.setattr(parquet, "STAGE_ABOVE", 0)  # a shuffled conversion stages the images
    schema, prepared = records(hub_parquet(tmp_path / "hub"), shuffle=True, seed=1)
    assert sorted(values_of(schema, p)["caption"] for p in prepared) == sorted(CAPTIONS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_parquet_fields_reach_the_shards(tmp_path, fmt):
    dst = tmp_path / "dst"
    convert(hub_parquet(tmp_path / "hub"), dst, fmt, encoding="jpeg", resize=32)
    schema, samples = stored(dst)
    assert schema["tags"].names == tuple(TAG_NAMES)
    assert [s["caption"] for s in samples] == CAPTIONS
    assert [s["tags"] for s in samples] == TAGS
    assert [s["score"] for s in samples] == [0.5 + n for n in range(len(PHOTOS))]


def test_parquet_fields_choose_and_a_multi_label_label_is_refused(tmp_path):
    src = hub_parquet(tmp_path / "hub", label=False)
    schema, prepared = records(src, fields=("score",))
    assert list(schema) == ["score"] and values_of(schema, prepared[2]) == {"score": 2.5}
    with pytest.raises(ValueError, match="column 'tags' holds several labels an image"):
        records(src, label_key="tags")


def test_a_parquet_column_that_cannot_name_a_field_is_refused_naming_it(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "a.parquet"
    image = [{"bytes": PHOTOS[0].read_bytes(), "path": "a.jpg"}]
    pq.write_table(pa.table({"image": image, "my caption": ["x"]}), src)
    with pytest.raises(ValueError, match=r"a\.parquet: column: 'my caption' cannot name a"):
        records(src)
    assert records(src, fields=())[0] == {}


def test_parquet_files_whose_field_kinds_differ_name_both_kinds(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    src.mkdir()
    image = [{"bytes": PHOTOS[0].read_bytes(), "path": "a.jpg"}]
    pq.write_table(pa.table({"image": image, "views": [3]}), src / "a.parquet")
    pq.write_table(pa.table({"image": image, "views": ["three"]}), src / "b.parquet")
    with pytest.raises(ValueError, match="field 'views' is int in some samples and text"):
        records(src)


# --- image folders: sidecars and --metadata ------------------------------------------------
def sidecar_folder(root: Path) -> Path:
    """Two class folders of images, each with a txt caption sidecar, a json sidecar but for
    one image, and a ``notes.txt`` that is no image's sidecar."""
    src = root / "src"
    for n, photo in enumerate(PHOTOS):
        folder = src / ("cat" if n < 3 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{n:03d}.jpg").write_bytes(photo.read_bytes())
        (folder / f"{n:03d}.txt").write_text(CAPTIONS[n], encoding="utf-8")
        if n != 4:
            (folder / f"{n:03d}.json").write_text(json.dumps({"n": n, "ok": True}))
        (folder / "notes.txt").write_text("not a sidecar")
    (src / "cat" / "000.txt~").write_text("an editor's backup: no field can be named txt~")
    return src


def test_sidecars_become_fields_and_stay_out_of_the_samples(tmp_path):
    src = sidecar_folder(tmp_path)
    source = open_source(str(src))
    scan = source.scan(ConvertOptions("pt", encoding="original"))
    assert scan.classes == ["cat", "dog"] and len(scan.samples) == len(PHOTOS)
    assert all(s.relpath.endswith(".jpg") for s in scan.samples)
    schema, prepared = records(src)
    assert {name: spec.kind for name, spec in schema.items()} == {"json": "json", "txt": "text"}
    values = [values_of(schema, p) for p in prepared]
    assert [v["txt"] for v in values] == CAPTIONS
    assert [v["json"] for v in values] == [
        None if n == 4 else {"n": n, "ok": True} for n in range(len(PHOTOS))
    ]
    assert records(src, fields=())[0] == {}
    schema, prepared = records(src, unlabeled=True)  # img2dataset's files layout: 00000/...
    assert [values_of(schema, p)["txt"] for p in prepared] == CAPTIONS


def test_a_sidecar_json_that_does_not_parse_is_that_samples_error(tmp_path):
    src = sidecar_folder(tmp_path)
    (src / "cat" / "001.json").write_text('{"cut')
    dst = tmp_path / "dst"
    result = convert(src, dst)
    assert (result.written, result.skipped) == (len(PHOTOS) - 1, 1)
    (error,) = [json.loads(line) for line in (dst / "errors.jsonl").read_text().splitlines()]
    assert error["path"] == str(Path("cat", "001.jpg"))
    assert f"its sidecar {Path('cat', '001.json')}: not a stored json value" in error["error"]
    with pytest.raises(ValueError, match=r"001\.json: not a stored json value"):
        convert(src, tmp_path / "dst2", on_error="fail")


def metadata_csv(path: Path, extra: str = "") -> Path:
    path.write_text(
        "path,score,views,note\n"
        "cat/000.jpg,0.5,3,first\n"
        "cat/001.jpg,1,4,\n"
        "dog/005.jpg,2.25,,last «ok»\n" + extra,
        encoding="utf-8",
    )
    return path


def test_a_metadata_csv_joins_its_columns_by_path(tmp_path):
    src = sidecar_folder(tmp_path)
    meta = metadata_csv(tmp_path / "meta.csv")
    schema, prepared = records(src, metadata=str(meta), fields=("note", "score", "views", "txt"))
    assert {name: spec.kind for name, spec in schema.items()} == {
        "note": "text",  # text: not every cell is a number
        "score": "float",  # float: every cell a number, not every one an integer
        "txt": "text",
        "views": "int",  # int: every non-empty cell an integer
    }
    values = [values_of(schema, p) for p in prepared]
    assert values[0] == {"note": "first", "score": 0.5, "txt": CAPTIONS[0], "views": 3}
    assert values[1] == {"note": None, "score": 1.0, "txt": CAPTIONS[1], "views": 4}
    assert values[5] == {"note": "last «ok»", "score": 2.25, "txt": CAPTIONS[5], "views": None}
    assert values[2] == {"note": None, "score": None, "txt": CAPTIONS[2], "views": None}  # no row


@pytest.mark.parametrize("fmt", FORMATS)
def test_metadata_fields_reach_the_shards(tmp_path, fmt):
    src = sidecar_folder(tmp_path)
    dst = tmp_path / "dst"
    convert(src, dst, fmt, metadata=str(metadata_csv(tmp_path / "meta.csv")))
    schema, samples = stored(dst)
    assert list(schema) == ["json", "note", "score", "txt", "views"]
    assert [s["txt"] for s in samples] == CAPTIONS
    assert [s["score"] for s in samples] == [0.5, 1.0, None, None, None, 2.25]
    assert [s["views"] for s in samples] == [3, 4, None, None, None, None]


def test_a_metadata_row_for_no_image_names_the_file_and_row(tmp_path):
    src = sidecar_folder(tmp_path)
    meta = metadata_csv(tmp_path / "meta.csv", "cat/missing.jpg,1,1,x\n")
    dst = tmp_path / "dst"
    result = convert(src, dst, metadata=str(meta))
    assert result.written == len(PHOTOS)
    (error,) = [json.loads(line) for line in (dst / "errors.jsonl").read_text().splitlines()]
    assert error["error"].startswith(f"{meta}: line 5: 'cat{os.sep}missing.jpg' names no image")
    with pytest.raises(ValueError, match=r"line 5: .* names no image below SRC"):
        convert(src, tmp_path / "dst2", metadata=str(meta), on_error="fail")


def test_metadata_json_lines_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = sidecar_folder(tmp_path)
    lines = tmp_path / "meta.jsonl"
    rows = [
        {"path": "cat/000.jpg", "score": 1, "tags": ["a", "b"]},
        {"path": "dog/003.jpg", "score": 1.5, "extra": {"k": [1]}},
    ]
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    schema, prepared = records(src, metadata=str(lines), fields=("extra", "score", "tags"))
    assert {n: s.kind for n, s in schema.items()} == {"extra": "json", "score": "float",
                                                      "tags": "json"}  # fmt: skip
    assert values_of(schema, prepared[0]) == {"extra": None, "score": 1.0, "tags": ["a", "b"]}
    assert values_of(schema, prepared[3]) == {"extra": {"k": [1]}, "score": 1.5, "tags": None}
    table = tmp_path / "meta.parquet"
    pq.write_table(pa.table({"path": ["dog/004.jpg"], "views": [7], "why": ["ok"]}), table)
    schema, prepared = records(src, metadata=str(table), fields=("views", "why"))
    assert values_of(schema, prepared[4]) == {"views": 7, "why": "ok"}
    assert values_of(schema, prepared[0]) == {"views": None, "why": None}


def test_metadata_values_of_two_kinds_and_a_missing_path_column_are_refused(tmp_path):
    src = sidecar_folder(tmp_path)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"path": "cat/000.jpg", "views": 3}\n{"path": "cat/001.jpg", "views": "x"}\n')
    with pytest.raises(ValueError, match="field 'views' is int in some samples and text"):
        records(src, metadata=str(mixed))
    no_path = tmp_path / "no_path.csv"
    no_path.write_text("file,score\ncat/000.jpg,1\n")
    with pytest.raises(ValueError, match="no 'path' column \\(columns: file, score\\)"):
        records(src, metadata=str(no_path))
    twice = metadata_csv(tmp_path / "twice.csv", "cat/000.jpg,9,9,again\n")
    with pytest.raises(ValueError, match=r"line 5: path .* is named again \(first at line 2\)"):
        records(src, metadata=str(twice))


def test_metadata_is_refused_for_a_dataset_source(tmp_path):
    meta = metadata_csv(tmp_path / "meta.csv")
    with pytest.raises(ValueError, match="--metadata applies to image folders only"):
        records(hub_parquet(tmp_path / "hub"), metadata=str(meta))


# --- imgpack datasets ----------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_an_imgpack_dataset_reconverted_keeps_its_fields(tmp_path, fmt):
    first = tmp_path / "first"
    convert(img2dataset_shards(tmp_path / "src"), first, fmt)
    schema, prepared = records(first)
    assert {name: spec.kind for name, spec in schema.items()} == {"json": "json", "txt": "text"}
    assert [values_of(schema, p)["txt"] for p in prepared] == CAPTIONS
    again = tmp_path / "again"
    convert(first, again, fields=("txt",))
    schema, samples = stored(again)
    assert list(schema) == ["txt"] and [s["txt"] for s in samples] == CAPTIONS


@pytest.mark.parametrize("fmt", ["pt", "wds"])
def test_every_field_source_prepares_in_the_pool_as_in_one_process(tmp_path, fmt):
    """Each reader that carries fields (webdataset tars, Parquet, sidecars with a metadata
    CSV, an imgpack dataset) crosses into the pool's workers and its fields come back: the
    same shards, byte for byte, as one process writes."""
    tars = img2dataset_shards(tmp_path / "tars")
    sidecars = sidecar_folder(tmp_path)
    sources = {
        "tars": (tars, {}),
        "parquet": (hub_parquet(tmp_path / "hub").parent, {"fields": ("caption", "score")}),
        "sidecars": (sidecars, {"metadata": str(metadata_csv(tmp_path / "meta.csv"))}),
        "dataset": (Path(convert(tars, tmp_path / "dataset", fmt).dst), {}),
    }
    for name, (src, options) in sources.items():
        one, two = tmp_path / f"{name}-1", tmp_path / f"{name}-2"
        convert(src, one, fmt, encoding="raw", resize=32, **options)
        convert(src, two, fmt, encoding="raw", resize=32, workers=2, **options)
        in_one = stored(one)
        assert in_one[0], f"{name}: no fields"
        assert stored(two) == in_one, name
        manifest = load_manifest(one)
        assert load_manifest(two).content_sha256 == manifest.content_sha256, name
        for shard in manifest.shards:
            assert (two / shard.path).read_bytes() == (one / shard.path).read_bytes(), name


def test_parquet_column_kinds_and_canonical_bytes_match_encode():
    import datetime
    import math

    import pyarrow as pa

    from convert.sources.parquet_columns import canonical_column, field_kind
    from readers.fields import encode

    columns = {
        "text": pa.array(["a", None, "größer\n写真"]),
        "large": pa.array(["x", "y", None], pa.large_string()),
        "cat": pa.array(["b", "a", "b"]).dictionary_encode(),
        "int": pa.array([1, None, -(2**63)], pa.int64()),
        "small": pa.array([1, 2, None], pa.uint8()),
        "bool": pa.array([True, False, None]),
        "float": pa.array([0.1, math.nan, -math.inf]),
        "f32": pa.array([0.1, None, 1.5], pa.float32()),
        "bytes": pa.array([b"\x00\xff", None, b""]),
        "list": pa.array([[1, 2], [], None]),
        "struct": pa.array([{"a": "ü", "b": 1.5}, None, {"a": None, "b": 2.0}]),
        "date": pa.array([datetime.date(2026, 12, 4), None, datetime.date(1970, 1, 1)]),
        "mask": pa.array(
            [{"bytes": b"\x89PNG", "path": "m.png"}, None, {"bytes": None, "path": "x"}]
        ),
    }
    kinds = {name: field_kind(column.type) for name, column in columns.items()}
    assert kinds == {
        "text": "text", "large": "text", "cat": "text", "int": "int", "small": "int",
        "bool": "int", "float": "float", "f32": "float", "bytes": "bytes", "list": "json",
        "struct": "json", "date": "text", "mask": "bytes",
    }  # fmt: skip
    for name, column in columns.items():
        got = canonical_column(column, kinds[name], name)
        values = column.cast(pa.string()).to_pylist() if name == "date" else column.to_pylist()
        if name == "mask":
            values = [None if v is None else v["bytes"] for v in values]
        assert got == [encode(kinds[name], v, name) for v in values], name


def test_a_folder_with_metadata_resumes(tmp_path):
    src = sidecar_folder(tmp_path)
    meta = str(metadata_csv(tmp_path / "meta.csv"))
    dst = tmp_path / "dst"
    convert(src, dst, metadata=meta)
    resumed = convert_folder(
        src, dst, ConvertOptions("pt", encoding="original", metadata=meta), workers=1,
        resume=True, progress=False,
    )  # fmt: skip
    assert resumed.resumed == len(PHOTOS)


def test_metadata_from_the_command_line(tmp_path):
    src = sidecar_folder(tmp_path)
    meta = metadata_csv(tmp_path / "meta.csv")
    dst = tmp_path / "dst"
    args = ["convert", str(src), str(dst), "--format", "pt", "--metadata", str(meta)]
    result = CliRunner().invoke(main, [*args, "--fields", "score,txt"])
    assert result.exit_code == 0, result.output
    schema, samples = stored(dst)
    assert list(schema) == ["score", "txt"] and samples[0]["score"] == 0.5
    plain = CliRunner().invoke(main, [*args[:2], str(tmp_path / "plain"), *args[3:], "--no-fields"])
    assert plain.exit_code == 0, plain.output
    assert load_manifest(tmp_path / "plain").fields == {}


@pytest.mark.usefixtures("s3_server")
def test_parquet_and_imgpack_fields_from_a_bucket(tmp_path):
    from readers.storage.remote import RemoteFolder

    bucket = RemoteFolder(f"s3://{BUCKET}/fields")
    bucket.upload(hub_parquet(tmp_path / "hub"), "train.parquet")
    dst = tmp_path / "from_parquet"
    convert(f"s3://{BUCKET}/fields/train.parquet", dst, "wds")
    schema, samples = stored(dst)
    assert [s["caption"] for s in samples] == CAPTIONS and [s["tags"] for s in samples] == TAGS
    dataset = RemoteFolder(f"s3://{BUCKET}/fields/dataset")
    for path in sorted(p for p in dst.rglob("*") if p.is_file()):
        dataset.upload(path, path.relative_to(dst).as_posix())
    again = tmp_path / "again"
    convert(f"s3://{BUCKET}/fields/dataset", again, "hdf5")
    schema, samples = stored(again)
    assert schema["tags"].names == tuple(TAG_NAMES)
    assert [s["caption"] for s in samples] == CAPTIONS
    assert [s["score"] for s in samples] == [0.5 + n for n in range(len(PHOTOS))]
