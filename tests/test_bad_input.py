"""Bad input gets a clear outcome and nothing is lost silently.

Each case builds one kind of bad input on the fly beside two good images, converts, and
checks the outcome: converted (and how), skipped with its reason in ``errors.jsonl`` and
counted, ignored, or refused with a message. The table in docs/RELIABILITY.md is rendered
from these cases, and a test keeps the two in step.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from convert import BadInputError, ConvertOptions, convert_folder
from readers import PtDataset, decode_image, spec
from readers.manifest import load_manifest
from tests.photos import encode, photo_crop

ROOT = Path(__file__).resolve().parent.parent
RELIABILITY_DOC = ROOT / "docs" / "RELIABILITY.md"
GOOD = {"good/a.jpg": 0, "good/b.png": 1}  # path -> photo seed; in every case's folder
GOOD_SHAPE = (48, 64)  # 3,072 pixels: under every --max-pixels the cases use
BIG = 120  # a 120x120 = 14,400 pixel image for the --max-pixels cases


# --- what a case expects ---------------------------------------------------------------
@dataclass(frozen=True)
class Skipped:
    """Left out, listed in errors.jsonl with a reason matching ``reason``, and counted."""

    path: str
    reason: str


@dataclass(frozen=True)
class Converted:
    """Converted; ``check(pixels, src)`` judges the stored HWC pixels."""

    path: str
    check: Callable[[np.ndarray, Path], None] | None = None


@dataclass(frozen=True)
class Ignored:
    """Neither a sample nor an error: not an image file."""

    path: str


@dataclass(frozen=True)
class EmptyClass:
    """A class with no samples that still takes its place in ``classes``."""

    name: str


@dataclass(frozen=True)
class Refused:
    """The conversion stops before writing, with ``error`` matching ``message``; DST is
    left exactly as it was."""

    error: type[Exception]
    message: str


Expectation = Skipped | Converted | Ignored | EmptyClass | Refused


@dataclass(frozen=True)
class Case:
    """One row of the bad-input table."""

    id: str
    input: str
    outcome: str
    build: Callable[[Path, Path], None]  # (src, dst)
    expect: tuple[Expectation, ...]
    options: dict = field(default_factory=dict)
    with_good: bool = True
    unreadable: bool = False  # run where file permissions bind, even as root


# --- builders ------------------------------------------------------------------------------
def put(src: Path, rel: str | bytes, data: bytes) -> None:
    """Write ``data`` at ``src/rel`` (``rel`` as bytes for names that are not UTF-8)."""
    path = os.path.join(os.fsencode(src), os.fsencode(rel))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def photo_file(rel: str | bytes, fmt: str = "JPEG", image: Image.Image | None = None, **kw):
    """A builder writing a photo crop (or ``image``) at ``rel``."""

    def build(src: Path, dst: Path) -> None:
        pixels = image if image is not None else photo_crop(*GOOD_SHAPE, seed=7)
        put(src, rel, encode(pixels, fmt, **kw))

    return build


def raw_file(rel: str, data: bytes):
    return lambda src, dst: put(src, rel, data)


def truncated_jpeg(src: Path, dst: Path) -> None:
    data = encode(photo_crop(*GOOD_SHAPE, seed=3))
    put(src, "good/truncated.jpg", data[: len(data) // 2])


def exif_rotated(src: Path, dst: Path) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    put(src, "good/rotated.jpg", encode(photo_crop(40, 64, seed=5), exif=exif.tobytes()))


def decompression_bomb(src: Path, dst: Path) -> None:
    # 9500 x 9500 = 90.25 M pixels, over Pillow's 89.48 M; mode "1" keeps building it cheap.
    put(src, "good/bomb.png", encode(Image.new("1", (9500, 9500)), "PNG"))


def symlink_loop(src: Path, dst: Path) -> None:
    (src / "good").mkdir(parents=True, exist_ok=True)
    (src / "good" / "loop").symlink_to(src / "good")


def symlink_to(link: str, target: str):
    """A builder linking ``good/<link>`` to ``target`` beside a second class ``other``."""

    def build(src: Path, dst: Path) -> None:
        photo_file("other/x.jpg")(src, dst)
        (src / "good").mkdir(parents=True, exist_ok=True)
        (src / "good" / link).symlink_to(target)

    return build


def broken_symlink(src: Path, dst: Path) -> None:
    (src / "good").mkdir(parents=True, exist_ok=True)
    (src / "good" / "gone.jpg").symlink_to(src / "nowhere.jpg")


def fifo(src: Path, dst: Path) -> None:
    (src / "good").mkdir(parents=True, exist_ok=True)
    os.mkfifo(src / "good" / "pipe.jpg")


def empty_class(src: Path, dst: Path) -> None:
    (src / "empty").mkdir(parents=True)


def no_images(src: Path, dst: Path) -> None:
    put(src, "cls/notes.txt", b"not an image")


def dst_with(name: str):
    def build(src: Path, dst: Path) -> None:
        dst.mkdir()
        (dst / name).write_text("someone's work\n")

    return build


# --- checks of converted pixels ------------------------------------------------------------
def same_as_pillow(convert: Callable[[Image.Image], Image.Image]):
    """Stored pixels equal Pillow's decode of the source file, through ``convert``."""

    def check(pixels: np.ndarray, source: Path) -> None:
        with Image.open(source) as img:
            expected = np.asarray(convert(img))
        np.testing.assert_array_equal(pixels, expected)

    return check


