"""Reading fields (issue 30 §3): ``fields=`` on every read path, ``ds.sizes`` and
``ds.metadata()``, over datasets converted from the inputs users bring.

The datasets are converted, to every format and as raw pixels and JPEGs, from an
img2dataset-style set written by ``webdataset.ShardWriter`` (jpg, a txt caption with
non-ASCII text and newlines, json metadata) and from a folder with caption sidecars and a
``--metadata`` CSV (int, float and text columns, values missing in some samples). Every value
read is compared with what the source holds for that sample (matched by its source path).
"""

from __future__ import annotations

import io
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import readers
from readers import batch_pool, spec
from tests.test_fields_sources import (
    CAPTIONS,
    PHOTOS,
    convert,
    img2dataset_shards,
    metadata_csv,
    sidecar_folder,
)
from tests.test_object_storage import BUCKET, s3_server  # noqa: F401 (the fixture)

ENCODINGS = {
    "raw": {"encoding": "raw", "resize": 32, "center_crop": 32},  # fixed pixels: gathered
    "jpeg": {"encoding": "jpeg", "resize": 32},  # sizes vary: decoded one by one
}
CROP = readers.CenterCrop(16)
N = len(PHOTOS)


def number(ds: readers.ImageDataset, i: int) -> int:
    """The source's number of sample ``i`` (its file stem: ``000000003.jpg``, ``cat/003.jpg``)."""
    return int(Path(ds.source_path(i)).stem)


def meta(n: int) -> dict[str, Any]:
    """The json member img2dataset_shards writes for sample ``n``."""
    return {"url": f"https://example.com/{n}.jpg", "width": 64, "height": 48, "score": 0.25 + n}


# What the folder's --metadata CSV (tests.test_fields_sources.metadata_csv) gives each image.
CSV = {0: (0.5, 3, "first"), 1: (1.0, 4, None), 5: (2.25, None, "last «ok»")}


def folder_values(n: int) -> dict[str, Any]:
    score, views, note = CSV.get(n, (None, None, None))
    sidecar = None if n == 4 else {"n": n, "ok": True}
    return {"txt": CAPTIONS[n], "json": sidecar, "score": score, "views": views, "note": note}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    """``dataset(source, fmt, encoding)``: ``source`` ("wds": img2dataset tars, "folder":
    sidecars and a metadata CSV) converted, once per module."""
    root = tmp_path_factory.mktemp("fields")
    sources = {
        "wds": lambda: img2dataset_shards(root / "wds-src"),
        "folder": lambda: sidecar_folder(root / "folder"),
    }
    made: dict[Any, Path] = {}

    def build(source: str, fmt: str, encoding: str = "jpeg") -> Path:
        if source not in made:
            made[source] = sources[source]()
        key = (source, fmt, encoding)
        if key not in made:
            made[key] = dst = root / "-".join(key)
            options = dict(ENCODINGS[encoding], shard_size=4 if fmt in ("pt", "wds") else None)
            if source == "folder":
                options["metadata"] = str(metadata_csv(root / "meta.csv"))
            convert(made[source], dst, fmt, on_error="fail", **options)
        return made[key]

    return build


