"""Crops inside the decode (``crop=``): the same pixels as a full decode followed by the
same crop and resize on the tensor, torchvision's sampling, reproducible boxes, the
Pillow fallback, and damaged samples named."""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import readers
from convert import ConvertOptions, convert_folder, process
from readers import spec
from readers.feeding.tune import Setting, sweep
from readers.formats.wds import read_index
from readers.images import decode
from readers.images.jpeg import DCT_REDUCING_GAP, crop_dct_divisors, jpeg_size
from readers.images.turbo import turbo_decoder
from tests.photos import encode, photo_crop

# (height, width): stored short side 256 as the benchmark's, larger ones that decode
# DCT-scaled under a ratio crop, one smaller than the crop (padded), one very wide.
SIZES = [(256, 341), (300, 256), (1440, 1920), (200, 150), (257, 1000), (1920, 1440)]
# A DCT-scaled decode low-passes unlike the antialiased resize of a full decode, which still
# does the last >= 2.5x (DCT_REDUCING_GAP): measured here mean 0.11-0.13 levels, 99th
# percentile 1, both paths (tests/test_crop_large.py measures 2560-6000 px photos).
DCT_MEAN_TOLERANCE, DCT_P99_TOLERANCE = 0.5, 4


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Within the tolerance of a DCT-scaled decode."""
    diff = (a.int() - b.int()).abs().float()
    return diff.mean() <= DCT_MEAN_TOLERANCE and diff.quantile(0.99) <= DCT_P99_TOLERANCE


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``pt`` dataset of original files: q90 JPEGs, a PNG, an EXIF-rotated JPEG."""
    src = tmp_path_factory.mktemp("crop-src")
    for k, (h, w) in enumerate(SIZES):
        folder = src / f"class{k % 2}"
        folder.mkdir(exist_ok=True)
        (folder / f"{k}.jpg").write_bytes(encode(photo_crop(h, w, seed=k), quality=90))
    (src / "class0" / "png.png").write_bytes(encode(photo_crop(240, 260, seed=7), "PNG"))
    rotated = Image.fromarray(photo_crop(280, 300, seed=8))
    exif = Image.Exif()
    exif[0x0112] = 6
    (src / "class1" / "rotated.jpg").write_bytes(encode(rotated, quality=90, exif=exif))
    dst = tmp_path_factory.mktemp("crop-pt")
    options = ConvertOptions(format="pt", encoding="original")
    convert_folder(src, dst, options, workers=1, overwrite=True, progress=False)
    return dst


def plain(ds: readers.ImageDataset, crop: readers.images.crop.Crop, index: int) -> torch.Tensor:
    """What the fused path must give: a full decode, then the crop, resize and flip on the
    ``[3, H, W]`` tensor (zero padding for a box outside the image)."""
    stored = ds.stored(index)
    pixels = stored if isinstance(stored, np.ndarray) else readers.decode_image(stored)
    image = torch.from_numpy(pixels).permute(2, 0, 1)
    top, left, bh, bw, flip = crop.boxes(np.array([image.shape[1:]]), np.array([index]))[0]
    pad = max(0, -top, -left, top + bh - image.shape[1], left + bw - image.shape[2])
    image = F.pad(image, (pad, pad, pad, pad))
    box = image[:, top + pad : top + pad + bh, left + pad : left + pad + bw]
    if tuple(box.shape[1:]) != crop.size:
        box = box[None].contiguous(memory_format=torch.channels_last)
        box = F.interpolate(box, size=crop.size, mode="bilinear", antialias=True)[0]
    return box.flip(-1) if flip else box


def scaled(ds: readers.ImageDataset, crop: readers.images.crop.Crop, index: int) -> bool:
    """Whether the fused path decodes sample ``index`` DCT-scaled."""
    size = jpeg_size(ds.stored(index))
    if size is None:
        return False
    boxes = crop.boxes(np.array([size]), np.array([index]))
    return crop_dct_divisors(boxes, np.array([size]), crop.size)[0] > 1


CROPS = {
    "center": readers.CenterCrop(224),
    "center-ratio": readers.CenterCrop(160, ratio=224 / 256),
    "random": readers.RandomResizedCrop(224, flip=True, seed=5),
    "random-small": readers.RandomResizedCrop((96, 128), scale=(0.3, 1.0), flip=True),
}


@pytest.mark.parametrize("name", CROPS)
def test_fused_crop_equals_full_decode_then_crop(photos, name):
    crop = CROPS[name]
    ds = readers.open_dataset(photos, crop=crop, decode_threads=2)
    batch, _ = readers.collate(ds.__getitems__(list(range(len(ds)))))
    assert batch.shape == (len(ds), 3, *crop.size) and batch.dtype == torch.uint8
    assert batch.is_contiguous(memory_format=torch.channels_last)
    exact = 0
    for i in range(len(ds)):
        want = plain(ds, crop, i)
        assert torch.equal(ds[i][0], batch[i])  # one sample or a batch: the same pixels
        if scaled(ds, crop, i):
            assert close(batch[i], want), f"sample {i}"
        else:
            assert torch.equal(batch[i], want), f"sample {i}"
            exact += 1
    assert exact >= 4