def close_to_photo(pixels: np.ndarray, source: Path) -> None:
    """A CMYK JPEG of the photo comes back as the photo's RGB (within JPEG error)."""
    diff = np.abs(pixels.astype(int) - photo_crop(*GOOD_SHAPE, seed=7).astype(int))
    assert diff.mean() < 4, diff.mean()


def upright(pixels: np.ndarray, source: Path) -> None:
    with Image.open(source) as img:
        expected = np.asarray(ImageOps.exif_transpose(img).convert("RGB"))
    assert pixels.shape == expected.shape == (64, 40, 3)
    assert np.abs(pixels.astype(int) - expected.astype(int)).max() <= 2


def sixteen_bit_scaled(pixels: np.ndarray, source: Path) -> None:
    with Image.open(source) as img:
        expected = (np.asarray(img, dtype=np.uint32) >> 8).astype(np.uint8)
    np.testing.assert_array_equal(pixels, np.repeat(expected[..., None], 3, axis=2))


def rgb(img: Image.Image) -> Image.Image:
    return img.convert("RGB")


PHOTO = photo_crop(*GOOD_SHAPE, seed=7)
PALETTE = Image.fromarray(PHOTO).quantize(64)
PALETTE.info["transparency"] = 0
SIXTEEN_BIT = Image.fromarray(photo_crop(*GOOD_SHAPE, seed=2)[..., 0].astype(np.uint16) * 257)
EIGHT_IN_SIXTEEN = Image.fromarray(photo_crop(*GOOD_SHAPE, seed=2)[..., 0].astype(np.uint16))

