"""The compiled crop kernel (``readers/images/``, the binding ``jpegcrop.c``): the pixels of
a full decode followed by the same box, torch's antialiased resize and flip, exactly (within
a stated tolerance when the box decodes DCT-scaled); the Python path's verdict on every
damaged file; batches that do not depend on the decode threads; C units that compile
warning-free."""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import threading
import zipfile
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import readers
from convert import ConvertOptions, convert_folder
from readers.images import kernel
from readers.images.decode import decode_image
from readers.images.fused import start_crops
from readers.images.jpeg import crop_dct_divisors, jpeg_header
from tests.photos import encode, photo_crop

ROOT = Path(__file__).resolve().parent.parent
KERNEL_SOURCES = sorted((ROOT / "readers" / "images").glob("*.c"))

needs_kernel = pytest.mark.skipif(
    kernel.crop_kernel() is None,
    reason="the crop kernel is not built (pip install -e . or python setup.py build_ext --inplace)",
)

# How JPEGs are stored: Pillow's subsampling 0/1/2 = 4:4:4/4:2:2/4:2:0, and 4:1:1.
ENCODINGS: dict[str, dict] = {
    "444": {"subsampling": 0},
    "422": {"subsampling": 1},
    "420": {"subsampling": 2},
    "411": {"subsampling": "4:1:1"},
    "gray": {"gray": True},
    "progressive-420": {"subsampling": 2, "progressive": True},
    "progressive-gray": {"gray": True, "progressive": True},
    "restart-420": {"subsampling": 2, "restart_marker_rows": 1},
    "restart-444": {"subsampling": 0, "restart_marker_blocks": 3},
    # a marker every MCU (what the converter writes) or every 2: verified crops then decode
    # only the intervals around the box
    "restart-mcu-420": {"subsampling": 2, "restart_marker_blocks": 1},
    "restart-mcu-422": {"subsampling": 1, "restart_marker_blocks": 1},
    "restart-mcu-gray": {"gray": True, "restart_marker_blocks": 1},
    "restart-2-411": {"subsampling": "4:1:1", "restart_marker_blocks": 2},
}
# (height, width): the benchmark's short side 256 both ways, odd sizes that end inside an
# MCU, and small ones that a centre crop pads.
SIZES = [(256, 341), (341, 256), (255, 257), (100, 333), (37, 61), (17, 23), (8, 8)]
OUTPUTS = [(224, 224), (96, 128), (37, 53)]


@cache  # the same file for each resize level and layout a test runs
def jpeg(height: int, width: int, seed: int, gray: bool = False, **params: object) -> bytes:
    """A q90 JPEG of a real photo crop."""
    image = Image.fromarray(photo_crop(height, width, seed=seed))
    return encode(image.convert("L") if gray else image, quality=90, **params)