@pytest.mark.parametrize("name", CROPS)
def test_nchw_crops_are_the_same_pixels_written_plane_by_plane(photos, name):
    # channels_last=False: NCHW-contiguous batches and images straight from the decode
    # (the kernel writes planes; the Python path through an HWC view of them)
    planar = copy.copy(CROPS[name])
    planar.channels_last = False
    ds = readers.open_dataset(photos, crop=CROPS[name], decode_threads=2)
    nchw = readers.open_dataset(photos, crop=planar, decode_threads=2)
    everything = list(range(len(ds)))
    batch, _ = readers.collate(nchw.__getitems__(everything))
    assert batch.is_contiguous() and not batch.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(batch, readers.collate(ds.__getitems__(everything))[0])
    for i in everything:
        image = nchw[i][0]
        assert image.is_contiguous() and torch.equal(image, batch[i])
    assert "channels_last=False" in repr(planar) and "channels_last" not in repr(CROPS[name])


def test_ratio_crop_of_large_jpegs_decodes_scaled(photos):
    ds = readers.open_dataset(photos)
    crop = CROPS["center-ratio"]
    assert sum(scaled(ds, crop, i) for i in range(len(ds))) >= 2


def test_crops_dct_scale_only_while_the_box_keeps_the_reducing_gap():
    """The converter's rule for a box: scaled by d only while the box stays at least
    DCT_REDUCING_GAP times the output in both directions once scaled; never a box that
    reaches outside its image (it is padded at full size)."""
    assert DCT_REDUCING_GAP == 2.5 and process.DCT_REDUCING_GAP is DCT_REDUCING_GAP
    image = np.array([[6000, 8000]])
    sides = {1119: 1, 1120: 2, 2239: 2, 2240: 4, 4480: 8, 5999: 8}  # 1120 = 2 * 2.5 * 224
    for side, divisor in sides.items():
        box = np.array([[0, 0, side, side, 0]])
        assert crop_dct_divisors(box, image, (224, 224)).tolist() == [divisor], side
    assert crop_dct_divisors(np.array([[0, 0, 2240, 1119, 0]]), image, (224, 224)) == 1
    assert crop_dct_divisors(np.array([[0, 0, 2240, 1600, 0]]), image, (224, 320)) == 2
    outside = np.array([[-1, 0, 4480, 4480, 0], [0, 4000, 4480, 4480, 0]])
    assert crop_dct_divisors(outside, image.repeat(2, 0), (224, 224)).tolist() == [1, 1]


@pytest.mark.parametrize("case", ["raw-fixed", "raw-variable"])
def test_raw_datasets_crop_from_their_pixels(converted, case):
    crop = readers.RandomResizedCrop(40, flip=True)
    ds = readers.open_dataset(converted("pt", case), crop=crop)
    batch, _ = readers.collate(ds.__getitems__(list(range(len(ds)))))
    for i in range(len(ds)):
        assert torch.equal(batch[i], plain(ds, crop, i))


def test_transform_sees_the_cropped_image(photos):
    seen: list[tuple[int, ...]] = []

    def record(image: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(image.shape))
        return image

    ds = readers.open_dataset(photos, crop=readers.CenterCrop(64), transform=record)
    readers.collate(ds.__getitems__([0, 1, 2]))
    assert seen == [(3, 64, 64)] * 3


def test_random_boxes_depend_on_seed_epoch_and_index_only():
    crop = readers.RandomResizedCrop(224, flip=True, seed=1)
    sizes, indices = np.array([[256, 341]] * 500), np.arange(500)
    first = crop.boxes(sizes, indices)
    assert np.array_equal(
        first, readers.RandomResizedCrop(224, flip=True, seed=1).boxes(sizes, indices)
    )
    assert np.array_equal(first[7:9], crop.boxes(sizes[:2], indices[7:9]))  # batch-independent
    crop.set_epoch(1)
    assert (crop.boxes(sizes, indices) != first).any(axis=1).mean() > 0.95
    other = readers.RandomResizedCrop(224, flip=True, seed=2).boxes(sizes, indices)
    assert (other != first).any(axis=1).mean() > 0.95


def torchvision_params(height: int, width: int, rng: random.Random) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params``, line by line, on Python's RNG."""
    area, log_ratio = height * width, (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target_area = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target_area * aspect)), round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < 3 / 4:
        w, h = width, round(width / (3 / 4))
    elif in_ratio > 4 / 3:
        h, w = height, round(height * 4 / 3)
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