def stored_size(value: Any) -> tuple[int, int]:
    if isinstance(value, np.ndarray):
        return value.shape[0], value.shape[1]
    width, height = Image.open(io.BytesIO(bytes(value))).size
    return height, width


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_samples_carry_the_fields_asked_for_in_that_order(dataset, fmt, encoding):
    dst = dataset("wds", fmt, encoding)
    plain = readers.open_dataset(dst)
    ds = readers.open_dataset(dst, fields=("txt", "json"))
    backwards = readers.DATASETS[fmt](dst, fields=["json", "txt"])
    assert {name: s.kind for name, s in ds.fields.items()} == {"json": "json", "txt": "text"}
    assert ds.fields == plain.fields and list(ds.fields) == ["json", "txt"]
    assert sorted(number(ds, i) for i in range(N)) == list(range(N))
    for i in range(N):
        n = number(ds, i)
        image, label = plain[i]
        assert type(plain[i]) is tuple and len(plain[i]) == 2  # without fields=: as before
        item = ds[i]
        assert isinstance(item, tuple) and len(item) == 4
        assert torch.equal(item[0], image) and item[1] == label
        assert item[2:] == (CAPTIONS[n], meta(n))
        assert backwards[i][2:] == (meta(n), CAPTIONS[n])
    first, last = number(ds, 5), number(ds, 0)
    assert ds.read_fields([5, 0]) == ([CAPTIONS[first], CAPTIONS[last]], [meta(first), meta(last)])


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_batches_carry_fields_on_every_read_path(dataset, fmt, encoding):
    dst = dataset("wds", fmt, encoding)
    rows = [5, 0, 3, 4]  # across both shards of pt and wds, out of order
    captions = [CAPTIONS[number(readers.open_dataset(dst), i)] for i in rows]
    metas = [meta(number(readers.open_dataset(dst), i)) for i in rows]
    for options in ({}, {"crop": CROP}, {"decode": False}):
        plain = readers.open_dataset(dst, **options)
        ds = readers.open_dataset(dst, fields=("txt", "json"), **options)
        expected = readers.collate_any(plain.__getitems__(rows))
        assert len(expected) == 2  # without fields=: (images, labels) as before
        images, labels, txt, js = readers.collate_any(ds.__getitems__(rows))
        assert (txt, js) == (captions, metas), options
        assert torch.equal(labels, expected[1])
        if isinstance(images, torch.Tensor):  # raw fixed pixels, or cropped
            assert torch.equal(images, expected[0])
        else:
            assert all(map(torch.equal, images, expected[0]))
        batch = ds.__getitems__(rows)
        assert [tuple(sample[2:]) for sample in batch] == list(zip(captions, metas, strict=True))
        if isinstance(images, torch.Tensor):  # readers.collate hands the batch on as it is
            assert torch.equal(readers.collate(batch)[0], images)
    undecoded = readers.open_dataset(dst, decode=False)
    assert [bytes(v) for v in ds.read_stored(rows)] == [bytes(undecoded.stored(i)) for i in rows]


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_sizes_are_the_stored_images_sizes(dataset, fmt, encoding):
    ds = readers.open_dataset(dataset("wds", fmt, encoding))
    sizes = ds.sizes
    assert sizes.dtype == np.int64 and sizes.shape == (N, 2)
    assert [tuple(s) for s in sizes.tolist()] == [stored_size(ds.stored(i)) for i in range(N)]
    assert [tuple(s) for s in sizes.tolist()] == [tuple(ds[i][0].shape[1:]) for i in range(N)]
    assert ds.sizes is sizes  # read once per dataset object
    # not shipped to spawned workers (16 bytes a sample); read again where asked for
    sent = pickle.loads(pickle.dumps(ds))
    assert "sizes" not in sent.__dict__ and np.array_equal(sent.sizes, sizes)


def held_epoch(loader: readers.Loader) -> list[Any]:
    """Every batch of one epoch, all kept until the end: more than a worker's slots."""
    return list(loader)


