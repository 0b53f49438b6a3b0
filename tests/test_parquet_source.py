"""Hugging Face Parquet as a conversion source (``convert.sources.parquet``,
``convert.sources.hub_layout``): the Hub's split and config layouts, the label columns
``datasets`` writes (``ClassLabel``, a list of them, plain integers, floats), image columns
that keep only a path, and a shuffled conversion's row-group reads (kept per worker, or the
images staged once by the scan when there are more than a worker keeps).

The files are written as ``datasets`` writes them: pyarrow tables whose ``huggingface``
schema metadata records the features (``{"info": {"features": {...}}}``, the ``List`` of a
multi-label column as datasets 5 writes it, ``Sequence`` and ``[...]`` as older ones do).
"""

from __future__ import annotations

import gc
import json
import random
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import readers
from convert import ConvertOptions, convert_folder
from convert.cli import main
from convert.sources import open_source, parquet
from convert.sources.parquet import ROW_GROUPS
from tests.photos import encode, photo_crop

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

NAMES = ["cat", "dog", "fox"]
IMAGE = {"_type": "Image"}


def class_label(names: list[str]) -> dict:
    return {"names": names, "_type": "ClassLabel"}


def images(count: int, seed: int = 0, folder: str = "") -> list[dict]:
    """``count`` small JPEG photo crops as ``datasets.Image`` values."""
    return [
        {"bytes": encode(photo_crop(24, 32, seed=seed + i)), "path": f"{folder}img{seed + i}.jpg"}
        for i in range(count)
    ]


