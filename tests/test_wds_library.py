"""imgpack's ``wds`` tars are standard WebDataset: the ``webdataset`` library and ``tarfile``
read them as they are, and agree with imgpack's own reader and index."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds

import readers
from readers import spec

IMAGE_KEYS = ("jpg", "png", "npy")

# The webdataset library never closes the shard files it opens (its tar iterator leaves
# them to the garbage collector): a ResourceWarning of the library's, not imgpack's doing.
pytestmark = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)


def shard_paths(root: Path) -> list[Path]:
    manifest = readers.load_manifest(root)
    return [manifest.shard_path(i) for i in range(len(manifest.shards))]


def library_samples(root: Path) -> list[dict]:
    """Every sample of ``root`` as the webdataset library decodes it, in stored order."""
    urls = [str(p) for p in shard_paths(root)]
    pipeline = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("rgb8")
    samples = list(pipeline)
    del pipeline
    return samples


def ours_hwc(ds: readers.ImageDataset, i: int) -> tuple[np.ndarray, int]:
    image, label = ds[i]
    return image.permute(1, 2, 0).numpy(), label


@pytest.mark.parametrize(
    ("case", "extra", "expected_exts"),
    [
        pytest.param("jpeg", {}, {"jpg"}, id="jpeg"),
        pytest.param("original", {}, {"jpg", "png"}, id="original"),
        pytest.param("jpeg", {"shard_size": 10}, {"jpg"}, id="jpeg-4-shards"),
    ],
)
def test_webdataset_library_reads_every_sample_like_our_reader(
    converted, case, extra, expected_exts
):
    root = converted("wds", case, **extra)
    ours = readers.open_dataset(root)
    samples = library_samples(root)
    assert len(samples) == len(ours) == 32

    seen_exts = set()
    for i, sample in enumerate(samples):
        fields = {k for k in sample if not k.startswith("__")}
        image_keys = fields & set(IMAGE_KEYS)
        assert len(image_keys) == 1, fields
        assert fields == image_keys | {"cls", "path.txt"}
        (ext,) = image_keys
        seen_exts.add(ext)
        assert sample["__key__"] == spec.SAMPLE_KEY.format(i)

        image = sample[ext]
        assert isinstance(image, np.ndarray)
        assert image.dtype == np.uint8
        assert image.ndim == 3 and image.shape[2] == 3
        expected_image, expected_label = ours_hwc(ours, i)
        assert image.shape == expected_image.shape, i
        np.testing.assert_array_equal(image, expected_image, err_msg=f"sample {i}")

        assert sample["cls"] == expected_label
        assert sample["path.txt"] == ours.source_path(i)
    assert seen_exts == expected_exts


def test_original_encoding_keeps_png_sources_as_png_members(converted, sample_data):
    root = converted("wds", "original")
    samples = library_samples(root)
    pngs = sorted(s["path.txt"] for s in samples if "png" in s)
    assert pngs == sorted(
        p.relative_to(sample_data).as_posix() for p in sample_data.glob("*/*.png")
    )
    assert len(pngs) == 2


def test_labels_follow_the_sorted_class_folders(converted):
    root = converted("wds", "jpeg")
    classes = readers.load_manifest(root).classes
    for sample in library_samples(root):
        assert classes[sample["cls"]] == sample["path.txt"].split("/")[0]


@pytest.mark.parametrize("case", ["jpeg", "raw-variable"])
def test_tar_members_are_in_key_order_with_fixed_metadata_and_safe_names(converted, case):
    root = converted("wds", case, shard_size=10)
    names_per_shard = []
    for path in shard_paths(root):
        with tarfile.open(path) as tar:
            members = tar.getmembers()
        names = [m.name for m in members]
        names_per_shard.append(names)
        assert names, path
        assert len(names) % 3 == 0
        keys = [name.split(".", 1)[0] for name in names]
        assert keys == sorted(keys), f"{path}: members not in key order"
        for k in range(0, len(names), 3):  # each sample's three members together
            assert len(set(keys[k : k + 3])) == 1
        for m in members:
            assert m.isfile(), m.name
            assert m.mtime == 0, m.name
            assert not m.name.startswith("/"), m.name
            assert ".." not in Path(m.name).parts, m.name
            assert "/" not in m.name, m.name  # flat: KEY.ext only
            assert m.uid == 0 and m.gid == 0, m.name
    all_keys = [n.split(".", 1)[0] for names in names_per_shard for n in names[::3]]
    assert all_keys == [spec.SAMPLE_KEY.format(i) for i in range(32)]


def test_raw_encoding_stores_npy_members_loadable_without_pickle(converted):
    root = converted("wds", "raw-variable")
    ours = readers.open_dataset(root)
    arrays = []
    with tarfile.open(shard_paths(root)[0]) as tar:
        for m in tar.getmembers():
            if m.name.endswith(".npy"):
                data = tar.extractfile(m).read()
                arrays.append(np.load(io.BytesIO(data), allow_pickle=False))
            else:
                assert m.name.endswith((".cls", ".path.txt")), m.name
    assert len(arrays) == 32
    for i, array in enumerate(arrays):
        assert array.dtype == np.uint8
        assert array.ndim == 3 and array.shape[2] == 3
        assert min(array.shape[:2]) == 48  # --resize 48
        np.testing.assert_array_equal(array, ours_hwc(ours, i)[0])


def test_raw_npy_members_decode_through_the_library_too(converted):
    root = converted("wds", "raw-variable")
    ours = readers.open_dataset(root)
    samples = library_samples(root)
    assert len(samples) == 32
    for i, sample in enumerate(samples):
        np.testing.assert_array_equal(sample["npy"], ours_hwc(ours, i)[0])


@pytest.mark.parametrize("case", ["jpeg", "original", "raw-variable"])
def test_index_offsets_point_at_the_exact_image_member_data(converted, case):
    root = converted("wds", case, shard_size=10)
    for path in shard_paths(root):
        index = json.loads(Path(str(path) + spec.WDS_INDEX_SUFFIX).read_text(encoding="utf-8"))
        with tarfile.open(path) as tar:
            images = [
                m
                for m in tar.getmembers()
                if m.name.endswith(tuple(f".{e}" for e in spec.WDS_IMAGE_EXTS))
            ]
            labels = {
                m.name.split(".")[0]: tar.extractfile(m).read()
                for m in tar.getmembers()
                if m.name.endswith(".cls")
            }
            paths = {
                m.name.split(".")[0]: tar.extractfile(m).read().decode()
                for m in tar.getmembers()
                if m.name.endswith(".path.txt")
            }
            member_data = [tar.extractfile(m).read() for m in images]
        assert len(images) == len(index["offsets"])
        raw = path.read_bytes()
        for k, m in enumerate(images):
            key, ext = m.name.split(".", 1)
            assert index["offsets"][k] == m.offset_data, m.name
            assert index["sizes"][k] == m.size, m.name
            assert index["exts"][k] == ext
            offset, size = index["offsets"][k], index["sizes"][k]
            assert raw[offset : offset + size] == member_data[k]
            assert str(index["labels"][k]).encode() == labels[key]
            assert index["paths"][k] == paths[key]