@pytest.mark.parametrize("shape", [(256, 341), (500, 120)])
def test_random_boxes_are_distributed_like_torchvision(shape):
    n, (height, width) = 20000, shape
    ours = readers.RandomResizedCrop(224, flip=True).boxes(np.array([shape] * n), np.arange(n))
    rng = random.Random(0)
    theirs = np.array([torchvision_params(height, width, rng) for _ in range(n)])
    assert (ours[:, :2] >= 0).all() and (ours[:, 0] + ours[:, 2] <= height).all()
    assert (ours[:, 1] + ours[:, 3] <= width).all()
    for stats in (ours, theirs):
        scale = stats[:, 2] * stats[:, 3] / (height * width)
        aspect = stats[:, 3] / stats[:, 2]
        assert scale.min() >= 0.07 and scale.max() <= 1.0
        assert aspect[scale < 0.99].min() >= 0.74 and aspect[scale < 0.99].max() <= 1.35
    for column in range(4):  # top, left, height, width: the same quantiles within 2 %
        q = np.linspace(0.05, 0.95, 10)
        a, b = np.quantile(ours[:, column], q), np.quantile(theirs[:, column], q)
        assert np.abs(a - b).max() <= 0.02 * max(height, width) + 1, column
    assert abs(ours[:, 4].mean() - 0.5) < 0.02


@pytest.mark.parametrize("name", CROPS)
def test_pillow_fallback_gives_the_same_crops(photos, name):
    crop = CROPS[name]
    turbo, _ = readers.collate(
        readers.open_dataset(photos, crop=crop).__getitems__([0, 1, 2, 3, 5])
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(decode.DECODER_ENV, "pillow")
        for cached in (decode._turbojpeg, turbo_decoder):
            cached.cache_clear()
        assert turbo_decoder() is None
        ds = readers.open_dataset(photos, crop=crop)
        pillow, _ = readers.collate(ds.__getitems__([0, 1, 2, 3, 5]))
    for cached in (decode._turbojpeg, turbo_decoder):
        cached.cache_clear()
    assert all(close(a, b) for a, b in zip(turbo, pillow, strict=True))


@pytest.mark.parametrize("damage", ["header", "cut-entropy-data"])
def test_damaged_sample_raises_dataset_error_naming_it(converted, tmp_path, damage):
    root = tmp_path / "wds"
    shutil.copytree(converted("wds", "jpeg"), root)
    shard = readers.load_manifest(root).shard_path(0)
    index = read_index(str(shard), shard.stat().st_size)
    data = bytearray(shard.read_bytes())
    offset, size = index["offsets"][1], index["sizes"][1]
    if damage == "header":
        data[offset + 3 : offset + size] = bytes(size - 3)  # SOI, then nothing JPEG
    else:  # markers intact, the scan cut and padded out to the same size, in a shard
        # converted before imgpack recorded CRC-32s (which would refuse it unread)
        data[offset + size // 2 : offset + size - 2] = bytes(size - 2 - size // 2)
        index_path = Path(str(shard) + spec.WDS_INDEX_SUFFIX)
        del index[spec.WDS_CRC_COLUMN]
        index_path.write_text(json.dumps(index), encoding="utf-8")
    shard.write_bytes(bytes(data))
    ds = readers.open_dataset(root, crop=readers.RandomResizedCrop(32), decode_threads=2)
    if damage == "header":
        with pytest.raises(readers.DatasetError, match=rf"{shard}\[1\]"):
            ds.__getitems__([0, 1, 2])
        with pytest.raises(readers.DatasetError, match=rf"{shard}\[1\]"):
            ds[1]
    else:  # what Pillow makes of it, as without crop= (libjpeg-turbo's warning defers to it)
        plain_ds = readers.open_dataset(root)
        assert torch.equal(ds[1][0], plain(plain_ds, ds.crop, 1))


def test_make_loader_crops_alike_with_workers_and_anew_each_epoch(photos):
    crop = readers.RandomResizedCrop(64, flip=True)
    epochs = {}
    for workers in (0, 2):
        loader = readers.make_loader(photos, batch_size=4, num_workers=workers, crop=crop)
        epochs[workers] = [torch.cat([x for x, _ in loader]) for _ in range(2)]
    assert torch.equal(epochs[0][0], epochs[2][0]) and torch.equal(epochs[0][1], epochs[2][1])
    assert not torch.equal(epochs[0][0], epochs[0][1])


def test_crop_needs_decoded_images(photos):
    with pytest.raises(ValueError, match="crop="):
        readers.open_dataset(photos, crop=readers.CenterCrop(8), decode=False)
    with pytest.raises(ValueError, match="size"):
        readers.CenterCrop(0)


def test_tune_measures_with_the_crop(photos):
    setting = Setting(num_workers=0, decode_threads=2, prefetch_factor=None, pin_memory=False)
    crop = readers.CenterCrop(32)
    (trial,) = sweep(photos, batch_size=4, seconds=0.05, settings=[setting], crop=crop)
    assert trial.samples_per_s > 0


def test_wds_stream_crops_like_the_map_style_reader(converted):
    root = converted("wds", "jpeg")
    crop = readers.RandomResizedCrop(48, flip=True)
    stream = readers.WdsStream(root, shuffle_buffer=0, crop=crop)
    stream.set_epoch(1)
    images = [image for image, _ in stream]
    ds = readers.open_dataset(root, crop=crop)
    ds.set_epoch(1)
    assert len(images) == len(ds)
    assert all(torch.equal(image, ds[i][0]) for i, image in enumerate(images))
