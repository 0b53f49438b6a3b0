"""The read options (``crop=``, ``decode=False``, ``transform=``) on every format, from a
local folder and from object storage, through every read path; and one manifest GET.

Each dataset holds the same dozen small photo crops of varying sizes, stored as their
original files (JPEGs and a PNG), in shards of 5. Every option is checked at ``ds[i]``
against a reference computed here from the source files (Pillow's decode, a crop by hand,
the stored bytes), and every other read path (``__getitems__`` through a ``DataLoader``,
``readers.make_loader``, and for ``wds`` ``stream=True``) must serve exactly the samples
``ds[i]`` does, each once. The object-storage copies are converted into a real S3 server
(moto's, on loopback), whose request log counts the ``imgpack.json`` GETs.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import readers
from convert import ConvertOptions, convert_folder
from readers import spec
from scripts.s3_server import S3Server, local_s3_server
from tests.photos import encode, photo_crop
from tests.test_crop import close, plain, scaled

BUCKET = "imgpack-read-options"
PLACES = ("local", "s3")
# (height, width) of each source image: every one larger than CROP, some large enough for
# the random crop to decode DCT-scaled; the last is stored as a PNG.
SIZES = [(40, 52), (64, 48), (56, 72), (96, 80), (48, 48), (72, 100)] * 2
CROP = 32
BATCH = 5


class Shift:
    """A transform that shows how often it ran: ``int16(image) + 1`` (twice gives +2, never
    a uint8), counting its calls in this process. Picklable, for DataLoader workers."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return image.to(torch.int16) + 1


# Each option as the reader arguments it stands for (fresh objects: a crop holds its epoch).
OPTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "decoded": dict,
    "center-crop": lambda: {"crop": readers.CenterCrop(CROP)},
    "random-crop": lambda: {
        "crop": readers.RandomResizedCrop(CROP, scale=(0.2, 1.0), flip=True, seed=3)
    },
    "decode=False": lambda: {"decode": False},
    "transform": lambda: {"transform": Shift()},
    "center-crop+transform": lambda: {"crop": readers.CenterCrop(CROP), "transform": Shift()},
}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The source folder: photo crops of SIZES in three classes, the last one a PNG."""
    src = tmp_path_factory.mktemp("options-src")
    for i, (height, width) in enumerate(SIZES):
        folder = src / f"class{i % 3}"
        folder.mkdir(exist_ok=True)
        pixels = photo_crop(height, width, seed=i)
        last = i == len(SIZES) - 1
        data = encode(pixels, "PNG") if last else encode(pixels, quality=90)
        (folder / f"img{i:02d}.{'png' if last else 'jpg'}").write_bytes(data)
    return src


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """The S3 server of this module, and a reader cache of its own."""
    with pytest.MonkeyPatch.context() as patch, local_s3_server(BUCKET) as server:
        patch.setenv("IMGPACK_CACHE_DIR", str(tmp_path_factory.mktemp("options-cache")))
        yield server


@pytest.fixture(scope="module")
def datasets(
    source: Path, s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str], str]:
    """``(format, place)`` -> the dataset's folder or URL, converted alike."""
    roots = {}
    for fmt in spec.FORMATS:
        options = ConvertOptions(fmt, encoding="original", shard_size=BATCH, shuffle=True)
        for place in PLACES:
            if place == "local":
                dst = str(tmp_path_factory.mktemp(f"options-{fmt}") / "dst")
            else:
                dst = f"s3://{BUCKET}/{fmt}"
            convert_folder(source, dst, options, workers=1, progress=False)
            roots[fmt, place] = dst
    return roots


def pixels(image: torch.Tensor) -> np.ndarray:
    """A served ``[3, H, W]`` image as an ``[H, W, 3]`` array."""
    return image.permute(1, 2, 0).numpy()


def by_hand(source: Path, ds: readers.ImageDataset, i: int) -> np.ndarray:
    """Sample ``i``'s source file decoded by Pillow."""
    with Image.open(source / ds.source_path(i)) as image:
        return np.asarray(image.convert("RGB"))


def center_crop(image: np.ndarray) -> np.ndarray:
    """torchvision's ``CenterCrop(CROP)`` of an image larger than it."""
    top = round((image.shape[0] - CROP) / 2)
    left = round((image.shape[1] - CROP) / 2)
    return image[top : top + CROP, left : left + CROP]


def check_sample(
    option: str, source: Path, ds: readers.ImageDataset, i: int, image: torch.Tensor
) -> None:
    """``image`` is what sample ``i`` must be under ``option``, from its source file."""
    if option == "decode=False":
        assert image.dtype == torch.uint8 and image.dim() == 1
        stored = image.numpy().tobytes()
        assert stored == bytes(ds.stored(i)) == (source / ds.source_path(i)).read_bytes()
        decoded = readers.open_dataset(ds.manifest)  # the same dataset, decoding
        assert np.array_equal(readers.decode_image(stored), pixels(decoded[i][0]))
        return
    if option == "random-crop":
        want = plain(ds, ds.crop, i)  # its box; the decode, crop and resize by hand
        assert image.dtype == torch.uint8 and image.shape == want.shape
        assert close(image, want) if scaled(ds, ds.crop, i) else torch.equal(image, want)
        return
    want = by_hand(source, ds, i)
    if "center-crop" in option:
        want = center_crop(want)
    if "transform" in option:
        assert image.dtype == torch.int16
        want = want.astype(np.int16) + 1
    else:
        assert image.dtype == torch.uint8
    assert np.array_equal(pixels(image), want)


