"""Decoding: one decoder per process, identical pixels with or without PyTurboJPEG.

Inputs are built here from real photos (scikit-image's astronaut, chelsea, coffee), in the
form each rule is about: EXIF orientation, decompression bombs, damaged JPEGs, colour modes.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import io
import struct
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
import pytest
from PIL import Image, ImageFile, ImageOps

from readers.images.decode import (
    DECODER_ENV,
    ImageTooLargeError,
    _turbojpeg,
    decode_image,
    decode_stored,
    decoder_name,
    encode_jpeg,
)
from readers.images.jpeg import dct_scale, exif_orientation, jpeg_header, jpeg_size
from tests.conftest import ROOT, SAMPLE_DATA
from tests.photos import wheel_photo

PILLOW_DEFAULT_LIMIT = 1024 * 1024 * 1024 // 4 // 3  # PIL.Image.MAX_IMAGE_PIXELS as shipped


@cache
def _photo_pixels(name: str) -> np.ndarray:
    return wheel_photo(name)


def _photo(name: str = "astronaut", width: int = 67, height: int = 45) -> Image.Image:
    """An odd-sized crop of a photo with detail in it (so flips and MCU edges show)."""
    top, left = {"astronaut": (40, 160), "chelsea": (60, 120), "coffee": (80, 200)}[name]
    return Image.fromarray(_photo_pixels(name)[top : top + height, left : left + width])


def _encode(img: Image.Image, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **kw)
    return out.getvalue()


def _pillow_rgb(data: bytes) -> np.ndarray:
    """The reference: Pillow alone (which warns about malformed EXIF while opening a JPEG)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _pillow_upright(data: bytes) -> np.ndarray:
    return np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))


def _exif(orientation: int, endian: str = "<") -> bytes:
    """An APP1/eXIf payload with Orientation between two other tags, as cameras write it."""
    exif = Image.Exif()
    exif.endian = endian
    exif[0x010F] = "imgpack"  # Make: stored out of line
    exif[0x0112] = orientation
    exif[0x011A] = 72.0  # XResolution, a RATIONAL
    return exif.tobytes()


def _decode_quietly(data: bytes, name: str = "") -> np.ndarray:
    """decode_image, failing on any Python warning whatever the warning filters say."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pixels = decode_image(data, name)
    assert not caught, [str(w.message) for w in caught]
    return pixels


@pytest.fixture(params=["turbojpeg", "pillow"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Runs a test with each JPEG decoder: PyTurboJPEG (where installed), then Pillow."""
    if request.param == "pillow":
        monkeypatch.setenv(DECODER_ENV, "pillow")
    _turbojpeg.cache_clear()
    if decoder_name() != request.param:
        pytest.skip("PyTurboJPEG or libturbojpeg is not installed")
    yield request.param
    _turbojpeg.cache_clear()


@pytest.mark.parametrize("path", sorted(SAMPLE_DATA.rglob("*.*g")), ids=lambda p: p.name)
def test_sample_images_decode_like_pillow(path) -> None:
    data = path.read_bytes()
    pixels = decode_image(data, path.name)
    assert pixels.dtype == np.uint8 and pixels.ndim == 3 and pixels.shape[2] == 3
    np.testing.assert_array_equal(pixels, _pillow_rgb(data))


def test_turbojpeg_is_used_when_installed() -> None:
    pytest.importorskip("turbojpeg")
    if ctypes.util.find_library("turbojpeg") is None:
        pytest.skip("libturbojpeg is not installed (make test installs it when root)")
    assert decoder_name() == "turbojpeg"