def check_aligned(batches: list[Any], crop_ds: readers.ImageDataset) -> None:
    """Each row's fields belong to its image: the caption names the sample, whose cropped
    image and json must be the row's; every sample comes once."""
    by_number = {number(crop_ds, i): i for i in range(N)}
    seen = []
    for images, labels, captions, metas in batches:
        assert isinstance(images, torch.Tensor) and images.shape[1:] == (3, *CROP.size)
        for row, caption in enumerate(captions):
            n = CAPTIONS.index(caption)
            image, label = crop_ds[by_number[n]]
            assert torch.equal(images[row], image) and int(labels[row]) == label
            assert metas[row] == meta(n)
            seen.append(n)
    assert sorted(seen) == list(range(N))


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_workers_hand_fields_with_their_images_through_the_batch_pools(dataset, fmt, encoding):
    dst = dataset("wds", fmt, encoding)
    crop_ds = readers.open_dataset(dst, crop=CROP)
    before = batch_pool.release_ended_pools()
    loader = readers.make_loader(dst, 2, fields=("txt", "json"), crop=CROP, num_workers=2)
    batches = held_epoch(loader) + held_epoch(loader)  # 6 batches held: past the slots
    assert batch_pool.release_ended_pools() > before  # held batches lie in workers' pools
    check_aligned(batches[:3], crop_ds)
    check_aligned(batches[3:], crop_ds)
    plain = next(iter(readers.make_loader(dst, 2, crop=CROP, num_workers=1)))
    assert len(plain) == 2


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_undecoded_batches_from_workers_carry_fields(dataset):
    dst = dataset("wds", "pt")
    ds = readers.open_dataset(dst)
    stored = {CAPTIONS[number(ds, i)]: bytes(ds.stored(i)) for i in range(N)}
    loader = readers.make_loader(dst, 4, fields=("txt",), decode=False, num_workers=1)
    seen = 0
    for images, _, captions in loader:
        assert [image.numpy().tobytes() for image in images] == [stored[c] for c in captions]
        seen += len(captions)
    assert seen == N


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_wds_stream_carries_fields(dataset, encoding):
    dst = dataset("wds", "wds", encoding)
    crop_ds = readers.open_dataset(dst, crop=CROP)
    stream = readers.WdsStream(dst, shuffle_buffer=0, crop=CROP, fields=("txt", "json"))
    assert list(stream.fields) == ["json", "txt"]
    items = list(stream)
    assert [item[2:] for item in items] == [
        (CAPTIONS[number(crop_ds, i)], meta(number(crop_ds, i))) for i in range(N)
    ]
    batches = list(DataLoader(stream, batch_size=2, num_workers=2, collate_fn=readers.collate))
    check_aligned(batches, crop_ds)
    loader = readers.make_loader(
        dst, 2, stream=True, shuffle=False, fields=("txt", "json"), crop=CROP, num_workers=1
    )
    check_aligned(list(loader), crop_ds)
    plain = next(iter(readers.WdsStream(dst, shuffle_buffer=0)))
    assert type(plain) is tuple and len(plain) == 2


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_int_float_and_missing_values_batch_by_kind(dataset, fmt):
    dst = dataset("folder", fmt)
    ds = readers.open_dataset(dst, fields=("score", "views", "note", "json"), crop=CROP)
    by_number = {number(ds, i): i for i in range(N)}
    for n in range(N):
        values = folder_values(n)
        assert ds[by_number[n]][2:] == (
            values["score"],
            values["views"],
            values["note"],
            values["json"],
        )
    both = [by_number[0], by_number[1]]  # every value present: tensors
    _, labels, score, views, note, sidecar = readers.collate(ds.__getitems__(both))
    assert labels.tolist() == [0, 0]
    assert score.dtype == torch.float64 and score.tolist() == [0.5, 1.0]
    assert views.dtype == torch.int64 and views.tolist() == [3, 4]
    assert note == ["first", None] and sidecar == [{"n": 0, "ok": True}, {"n": 1, "ok": True}]
    _, _, score, views, _, _ = readers.collate(ds.__getitems__([by_number[5], by_number[2]]))
    assert score == [2.25, None] and views == [None, None]  # a value missing: a list


@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_metadata_is_a_table_of_every_sample_without_images(dataset, fmt):
    dst = dataset("folder", fmt)
    ds = readers.open_dataset(dst)
    table = ds.metadata()
    assert table.column_names == [
        "index", "label", "height", "width", "json", "note", "score", "txt", "views"
    ]  # fmt: skip
    types = {name: str(table.schema.field(name).type) for name in table.column_names}
    assert types == {
        **dict.fromkeys(["index", "label", "height", "width", "views"], "int64"),
        **dict.fromkeys(["json", "note", "txt"], "string"),
        "score": "double",
    }
    assert table["index"].to_pylist() == list(range(N))
    assert table["label"].to_pylist() == ds.targets
    assert table["height"].to_pylist() == ds.sizes[:, 0].tolist()
    assert table["width"].to_pylist() == ds.sizes[:, 1].tolist()
    for i, row in enumerate(table.to_pylist()):
        expected = folder_values(number(ds, i))
        assert {k: row[k] for k in ("txt", "score", "views", "note")} == {
            k: expected[k] for k in ("txt", "score", "views", "note")
        }
        assert (None if row["json"] is None else json.loads(row["json"])) == expected["json"]
    chosen = ds.metadata(columns=("score", "txt"))
    assert chosen.column_names == ["index", "label", "height", "width", "score", "txt"]

    # the README's recipe: filter by a field, train on what is kept
    kept = table.filter(pc.greater(table["score"], 0.75))["index"].to_numpy()
    wanted = {n for n, (score, _, _) in CSV.items() if score > 0.75}
    assert {number(ds, int(i)) for i in kept} == wanted
    loader = readers.make_loader(dst, 2, indices=kept, fields=("score", "txt"), crop=CROP)
    seen = [
        (s, t)
        for _, _, scores, texts in loader
        for s, t in zip(scores.tolist(), texts, strict=True)
    ]
    assert sorted(seen) == sorted((CSV[n][0], CAPTIONS[n]) for n in wanted)