def fingerprint(image: torch.Tensor, label: int) -> tuple[str, str, tuple[int, ...], int]:
    return (
        hashlib.sha256(image.contiguous().numpy().tobytes()).hexdigest(),
        str(image.dtype),
        tuple(image.shape),
        int(label),
    )


def served(batches: Iterable[tuple[Any, torch.Tensor]]) -> Counter:
    """How often each sample (image and label) came out of ``batches``."""
    return Counter(
        fingerprint(image, label)
        for images, labels in batches
        for image, label in zip(images, labels.tolist(), strict=True)
    )


def read_paths(
    ds: readers.ImageDataset, root: str, fmt: str, options: dict[str, Any], workers: int = 0
) -> dict[str, Iterable[tuple[Any, torch.Tensor]]]:
    """Every batch read path over ``ds`` (opened from ``root`` with ``options``)."""
    loaders: dict[str, Iterable[tuple[Any, torch.Tensor]]] = {
        "DataLoader": DataLoader(
            ds, batch_size=BATCH, num_workers=workers, collate_fn=readers.collate_any
        ),
        "make_loader": readers.make_loader(
            root, BATCH, num_workers=workers, collate_fn=readers.collate_any, **options
        ),
    }
    if fmt == "wds":
        loaders["make_loader(stream=True)"] = readers.make_loader(
            root, BATCH, stream=True, num_workers=workers, collate_fn=readers.collate_any, **options
        )
    return loaders


CASES = [(fmt, place) for fmt in spec.FORMATS for place in PLACES]


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize(("fmt", "place"), CASES)
def test_every_read_path_serves_the_option(datasets, source, fmt, place, option):
    root = datasets[fmt, place]
    options = OPTIONS[option]()
    ds = readers.open_dataset(root, **options)
    assert len(ds) == len(SIZES)
    classes = sorted(p.name for p in source.iterdir())
    samples = []
    for i in range(len(ds)):
        image, label = ds[i]
        assert label == classes.index(Path(ds.source_path(i)).parent.name)
        check_sample(option, source, ds, i, image)
        samples.append(fingerprint(image, label))
    want = Counter(samples)
    assert len(want) == len(ds)  # every sample tells apart: a repeat cannot hide a loss
    transform = options.get("transform")
    for path, batches in read_paths(ds, root, fmt, options).items():
        calls = transform.calls if transform is not None else 0
        assert served(batches) == want, path
        if transform is not None:  # once per sample, in this process (no workers)
            assert transform.calls - calls == len(ds), path


@pytest.mark.parametrize(
    ("fmt", "option"), [("lmdb", "random-crop"), ("hdf5", "decode=False"), ("wds", "transform")]
)
def test_two_workers_serve_what_one_process_does(datasets, fmt, option):
    root = datasets[fmt, "s3"]
    ds = readers.open_dataset(root, **OPTIONS[option]())
    want = Counter(fingerprint(*ds[i]) for i in range(len(ds)))
    for path, batches in read_paths(ds, root, fmt, OPTIONS[option](), workers=2).items():
        assert served(batches) == want, path


def manifest_gets(server: S3Server, url: str) -> int:
    """The GETs of ``url``'s manifest the server has received."""
    key = f"/{url.removeprefix('s3://')}/{spec.MANIFEST_NAME}"
    return sum(r.method == "GET" and r.target == key for r in server.requests())


OPENERS: dict[str, Callable[[str], Iterable[Any]]] = {
    "open_dataset": lambda url: DataLoader(
        readers.open_dataset(url), batch_size=BATCH, collate_fn=readers.collate_any
    ),
    "make_loader": lambda url: readers.make_loader(
        url, BATCH, num_workers=2, collate_fn=readers.collate_any
    ),
    "make_loader(stream=True)": lambda url: readers.make_loader(
        url, BATCH, stream=True, num_workers=2, collate_fn=readers.collate_any
    ),
}
GET_CASES = [(fmt, call) for fmt in spec.FORMATS for call in OPENERS if "stream" not in call]


@pytest.mark.parametrize(("fmt", "call"), [*GET_CASES, ("wds", "make_loader(stream=True)")])
def test_one_manifest_get_per_open(datasets, s3_server, fmt, call):
    url = datasets[fmt, "s3"]
    before = manifest_gets(s3_server, url)
    loader = OPENERS[call](url)
    assert manifest_gets(s3_server, url) - before == 1
    assert sum(len(labels) for _, labels in loader) == len(SIZES)  # workers read none
    assert manifest_gets(s3_server, url) - before == 1
