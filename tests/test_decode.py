"""Decoding: one decoder per process, identical pixels with or without PyTurboJPEG."""

from __future__ import annotations

import ctypes.util
import io
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from PIL import Image

from readers.decode import decode_image, decoder_name, encode_jpeg
from tests.conftest import ROOT, SAMPLE_DATA


def _pillow_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _encode(img: Image.Image, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **kw)
    return out.getvalue()


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


@pytest.mark.parametrize(
    ("mode", "fmt"),
    [("L", "PNG"), ("P", "PNG"), ("RGBA", "PNG"), ("CMYK", "JPEG"), ("L", "JPEG")],
)
def test_modes_become_rgb(mode: str, fmt: str) -> None:
    rgb = Image.open(SAMPLE_DATA / "scenes" / "china_00.jpg").convert("RGB").resize((64, 48))
    data = _encode(rgb.convert(mode), fmt)
    pixels = decode_image(data)
    assert pixels.shape == (48, 64, 3)
    np.testing.assert_array_equal(pixels, _pillow_rgb(data))


def test_16_bit_png_is_scaled_to_8_bits() -> None:
    ramp = (np.arange(64 * 32, dtype=np.uint32).reshape(32, 64) * 32).astype(np.uint16)
    data = _encode(Image.fromarray(ramp), "PNG")
    pixels = decode_image(data)
    np.testing.assert_array_equal(pixels[..., 0], (ramp >> 8).astype(np.uint8))
    np.testing.assert_array_equal(pixels[..., 0], pixels[..., 2])


def test_truncated_jpeg_is_an_error_naming_the_file() -> None:
    data = (SAMPLE_DATA / "scenes" / "china_00.jpg").read_bytes()
    with pytest.raises(ValueError, match=r"cut\.jpg"):
        decode_image(data[: len(data) // 2], "cut.jpg")


def test_random_bytes_are_an_error_naming_the_file() -> None:
    noise = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    with pytest.raises(ValueError, match=r"noise\.jpg"):
        decode_image(noise, "noise.jpg")


def test_encode_jpeg_round_trips_closely() -> None:
    pixels = np.asarray(Image.open(SAMPLE_DATA / "people" / "astronaut_00.jpg").convert("RGB"))
    decoded = decode_image(encode_jpeg(pixels, 90))
    assert decoded.shape == pixels.shape
    assert np.abs(decoded.astype(int) - pixels).mean() < 3


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
        from readers.decode import decode_image, decoder_name
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
        "from readers.decode import decoder_name; print(decoder_name())", IMGPACK_DECODER="pillow"
    )
    assert result.stdout.strip() == "pillow", result.stderr
