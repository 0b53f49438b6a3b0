"""The converter's decode + resize through the compiled kernel against its Python path
(``IMGPACK_KERNEL=0``): the same bytes when nothing is DCT-scaled, close when it is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from convert.cli import main
from convert.codec import recipe
from convert.process import DCT_REDUCING_GAP, Transform, prepare
from readers.images import kernel
from readers.images.decode import decoder_name
from readers.manifest import load_manifest
from tests.photos import encode, photo_crop, photo_folder
from tests.test_kernel import ENCODINGS, jpeg

needs_kernel = pytest.mark.skipif(
    kernel.crop_kernel() is None or decoder_name() != "turbojpeg",
    reason="the crop kernel is not built, or PyTurboJPEG is missing",
)

# (height, width): the benchmark's short side 256 both ways, odd sizes ending inside an
# MCU, and photos large enough for a DCT-scaled decode at the smaller targets.
SIZES = [(256, 341), (341, 256), (255, 257), (100, 333), (481, 643), (700, 526), (1337, 999)]
RESIZES = (64, 96, 224, 256)
ENCODED = {name: ENCODINGS[name] for name in ("444", "422", "420", "gray", "progressive-420")}
ENCODED["restart-420"] = ENCODINGS["restart-420"]
# Against the Python path's DCT-scaled pixels (the same scaled IDCT; the resize's scale
# computed from the extent rather than from interpolate's scale_factor): measured identical
# here (0 mean, 0 max on every scaled output); the bounds allow a weight an ulp apart.
SCALED_MEAN, SCALED_MAX = 0.1, 2


def _sources() -> dict[str, bytes]:
    return {
        f"{name}-{h}x{w}": jpeg(h, w, seed=k, **params)
        for k, (h, w) in enumerate(SIZES)
        for name, params in ENCODED.items()
    }


def _outputs(transforms: list[Transform]) -> dict[tuple[str, Transform], np.ndarray]:
    return {
        (name, t): prepare(data, name, t).data
        for name, data in _sources().items()
        for t in transforms
    }


@needs_kernel
@pytest.mark.parametrize("exact", [True, False], ids=["exact-resize", "default"])
def test_kernel_conversion_equals_the_python_path(exact: bool, request) -> None:
    transforms = [Transform("raw", size, exact_resize=exact) for size in RESIZES]
    transforms.append(Transform("raw", 256, center_crop=224, exact_resize=exact))
    with_kernel = _outputs(transforms)
    for name, data in _sources().items():  # the kernel takes every one of them
        assert recipe._kernel_resized(data, 64, None, None) is not None, name
    request.getfixturevalue("python_path")
    without = _outputs(transforms)
    scaled = 0
    for key, pixels in with_kernel.items():
        name, t = key
        assert pixels.shape == without[key].shape, key
        height, width = (int(v) for v in name.rsplit("-", 1)[1].split("x"))
        if exact or min(height, width) < 2 * DCT_REDUCING_GAP * t.resize:
            assert np.array_equal(pixels, without[key]), key
        else:
            scaled += 1
            diff = np.abs(pixels.astype(np.int16) - without[key])
            assert diff.mean() <= SCALED_MEAN and diff.max() <= SCALED_MAX, (key, diff.max())
    assert exact or scaled > 0  # the scaled branch was exercised


def _rotated(photo: np.ndarray) -> bytes:
    """``photo`` as a JPEG whose EXIF says to turn it (orientation 6)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return encode(photo, quality=90, exif=exif.tobytes())


@needs_kernel
def test_non_kernel_inputs_take_the_python_path() -> None:
    """PNG, EXIF-rotated and truncated JPEGs are not the kernel's to decode: None, today's
    decoder."""
    photo = photo_crop(300, 400, seed=1)
    rotated = _rotated(photo)
    for data in (encode(photo, "PNG"), rotated, jpeg(300, 400, seed=1)[:-300]):
        assert recipe._kernel_resized(data, 64, None, None) is None
    assert prepare(rotated, "r", Transform("raw", 64)).shape == (85, 64, 3)