# --- EXIF orientation ------------------------------------------------------------------------
@pytest.mark.parametrize("endian", ["<", ">"], ids=["II", "MM"])
@pytest.mark.parametrize("orientation", range(1, 9))
def test_jpeg_orientation_is_applied(decoder: str, orientation: int, endian: str) -> None:
    data = _encode(_photo(), "JPEG", quality=90, exif=_exif(orientation, endian))
    pixels = _decode_quietly(data)
    assert pixels.shape == ((67, 45, 3) if orientation >= 5 else (45, 67, 3))
    assert pixels.flags.c_contiguous and pixels.flags.writeable  # as torch.from_numpy wants
    np.testing.assert_array_equal(pixels, _pillow_upright(data))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_png_orientation_is_applied(orientation: int) -> None:
    endian = "<" if orientation % 2 else ">"
    data = _encode(_photo("chelsea"), "PNG", exif=_exif(orientation, endian))
    pixels = _decode_quietly(data)
    assert pixels.flags.c_contiguous and pixels.flags.writeable
    np.testing.assert_array_equal(pixels, _pillow_upright(data))


def test_xmp_orientation_is_the_fallback(decoder: str) -> None:
    xmp = b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:Description tiff:Orientation="6"/>'
    data = _encode(_photo("coffee"), "JPEG", xmp=xmp + b"</x:xmpmeta>")
    pixels = _decode_quietly(data)
    assert pixels.shape == (67, 45, 3)
    np.testing.assert_array_equal(pixels, _pillow_upright(data))
    # EXIF, where it has the tag, wins over XMP, as in Pillow
    data = _encode(_photo("coffee"), "JPEG", xmp=xmp + b"</x:xmpmeta>", exif=_exif(3))
    np.testing.assert_array_equal(_decode_quietly(data), _pillow_upright(data))


def _malformed_exif() -> dict[str, bytes]:
    """TIFF-structured EXIF payloads that break in the ways files in the wild do."""
    valid = _exif(6, "<")[6:]
    bogus_ifd = valid[:4] + struct.pack("<I", 0xFFFFFFF0) + valid[8:]
    return {
        "truncated-header": valid[:6],
        "truncated-entry": valid[: 8 + 2 + 12 + 5],  # Make, then half of Orientation
        "ifd-past-the-end": bogus_ifd,
        "ifd-at-last-byte": valid[:4] + struct.pack("<I", len(valid) - 1) + valid[8:],
        "byte-order-XX": b"XX" + valid[2:],
        "empty": b"",
    }


@pytest.mark.parametrize("kind", list(_malformed_exif()))
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_malformed_exif_decodes_as_orientation_1(decoder: str, fmt: str, kind: str) -> None:
    data = _encode(_photo(), fmt, exif=b"Exif\0\0" + _malformed_exif()[kind])
    np.testing.assert_array_equal(_decode_quietly(data), _pillow_rgb(data))


def test_randomly_damaged_exif_never_warns(decoder: str) -> None:
    data = _encode(_photo(), "JPEG", exif=_exif(6))
    start = data.index(b"Exif\0\0")
    end = start - 2 + int.from_bytes(data[start - 2 : start], "big")  # the APP1 payload
    rng = np.random.default_rng(2)
    for _ in range(300):  # random bytes are what this test is about
        damaged = bytearray(data)
        for at in rng.integers(start - 2, end, 3):
            damaged[at] = rng.integers(0, 256)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with contextlib.suppress(ValueError):
                decode_image(bytes(damaged))
        assert not caught, [str(w.message) for w in caught]


def test_malformed_exif_behind_junk_bytes_gives_no_warning(decoder: str) -> None:
    data = _encode(_photo(), "JPEG", exif=b"Exif\0\0" + _malformed_exif()["truncated-entry"])
    app1 = data.index(b"\xff\xe1")
    data = data[:app1] + b"\x00\x00" + data[app1:]  # junk that Pillow skips; our parser stops
    assert jpeg_header(data) is None
    np.testing.assert_array_equal(_decode_quietly(data), _pillow_rgb(data))