def reference(pixels: np.ndarray, box: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The recipe the kernel must equal: the ``[3, H, W]`` tensor of a full decode, the box
    (zero padding outside the image), ``F.interpolate(antialias=True)``, then the flip."""
    top, left, bh, bw, flip = (int(v) for v in box)
    image = torch.from_numpy(pixels).permute(2, 0, 1)
    pad = max(0, -top, -left, top + bh - image.shape[1], left + bw - image.shape[2])
    if pad:  # (a copy of the whole image: most boxes lie inside it)
        image = F.pad(image, (pad, pad, pad, pad))
    out = image[:, top + pad : top + pad + bh, left + pad : left + pad + bw]
    if tuple(out.shape[1:]) != size:
        out = out[None].contiguous(memory_format=torch.channels_last)
        out = F.interpolate(out, size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    return (out.flip(-1) if flip else out).permute(1, 2, 0).numpy()


def assert_same(actual: np.ndarray, desired: np.ndarray, *where: object) -> None:
    """``np.testing.assert_array_equal``, its costly report (``where`` formatted as the
    message) only for arrays that differ."""
    if not np.array_equal(actual, desired):
        np.testing.assert_array_equal(actual, desired, err_msg=" ".join(map(str, where)))


def edge_boxes(height: int, width: int, size: tuple[int, int]) -> np.ndarray:
    """Boxes touching every edge and corner, the whole image, one-pixel boxes, and a centre
    box of the output's size (padded where the image is smaller)."""
    h2, w2 = max(1, height // 2), max(1, width // 2)
    oh, ow = size
    return np.array(
        [
            [0, 0, height, width, 0],
            [0, 0, h2, w2, 1],
            [0, width - w2, h2, w2, 0],
            [height - h2, 0, h2, w2, 1],
            [height - h2, width - w2, h2, w2, 0],
            [0, 0, 1, 1, 0],
            [height - 1, width - 1, 1, 1, 1],
            [0, 0, height, 1, 0],
            [height - 1, 0, 1, width, 1],
            [(height - oh) // 2, (width - ow) // 2, oh, ow, 0],
        ],
        dtype=np.int64,
    )


def kernel_crop(
    data: bytes,
    boxes: np.ndarray,
    size: tuple[int, int],
    planar: bool = False,
    verified: bool = False,
    simd: int = -1,
    huffman: bool | None = None,
) -> np.ndarray:
    """``boxes`` of one JPEG through the kernel alone (``planar``: into an NCHW array, seen
    as NHWC; ``verified``: told the bytes passed their CRC-32; ``simd``, ``huffman``: the
    call's resize level and Huffman decoder); every row must decode there."""
    n = len(boxes)
    header = jpeg_header(data)
    assert header is not None
    if planar:
        out = np.zeros((n, 3, *size), dtype=np.uint8).transpose(0, 2, 3, 1)
    else:
        out = np.zeros((n, *size, 3), dtype=np.uint8)
    sizes = np.array([[header[1], header[0]]] * n)
    failed = kernel.crop_rows(
        kernel.crop_kernel(),
        [data] * n,
        np.arange(n),
        boxes,
        sizes,
        out,
        verified=verified,
        simd=simd,
        huffman=huffman,
    )
    assert failed.size == 0, f"the kernel refused rows {failed}"
    return out


@pytest.fixture(params=[2, 1, 0], ids=["avx2-groups", "avx2", "plain-c"])
def simd(request: pytest.FixtureRequest) -> int:
    """Each of the kernel's resizes, for a test to pass per call: AVX2 by groups of four
    outputs (where the taps fit), AVX2 an output at a time, plain C."""
    module = kernel.crop_kernel()
    if request.param > module.SIMD:
        pytest.skip(f"this CPU (or build) has only resize level {module.SIMD}")
    return request.param


# The encodings whose crops go through every resize level this CPU runs (see :func:`simd`):
# the resize works on the decoded RGB rows, whatever the subsampling or scan order, so the
# other encodings run the default level.
EVERY_LEVEL = ("420", "restart-mcu-gray")


@needs_kernel
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_kernel_crop_equals_full_decode_box_resize_flip(encoding: str) -> None:
    """Each resize level equals the reference. The NCHW layout and verified bytes are
    checked at the default level: they change where the resized pixels are written and how
    far the decode goes, not the resize."""
    every = range(kernel.crop_kernel().SIMD + 1)
    levels = every if encoding in EVERY_LEVEL else [every[-1]]
    checked = 0
    for k, (height, width) in enumerate(SIZES):
        data = jpeg(height, width, seed=k, **ENCODINGS[encoding])
        pixels = decode_image(data)
        for size in OUTPUTS:
            random_boxes = readers.RandomResizedCrop(size, flip=True, seed=k).boxes(
                np.array([(height, width)] * 8), np.arange(8)
            )
            boxes = np.concatenate([edge_boxes(height, width, size), random_boxes])
            unscaled = crop_dct_divisors(boxes, np.array([(height, width)] * len(boxes)), size)
            boxes = boxes[unscaled == 1]
            expected = [reference(pixels, box, size) for box in boxes]
            for level in levels:
                out = kernel_crop(data, boxes, size, simd=level)
                for box, got, want in zip(boxes, out, expected, strict=True):
                    assert_same(got, want, "resize level", level, box)
                    checked += 1
            assert_same(kernel_crop(data, boxes, size, planar=True), out)
            # verified: stops after the box, and with restart markers decodes only the
            # intervals around it
            assert_same(kernel_crop(data, boxes, size, verified=True), out)
    assert checked >= 300 * len(levels)


@needs_kernel
def test_whole_decodes_resize_as_torch_at_every_scale(simd: int) -> None:
    """The converter's decode and resize in one call equals ``F.interpolate(antialias=True)``
    of the full decode at scales from 3x up to 2.6x down: the grouped horizontal pass where
    its taps fit (up to about 1.8x down), and each group tail of 0-3 outputs and odd and even
    row counts; past that the per-pixel pass."""
    data = jpeg(301, 403, seed=5)
    pixels = decode_image(data)
    box = np.array([0, 0, 301, 403, 0])
    heights, widths = (115, 160, 171, 224, 301, 302, 700), (155, 222, 257, 403, 406)
    outputs = [(h, w) for h in heights for w in widths]
    outputs += [(h, w) for h in (90, 151) for w in (81, 160, 229, 1000)]
    for size in outputs:
        whole = kernel.decode_whole(
            kernel.crop_kernel(), data, None, lambda h, w, s=size: s, simd=simd
        )
        np.testing.assert_array_equal(whole, reference(pixels, box, size), err_msg=str(size))


@needs_kernel
def test_resize_of_decoded_pixels_equals_torch_at_every_scale(simd: int) -> None:
    """The converter's resize of pixels that are no JPEG box (PNGs, datasets' raw pixels)
    equals ``F.interpolate(antialias=True)``: down and up, one dimension at a time, to and
    from a single pixel, at every resize level."""
    module = kernel.crop_kernel()
    for seed, (height, width) in enumerate([(301, 403), (37, 61), (1, 5), (640, 17)]):
        pixels = photo_crop(height, width, seed=seed).copy()  # writable, for torch.from_numpy
        whole = np.array([0, 0, height, width, 0])
        for size in [(224, 224), (115, width), (height, 160), (700, 999), (1, 1)]:
            assert_same(
                kernel.resize(module, pixels, size, simd=simd),
                reference(pixels, whole, size),
                f"{height}x{width} -> {size}",
            )


@needs_kernel
def test_resize_of_random_sizes_and_extents_is_torchs(simd: int) -> None:
    """400 random small images, outputs and extents (the corners where taps and the AVX2
    passes' reads past a row meet the buffer's end; ``make asan`` runs this too): the whole
    image bit-exact with ``F.interpolate(size=...)``, an extent within a level of its
    ``scale_factor`` mapping (as :func:`convert.codec.geometry.resize_shorter` without the
    kernel calls it; the converter's extents, DCT-scaled decodes, are 2.5 times the output
    or more, so never the size torch leaves alone)."""
    from convert.codec.geometry import _scale_factor

    module, rng = kernel.crop_kernel(), np.random.default_rng(7)
    photo, mismatched = photo_crop(48, 48, seed=9), 0
    for _ in range(400):
        height, width, out_h, out_w = (int(v) for v in rng.integers(1, 48, 4))
        pixels = photo[:height, :width].copy()
        extent = (height, width)
        if rng.random() < 0.5:  # a DCT-scaled decode's partial last row and column
            extent = (height - rng.random() * 0.99 * (height > 1), width - rng.random() * 0.99)
        out = kernel.resize(module, pixels, (out_h, out_w), extent, simd=simd)
        if extent == (height, width):
            whole = np.array([0, 0, height, width, 0])
            assert_same(out, reference(pixels, whole, (out_h, out_w)), str(extent))
            continue
        if out_h == height or out_w == width:
            continue  # torch skips a dimension whose size stays, whatever its scale factor
        factors = [
            _scale_factor(n, e, o) for n, e, o in zip(pixels.shape, extent, out.shape, strict=False)
        ]
        expected = F.interpolate(
            torch.from_numpy(pixels).permute(2, 0, 1)[None],
            scale_factor=factors,
            mode="bilinear",
            antialias=True,
            recompute_scale_factor=False,
        )[0, :, :out_h, :out_w].permute(1, 2, 0)
        scaled = np.abs(out.astype(np.int16) - expected.numpy())
        assert scaled.max() <= 1, (height, width, extent, out.shape)
        mismatched += scaled.any()
    assert mismatched <= 8  # measured: 0 of the 192 compared


@needs_kernel
def test_resize_refuses_sizes_and_extents_that_do_not_fit() -> None:
    module = kernel.crop_kernel()
    pixels, out = photo_crop(8, 8, seed=0), np.zeros((4, 4, 3), np.uint8)
    for args, message in [
        ((pixels, 8, 9, out, 4, 4, 8.0, 8.0), "height x width x 3"),
        ((pixels, 8, 8, out, 4, 5, 8.0, 8.0), "out_h x out_w x 3"),
        ((pixels, 8, 8, out, 0, 4, 8.0, 8.0), "1 to 1048576"),
        ((pixels, 8, 8, out, 4, 4, 8.5, 8.0), "extent"),
        ((pixels, 8, 8, out, 4, 4, 8.0, float("nan")), "extent"),
        ((pixels, 8, 8, out, 4, 4, 0.0, 8.0), "extent"),
    ]:
        with pytest.raises(ValueError, match=message):
            module.resize(*args)
    with pytest.raises(TypeError):  # read-only bytes are no output
        module.resize(pixels, 8, 8, bytes(48), 4, 4, 8.0, 8.0)
    for wrong in (pixels.astype(np.uint16), pixels[:, :, :2], pixels[:, :, 0]):
        with pytest.raises(ValueError, match=r"uint8 \[H, W, 3\]"):
            kernel.resize(module, wrong, (4, 4))


# Beside ENCODINGS: Huffman tables of the image's own statistics instead of the standard ones.
OWN_TABLES: dict[str, dict] = {
    "optimized-420": {"subsampling": 2, "optimize": True},
    "optimized-restart-mcu-444": {"subsampling": 0, "optimize": True, "restart_marker_blocks": 1},
    "optimized-restart-row-gray": {"gray": True, "optimize": True, "restart_marker_rows": 1},
}


@needs_kernel
@pytest.mark.parametrize("encoding", [*ENCODINGS, *OWN_TABLES])
def test_verified_bytes_decode_to_libjpegs_pixels_through_the_own_huffman_decoder(
    encoding: str,
) -> None:
    """Verified bytes decode their Huffman codes through ``huffman.c`` instead of libjpeg's
    decoder: the same pixels, for every encoding (restart markers every MCU, every row or
    none; custom tables), boxes at every edge and random ones, DCT-scaled boxes. (The
    layout is the resize's concern, above; progressive files stay with libjpeg: equal
    trivially.)"""
    params = {**ENCODINGS, **OWN_TABLES}[encoding]
    checked = 0
    for k, (height, width) in enumerate(SIZES):
        data = jpeg(height, width, seed=k, **params)
        for size in OUTPUTS:
            random_boxes = readers.RandomResizedCrop(size, scale=(0.05, 1.0), flip=True, seed=k)
            boxes = np.concatenate(
                [
                    edge_boxes(height, width, size),
                    random_boxes.boxes(np.array([(height, width)] * 8), np.arange(8)),
                ]
            )
            own = kernel_crop(data, boxes, size, verified=True, huffman=True)
            theirs = kernel_crop(data, boxes, size, verified=True, huffman=False)
            assert_same(own, theirs, (height, width), size)
            checked += len(boxes)
    assert checked >= 300


@needs_kernel
@pytest.mark.parametrize("encoding", [*ENCODINGS, *OWN_TABLES])
def test_verified_full_decodes_take_the_kernel_to_the_same_pixels(encoding: str) -> None:
    """``decode_image(..., verified=True)`` (a ``transform=`` read of bytes whose CRC-32
    matched) decodes through the kernel, the own Huffman decoder included: TurboJPEG's
    pixels."""
    params = {**ENCODINGS, **OWN_TABLES}[encoding]
    for k, (height, width) in enumerate(SIZES):
        data = jpeg(height, width, seed=k, **params)
        whole = kernel.decode_whole(kernel.crop_kernel(), data, None, verified=True)
        assert whole is not None and whole.shape == (height, width, 3)
        assert_same(whole, decode_image(data))
        assert_same(decode_image(data, verified=True), whole)


@needs_kernel
def test_dct_scaled_crops_stay_close_to_the_full_decode() -> None:
    """Boxes at least :data:`readers.images.jpeg.DCT_REDUCING_GAP` times the output once
    scaled decode with libjpeg's scaled IDCT (:func:`readers.images.jpeg.crop_dct_divisors`);
    restart markers and verified bytes give the same pixels, scaled IDCT and all. Measured
    over these 38 boxes: mean 0.14 levels, p99 1."""
    crops = [
        readers.CenterCrop(112, ratio=224 / 256),
        readers.RandomResizedCrop(112, flip=True, seed=3),
        readers.RandomResizedCrop(64, flip=True, seed=4),
    ]
    diffs, divisors = [], []
    for seed, (height, width) in enumerate([(512, 683), (960, 720), (600, 800), (1000, 1500)]):
        data = jpeg(height, width, seed=seed, subsampling=2)
        pixels = decode_image(data)
        sizes = np.array([(height, width)] * 6)
        for crop in crops:
            boxes = crop.boxes(sizes, np.arange(6))
            scale = crop_dct_divisors(boxes, sizes, crop.size)
            boxes, scale = boxes[scale > 1], scale[scale > 1]
            got_rows = kernel_crop(data, boxes, crop.size)
            marked = jpeg(height, width, seed=seed, subsampling=2, restart_marker_blocks=1)
            for verified in (False, True):
                np.testing.assert_array_equal(
                    kernel_crop(marked, boxes, crop.size, verified=verified), got_rows
                )
            for box, got in zip(boxes, got_rows, strict=True):
                want = reference(pixels, box, crop.size)
                diffs.append(np.abs(got.astype(np.int16) - want).ravel())
            divisors += scale.tolist()
    diff = np.concatenate(diffs)
    assert len(divisors) >= 30 and {2, 4} <= set(divisors)
    mean, p99 = diff.mean(), np.quantile(diff, 0.99)
    assert mean <= 0.3 and p99 <= 4, (mean, p99)


@needs_kernel
def test_crop_scales_each_row_by_the_divisor_it_is_given() -> None:
    """The divisors are the caller's (one per value, or one for all), the kernel does not
    choose: 1 is the full decode's pixels exactly, each larger one further from them (the
    less the antialiased resize is left to do), and an unknown one is refused."""
    module = kernel.crop_kernel()
    data = jpeg(960, 1280, seed=2)
    box, size = np.array([[80, 96, 800, 960, 0]]), (100, 120)
    boxes, sizes = box.repeat(4, 0), np.array([(960, 1280)] * 4)
    out = np.zeros((4, *size, 3), dtype=np.uint8)
    rows = np.arange(4)
    assert not len(
        kernel.crop_rows(module, [data] * 4, rows, boxes, sizes, out, np.array([1, 2, 4, 8]))
    )
    want = reference(decode_image(data), box[0], size)
    np.testing.assert_array_equal(out[0], want)
    means = [np.abs(row.astype(np.int16) - want).mean() for row in out]
    assert 0 < means[1] < means[2] < means[3], means  # 1/8: no resize left (1.3 levels)
    by_one = np.zeros_like(out)
    assert not len(kernel.crop_rows(module, [data] * 4, rows, boxes, sizes, by_one, 2))
    np.testing.assert_array_equal(by_one, out[[1, 1, 1, 1]])
    ruled = np.zeros_like(out)  # none given: the reducing-gap rule, here 1/2
    assert crop_dct_divisors(box, sizes[:1], size).tolist() == [2]
    assert not len(kernel.crop_rows(module, [data] * 4, rows, boxes, sizes, ruled))
    np.testing.assert_array_equal(ruled, by_one)
    with pytest.raises(ValueError, match=r"dct\[2\] is 3"):
        kernel.crop_rows(module, [data] * 4, rows, boxes, sizes, out, np.array([1, 2, 3, 8]))


@needs_kernel
def test_start_crops_sends_only_upright_complete_jpegs_to_the_kernel() -> None:
    """EXIF-rotated, CMYK, PNG and pixel samples take the Python path (the kernel only
    decodes upright JPEGs); the batch equals the recipe for all of them."""
    photo = photo_crop(120, 150, seed=2)
    exif = Image.Exif()
    exif[0x0112] = 6
    values: list[bytes | np.ndarray] = [
        jpeg(120, 150, seed=1),
        encode(Image.fromarray(photo), quality=90, exif=exif),  # rotated: the fallback's
        encode(Image.fromarray(photo).convert("CMYK"), quality=90),
        encode(photo, "PNG"),
        photo,
        jpeg(90, 60, seed=3, progressive=True),
    ]
    taken = kernel.kernel_decodes(kernel.jpeg_headers(kernel.crop_kernel(), values), None)
    assert taken.tolist() == [True, False, False, False, False, True]
    crop = readers.RandomResizedCrop((64, 80), flip=True, seed=9)
    rows = np.zeros((len(values), 64, 80, 3), dtype=np.uint8)
    indices = np.arange(len(values))
    start_crops(values, indices, crop, rows, str).finish()
    for row, value in enumerate(values):
        pixels = value if isinstance(value, np.ndarray) else decode_image(value)
        box = crop.boxes(np.array([pixels.shape[:2]]), indices[row : row + 1])[0]
        np.testing.assert_array_equal(rows[row], reference(pixels, box, crop.size), str(row))


@needs_kernel
def test_headers_match_the_python_marker_walk(sample_data: Path) -> None:
    files = sorted(sample_data.rglob("*.*g"))
    values = [path.read_bytes() for path in files]
    headers = kernel.jpeg_headers(kernel.crop_kernel(), values)
    for path, data, row in zip(files, values, headers, strict=True):
        parsed = jpeg_header(data) if data[:3] == b"\xff\xd8\xff" else None
        got = tuple(row[[kernel.WIDTH, kernel.HEIGHT, kernel.ORIENTATION]]) if row[0] else None
        assert got == (parsed[:3] if parsed else None), path.name


# --- damaged files ------------------------------------------------------------------------
FUZZ = r"""
import hashlib, json, os, random, sys
import numpy as np
import readers
from readers.images import kernel
from readers.images.fused import start_crops
from readers.images.jpeg import crop_dct_divisors, jpeg_header
from readers.spec import DatasetError
from tests.test_kernel import ENCODINGS, jpeg

CASES = int(sys.argv[1])
# With IMGPACK_KERNEL_HUFFMAN=0 (libjpeg's Huffman decoder, fixed at import) this child only
# prints its crop outcomes; the other child reads them from the file argv[2].
LIBJPEG = kernel.crop_kernel().HUFFMAN == 0
rng = random.Random(17)
bases = [jpeg(72, 90, seed=k, **params) for k, params in enumerate(ENCODINGS.values())]
SIZE = (40, 48)  # a box of a 72x90 image never decodes DCT-scaled for it


def segments(data):
    i, found = 2, []
    while i + 4 <= len(data) and data[i] == 0xFF and data[i + 1] != 0xDA:
        found.append(i)
        i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return found or [2]


def restart_markers(data):
    at = data.index(b"\xff\xda")
    return [i for i in range(at, len(data) - 1) if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]


def mutate(data):
    marked = b"\xff\xdd" in data
    kind = rng.choice(["truncate", "flip", "marker", "dimensions", "insert"] + ["restart"] * marked)
    b = bytearray(data)
    if kind == "restart":  # the intervals a verified crop cuts out, misplaced or misnumbered
        found, dri = restart_markers(data), data.index(b"\xff\xdd")
        how = rng.choice(["number", "drop", "duplicate", "interval"])
        at = rng.choice(found) if found else dri
        if how == "number" and found:
            b[at + 1] = 0xD0 + rng.randrange(8)
        elif how == "drop" and found:
            del b[at : at + 2]
        elif how == "duplicate" and found:
            b[at:at] = data[at : at + 2]
        else:  # the interval the DRI segment declares
            b[dri + 4 : dri + 6] = rng.randrange(6).to_bytes(2, "big")
    elif kind == "truncate":
        b = b[: rng.randrange(2, len(b))]
        if rng.random() < 0.5:
            b += b"\xff\xd9"  # still ends like a complete file
    elif kind == "flip":
        start = 0 if rng.random() < 0.5 else segments(data)[-1]
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(start, len(b) - 2)] ^= rng.randrange(1, 256)
    elif kind == "marker":
        at = rng.choice(segments(data))
        field = rng.choice([1, 2, 3])  # the marker, or its length
        b[at + field] = rng.randrange(256)
    elif kind == "dimensions":
        at = data.index(b"\xff\xc0") if b"\xff\xc0" in data else data.index(b"\xff\xc2")
        # over the decompression-bomb limit (refused from the header), or large enough
        # that the data runs out (a decode of hundreds of megapixels is left out for time)
        h, w = rng.choice([(0, 90), (72, 0), (65535, 65535), (20000, 9000), (1500, 2000),
                           (73, 91), (1, 1), (rng.randrange(2000), rng.randrange(2000))])
        b[at + 5 : at + 9] = bytes([h >> 8, h & 255, w >> 8, w & 255])
    else:
        at = rng.randrange(2, len(b) - 2)
        b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return kind, bytes(b)


cases = [mutate(rng.choice(bases)) for _ in range(CASES)]


def crop_for(data, index):
    random_crop = readers.RandomResizedCrop(SIZE, flip=True, seed=index)
    header = jpeg_header(data)
    if header is None:
        return random_crop
    box = random_crop.boxes(np.array([(header[1], header[0])]), np.array([index]))[0]
    # a DCT-scaled box is placed alike by the kernel and the Python path, but not to the
    # level: compare unscaled ones
    scaled = crop_dct_divisors(box[None], np.array([(header[1], header[0])]), SIZE)[0] > 1
    return readers.CenterCrop(SIZE) if scaled else random_crop


def outcome(data, index, verified=False):
    rows = np.zeros((1, *SIZE, 3), dtype=np.uint8)
    try:
        start_crops([data], np.array([index]), crop_for(data, index), rows, lambda row: "sample",
                   verified).finish()
    except DatasetError as e:
        return "error", str(e)
    return "pixels", hashlib.sha1(rows.tobytes()).hexdigest()


with_kernel = [outcome(data, k) for k, (_, data) in enumerate(cases)]
# Told the bytes passed their CRC-32, the kernel stops after the box: damage below it goes
# unseen (the CRC-32 is what guards stored bytes), anything else is judged as before.
stopping = [outcome(data, k, verified=True) for k, (_, data) in enumerate(cases)]
if LIBJPEG:
    print(json.dumps({"with_kernel": with_kernel, "stopping": stopping}))
    sys.exit(0)
# Both again with libjpeg's Huffman decoder in place of the kernel's own (huffman.c): the
# other child's.
with open(sys.argv[2]) as f:
    theirs = json.load(f)
with_libjpeg = [tuple(o) for o in theirs["with_kernel"]]
stopping_libjpeg = [tuple(o) for o in theirs["stopping"]]
# Whole decodes (the converter's), by the own decoder and by libjpeg's (a per-call choice):
# the same pixels wherever both decode; the own one refuses more (it takes only well-formed
# data).
def whole(data, huffman):
    pixels = kernel.decode_whole(kernel.crop_kernel(), data, 4000 * 4000, huffman=huffman)
    return None if pixels is None else pixels.tobytes()
wholes = [(whole(data, True), whole(data, False)) for _, data in cases]
whole_mismatches = [k for k, (a, b) in enumerate(wholes) if a is not None and a != b]
headers = kernel.jpeg_headers(kernel.crop_kernel(), [data for _, data in cases])
taken = kernel.kernel_decodes(headers, None)
header_mismatches = []
for k, (_, data) in enumerate(cases):
    parsed = jpeg_header(data) if data[:3] == b"\xff\xd8\xff" else None
    got = tuple(int(v) for v in headers[k, [kernel.WIDTH, kernel.HEIGHT, kernel.ORIENTATION]])
    if (got if headers[k, kernel.PARSED] else None) != (parsed[:3] if parsed else None):
        header_mismatches.append(k)
os.environ[kernel.KERNEL_ENV] = "0"
kernel.crop_kernel.cache_clear()
assert kernel.crop_kernel() is None
without = [outcome(data, k) for k, (_, data) in enumerate(cases)]
mismatches = [
    {"case": k, "kind": cases[k][0], "kernel": a[0], "python": b[0], "text": (a[1][:99], b[1][:99])}
    for own in (with_kernel, with_libjpeg) for k, (a, b) in enumerate(zip(own, without)) if a != b
]
stopping_mismatches = [
    k for k, (a, b) in enumerate(zip(stopping, without)) if a != b and b[0] != "error"
]
# The own decoder refuses more (it takes only well-formed data) and then leaves the file to
# the Python path; it never gives an outcome that is neither libjpeg's nor the Python path's.
huffman_mismatches = [
    k for k, (a, b, c) in enumerate(zip(stopping, stopping_libjpeg, without)) if a != b and a != c
]
print(json.dumps({
    "cases": len(cases),
    "taken_by_kernel": int(taken.sum()),
    "decoded": sum(kind == "pixels" for kind, _ in with_kernel),
    "errors": sum(kind == "error" for kind, _ in with_kernel),
    "header_mismatches": header_mismatches,
    "mismatches": mismatches[:20],
    "stopping_mismatches": stopping_mismatches[:20],
    "stopping_decoded_damage": sum(a[0] != b[0] for a, b in zip(stopping, without)),
    "huffman_mismatches": huffman_mismatches[:20],
    "huffman_refused": sum(a != b for a, b in zip(stopping, stopping_libjpeg)),
    "whole_mismatches": whole_mismatches[:20],
    "whole_refused": sum(a is None and b is not None for a, b in wholes),
}))
"""


@needs_kernel
@pytest.mark.fuzz
def test_fuzzed_jpegs_never_crash_and_match_the_python_path(tmp_path: Path) -> None:
    """2,000 mutated JPEGs (truncations, byte flips, damaged markers, huge dimensions,
    inserted bytes; restart markers misnumbered, dropped, doubled or declared at another
    interval, where a verified crop would cut intervals out) in a child process: a crash or
    hang fails this test, not the suite; every one gives the Python path's pixels or its
    DatasetError text, and the kernel's header walk agrees with
    :func:`readers.images.jpeg.jpeg_header` on each; with libjpeg's Huffman decoder (a
    second child, ``IMGPACK_KERNEL_HUFFMAN=0``) too."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    theirs = subprocess.run(
        [sys.executable, "-c", FUZZ, "2000"],
        cwd=ROOT,
        env={**env, "IMGPACK_KERNEL_HUFFMAN": "0"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    (tmp_path / "libjpeg.json").write_text(theirs.stdout.strip().splitlines()[-1])
    result = subprocess.run(
        [sys.executable, "-c", FUZZ, "2000", str(tmp_path / "libjpeg.json")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["cases"] == 2000
    assert report["header_mismatches"] == []
    assert report["mismatches"] == []
    # verified: the Python path's pixels wherever it decodes; pixels where it errors only
    # for damage after the box (seen: the kernel then read less than the whole file)
    assert report["stopping_mismatches"] == []
    assert report["stopping_decoded_damage"] > 0, report
    assert report["huffman_mismatches"] == [], report
    assert report["whole_mismatches"] == [], report
    # the kernel judged many damaged files itself (not all left to the fallback), and both
    # outcomes occur
    assert report["taken_by_kernel"] >= 500, report
    assert report["decoded"] >= 200 and report["errors"] >= 200, report


@needs_kernel
def test_crop_rows_takes_nhwc_or_the_nhwc_view_of_nchw_only() -> None:
    data = jpeg(64, 80, seed=1)
    boxes, sizes = np.array([[0, 0, 32, 32, 0]]), np.array([[64, 80]])
    strided = np.zeros((1, 32, 64, 3), dtype=np.uint8)[:, :, ::2]
    with pytest.raises(ValueError, match="NHWC"):
        kernel.crop_rows(kernel.crop_kernel(), [data], np.zeros(1, np.int64), boxes, sizes, strided)


@needs_kernel
def test_crop_refuses_rows_outside_the_batch_and_non_bytes() -> None:
    module = kernel.crop_kernel()
    data = jpeg(16, 16, seed=0)
    out, boxes = np.zeros((1, 8, 8, 3), np.uint8), np.array([[0, 0, 8, 8, 0]])
    with pytest.raises(IndexError):
        kernel.crop_rows(module, [data], np.array([1]), boxes, np.array([[16, 16]]), out)
    with pytest.raises(TypeError):
        kernel.crop_rows(module, [np.zeros(3)], np.array([0]), boxes, np.array([[16, 16]]), out)
    with pytest.raises(ValueError, match="out"):
        two = out.repeat(2, 0)  # rows for two samples, one value
        kernel.crop_rows(module, [data], np.array([0]), boxes, np.array([[16, 16]]), two)


# --- threads, fallback, build -------------------------------------------------------------
BOTH_CROPS = pytest.mark.parametrize(
    "crop",
    [readers.RandomResizedCrop(224, flip=True, seed=2), readers.CenterCrop(224, ratio=224 / 256)],
    ids=["random", "center"],
)


@pytest.fixture(scope="module")
def jpeg_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("kernel-src")
    for k in range(24):
        folder = src / f"class{k % 2}"
        folder.mkdir(exist_ok=True)
        height, width = SIZES[k % 4]
        params = list(ENCODINGS.values())[k % len(ENCODINGS)]
        (folder / f"{k}.jpg").write_bytes(jpeg(height, width, seed=k, **params))
    dst = tmp_path_factory.mktemp("kernel-pt")
    options = ConvertOptions(format="pt", encoding="original")
    convert_folder(src, dst, options, workers=1, overwrite=True, progress=False)
    return dst


@needs_kernel
@BOTH_CROPS
def test_batches_do_not_depend_on_decode_threads(jpeg_dataset: Path, crop) -> None:
    batches = []
    for threads in (1, 2, 3):  # one part, or 2 per thread
        ds = readers.open_dataset(jpeg_dataset, crop=crop, decode_threads=threads)
        batches.append(readers.collate(ds.__getitems__(list(range(len(ds)))))[0])
    assert torch.equal(batches[0], batches[1]) and torch.equal(batches[0], batches[2])


@needs_kernel
def test_threads_sharing_a_batch_decode_each_row_once_as_one_call_does(jpeg_dataset: Path) -> None:
    # start_crops' decode threads take the batch's rows one at a time from a shared counter
    ds = readers.open_dataset(jpeg_dataset)
    values = [bytes(v) for v in ds.read_stored(range(len(ds)))]
    values[3] = values[3][: len(values[3]) // 2] + b"\xff\xd9"  # truncated: libjpeg warns
    k = kernel.crop_kernel()
    headers = kernel.jpeg_headers(k, values)
    sizes = np.ascontiguousarray(headers[:, [kernel.HEIGHT, kernel.WIDTH]])
    boxes = readers.RandomResizedCrop(32, flip=True).boxes(sizes, np.arange(len(values)))
    rows = np.arange(len(values), dtype=np.int64)
    alone = np.zeros((len(values), 32, 32, 3), dtype=np.uint8)
    failed = kernel.crop_rows(k, values, rows, boxes, sizes, alone)
    shared = np.full_like(alone, 7)
    status = np.zeros(len(values), dtype=np.int32)
    next_row = np.zeros(1, dtype=np.int64)
    args = (k, values, rows, boxes, sizes, shared, status, next_row)
    threads = [threading.Thread(target=kernel.crop_shared, args=args) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert next_row[0] == len(rows) + len(threads)  # every row taken once, then one past each
    assert 3 in failed and np.flatnonzero(status).tolist() == failed.tolist()
    assert np.array_equal(shared[status == 0], alone[status == 0])
    with pytest.raises(ValueError, match="next has 16 bytes, not 8"):
        kernel.crop_shared(k, values, rows, boxes, sizes, shared, status, np.zeros(2, np.int64))


def _child(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with this one's environment (an install found through
    ``PYTHONPATH``, `make asan`'s preloaded runtime) but none of imgpack's own switches: only
    those in ``env``."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("IMGPACK_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**inherited, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


CROP_TWICE = """
    import pathlib
    import numpy as np
    import readers
    from readers.images.fused import start_crops
    data = pathlib.Path({photo!r}).read_bytes()
    rows = np.zeros((2, 224, 224, 3), dtype=np.uint8)
    crop = readers.RandomResizedCrop(224, flip=True, seed=1)  # a 427x640 photo: never DCT-scaled
    for _ in range(2):
        start_crops([data, data], np.arange(2), crop, rows, str).finish()
    print(readers.decoder_name(), readers.decoder_name(crop=True), rows.tobytes().hex())
"""


def _crop_twice_code() -> str:
    return textwrap.dedent(CROP_TWICE).format(photo=str(ROOT / "sample_data/scenes/china_00.jpg"))


@cache  # the same run for each way of going without the kernel
def _crop_twice_here() -> list[str]:
    """What CROP_TWICE prints in this process, where the kernel is on."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(_crop_twice_code(), {})
    return printed.getvalue().split()


@needs_kernel
@pytest.mark.parametrize("how", ["IMGPACK_KERNEL=0", "not built"])
def test_without_the_kernel_crops_take_the_python_path_with_one_notice(how: str) -> None:
    kernel_run = _crop_twice_here()
    assert kernel_run[:2] == ["turbojpeg", "turbojpeg+kernel"]
    logged = "import logging, sys\nlogging.basicConfig(level=logging.INFO)\n"
    if how == "not built":  # as if the extension had not compiled
        setup = 'sys.modules["readers.images.jpegcrop"] = None\n'
        run = _child(logged + setup + _crop_twice_code())
        notice = "the crop kernel is not built"
    else:
        run = _child(logged + _crop_twice_code(), IMGPACK_KERNEL="0")
        notice = "IMGPACK_KERNEL=0"
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[:2] == ["turbojpeg", "turbojpeg"]
    assert run.stderr.count(notice) == 1, run.stderr
    assert run.stdout.split()[2] == kernel_run[2]  # the same pixels


def missing_build_tools() -> str | None:
    """Why the kernel cannot be compiled here (no gcc, or no Python or libjpeg headers), or
    None when it can."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return "gcc is not installed"
    probe = subprocess.run(
        [gcc, "-I", sysconfig.get_paths()["include"], "-E", "-x", "c", "-o", os.devnull, "-"],
        input="#include <Python.h>\n#include <stdio.h>\n#include <jpeglib.h>\n",
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"Python's or libjpeg's headers are missing: {probe.stderr.strip()[:200]}"
    return None


def test_the_kernel_is_built_wherever_it_can_be() -> None:
    """The suite runs with the kernel: a machine that can compile it (as CI, which installs
    libjpeg62-turbo-dev) must have built it, not fallen back without a word."""
    missing = missing_build_tools()
    if missing is not None:
        pytest.skip(missing)
    assert importlib.util.find_spec("readers.images.jpegcrop") is not None, (
        "gcc and the headers are here but readers.images.jpegcrop was not built: "
        "pip install -e . (or python setup.py build_ext --inplace) and read its warning"
    )


def other_libjpeg_api(gcc: str, into: Path) -> Path:
    """A folder whose ``jconfig.h`` is the system's with the other ``JPEG_LIB_VERSION``
    (80 where it is 62, else 62): put first on the include path, jpeglib.h then declares
    the other API's structs."""
    found = subprocess.run(
        [gcc, "-M", "-x", "c", "-"],
        input="#include <jpeglib.h>\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (config,) = {Path(p) for p in found.replace("\\\n", " ").split() if p.endswith("/jconfig.h")}
    text = config.read_text()
    version = int(re.search(r"#define JPEG_LIB_VERSION\s+(\d+)", text).group(1))
    other = 80 if version < 70 else 62
    into.mkdir()
    (into / "jconfig.h").write_text(
        re.sub(r"#define JPEG_LIB_VERSION\s+\d+", f"#define JPEG_LIB_VERSION {other}", text)
    )
    return into


def test_kernel_c_compiles_without_warnings(tmp_path: Path) -> None:
    missing = missing_build_tools()
    if missing is not None:
        pytest.skip(missing)
    gcc = shutil.which("gcc")
    include = ["-I", sysconfig.get_paths()["include"]]
    obj = str(tmp_path / "kernel.o")
    # At -O3 (-Wclobbered, for setjmp, shows only when optimising) also: with libjpeg's own
    # Huffman decoder, the build where the libjpeg-turbo is not the one huffman.c was
    # written against; and against the other API of libjpeg-turbo (6b's, as Debian's
    # libjpeg62-turbo, or 8's, as Ubuntu's libjpeg-turbo8), whose structs differ.
    other_api = other_libjpeg_api(gcc, tmp_path / "other-api")
    variants = {
        "-O0": [[]],
        "-O3": [[], ["-DIMGPACK_NO_OWN_HUFFMAN"], ["-I", str(other_api)]],
    }
    for source in KERNEL_SOURCES:
        for level, builds in variants.items():
            compiled: set[bytes] = set()
            for flags in builds:
                command = [gcc, "-Wall", "-Wextra", "-Werror", level, *flags, *include]
                command.append(str(source))
                if len(builds) > 1:  # a build whose preprocessed unit was compiled at
                    # this level cannot warn anew (most units include no libjpeg header)
                    unit = subprocess.run([*command, "-E"], capture_output=True).stdout
                    if unit in compiled:
                        continue
                    compiled.add(unit)
                result = subprocess.run(
                    [*command, "-c", "-o", obj], capture_output=True, text=True, check=False
                )
                assert result.returncode == 0, f"{source.name} {level} {flags}: {result.stderr}"


def test_setup_builds_every_kernel_unit() -> None:
    """setup.py's KERNEL_UNITS names each ``readers/images/*.c`` once, each with its header
    (the binding ``jpegcrop.c`` has none)."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    (units,) = [
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "KERNEL_UNITS" for t in node.targets)
    ]
    assert sorted(units) == sorted(p.stem for p in KERNEL_SOURCES) and len(set(units)) == len(units)
    headless = [u for u in units if not (ROOT / "readers" / "images" / f"{u}.h").is_file()]
    assert headless == ["jpegcrop"]


@needs_kernel
def test_the_own_huffman_decoder_is_built_for_the_libjpeg_turbo_it_was_written_against() -> None:
    module = kernel.crop_kernel()
    written_for = 2000000 <= module.LIBJPEG_TURBO_VERSION < 3001000
    assert written_for == module.OWN_HUFFMAN
    assert (written_for and os.environ.get("IMGPACK_KERNEL_HUFFMAN") != "0") == module.HUFFMAN
    # IMGPACK_KERNEL_HUFFMAN=0, read once at import, makes libjpeg's the default
    child = subprocess.run(
        [sys.executable, "-c", "import readers.images.jpegcrop as m; print(m.HUFFMAN)"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "IMGPACK_KERNEL_HUFFMAN": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == "0"


@pytest.mark.parametrize("fmt", sorted(readers.DATASETS))
@pytest.mark.parametrize("case", ["jpeg", "original", "raw-fixed"])
def test_shards_whose_samples_carry_crcs_are_verified(converted, fmt: str, case: str) -> None:
    # what lets the kernel stop after a crop's box: every read was checked against the
    # CRC-32 the converter recorded; never for raw pixels, which carry none
    ds = readers.open_dataset(converted(fmt, case))
    assert ds.shard(0).verified is (case != "raw-fixed")


@needs_kernel
@BOTH_CROPS
def test_stopping_after_the_box_gives_the_same_pixels(jpeg_dataset: Path, crop) -> None:
    ds = readers.open_dataset(jpeg_dataset)
    values = ds.read_stored(range(len(ds)))
    headers = kernel.jpeg_headers(kernel.crop_kernel(), values)
    sizes = headers[:, [kernel.HEIGHT, kernel.WIDTH]]
    boxes = crop.boxes(sizes, np.arange(len(ds)))
    rows = [np.zeros((len(ds), 224, 224, 3), dtype=np.uint8) for _ in range(2)]
    for verified, out in zip((False, True), rows, strict=True):
        failed = kernel.crop_rows(
            kernel.crop_kernel(), values, np.arange(len(ds)), boxes, sizes, out, verified=verified
        )
        assert failed.tolist() == []
    np.testing.assert_array_equal(rows[0], rows[1])
    assert (boxes[:, 0] + boxes[:, 2] < sizes[:, 0]).any()  # some boxes end above the bottom


def restart_intervals(data: bytes) -> list[tuple[int, int]]:
    """The (start, end) of each restart interval's entropy-coded bytes."""
    start = data.index(b"\xff\xda")
    start += 2 + int.from_bytes(data[start + 2 : start + 4], "big")
    bounds, i = [], start
    while (i := data.index(b"\xff", i)) < len(data) - 2:
        if 0xD0 <= data[i + 1] <= 0xD7:
            bounds.append((start, i))
            start = i + 2
        i += 1 if data[i + 1] == 0xFF else 2
    return [*bounds, (start, len(data) - 2)]


@needs_kernel
def test_verified_crops_of_restart_marked_jpegs_read_only_the_intervals_around_the_box() -> None:
    height, width, size = 256, 341, (224, 224)
    data = jpeg(height, width, seed=5, subsampling=2, restart_marker_blocks=1)
    columns = -(-width // 16)  # 4:2:0: 16x16 MCUs, a marker after each
    intervals = restart_intervals(data)
    assert len(intervals) == columns * (height // 16)
    # garble the first MCU of row 8, left of the centre box (columns 58-282)
    start, end = intervals[8 * columns]
    damaged = data[:start] + bytes(end - start) + data[end:]
    box = np.array([[16, 58, 224, 224, 0]])
    want = reference(decode_image(data), box[0], size)
    np.testing.assert_array_equal(kernel_crop(damaged, box, size, verified=True)[0], want)
    # unverified, or for a box over the damaged interval, the kernel reads it and leaves
    # the file to the Python path
    for refused, verified in ((box, False), (np.array([[100, 0, 64, 64, 0]]), True)):
        out = np.zeros((1, *size, 3), dtype=np.uint8)
        failed = kernel.crop_rows(
            kernel.crop_kernel(),
            [damaged],
            np.arange(1),
            refused,
            np.array([[height, width]]),
            out,
            verified=verified,
        )
        assert failed.tolist() == [0], refused


@needs_kernel
@pytest.mark.parametrize("quality", [50, 90, 96, 100])
def test_the_kernel_encodes_turbojpegs_bytes_and_restart_markers_keep_the_pixels(
    quality: int,
) -> None:
    from readers.images.decode import _turbojpeg

    pixels = photo_crop(200, 301, seed=quality)
    module = kernel.crop_kernel()
    plain = module.encode(pixels, 200, 301, quality, 0)
    marked = module.encode(pixels, 200, 301, quality, 1)
    tj = _turbojpeg()
    if tj is not None:  # the converter's bytes do not depend on which encoder it has
        assert plain == tj.encode(pixels, quality=quality, pixel_format=0, jpeg_subsample=2)
    np.testing.assert_array_equal(decode_image(marked), decode_image(plain))
    assert len(restart_intervals(marked)) == 13 * 19  # one per 16x16 MCU
    assert b"\xff\xdd" not in plain and len(restart_intervals(plain)) == 1
    # the marker, the byte it aligns to and the DC restarted: a few bytes an MCU
    assert 2 * 13 * 19 < len(marked) - len(plain) < 5 * 13 * 19


@needs_kernel
def test_the_kernel_encoder_refuses_what_it_cannot_encode() -> None:
    module = kernel.crop_kernel()
    pixels = photo_crop(8, 8, seed=0)
    for args, message in [
        ((pixels, 8, 9, 90, 0), "height x width x 3"),
        ((pixels, 0, 8, 90, 0), "1 to 65500"),
        ((pixels, 8, 8, 0, 0), "quality"),
        ((pixels, 8, 8, 90, -1), "restart"),
    ]:
        with pytest.raises(ValueError, match=message):
            module.encode(*args)


@needs_kernel
@pytest.mark.wheel
def test_pip_wheel_builds_the_kernel_and_it_passes_the_release_check(tmp_path: Path) -> None:
    # `pip wheel .` (what a release build runs, scripts/wheels/cibuildwheel.toml) puts the
    # kernel, the batch CRC-32 and the Feistel network in the wheel, and the wheels' smoke test
    # runs those files
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("imgpack-*.whl")
    built = []
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        modules = ("readers/images/jpegcrop.", "readers/formats/crc32.", "readers/epochs/feistel.")
        for stem in modules:
            (name,) = [n for n in names if n.startswith(stem) and n.endswith((".so", ".pyd"))]
            built.append(archive.extract(name, tmp_path / "unpacked"))
            assert stem + "pyi" in names, f"the wheel lacks {stem}pyi"
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "wheels" / "check_wheel.py"), *built],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "the crop kernel works" in check.stdout
    assert "the batch CRC-32 works" in check.stdout
    assert "the Feistel network works" in check.stdout
    assert check.stdout.count("exports only PyInit_*") == 3, check.stdout


def stub_names(path: Path) -> set[str]:
    """The top-level functions and annotated constants of a ``.pyi`` stub."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


@pytest.mark.parametrize(
    "name", ["readers.images.jpegcrop", "readers.formats.crc32", "readers.epochs.feistel"]
)
def test_each_compiled_module_has_a_stub_of_every_name(name: str) -> None:
    """A type checker sees every call: the stub beside the module names exactly what it
    defines (setup.cfg ships the stubs in the wheel)."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not built")
    module = importlib.import_module(name)
    stub = ROOT / (name.replace(".", "/") + ".pyi")
    public = {n for n in dir(module) if not n.startswith("_")}
    assert stub_names(stub) == public


@pytest.mark.wheel
def test_a_toolchain_without_lto_still_builds_the_kernel(tmp_path: Path) -> None:
    # A gcc whose LTO plugin cannot run (met on a CUDA image: "could not run lto-wrapper")
    # links the kernel without -flto rather than falling back to the Python path
    missing = missing_build_tools()
    if missing is not None:
        pytest.skip(missing)
    broken = tmp_path / "broken-lto"
    broken.mkdir()
    (broken / "lto-wrapper").write_text("#!/bin/sh\necho no LTO here >&2\nexit 1\n")
    (broken / "lto-wrapper").chmod(0o755)
    out = tmp_path / "build"
    build = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "-b", str(out), "-t", str(out / "tmp")],
        cwd=ROOT,
        env={**os.environ, "LDSHARED": f"{shutil.which('gcc')} -shared -B{broken}"},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert "link-time optimisation failed" in build.stdout + build.stderr
    (built,) = out.glob("readers/images/jpegcrop.*.so")
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "wheels" / "check_wheel.py"), str(built)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "the crop kernel works" in check.stdout, check.stdout + check.stderr