CASES = [
    Case(
        "zero-byte",
        "a zero-byte file",
        "skipped: `empty file`",
        raw_file("good/empty.jpg", b""),
        (Skipped("good/empty.jpg", "empty file"),),
    ),
    Case(
        "truncated-jpeg",
        "a truncated JPEG (second half cut off)",
        "skipped: `cannot decode image: truncated`",
        truncated_jpeg,
        (Skipped("good/truncated.jpg", "cannot decode image.*truncated"),),
    ),
    Case(
        "random-bytes",
        "random bytes named `.jpg`",
        "skipped: `cannot decode image: cannot identify image file`",
        raw_file("good/random.jpg", np.random.default_rng(0).bytes(4096)),
        (Skipped("good/random.jpg", "cannot decode image.*cannot identify"),),
    ),
    Case(
        "png-named-jpg",
        "a PNG named `.jpg` (ImageNet has some)",
        "converted: decoded by its content, not its name",
        photo_file("good/really-png.jpg", "PNG"),
        (Converted("good/really-png.jpg", same_as_pillow(rgb)),),
    ),
    Case(
        "cmyk-jpeg",
        "a CMYK JPEG",
        "converted to RGB (Pillow's CMYK conversion)",
        photo_file("good/cmyk.jpg", image=Image.fromarray(PHOTO).convert("CMYK"), quality=95),
        (Converted("good/cmyk.jpg", close_to_photo),),
    ),
    Case(
        "grayscale-png",
        "a grayscale (L) PNG",
        "converted: the gray value in R, G and B",
        photo_file("good/gray.png", "PNG", image=Image.fromarray(PHOTO).convert("L")),
        (Converted("good/gray.png", same_as_pillow(rgb)),),
    ),
    Case(
        "palette-png",
        "a palette (P) PNG with a transparent colour",
        "converted: the palette colours, transparency ignored",
        photo_file("good/palette.png", "PNG", image=PALETTE, transparency=0),
        (Converted("good/palette.png", same_as_pillow(rgb)),),
    ),
    Case(
        "rgba-png",
        "an RGBA PNG",
        "converted: alpha dropped, not composited (as `ImageFolder`)",
        photo_file("good/rgba.png", "PNG", image=Image.fromarray(PHOTO).convert("RGBA")),
        (Converted("good/rgba.png", same_as_pillow(rgb)),),
    ),
    Case(
        "16-bit-png",
        "a 16-bit grayscale PNG (values above 255)",
        "converted: scaled to 8 bits (value >> 8), then gray to RGB",
        photo_file("good/deep.png", "PNG", image=SIXTEEN_BIT),
        (Converted("good/deep.png", sixteen_bit_scaled),),
    ),
    Case(
        "16-bit-png-of-8-bit-values",
        "a 16-bit grayscale PNG holding 0-255 values",
        "converted: the values as 8-bit, as Pillow and `ImageFolder` show them (not black)",
        photo_file("good/shallow.png", "PNG", image=EIGHT_IN_SIXTEEN),
        (Converted("good/shallow.png", same_as_pillow(rgb)),),
    ),
    Case(
        "exif-orientation",
        "a JPEG with EXIF orientation 6 (stored sideways)",
        "converted upright: the EXIF orientation is applied",
        exif_rotated,
        (Converted("good/rotated.jpg", upright),),
    ),
    Case(
        "decompression-bomb",
        "a 9500x9500 PNG, over Pillow's decompression-bomb limit (89,478,485 pixels)",
        "skipped without decoding: `over the decompression-bomb limit`",
        decompression_bomb,
        (Skipped("good/bomb.png", "over the decompression-bomb limit"),),
    ),
    Case(
        "over-max-pixels",
        "a 120x120 image with `--max-pixels 10000`",
        "skipped: `over the decompression-bomb limit of 10,000`",
        photo_file("good/big.jpg", image=photo_crop(BIG, BIG)),
        (Skipped("good/big.jpg", "over the decompression-bomb limit of 10,000"),),
        options={"max_pixels": 10_000},
    ),
    Case(
        "max-pixels-raised",
        "the same image with `--max-pixels 20000`",
        "converted",
        photo_file("good/big.jpg", image=photo_crop(BIG, BIG)),
        (Converted("good/big.jpg", same_as_pillow(rgb)),),
        options={"max_pixels": 20_000},
    ),
    Case(
        "unreadable",
        "a file without read permission",
        "skipped: `cannot read: Permission denied`",
        photo_file("good/secret.jpg"),
        (Skipped("good/secret.jpg", "cannot read: Permission denied"),),
        unreadable=True,
    ),
    Case(
        "non-image-files",
        "`notes.txt` and `.DS_Store` in a class folder",
        "ignored: not image files (not errors)",
        lambda src, dst: [put(src, f"good/{n}", b"x") for n in ("notes.txt", ".DS_Store")],
        (Ignored("good/notes.txt"), Ignored("good/.DS_Store")),
    ),
    Case(
        "non-utf8-name",
        "a file name that is not valid UTF-8 (Latin-1 `caf\\xe9.jpg`)",
        "converted: its path round-trips byte for byte (`os.fsencode(ds.source_path(i))`)",
        photo_file(b"good/caf\xe9.jpg"),
        (Converted(os.fsdecode(b"good/caf\xe9.jpg"), same_as_pillow(rgb)),),
    ),
    Case(
        "non-utf8-class",
        "a class folder whose name is not valid UTF-8",
        "converted: the class name round-trips byte for byte (`os.fsencode(ds.classes[k])`)",
        photo_file(b"caf\xe9/x.jpg"),
        (Converted(os.fsdecode(b"caf\xe9/x.jpg"), same_as_pillow(rgb)),),
    ),
    Case(
        "symlink-loop",
        "a symlink from a class folder to itself (a loop)",
        "listed in errors.jsonl (`symlink loop`), not followed; the rest is converted",
        symlink_loop,
        (Skipped("good/loop", "symlink loop"),),
    ),
    Case(
        "symlink-to-src",
        "a symlink from a class folder to SRC or above (`ln -s .. SRC/good/up`)",
        "listed in errors.jsonl (`symlink loop`), nothing read through it: no image comes "
        "back with a second label",
        symlink_to("up", ".."),
        (Skipped("good/up", "symlink loop: links to SRC itself"), Converted("other/x.jpg")),
    ),
    Case(
        "symlink-to-class",
        "a symlink from one class folder into another (`good/others -> ../other`)",
        "listed in errors.jsonl, not followed (`ImageFolder` would label `other`'s images "
        "`good` too); a link to a folder outside SRC is followed",
        symlink_to("others", "../other"),
        (Skipped("good/others", "outside this class folder"), Converted("other/x.jpg")),
    ),
    Case(
        "broken-symlink",
        "a broken symlink named `.jpg`",
        "skipped: `broken symlink`",
        broken_symlink,
        (Skipped("good/gone.jpg", "broken symlink"),),
    ),
    Case(
        "fifo",
        "a FIFO named `.jpg` (opening it would block)",
        "skipped, never opened: `not a regular file`",
        fifo,
        (Skipped("good/pipe.jpg", "not a regular file"),),
    ),
    Case(
        "empty-class",
        "an empty class folder",
        "kept as a class with 0 samples (as `ImageFolder`)",
        empty_class,
        (EmptyClass("empty"),),
    ),
    Case(
        "no-images",
        "a source folder with no images",
        "refused: `no images found`",
        no_images,
        (Refused(FileNotFoundError, "no images found"),),
        with_good=False,
    ),
    Case(
        "src-missing",
        "SRC missing",
        "refused: `source folder does not exist`",
        lambda src, dst: None,
        (Refused(FileNotFoundError, "source folder does not exist"),),
        with_good=False,
    ),
    Case(
        "dst-not-empty",
        "DST exists and is not empty, without `--overwrite` or `--resume`",
        "refused: `folder is not empty`; DST untouched",
        dst_with("thesis.tex"),
        (Refused(FileExistsError, "folder is not empty"),),
    ),
    Case(
        "dst-foreign-overwrite",
        "DST holds files imgpack did not write, with `--overwrite`",
        "refused: `holds files imgpack did not write`; DST untouched",
        dst_with("thesis.tex"),
        (Refused(FileExistsError, "holds files imgpack did not write"),),
        options={"overwrite": True},
    ),
]