def test_exif_parser_never_raises_on_damaged_exif() -> None:
    valid = _exif(8, ">")[6:]
    rng = np.random.default_rng(0)
    damaged = [valid[:cut] for cut in range(len(valid))]
    for _ in range(2000):  # random bytes are what this test is about
        flipped = bytearray(valid)
        flipped[rng.integers(0, len(valid))] = rng.integers(0, 256)
        damaged.append(bytes(flipped))
    for tiff in damaged:
        assert exif_orientation(tiff) in {None, *range(9)} or tiff[:2] in (b"II", b"MM")
    assert exif_orientation(valid) == 8


def test_jpeg_header_parser_never_raises_and_stops_at_sos() -> None:
    data = _encode(_photo(), "JPEG", exif=_exif(5))
    header = jpeg_header(data)
    assert header is not None and header[:3] == (67, 45, 5)
    sos = data.index(b"\xff\xda")
    for cut in range(sos + 4):
        jpeg_header(data[:cut])
    rng = np.random.default_rng(1)
    for _ in range(2000):
        flipped = bytearray(data[: sos + 16])
        flipped[rng.integers(2, sos)] = rng.integers(0, 256)
        jpeg_header(bytes(flipped))
    # whatever follows SOS is not read: a bogus marker there changes nothing
    assert jpeg_header(data[: sos + 2] + b"\xff\xe1\xff\xff" + data[sos + 2 :]) == header


# --- decompression bombs ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def bomb_png() -> bytes:
    """A real 9500x9500 1-bit PNG (a photo, tiled): 90,250,000 pixels, cheap to build."""
    gray = np.asarray(Image.fromarray(_photo_pixels("astronaut")).convert("L"))
    rows = np.tile(np.packbits(gray > gray.mean(), axis=1), (19, 19))[:9500, :1188]
    return _encode(Image.frombytes("1", (9500, 9500), rows.tobytes()), "PNG", compress_level=1)


def test_png_over_the_default_limit_is_refused_without_decoding(
    bomb_png: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", PILLOW_DEFAULT_LIMIT)
    with pytest.warns(Image.DecompressionBombWarning):
        Image.open(io.BytesIO(bomb_png))  # what Pillow alone does: a warning, then decodes

    def no_decoding(self: ImageFile.ImageFile) -> None:
        raise AssertionError("the bomb was decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    message = (
        "bomb.png: image is 9500x9500 = 90,250,000 pixels, over the decompression-bomb limit "
        "of 89,478,485 (PIL.Image.MAX_IMAGE_PIXELS; imgpack convert --max-pixels raises it)"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ImageTooLargeError) as refused:
            decode_image(bomb_png, "bomb.png")
    assert str(refused.value) == message and not caught
    assert isinstance(refused.value, ValueError)


def test_png_over_twice_the_limit_is_our_error_not_pillows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _encode(_photo("coffee", 200, 200), "PNG")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)
    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(data))  # what Pillow alone does over twice the limit
    with pytest.raises(ImageTooLargeError, match=r"^crop\.png: image is 200x200 = 40,000 pix"):
        decode_image(data, "crop.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40_000)
    np.testing.assert_array_equal(_decode_quietly(data), np.asarray(_photo("coffee", 200, 200)))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    np.testing.assert_array_equal(_decode_quietly(data), np.asarray(_photo("coffee", 200, 200)))


def test_jpeg_over_the_limit_is_refused_before_decoding(
    decoder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _encode(_photo("chelsea", 200, 200), "JPEG", quality=90)
    reference = _pillow_rgb(data)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)

    def no_decoding(*args, **kwargs) -> None:
        raise AssertionError("the bomb was decoded")

    if decoder == "turbojpeg":
        monkeypatch.setattr(_turbojpeg(), "decode", no_decoding)
    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    with pytest.raises(ImageTooLargeError, match=r"^cat\.jpg: image is 200x200 = 40,000 pixels"):
        decode_image(data, "cat.jpg")
    monkeypatch.undo()  # the default limit and decoders again
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40_000)
    np.testing.assert_array_equal(_decode_quietly(data), reference)


