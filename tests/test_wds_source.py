"""WebDataset tars made by other tools as a conversion source (``convert.sources.webdataset``):
duplicate keys, labels from ``cls``/``txt``/a key inside the ``json`` member, compressed tars,
and the summary line of a source without labels.

The tars are real: written by ``tarfile`` member by member (to place duplicates exactly) and
by ``webdataset.TarWriter`` as img2dataset writes them (``key.jpg`` beside ``key.json``).
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import readers
from convert import ConvertOptions, convert_folder
from convert.cli import main
from convert.sources.labels import LabelField, Labels
from tests.conftest import SAMPLE_DATA
from tests.test_object_storage import BUCKET, s3_server  # noqa: F401 (the fixture)

PHOTOS = sorted(p for p in SAMPLE_DATA.rglob("*.jpg"))
NUMBERS = [n % 12 for n in range(24)]  # class 10 and 11: "10" < "2" as strings


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A plain tar of ``members`` (name, bytes), in that order, as ``tarfile`` writes it."""
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def img2dataset_tar(path: Path, numbers: list[int]) -> Path:
    """``webdataset.TarWriter`` samples as img2dataset writes them: the image, a caption in
    ``txt`` and the metadata in ``json`` (here with a class number under ``label``)."""
    import webdataset

    with webdataset.TarWriter(str(path)) as sink:
        for n, (photo, number) in enumerate(zip(PHOTOS, numbers, strict=False)):
            key = f"{n:09d}"
            meta = {"key": key, "url": f"https://example.com/{key}.jpg", "label": number}
            sink.write({"__key__": key, "jpg": photo.read_bytes(), "txt": "a photo", "json": meta})
    return path


def convert(src: Path | str, dst: Path, workers: int = 1, **options: object):
    """In this process unless ``workers`` is given (the pool reads tars in
    tests/test_fields_sources.py, gzipped ones below)."""
    options = {"encoding": "original", **options}
    return convert_folder(
        src, dst, ConvertOptions("pt", **options), workers=workers, progress=False
    )


def cli(*args: object):
    return CliRunner().invoke(main, ["convert", *(str(a) for a in args), "--format", "pt"])


def errors_of(dst: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in (dst / "errors.jsonl").read_text().splitlines()]


def test_a_duplicate_key_is_listed_and_skipped_never_dropped_silently(tmp_path):
    import webdataset

    jpg = [p.read_bytes() for p in PHOTOS[:5]]
    src = tmp_path / "src"
    src.mkdir()
    first = write_tar(
        src / "a-0.tar",
        [
            ("k0.jpg", jpg[0]), ("k0.cls", b"0"),
            ("k0.jpg", jpg[1]), ("k0.cls", b"1"),  # a second member set in a row
            ("k1.jpg", jpg[2]), ("k1.cls", b"1"),
            ("k0.jpg", jpg[3]), ("k0.cls", b"0"),  # the key again, later in the tar
        ],
    )  # fmt: skip
    write_tar(src / "a-1.tar", [("k1.jpg", jpg[4]), ("k1.cls", b"1")])  # and in another
    with tarfile.open(first) as tf:
        files = [{"fname": m.name, "data": tf.extractfile(m).read(), "__url__": "a-0"} for m in tf]
    with pytest.raises(ValueError, match="duplicate file name"):  # the library refuses it
        list(webdataset.tariterators.group_by_keys(files))
    out = tmp_path / "out"
    result = convert(src, out)
    assert (result.written, result.skipped) == (2, 3)
    errors = errors_of(out)
    assert [e["path"] for e in errors] == ["k0.jpg", "k0.jpg", "k1.jpg"]
    assert all("duplicate key" in e["error"] for e in errors)
    assert "earlier in that tar" in errors[0]["error"] and str(first) in errors[2]["error"]
    ds = readers.open_dataset(out)
    assert ds.samples == [("k0.jpg", 0), ("k1.jpg", 1)]
    assert [bytes(ds.stored(i)) for i in range(2)] == [jpg[0], jpg[2]]  # the first sets' images


def test_integer_labels_are_stored_as_those_integers_wherever_they_are(tmp_path):
    tars = tmp_path / "tars"
    tars.mkdir()
    img2dataset_tar(tars / "00000.tar", NUMBERS)
    members = []
    for n, (photo, number) in enumerate(zip(PHOTOS, NUMBERS, strict=False)):
        members += [(f"{n:03d}.jpg", photo.read_bytes()), (f"{n:03d}.cls", b"%d\n" % number)]
        members += [(f"{n:03d}.txt", str(number).encode())]
    write_tar(tmp_path / "plain.tar", members)
    classes = [str(n) for n in range(12)]
    plain = tmp_path / "plain.tar"
    for src, key in ((tars, "json.label"), (plain, "cls"), (plain, "txt")):
        out = tmp_path / f"out-{key}"
        convert(src, out, label_key=key)
        ds = readers.open_dataset(out)
        assert ds.targets == NUMBERS and ds.classes == classes, key
    names = tmp_path / "classes.txt"
    names.write_text("".join(f"class {n}\n" for n in range(12)))
    named = cli(tars, tmp_path / "named", "--label-key", "json.label", "--classes", names)
    assert named.exit_code == 0, named.output
    ds = readers.open_dataset(tmp_path / "named")
    assert ds.targets == NUMBERS and ds.classes[10] == "class 10"