def write_hub(path: Path, columns: dict[str, list], features: dict, row_group_size: int = 8):
    """A Parquet file as ``datasets`` writes it: the features in the schema metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(columns)
    meta = {"huggingface": json.dumps({"info": {"features": features}})}
    pq.write_table(table.replace_schema_metadata(meta), path, row_group_size=row_group_size)


def write_split(folder: Path, split: str, count: int, seed: int, labels: list[int] | None = None):
    labels = labels if labels is not None else [i % len(NAMES) for i in range(count)]
    write_hub(
        folder / f"{split}-00000-of-00001.parquet",
        {"image": images(count, seed, f"{split}/"), "label": labels},
        {"image": IMAGE, "label": class_label(NAMES)},
    )


def convert(src: Path, dst: Path, *args: str):
    """``imgpack convert`` in one process (``args`` may ask for workers: the last count
    given counts); tests/test_fields_sources.py converts Parquet through the pool."""
    args = ("--workers", "1", *args)
    return CliRunner().invoke(main, ["convert", str(src), str(dst), "--format", "pt", *args])


def test_hub_splits_are_refused_together_and_converted_one_at_a_time(tmp_path):
    hub = tmp_path / "hub"
    write_split(hub / "data", "train", 12, seed=0)
    write_split(hub / "data", "validation", 6, seed=100)
    write_split(hub / "data", "test", 5, seed=200, labels=[-1] * 5)
    merged = convert(hub, tmp_path / "all")
    assert merged.exit_code == 1 and len(merged.output.strip().splitlines()) == 1
    assert "holds the splits test, train, validation: choose one with --split" in merged.output
    assert not (tmp_path / "all").exists()
    train = convert(hub, tmp_path / "train", "--split", "train")
    assert train.exit_code == 0, train.output
    ds = readers.open_dataset(tmp_path / "train")
    assert len(ds) == 12 and ds.classes == NAMES and ds.targets == [i % 3 for i in range(12)]
    assert all(path.startswith("train/") for path, _ in ds.samples)
    assert readers.load_manifest(tmp_path / "train").source["split"] == "train"
    test = convert(hub, tmp_path / "test", "--split", "test")
    assert test.exit_code == 0, test.output  # the Hub's -1: no label, not "skipped"
    assert readers.open_dataset(tmp_path / "test").targets == [-1] * 5
    unknown = convert(hub, tmp_path / "x", "--split", "dev")
    assert unknown.exit_code == 1
    assert "no split 'dev' (splits: test, train, validation)" in unknown.output
    resumed = convert(hub, tmp_path / "train", "--split", "validation", "--resume")
    assert resumed.exit_code == 1 and "split 'train' -> 'validation'" in resumed.output


def test_hub_files_at_the_top_and_a_pattern_are_split_the_same_way(tmp_path):
    write_split(tmp_path / "hub", "train", 4, seed=0)
    write_split(tmp_path / "hub", "test", 3, seed=50)
    pattern = str(tmp_path / "hub" / "*.parquet")
    with pytest.raises(ValueError, match="holds the splits test, train"):
        open_source(pattern)
    assert len(open_source(pattern, split="test").files) == 1
    (tmp_path / "photos" / "cat").mkdir(parents=True)  # an image folder
    (tmp_path / "photos" / "cat" / "a.jpg").write_bytes(images(1)[0]["bytes"])
    with pytest.raises(ValueError, match="--split applies to Parquet sources only"):
        open_source(tmp_path / "photos", split="train")


def test_a_hub_config_layout_is_refused_naming_the_configs(tmp_path):
    hub = tmp_path / "hub"
    write_split(hub / "cifar10", "train", 3, seed=0)
    write_split(hub / "cifar100" / "data", "train", 3, seed=10)
    (hub / "README.md").write_text("---\nconfigs: ...\n---\n")
    result = convert(hub, tmp_path / "out")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "the configs cifar10, cifar100" in result.output, result.output
    one = convert(hub / "cifar100", tmp_path / "out")
    assert one.exit_code == 0, one.output


def test_two_class_label_columns_are_refused_until_label_key_picks_one(tmp_path):
    src = tmp_path / "cifar100.parquet"  # CIFAR-100's layout on the Hub
    features = {"img": IMAGE, "fine_label": class_label(["a", "b", "c", "d"])}
    features["coarse_label"] = class_label(["ab", "cd"])
    write_hub(src, {"img": images(8), "fine_label": [i % 4 for i in range(8)],
                    "coarse_label": [i % 4 // 2 for i in range(8)]}, features)  # fmt: skip
    refused = convert(src, tmp_path / "out")
    assert refused.exit_code == 1
    assert "2 label columns (fine_label, coarse_label): choose one with --label-key" in (
        refused.output
    )
    picked = convert(src, tmp_path / "out", "--label-key", "coarse_label")
    assert picked.exit_code == 0, picked.output
    ds = readers.open_dataset(tmp_path / "out")
    assert ds.classes == ["ab", "cd"] and ds.targets == [i % 4 // 2 for i in range(8)]


@pytest.mark.parametrize(
    "feature",
    [
        {"feature": class_label(NAMES), "_type": "List"},  # datasets 5
        {"feature": class_label(NAMES), "_type": "Sequence"},  # datasets 2-3
        [class_label(NAMES)],  # a list literal
    ],
    ids=["List", "Sequence", "list"],
)
def test_a_multi_label_column_is_a_field_and_refused_as_the_label(tmp_path, feature):
    src = tmp_path / "tags.parquet"
    write_hub(src, {"image": images(4), "labels": [[0, 2], [1], [], [0]]},
              {"image": IMAGE, "labels": feature})  # fmt: skip
    result = convert(src, tmp_path / "out", "--label-key", "labels")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "column 'labels' holds several labels an image (multi-label)" in result.output
    assert "--label-key" in result.output and "Traceback" not in result.output
    alone = convert(src, tmp_path / "alone")  # no label column: unlabelled, tags a field
    assert alone.exit_code == 0, alone.output
    assert readers.load_manifest(tmp_path / "alone").fields["labels"].names == tuple(NAMES)
    both = tmp_path / "both.parquet"  # a single-label column beside it: that is the label
    write_hub(both, {"image": images(4), "labels": [[0, 2], [1], [], [0]], "label": [0, 1, 2, 0]},
              {"image": IMAGE, "labels": feature, "label": class_label(NAMES)})  # fmt: skip
    chosen = convert(both, tmp_path / "out")
    assert chosen.exit_code == 0, chosen.output
    ds = readers.open_dataset(tmp_path / "out")
    assert ds.targets == [0, 1, 2, 0] and list(ds.manifest.fields) == ["labels"]


def test_a_float_label_column_is_refused_before_anything_is_written(tmp_path):
    src = tmp_path / "scores.parquet"
    write_hub(src, {"image": images(4), "label": [0.5, 1.0, 2.0, 0.25]}, {"image": IMAGE})
    result = convert(src, tmp_path / "out")
    assert result.exit_code == 1
    assert "column 'label' holds double values, not class numbers or names" in result.output
    assert not (tmp_path / "out").exists()


def test_integer_labels_without_class_label_are_stored_as_they_are(tmp_path):
    src = tmp_path / "numbers.parquet"
    labels = [10, 2, 0, 9, 2, 10]  # as text they would sort 0, 10, 2, 9
    write_hub(src, {"image": images(6), "label": labels}, {"image": IMAGE})
    assert convert(src, tmp_path / "out").exit_code == 0
    ds = readers.open_dataset(tmp_path / "out")
    assert ds.targets == labels and ds.classes == [str(n) for n in range(11)]
    names = tmp_path / "classes.txt"
    names.write_text("\n".join(f"class{n}" for n in range(11)) + "\n")
    named = convert(src, tmp_path / "named", "--classes", str(names))
    assert named.exit_code == 0, named.output
    ds = readers.open_dataset(tmp_path / "named")
    assert ds.targets == labels and ds.classes[10] == "class10"


def test_image_paths_without_bytes_are_read_from_the_parquet_folder(tmp_path):
    kept = images(4)
    (tmp_path / "photos").mkdir()
    rows = []
    for i, image in enumerate(kept):
        if i < 3:  # the fourth one's file is missing
            (tmp_path / "photos" / f"{i}.jpg").write_bytes(image["bytes"])
        rows.append({"bytes": None, "path": f"photos/{i}.jpg"})
    src = tmp_path / "paths.parquet"
    write_hub(src, {"image": rows, "label": [0, 1, 2, 0]},
              {"image": IMAGE, "label": class_label(NAMES)})  # fmt: skip
    out = tmp_path / "out"
    result = convert(src, out)
    assert result.exit_code == 0, result.output
    ds = readers.open_dataset(out)
    assert [p for p, _ in ds.samples] == ["photos/0.jpg", "photos/1.jpg", "photos/2.jpg"]
    assert ds.targets == [0, 1, 2]
    (error,) = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert error["path"] == "photos/3.jpg"
    assert "holds no image bytes for it, only the path 'photos/3.jpg'" in error["error"]


def test_a_shuffled_conversion_reads_each_row_group_once(tmp_path):
    src = tmp_path / "train-00000-of-00001.parquet"
    write_hub(src, {"image": images(40), "label": [i % 3 for i in range(40)]},
              {"image": IMAGE, "label": class_label(NAMES)}, row_group_size=10)  # fmt: skip
    source = open_source(src)
    samples = list(source.scan(ConvertOptions("pt")).samples)
    random.Random(0).shuffle(samples)
    reader, before = source.reader(), ROW_GROUPS.reads
    read = [value for at in range(0, 40, 16) for value in reader.read(samples[at : at + 16])]
    assert ROW_GROUPS.reads - before == 4  # today: about one a sample
    assert read == [images(40)[int(s.relpath[3:-4])]["bytes"] for s in samples]
    plain, shuffled = tmp_path / "plain", tmp_path / "shuffled"
    for dst, shuffle in ((plain, False), (shuffled, True)):
        options = ConvertOptions("pt", shuffle=shuffle)
        convert_folder(src, dst, options, workers=2, progress=False)
    a, b = readers.open_dataset(plain), readers.open_dataset(shuffled)
    assert sorted(a.samples) == sorted(b.samples) and a.samples != b.samples


def test_a_large_shuffled_conversion_stages_the_images_once_in_order(tmp_path, monkeypatch):
    src = tmp_path / "train-00000-of-00001.parquet"
    kept = images(40)
    kept[7] = {"bytes": None, "path": "photos/7.jpg"}  # a row with a path only: its file
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "7.jpg").write_bytes(images(40)[7]["bytes"])
    write_hub(src, {"image": kept, "label": [i % 3 for i in range(40)]},
              {"image": IMAGE, "label": class_label(NAMES)}, row_group_size=10)  # fmt: skip
    options = ConvertOptions("pt", shuffle=True)
    convert_folder(src, tmp_path / "cached", options, workers=2, progress=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the images are staged
    monkeypatch.setattr(parquet, "STAGE_ABOVE", 1000)  # a budget smaller than the file
    source = open_source(src)
    before = ROW_GROUPS.reads
    samples = list(source.scan(options).samples)
    assert ROW_GROUPS.reads - before == 4  # the scan reads each row group once
    (staged,) = tmp_path.glob("imgpack-staged-*/*.images")
    random.Random(0).shuffle(samples)
    before = ROW_GROUPS.reads
    read = [
        value for at in range(0, 40, 16) for value in source.reader().read(samples[at : at + 16])
    ]
    assert ROW_GROUPS.reads - before == 1  # only for the row without bytes
    want = {row["path"]: row["bytes"] for row in images(40)} | {"photos/7.jpg": b""}
    want["photos/7.jpg"] = want["img7.jpg"]
    assert read == [want[s.relpath] for s in samples]
    del source
    gc.collect()
    assert not staged.exists()  # removed with the source
    convert_folder(src, tmp_path / "staged", options, workers=2, progress=False)
    a, b = (readers.load_manifest(tmp_path / name) for name in ("cached", "staged"))
    assert a.content_sha256 == b.content_sha256 and a.num_samples == b.num_samples == 40
    assert not list(tmp_path.glob("imgpack-staged-*"))