def test_an_explicit_limit_is_obeyed_and_pillows_setting_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _encode(_photo("coffee", 200, 200), "PNG")
    expected = np.asarray(_photo("coffee", 200, 200))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)  # what the calling program set
    np.testing.assert_array_equal(decode_image(data, "c.png", max_pixels=40_000), expected)
    np.testing.assert_array_equal(decode_image(data, "c.png", max_pixels=0), expected)
    with pytest.raises(ImageTooLargeError, match=r"limit of 39,999 \(imgpack convert --max-pix"):
        decode_image(data, "c.png", max_pixels=39_999)
    assert Image.MAX_IMAGE_PIXELS == 10_000


# --- damaged data ----------------------------------------------------------------------------
def _damaged_jpegs() -> dict[str, bytes]:
    """Complete JPEGs (SOI ... EOI) with their entropy-coded data damaged mid-scan."""
    data = _encode(_photo("astronaut", 240, 160), "JPEG", quality=90)
    mid = (data.index(b"\xff\xda") + len(data)) // 2
    return {
        "stray-restart-marker": data[:mid] + b"\xff\xd3" + data[mid:],
        "run-of-ff": data[:mid] + b"\xff" * 8 + data[mid + 8 :],
        "bytes-before-eoi": data[:-2] + b"\x12\x34\x56" + data[-2:],
        "zeroed-run": data[:mid] + bytes(64) + data[mid + 64 :],
    }


def test_damaged_jpegs_make_libjpeg_turbo_warn() -> None:
    """What the cases below guard against: PyTurboJPEG warns and returns pixels anyway."""
    turbojpeg = pytest.importorskip("turbojpeg")
    if ctypes.util.find_library("turbojpeg") is None:
        pytest.skip("libturbojpeg is not installed")
    plain = turbojpeg.TurboJPEG()
    for kind, data in _damaged_jpegs().items():
        if kind != "zeroed-run":  # valid entropy data, just wrong: nobody can tell
            with pytest.warns(UserWarning, match="Corrupt JPEG data|Unsupported marker"):
                plain.decode(data, pixel_format=0)


@pytest.mark.parametrize("kind", list(_damaged_jpegs()))
def test_damaged_jpeg_is_judged_like_pillow(decoder: str, kind: str) -> None:
    data = _damaged_jpegs()[kind]
    try:
        reference = _pillow_rgb(data)
    except OSError:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ValueError, match=r"^damaged\.jpg: cannot decode image"):
                decode_image(data, "damaged.jpg")
        assert not caught
    else:
        np.testing.assert_array_equal(_decode_quietly(data, "damaged.jpg"), reference)


@pytest.mark.parametrize(
    "kind", ["empty", "random", "truncated-jpeg", "truncated-png", "jpeg-magic-only"]
)
def test_undecodable_bytes_are_an_error_naming_the_file(decoder: str, kind: str) -> None:
    jpeg = _encode(_photo(), "JPEG")
    data = {
        "empty": b"",
        "random": np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        "truncated-jpeg": jpeg[: len(jpeg) // 2],
        "truncated-png": _encode(_photo(), "PNG")[:300],
        "jpeg-magic-only": b"\xff\xd8\xff\xd9",
    }[kind]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"^broken\.jpg: "):
            decode_image(data, "broken.jpg")
    assert not caught


def test_png_named_jpg_decodes_as_png() -> None:
    data = _encode(_photo("chelsea"), "PNG")
    np.testing.assert_array_equal(_decode_quietly(data, "cat.jpg"), np.asarray(_photo("chelsea")))


def test_memoryview_input_decodes_like_bytes() -> None:
    data = _encode(_photo(), "JPEG", exif=_exif(6))
    np.testing.assert_array_equal(decode_image(memoryview(data)), decode_image(data))


def test_decoding_from_threads_matches_decoding_alone() -> None:
    cases = [
        _encode(_photo(), "JPEG", exif=_exif(7)),
        _damaged_jpegs()["stray-restart-marker"],
        _encode(_photo("coffee").quantize(32), "PNG", transparency=bytes(range(0, 256, 8))),
        _encode(_photo("chelsea").convert("CMYK"), "JPEG"),
    ]
    alone = [_decode_quietly(data) for data in cases]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(decode_image, cases * 8))
    for i, pixels in enumerate(together):
        np.testing.assert_array_equal(pixels, alone[i % len(cases)])