@needs_kernel
def test_pixels_the_kernel_does_not_decode_it_resizes_as_the_python_path(request) -> None:
    """PNGs, EXIF-rotated JPEGs and datasets' raw pixels: decoded elsewhere, resized by the
    kernel (so no torch in the conversion), to the Python path's bytes, up or down; an
    EXIF-rotated JPEG decoded DCT-scaled (its extent mapped as the kernel's own scaled
    decodes map it) within the scaled bounds above."""
    photo = photo_crop(700, 526, seed=2)
    sources = {"png": encode(photo, "PNG"), "rotated": _rotated(photo), "raw": photo.copy()}
    transforms = [Transform("raw", size) for size in (64, 224, 900)]
    transforms += [Transform("raw", 256, center_crop=224), Transform("raw", 64, exact_resize=True)]

    def outputs() -> dict[tuple[str, Transform], np.ndarray]:
        return {
            (name, t): prepare(data, name, t).data
            for name, data in sources.items()
            for t in transforms
        }

    with_kernel = outputs()
    request.getfixturevalue("python_path")
    for (name, t), pixels in outputs().items():
        kernels = with_kernel[name, t]
        assert kernels.shape == pixels.shape, (name, t)
        if name == "rotated" and t == Transform("raw", 64):  # 526 >= 2 * 2.5 * 64: scaled 1/2
            diff = np.abs(kernels.astype(np.int16) - pixels)
            assert diff.mean() <= SCALED_MEAN and diff.max() <= SCALED_MAX, diff.max()
        else:
            assert np.array_equal(kernels, pixels), (name, t)


CONVERT_OPTIONS = ("--format", "pt", "--encoding", "raw", "--resize", "256", "--center-crop", "224")
CONVERT_OPTIONS += ("--workers", "2")


def _convert(src: Path, dst: Path) -> tuple[str, str]:
    """The content checksum of ``src`` converted to ``dst`` (click's runner, the pool's
    workers forked from this process), and the decoder recorded."""
    result = CliRunner().invoke(main, ["convert", str(src), str(dst), *CONVERT_OPTIONS])
    assert result.exit_code == 0, result.output
    manifest = load_manifest(dst)
    assert manifest.content_sha256
    return manifest.content_sha256, manifest.converted_with["jpeg_decoder"]


@needs_kernel
def test_conversion_checksum_is_the_same_with_and_without_the_kernel(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """(``IMGPACK_KERNEL=0`` read at a process's start: tests/test_kernel.py's notice test.)"""
    (tmp_path / "src").mkdir()
    src = photo_folder(tmp_path / "src", 12, 480, 640)  # short 480 < 2.5 * 2 * 256: unscaled
    # and what the kernel resizes but does not decode
    (src / "class0" / "png.png").write_bytes(encode(photo_crop(300, 400, seed=3), "PNG"))
    (src / "class0" / "rotated.jpg").write_bytes(_rotated(photo_crop(480, 640, seed=4)))
    checksum, decoder = _convert(src, tmp_path / "kernel")
    assert decoder == "turbojpeg+kernel"  # recorded in converted_with
    request.getfixturevalue("python_path")
    assert _convert(src, tmp_path / "python") == (checksum, "turbojpeg")


@needs_kernel
def test_jpeg_samples_carry_restart_markers_unless_asked_not_to(tmp_path: Path) -> None:
    import readers
    from convert import ConvertOptions, convert_folder
    from readers.images.decode import decode_image

    (tmp_path / "src").mkdir()
    src = photo_folder(tmp_path / "src", 6, 300, 400)
    options = ConvertOptions(format="lmdb", encoding="jpeg", resize=256)
    convert_folder(src, tmp_path / "marked", options, workers=1, progress=False)
    plain = ["convert", str(src), str(tmp_path / "plain"), "--format", "lmdb", "--resize", "256"]
    result = CliRunner().invoke(main, [*plain, "--no-restart-markers", "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert load_manifest(tmp_path / "plain").options["restart_markers"] is False
    for name, encoder in (("marked", "kernel+restart-markers"), ("plain", "kernel")):
        assert load_manifest(tmp_path / name).converted_with["jpeg_encoder"] == encoder
    stored = {}
    for name in ("marked", "plain"):
        ds = readers.open_dataset(tmp_path / name)
        stored[name] = [bytes(v) for v in ds.read_stored(range(len(ds)))]
    for marked, plain in zip(stored["marked"], stored["plain"], strict=True):
        assert b"\xff\xdd" in marked and b"\xff\xdd" not in plain  # DRI: the interval
        np.testing.assert_array_equal(decode_image(marked), decode_image(plain))
        mcus = -(-256 // 16) * -(-341 // 16)  # 400x300 resized to 341x256
        assert 2 * mcus < len(marked) - len(plain) < 6 * mcus  # a few bytes an MCU