def test_a_json_label_key_that_names_no_single_label_is_refused_in_one_line(tmp_path):
    img2dataset_tar(tmp_path / "00000.tar", NUMBERS)
    whole = cli(tmp_path / "00000.tar", tmp_path / "whole", "--label-key", "json")
    assert whole.exit_code == 1 and len(whole.output.splitlines()) == 1
    assert "a JSON object" in whole.output and "--label-key json.key" in whole.output
    caption = cli(tmp_path / "00000.tar", tmp_path / "url", "--label-key", "json.url")
    assert caption.exit_code == 0  # text: class names, one per URL, sorted
    assert len(readers.load_manifest(tmp_path / "url").classes) == len(NUMBERS)


@pytest.mark.parametrize(
    ("value", "field", "want"),
    [
        (b'{"label": 3}', "json.label", 3),
        (b'{"ann": {"labels": [7, 2]}}', "json.ann.labels.1", 2),
        (b'{"label": null}', "json.label", None),
        (b'{"other": 1}', "json.label", None),
        (b'"tench"', "json", "tench"),
        (b" 5\n", "cls", b" 5\n"),
    ],
)
def test_a_label_field_reads_its_member_or_the_key_inside_the_json(value, field, want):
    assert LabelField.parse(field).value(value, "s") == want


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b'{"label": [1, 2]}', "a list of 2 values"),
        (b'{"label": 2.5}', "2.5, not a class number or name"),
        (b'{"label": true}', "true, not a class number or name"),
        (b"{not json", "not JSON"),
    ],
)
def test_a_json_label_that_is_no_class_number_or_name_is_refused_naming_the_sample(value, why):
    with pytest.raises(ValueError, match=f"^shard.tar: s.jpg: .*{why}"):
        LabelField.parse("json.label").value(value, "shard.tar: s.jpg")


def test_text_that_only_looks_like_a_number_is_a_class_name():
    labels = Labels("src", "txt", None)
    for path, value in (("a", "²"), ("b", "--2"), ("c", "x")):
        labels.add(path, value.encode())
    assert labels.resolve()[:2] == (["--2", "x", "²"], [2, 0, 1])


def test_gzipped_tars_convert_like_the_plain_ones_and_their_staged_copies_go(tmp_path, monkeypatch):
    plain = img2dataset_tar(tmp_path / "plain.tar", NUMBERS)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the images are staged
    want = convert(plain, tmp_path / "want", label_key="json.label")
    gz = tmp_path / "gz"
    gz.mkdir()
    (gz / "a.tar.gz").write_bytes(gzip.compress(plain.read_bytes()))
    (gz / "b.tgz").write_bytes(gzip.compress(write_tar(tmp_path / "b.tar", []).read_bytes()))
    for src in (gz / "a.tar.gz", gz, f"{gz}/{{a.tar.gz,b.tgz}}"):
        out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
        result = convert(src, out, workers=2, label_key="json.label")  # staged in workers
        assert result.written == want.written == len(NUMBERS)
        manifest = readers.load_manifest(out)
        assert manifest.content_sha256 == readers.load_manifest(tmp_path / "want").content_sha256
    assert not list(tmp_path.glob("imgpack-staged-*"))  # removed with the source


def test_a_compressed_tar_that_cannot_be_read_is_refused_naming_the_compression(tmp_path):
    plain = img2dataset_tar(tmp_path / "plain.tar", NUMBERS[:4])
    (tmp_path / "cut.tar.gz").write_bytes(gzip.compress(plain.read_bytes())[:-5000])
    (tmp_path / "z.tar.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(100))
    cut = cli(tmp_path / "cut.tar.gz", tmp_path / "x")
    assert cut.exit_code == 1 and len(cut.output.splitlines()) == 1
    assert "cut.tar.gz: cannot read the gzip-compressed tar (damaged or cut short?)" in cut.output
    zstd = cli(f"{tmp_path}/z.tar*", tmp_path / "y")
    assert zstd.exit_code == 1 and "a zstd-compressed tar" in zstd.output
    assert "decompress it first (zstd -d)" in zstd.output


def test_a_source_without_labels_says_unlabeled_and_how_to_choose_one(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tar = img2dataset_tar(tmp_path / "00000.tar", NUMBERS[:4])
    plain = cli(tar, tmp_path / "a")
    assert plain.exit_code == 0, plain.output
    summary = plain.output.splitlines()[0]
    assert summary.startswith("written 4, skipped 0")
    assert "; unlabeled: no 'cls' member found (--label-key names the label member)" in summary
    wrong = cli(tar, tmp_path / "b", "--label-key", "json.class")
    assert "; unlabeled: no sample has a 'json.class' label" in wrong.output
    table = pa.table({"image": [p.read_bytes() for p in PHOTOS[:4]], "caption": ["x"] * 4})
    pq.write_table(table, tmp_path / "x.parquet")
    parquet = cli(tmp_path / "x.parquet", tmp_path / "c")
    assert "; unlabeled: no ClassLabel or 'label' column found (--label-key" in parquet.output
    labelled = cli(tar, tmp_path / "d", "--label-key", "json.label")
    assert "unlabeled" not in labelled.output


@pytest.mark.usefixtures("s3_server")
def test_gzipped_tars_at_a_url_convert_like_local_ones(tmp_path):
    from readers.storage.remote import RemoteFolder

    plain = img2dataset_tar(tmp_path / "plain.tar", NUMBERS)
    want = tmp_path / "want"
    convert(plain, want, label_key="json.label")
    (tmp_path / "plain.tgz").write_bytes(gzip.compress(plain.read_bytes()))
    RemoteFolder(f"s3://{BUCKET}/gz").upload(tmp_path / "plain.tgz", "plain.tgz")
    out = tmp_path / "out"
    convert(f"s3://{BUCKET}/gz", out, label_key="json.label")
    assert readers.load_manifest(out).content_sha256 == readers.load_manifest(want).content_sha256