# --- colour rules (the module docstring's table) ---------------------------------------------
def _gray(name: str = "astronaut") -> np.ndarray:
    return np.asarray(_photo(name).convert("L"))


def test_grayscale_is_replicated_to_rgb() -> None:
    gray = _gray()
    np.testing.assert_array_equal(
        _decode_quietly(_encode(Image.fromarray(gray), "PNG")), np.dstack([gray] * 3)
    )


def test_alpha_is_dropped_not_composited() -> None:
    alpha = _gray("coffee")
    rgba = np.dstack([np.asarray(_photo()), alpha])
    expected = np.asarray(_photo())
    np.testing.assert_array_equal(_decode_quietly(_encode(Image.fromarray(rgba), "PNG")), expected)
    gray_alpha = Image.fromarray(np.dstack([_gray(), alpha]), "LA")
    np.testing.assert_array_equal(
        _decode_quietly(_encode(gray_alpha, "PNG")), np.dstack([_gray()] * 3)
    )


@pytest.mark.parametrize(
    "transparency", [None, 5, bytes(range(0, 256, 8))], ids=["none", "index", "per-index"]
)
def test_palette_gives_its_colours_and_ignores_transparency(transparency) -> None:
    palette_image = _photo("coffee").quantize(32)
    kw = {} if transparency is None else {"transparency": transparency}
    data = _encode(palette_image, "PNG", **kw)
    palette = np.asarray(palette_image.getpalette(), dtype=np.uint8).reshape(-1, 3)
    np.testing.assert_array_equal(_decode_quietly(data), palette[np.asarray(palette_image)])