def test_metadata_of_the_webdataset_captions_and_json_text(dataset):
    ds = readers.open_dataset(dataset("wds", "wds"))
    table = ds.metadata()
    assert table["txt"].to_pylist() == [CAPTIONS[number(ds, i)] for i in range(N)]
    assert [json.loads(v) for v in table["json"].to_pylist()] == [
        meta(number(ds, i)) for i in range(N)
    ]
    long = table.filter(pc.greater(pc.utf8_length(table["txt"]), 20))
    assert long.num_rows == N


def test_an_unknown_field_lists_the_fields_there_are(dataset):
    dst = dataset("wds", "pt")
    listed = r"no field 'caption' in this dataset; its fields: json, txt"
    with pytest.raises(ValueError, match=listed):
        readers.open_dataset(dst, fields=("txt", "caption"))
    with pytest.raises(ValueError, match=listed):
        readers.make_loader(dst, 2, fields=("caption",))
    with pytest.raises(ValueError, match=listed):
        readers.open_dataset(dst).metadata(columns=("caption",))
    with pytest.raises(ValueError, match=r"fields=\('txt',\)"):
        readers.open_dataset(dst, fields="txt")
    with pytest.raises(ValueError, match="names 'txt' twice"):
        readers.open_dataset(dst, fields=("txt", "txt"))
    ds = readers.open_dataset(dst, fields=("txt",))
    with pytest.raises(ValueError, match=r"another fields= \(\('txt',\)\)"):
        readers.make_loader(ds, 2, fields=("json",))
    assert len(next(iter(readers.make_loader(ds, 2, fields=("txt",), crop=CROP)))) == 3
    with pytest.raises(ValueError, match="no field 'x' in this dataset; its fields: json, txt"):
        readers.WdsStream(dataset("wds", "wds"), shuffle_buffer=0, fields=("json", "txt", "x"))


def test_a_bytes_field_is_read_but_is_no_metadata_column(tmp_path):
    src = img2dataset_shards(tmp_path / "src", pyd=b"\x80\x04K\x01.")
    convert(src, tmp_path / "dst", "pt", on_error="fail")
    ds = readers.open_dataset(tmp_path / "dst", fields=("pyd",))
    assert [ds[i][2] for i in range(N)] == [b"\x80\x04K\x01."] * N
    assert ds.metadata().column_names[4:] == ["json", "txt"]
    with pytest.raises(ValueError, match="field 'pyd' is bytes"):
        ds.metadata(columns=("pyd",))


def test_metadata_without_pyarrow_says_how_to_install_it(dataset, monkeypatch):
    ds = readers.open_dataset(dataset("wds", "pt"))
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    with pytest.raises(ImportError, match="pip install pyarrow"):
        ds.metadata()