# --- running a case ------------------------------------------------------------------------
def make_case(case: Case, tmp_path: Path) -> tuple[Path, Path]:
    src, dst = tmp_path / "src", tmp_path / "dst"
    if case.with_good:
        for rel, seed in GOOD.items():
            fmt = "PNG" if rel.endswith(".png") else "JPEG"
            put(src, rel, encode(photo_crop(*GOOD_SHAPE, seed=seed), fmt))
    case.build(src, dst)
    if case.unreadable:
        for path in src.rglob("secret.jpg"):
            path.chmod(0)
    return src, dst


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def convert_case(case: Case, src: Path, dst: Path, on_error: str = "skip") -> None:
    options = {k: v for k, v in case.options.items() if k != "overwrite"}
    convert_folder(
        src,
        dst,
        ConvertOptions(format="pt", encoding="raw", **options),
        workers=1,
        overwrite=case.options.get("overwrite", False),
        on_error=on_error,
        progress=False,
    )


def _drop_file_permission_override() -> None:
    """In the child before exec: drop root's CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from
    the bounding set, so that file modes bind it like any user."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")


def convert_where_permissions_bind(case: Case, src: Path, dst: Path) -> None:
    """Convert in a subprocess that file permissions apply to, even when we are root."""
    if os.geteuid() != 0:
        convert_case(case, src, dst)
        return
    command = [sys.executable, "-m", "convert.cli", "convert", str(src), str(dst)]
    command += ["--format", "pt", "--encoding", "raw", "--workers", "1"]
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=_drop_file_permission_override,
        )
    except subprocess.SubprocessError as e:  # the drop needs CAP_SETPCAP
        pytest.skip(f"cannot drop root's file-permission override here: {e}")
    assert done.returncode == 0, done.stderr


def check_outcome(case: Case, src: Path, dst: Path) -> None:
    errors_file = dst / "errors.jsonl"
    lines = errors_file.read_text().splitlines() if errors_file.exists() else []
    errors = [json.loads(line) for line in lines]
    manifest = load_manifest(dst)
    assert manifest.skipped == len(errors)
    dataset = PtDataset(dst)
    stored = {dataset.source_path(i): i for i in range(len(dataset))}
    reasons = {e["path"]: e["error"] for e in errors}
    expected_samples = set(GOOD)
    for expect in case.expect:
        if isinstance(expect, Skipped):
            assert re.search(expect.reason, reasons.pop(expect.path), re.IGNORECASE), errors
        elif isinstance(expect, Converted):
            expected_samples.add(expect.path)
            label = dataset[stored[expect.path]][1]
            assert dataset.classes[label] == expect.path.split("/")[0]
            pixels = dataset[stored[expect.path]][0].permute(1, 2, 0).numpy()
            if expect.check is not None:
                expect.check(pixels, src / expect.path)
        elif isinstance(expect, Ignored):
            assert expect.path not in stored and expect.path not in reasons
        elif isinstance(expect, EmptyClass):
            assert expect.name in dataset.classes
            assert manifest.samples_per_class[expect.name] == 0
    assert reasons == {}, f"unexpected errors: {reasons}"
    assert set(stored) == expected_samples  # nothing lost, nothing extra
    for rel in GOOD:  # the good images are intact whatever sits beside them
        np.testing.assert_array_equal(
            dataset[stored[rel]][0].permute(1, 2, 0).numpy(),
            decode_image((src / rel).read_bytes()),
        )


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_has_its_documented_outcome(case, tmp_path):
    src, dst = make_case(case, tmp_path)
    refusals = [e for e in case.expect if isinstance(e, Refused)]
    if refusals:
        before = snapshot(dst) if dst.exists() else None
        with pytest.raises(refusals[0].error, match=refusals[0].message):
            convert_case(case, src, dst)
        assert (snapshot(dst) if dst.exists() else None) == before
        return
    if case.unreadable:
        convert_where_permissions_bind(case, src, dst)
    else:
        convert_case(case, src, dst)
    check_outcome(case, src, dst)


SKIPPING = [c for c in CASES if any(isinstance(e, Skipped) for e in c.expect) and not c.unreadable]


@pytest.mark.parametrize("case", SKIPPING, ids=[c.id for c in SKIPPING])
def test_on_error_fail_stops_at_the_bad_file_naming_it_and_writes_no_manifest(case, tmp_path):
    src, dst = make_case(case, tmp_path)
    skipped = next(e for e in case.expect if isinstance(e, Skipped))
    with pytest.raises(BadInputError) as caught:
        convert_case(case, src, dst, on_error="fail")
    message = str(caught.value)
    assert skipped.path in message and re.search(skipped.reason, message, re.I), message
    assert "--on-error fail" in message
    assert not (dst / spec.MANIFEST_NAME).exists()


# --- the table in docs/RELIABILITY.md -----------------------------------------------------
TABLE_START = "<!-- bad-input table: generated from tests/test_bad_input.py -->"
TABLE_END = "<!-- end of bad-input table -->"


def render_table() -> str:
    rows = ["| Input | Outcome |", "|---|---|"]
    rows += [f"| {c.input} | {c.outcome} |" for c in CASES]
    return "\n".join([TABLE_START, *rows, TABLE_END])


def test_reliability_doc_lists_every_case_with_its_outcome():
    text = RELIABILITY_DOC.read_text(encoding="utf-8")
    assert render_table() in text, (
        "docs/RELIABILITY.md is out of date; its table should read:\n" + render_table()
    )


def test_reliability_doc_cites_only_tests_that_exist():
    cited = re.findall(r"`(tests/\w+\.py)::(\w+)`", RELIABILITY_DOC.read_text(encoding="utf-8"))
    assert len(cited) >= 15
    for file, name in cited:
        source = (ROOT / file).read_text(encoding="utf-8")
        assert re.search(rf"^def {name}\(", source, re.MULTILINE), f"{file}::{name} is gone"


if __name__ == "__main__":  # python -m tests.test_bad_input: print the table for the doc
    print(render_table())