def test_16_bit_grayscale_is_scaled_to_8_bits() -> None:
    gray = _gray("chelsea")
    deep = gray.astype(np.uint16) << 8 | _gray("coffee")  # another photo in the low byte
    data = _encode(Image.fromarray(deep), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    pixels = _decode_quietly(data)
    np.testing.assert_array_equal(pixels, np.dstack([gray] * 3))
    assert (_pillow_rgb(data) == 255).mean() > 0.9  # what convert("RGB") alone does: clip


@pytest.mark.parametrize(("mode", "fmt"), [("I;16", "PNG"), ("I", "TIFF")])
def test_8_bit_values_in_a_16_or_32_bit_image_show_as_a_viewer_shows_them(mode, fmt) -> None:
    gray = _gray("chelsea")  # 0-255 in a wide container: what some tools write
    wide = gray.astype(np.uint16 if mode == "I;16" else np.int32)
    data = _encode(Image.fromarray(wide, mode if mode == "I" else None), fmt)
    assert Image.open(io.BytesIO(data)).mode == mode
    pixels = _decode_quietly(data)
    np.testing.assert_array_equal(pixels, np.dstack([gray] * 3))
    np.testing.assert_array_equal(pixels, _pillow_rgb(data))  # Pillow's (ImageFolder's) view


def test_a_16_bit_image_just_over_8_bits_is_still_scaled_by_8_bits() -> None:
    deep = _gray("chelsea").astype(np.uint16)
    deep[0, 0] = 256  # one value needs a ninth bit: 16-bit data, >> 8
    pixels = _decode_quietly(_encode(Image.fromarray(deep), "PNG"))
    np.testing.assert_array_equal(pixels, np.dstack([(deep >> 8).astype(np.uint8)] * 3))


@pytest.mark.parametrize("bits", [16, 31])
def test_32_bit_integer_images_are_scaled_by_the_range_they_use(bits) -> None:
    gray = _gray("chelsea")
    wide = gray.astype(np.int32) << (bits - 8) | _gray("coffee")  # detail below the top byte
    data = _encode(Image.fromarray(wide, "I"), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "I"
    np.testing.assert_array_equal(_decode_quietly(data), np.dstack([gray] * 3))


def test_bilevel_is_0_or_255() -> None:
    bits = _photo().convert("1")  # dithered
    pixels = _decode_quietly(_encode(bits, "PNG"))
    np.testing.assert_array_equal(pixels, np.dstack([np.asarray(bits).astype(np.uint8) * 255] * 3))


@pytest.mark.parametrize("mode", ["L", "CMYK"])
def test_grayscale_and_cmyk_jpeg_become_rgb(decoder: str, mode: str) -> None:
    rgb = _photo("coffee", 96, 64)
    data = _encode(rgb.convert(mode), "JPEG", quality=95)
    pixels = _decode_quietly(data)
    np.testing.assert_array_equal(pixels, _pillow_rgb(data))
    expected = np.asarray(rgb.convert(mode).convert("RGB"), dtype=int)
    assert np.abs(pixels.astype(int) - expected).mean() < 2  # JPEG's loss only


def test_encode_jpeg_round_trips_closely() -> None:
    pixels = _photo_pixels("astronaut")
    decoded = decode_image(encode_jpeg(pixels, 90))
    assert decoded.shape == pixels.shape
    assert np.abs(decoded.astype(int) - pixels).mean() < 3


# --- which decoder ---------------------------------------------------------------------------
def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_falls_back_to_pillow_with_one_warning_when_turbojpeg_is_missing() -> None:
    code = """
        import logging, sys
        logging.basicConfig()
        sys.modules["turbojpeg"] = None  # as if PyTurboJPEG were not installed
        import numpy as np
        from readers.images.decode import decode_image, decoder_name
        data = open("sample_data/scenes/china_00.jpg", "rb").read()
        for _ in range(3):
            pixels = decode_image(data)
        print(decoder_name(), pixels.shape, int(pixels.sum()))
    """
    result = _run(code)
    assert result.returncode == 0, result.stderr
    pixels = decode_image((SAMPLE_DATA / "scenes" / "china_00.jpg").read_bytes())
    assert result.stdout.split()[0] == "pillow"
    assert result.stdout.split()[-1] == str(int(pixels.sum()))
    assert result.stderr.count("PyTurboJPEG unavailable") == 1


def test_decoder_can_be_forced_to_pillow() -> None:
    result = _run(
        "from readers.images.decode import decoder_name; print(decoder_name())",
        IMGPACK_DECODER="pillow",
    )
    assert result.stdout.strip() == "pillow", result.stderr


# --- DCT-scaled decoding (the converter's default before --resize) -------------------------
def _large_photo() -> bytes:
    """A 1,600x1,066 JPEG of a real photo (scikit-learn's china.jpg scaled 2.5x, then
    sharpened so that it has fine detail again), EXIF-rotated by 90 degrees."""
    from PIL import ImageFilter

    photo = Image.fromarray(wheel_photo("china.jpg")).resize((1600, 1066))
    photo = photo.filter(ImageFilter.UnsharpMask(radius=2, percent=80))
    return _encode(photo, "JPEG", quality=90, exif=_exif(6))


def test_dct_scale_shrinks_most_while_the_shorter_side_stays_large_enough() -> None:
    assert dct_scale(1600, 1066, 256) == (1, 4)  # 1066 / 4 = 266.5 >= 256; / 8 = 133.25
    assert dct_scale(1600, 1066, 133) == (1, 8)
    assert dct_scale(1600, 1066, 266.5) == (1, 4)  # exactly, as Pillow's draft() decides
    assert dct_scale(1600, 1066, 266.6) == (1, 2)  # although 1066 / 4 rounds up to 267
    assert dct_scale(1600, 1066, 534) == (1, 1)  # 533 < 534: not even a half
    assert dct_scale(1600, 1066, None) == (1, 1)


def test_scaled_decode_is_the_same_with_either_decoder_and_oriented(decoder: str) -> None:
    data = _large_photo()
    assert jpeg_size(data) == (1600, 1066)  # upright (height, width): EXIF 6 rotates
    full = decode_image(data)
    scaled = decode_image(data, min_side=256)
    assert full.shape == (1600, 1066, 3) and scaled.shape == (400, 267, 3)
    # libjpeg-turbo's scaling and Pillow's draft() give the same pixels (both libjpeg-turbo)
    other = _decode_with("pillow" if decoder == "turbojpeg" else "turbojpeg", data)
    if other is not None:
        assert np.array_equal(scaled, other)


def _decode_with(name: str, data: bytes) -> np.ndarray | None:
    with pytest.MonkeyPatch.context() as patch:
        if name == "pillow":
            patch.setenv(DECODER_ENV, "pillow")
        else:
            patch.delenv(DECODER_ENV, raising=False)
        _turbojpeg.cache_clear()
        try:
            return decode_image(data, min_side=256) if decoder_name() == name else None
        finally:
            _turbojpeg.cache_clear()


def test_converter_dct_scales_only_while_the_resize_keeps_the_reducing_gap() -> None:
    from convert.process import DCT_REDUCING_GAP, Transform, prepare

    data = _large_photo()  # 1066 px short: 2.5 x 256 = 640 > 533, so no scaling for 256
    assert DCT_REDUCING_GAP == 2.5
    assert decode_stored(data, min_side=DCT_REDUCING_GAP * 256).scale == 1
    exact = prepare(data, "big.jpg", Transform("raw", 256, None, 90, exact_resize=True)).data
    assert np.array_equal(prepare(data, "big.jpg", Transform("raw", 256, None, 90)).data, exact)
    # for 128, a half (533 >= 320, 266.5 < 320), resized to the full path's shape
    assert decode_stored(data, min_side=DCT_REDUCING_GAP * 128).scale == 2
    exact = prepare(data, "big.jpg", Transform("raw", 128, None, 90, exact_resize=True)).data
    fast = prepare(data, "big.jpg", Transform("raw", 128, None, 90)).data
    assert exact.shape == fast.shape == (192, 128, 3)  # int(128 * 1600 / 1066), upright
    # this photo is upscaled and sharpened (fine detail everywhere): measured 0.52
    assert np.abs(exact.astype(np.int16) - fast).mean() < 0.8
    # small sources, small targets: the same shape too
    for path in sorted(SAMPLE_DATA.rglob("*.jpg"))[:8]:
        small = path.read_bytes()
        a = prepare(small, path.name, Transform("raw", 72, None, 90, exact_resize=True)).data
        b = prepare(small, path.name, Transform("raw", 72, None, 90)).data
        assert a.shape == b.shape, path


@pytest.mark.parametrize("orientation", range(1, 9))
def test_dct_scaled_conversion_maps_the_partial_edge_pixels_in_every_orientation(
    orientation: int, decoder: str
) -> None:
    """739x499 decodes at 1/2 to 370x250 pixels that span 369.5x249.5: the last column
    and row are half outside the image, on the right and bottom as stored. Resized before
    it is turned upright, the scaled decode stays within 0.3 levels of the full decode in
    every orientation; resized after, the half pixel lands on the wrong side for
    orientations 2-4 and 6-8 (measured 2.1-3.3 levels)."""
    from convert.process import Transform, prepare

    photo = Image.fromarray(wheel_photo("motorcycle_left.png")).crop((0, 0, 739, 499))
    data = _encode(photo, "JPEG", quality=90, exif=_exif(orientation))
    assert decode_stored(data, min_side=160).scale == 2
    exact = prepare(data, "moto.jpg", Transform("raw", 64, None, exact_resize=True)).data
    fast = prepare(data, "moto.jpg", Transform("raw", 64, None)).data
    assert exact.shape == fast.shape == ((64, 94, 3) if orientation < 5 else (94, 64, 3))
    assert np.abs(exact.astype(np.int16) - fast).mean() < 0.4  # measured 0.29