@pytest.mark.usefixtures("s3_server")
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_fields_read_from_object_storage(dataset, tmp_path):
    local = dataset("wds", "wds")
    url = f"s3://{BUCKET}/fields/wds"
    convert(
        local.parent / "wds-src", url, "wds", on_error="fail", **ENCODINGS["jpeg"], shard_size=4
    )
    ds = readers.open_dataset(url, fields=("txt", "json"), cache_dir=tmp_path / "cache")
    assert [ds[i][2:] for i in range(N)] == [
        (CAPTIONS[number(ds, i)], meta(number(ds, i))) for i in range(N)
    ]
    assert ds.metadata()["txt"].to_pylist() == [CAPTIONS[number(ds, i)] for i in range(N)]
    assert ds.sizes.tolist() == readers.open_dataset(local).sizes.tolist()
    crop_ds = readers.open_dataset(local, crop=CROP)  # the same samples, in the same order
    streamed = readers.make_loader(
        url, 2, stream=True, shuffle=False, fields=("txt", "json"), crop=CROP, num_workers=1
    )
    check_aligned(list(streamed), crop_ds)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("fmt", spec.FORMATS)
def test_a_damaged_field_value_names_the_sample_and_field_on_every_path(tmp_path, fmt):
    src = img2dataset_shards(tmp_path / "src")
    dst = tmp_path / "dst"
    convert(src, dst, fmt, on_error="fail", **ENCODINGS["jpeg"])
    ds = readers.open_dataset(dst, fields=("json", "txt"))
    i = next(i for i in range(N) if number(ds, i) == 1)
    shard, local = ds.locate(i)
    path = ds.manifest.shard_path(shard)
    data = path.read_bytes()
    assert data.count(b"Foto Nr. 1:") == 1  # the caption's stored bytes
    path.write_bytes(data.replace(b"Foto Nr. 1:", b"Foto Nr. 9:"))

    named = rf"{path.name}\[{local}\]: field 'txt': stored bytes fail their CRC-32"
    ds = readers.open_dataset(dst, fields=("json", "txt"))
    with pytest.raises(readers.DatasetError, match=named):
        ds[i]
    with pytest.raises(readers.DatasetError, match=named):
        ds.__getitems__([0, i])
    with pytest.raises(readers.DatasetError, match=named):
        ds.metadata()
    loader = readers.make_loader(dst, 2, fields=("txt",), crop=CROP, num_workers=1)
    with pytest.raises(readers.DatasetError, match=named):
        list(loader)
    if fmt == "wds":
        stream = readers.WdsStream(dst, shuffle_buffer=0, fields=("txt",))
        with pytest.raises(readers.DatasetError, match=named):
            list(stream)
    # what is not asked for is not read: the images and the json are whole
    plain = readers.open_dataset(dst)
    assert [plain[k][1] for k in range(N)] == [-1] * N
    assert readers.open_dataset(dst, fields=("json",))[i][2] == meta(1)
    assert ds.metadata(columns=("json",))["json"].null_count == 0


def test_a_field_named_like_a_base_column_keeps_both(tmp_path):
    src = sidecar_folder(tmp_path)
    csv = tmp_path / "meta.csv"
    csv.write_text("path,width\ncat/000.jpg,640\ndog/005.jpg,320\n", encoding="utf-8")
    convert(src, tmp_path / "dst", "pt", on_error="fail", metadata=str(csv), **ENCODINGS["jpeg"])
    ds = readers.open_dataset(tmp_path / "dst")
    table = ds.metadata()
    assert table.column_names == ["index", "label", "height", "width", "json", "txt", "field:width"]
    assert table["width"].to_pylist() == ds.sizes[:, 1].tolist()
    widths = {0: 640, 5: 320}
    assert table["field:width"].to_pylist() == [widths.get(number(ds, i)) for i in range(N)]


def test_the_device_prefetcher_carries_fields(dataset):
    ds = readers.open_dataset(dataset("folder", "pt"), fields=("views", "note"), crop=CROP)
    loader = readers.make_loader(ds, 2, shuffle=False)
    fed = list(readers.DevicePrefetcher(loader, "cpu"))
    plain = list(loader)
    assert len(fed) == len(plain) > 0
    for (images, labels, views, note), (raw, raw_labels, raw_views, raw_note) in zip(
        fed, plain, strict=True
    ):
        assert images.dtype == torch.float32 and images.mul(255).round().byte().equal(raw)
        assert labels.equal(raw_labels) and note == raw_note
        assert views.equal(raw_views) if isinstance(views, torch.Tensor) else views == raw_views
