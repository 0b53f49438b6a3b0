"""``imgpack inspect --grid``: class names in real glyphs (Latin, Greek, Cyrillic), long
names ellipsed inside their tile, and a sheet of bounded size for a thousand classes, on
real image folders and the font matplotlib ships."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from xml.sax.saxutils import escape

import matplotlib
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image, ImageDraw, ImageFont

from convert.cli import main
from convert.inspection import (
    ELLIPSIS,
    GAP,
    LABEL_FONT_SIZE,
    LABEL_HEIGHT,
    LABEL_PADDING,
    MAX_ROWS,
    contact_sheet,
    fit_label,
)
from convert.tile_text import installed_fonts

BACKGROUND, INK = (32, 32, 32), (240, 240, 240)  # the sheet's and its labels' colours
# A private-use character. Some fonts have one (STIX, which matplotlib ships; icon fonts),
# but its glyph means something else in each, and TileFont asks no other font for a
# character Python does not count as printable: DejaVu Sans draws its missing glyph.
NOTDEF = "\ue000"


def mpl_font(name: str) -> Path:
    """A font file matplotlib ships."""
    return Path(matplotlib.get_data_path(), "fonts", "ttf", name)


def dejavu_sans() -> ImageFont.FreeTypeFont:
    """The font the labels must be in, found through matplotlib itself."""
    return ImageFont.truetype(str(mpl_font("DejaVuSans.ttf")), LABEL_FONT_SIZE)


def class_folder(root: Path, names: list[str], per_class: int = 1, size: int = 24) -> Path:
    """An image folder with ``per_class`` small PNGs in a folder named after each class."""
    for k, name in enumerate(names):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.full((size, size, 3), (37 * k + 11 * i) % 200 + 40, np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def label_strip(sheet: Image.Image, row: int, tile: int, column: int = 0) -> np.ndarray:
    """The pixels under one tile where its class name is drawn, as wide as the tile."""
    left, top = column * (tile + GAP) + GAP // 2, row * (tile + LABEL_HEIGHT + GAP) + GAP // 2
    return np.asarray(sheet.crop((left, top + tile, left + tile, top + tile + LABEL_HEIGHT)))


def ink(strip: np.ndarray) -> np.ndarray:
    """The strip cut to the box of its drawn pixels (where the text is)."""
    drawn = np.argwhere((strip != BACKGROUND).any(axis=2))
    assert len(drawn), "no text drawn"
    (top, left), (bottom, right) = drawn.min(axis=0), drawn.max(axis=0)
    return strip[top : bottom + 1, left : right + 1]


def rendered(text: str, font: ImageFont.FreeTypeFont, width: int) -> np.ndarray:
    """``text`` drawn by Pillow in ``font`` on the sheet's colours, cut to its ink."""
    strip = Image.new("RGB", (width, LABEL_HEIGHT), BACKGROUND)
    ImageDraw.Draw(strip).text((LABEL_PADDING, 2), text, INK, font)
    return ink(np.asarray(strip))


def fonts_seen(monkeypatch: pytest.MonkeyPatch, folder: Path, fonts: Sequence[Path]) -> None:
    """Make ``fonts`` the installed fonts the grid finds (``installed_fonts``), whatever
    this machine has: ``fc-list`` reads a fontconfig file whose one font folder holds
    copies of them, and matplotlib's search (where there is no ``fc-list``) ignores the
    system's fonts (so sees none)."""
    folder.mkdir()
    for font in fonts:
        shutil.copy(font, folder / font.name)
    config = folder.parent / "fonts.conf"
    config.write_text(
        '<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n'
        f"<fontconfig><dir>{escape(str(folder))}</dir>"
        f"<cachedir>{escape(str(folder.parent / 'fontconfig-cache'))}</cachedir></fontconfig>\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("FONTCONFIG_FILE", str(config))
    monkeypatch.setenv("MPL_IGNORE_SYSTEM_FONTS", "1")
    seen = [folder / font.name for font in fonts] if shutil.which("fc-list") else []
    assert installed_fonts() == sorted(seen)


@pytest.mark.parametrize(
    "fonts",
    [(), ("STIXNonUni.ttf",)],  # no font with U+E000; one that has it
    ids=["none", "one-with-U+E000"],
)
def test_greek_cyrillic_and_accented_class_names_are_drawn_in_real_glyphs(
    tmp_path, monkeypatch, fonts, caplog
):
    fonts_seen(monkeypatch, tmp_path / "fonts", [mpl_font(name) for name in fonts])
    words, letters = ["Жёлтый", "λύκος", "café", "Ærø"], ["Ж", "λ", "é", NOTDEF]
    root = class_folder(tmp_path / "folder", words + letters)
    with caplog.at_level(logging.WARNING, logger="convert.tile_text"):
        sheet = contact_sheet(root, tmp_path / "sheet.png", per_class=1, tile=64)
    # The one box on the sheet is named, by code point; nothing else is said missing.
    assert [r.getMessage() for r in caplog.records if r.name == "convert.tile_text"] == [
        "inspect --grid: U+E000 drawn as boxes: control, private-use or unassigned code "
        "points, which mean something else in each font"
    ]
    font = dejavu_sans()
    with Image.open(sheet.path) as image:
        strips = {name: label_strip(image, row, 64) for row, name in enumerate(sheet.classes)}
    for name in words + letters:  # what DejaVu Sans itself draws of the name
        assert np.array_equal(ink(strips[name]), rendered(name, font, 64)), name
    missing = ink(strips[NOTDEF])
    for letter in letters[:-1]:  # Pillow's own font drew each of these as the missing glyph
        assert not np.array_equal(ink(strips[letter]), missing), letter
    assert len({ink(strips[letter]).tobytes() for letter in letters}) == len(letters)


def test_a_long_class_name_ends_in_an_ellipsis_inside_its_tile(tmp_path):
    long_name = "n01440764_tench_Tinca_tinca_a_freshwater_fish"
    root = class_folder(tmp_path / "folder", [long_name, "short"], per_class=2)
    tile = 64
    sheet = contact_sheet(root, tmp_path / "sheet.png", per_class=2, tile=tile)
    font = dejavu_sans()
    fitted = fit_label(long_name, font, tile - 2 * LABEL_PADDING)
    assert fitted.endswith(ELLIPSIS) and long_name.startswith(fitted[:-1]) and len(fitted) > 4
    assert font.getlength(fitted) <= tile - 2 * LABEL_PADDING
    assert font.getlength(long_name[: len(fitted)] + ELLIPSIS) > tile - 2 * LABEL_PADDING
    assert fit_label("short", font, tile - 2 * LABEL_PADDING) == "short"
    assert fit_label(long_name, font, 5) == ""  # not even the ellipsis fits
    row = sheet.classes.index(long_name)
    with Image.open(sheet.path) as image:
        pixels = np.asarray(image)
        for column in (0, 1):
            strip = label_strip(image, row, tile, column)
            assert np.array_equal(ink(strip), rendered(fitted, font, tile))
            assert (strip[:, -LABEL_PADDING + 1 :] == BACKGROUND).all()  # ends inside its tile
    top = row * (tile + LABEL_HEIGHT + GAP) + GAP // 2 + tile
    between = pixels[top : top + LABEL_HEIGHT, tile + GAP // 2 : tile + GAP + GAP // 2]
    assert (between == BACKGROUND).all()  # nothing drawn in the gap between two tiles


def test_a_thousand_classes_draw_capped_rows_with_a_hint_to_name_them(tmp_path):
    names = [f"class{k:04d}" for k in range(1000)]
    root = class_folder(tmp_path / "in1k", names, size=8)
    out = tmp_path / "sheet.png"
    result = CliRunner().invoke(main, ["inspect", str(root), "--grid", str(out)])
    assert result.exit_code == 0, result.output
    assert (
        f"grid: the first {MAX_ROWS} of 1,000 classes, one row each: name the ones to draw "
        "with --classes NAME,... (or raise --max-rows)"
    ) in result.output.splitlines()
    with Image.open(out) as image:
        assert image.size == (8 * (96 + GAP), MAX_ROWS * (96 + LABEL_HEIGHT + GAP))
    assert out.stat().st_size < 4_000_000  # 1,000 rows of photos made 626 MB
    named = ["class0999", "class0500"]
    result = CliRunner().invoke(
        main, ["inspect", str(root), "--grid", str(out), "--classes", ",".join(named), "--json"]
    )
    assert result.exit_code == 0, result.output
    assert list(json.loads(result.stdout)["grid"]["tiles"]) == named
    assert "the first" not in result.output
    result = CliRunner().invoke(
        main, ["inspect", str(root), "--grid", str(out), "--max-rows", "3", "--per-class", "1"]
    )
    assert result.exit_code == 0 and "the first 3 of 1,000 classes" in result.output
    with Image.open(out) as image:
        assert image.size == (96 + GAP, 3 * (96 + LABEL_HEIGHT + GAP))


def test_without_matplotlib_the_grid_uses_pillows_font_and_says_what_to_install(tmp_path):
    root = class_folder(tmp_path / "folder", ["Жёлтый", "plain"])
    out = tmp_path / "sheet.png"
    hide_matplotlib = "import sys; sys.modules['matplotlib'] = None; from convert.cli import main"
    argv = [sys.executable, "-c", f"{hide_matplotlib}; main()", "inspect", str(root)]
    proc = subprocess.run(
        [*argv, "--grid", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "imgpack: inspect --grid: class names drawn in Pillow's font, which has ASCII glyphs "
        "only (other letters show as boxes): for DejaVu Sans, pip install -e '.[plot]' in the "
        "imgpack checkout (or pip install matplotlib)"
    ]
    rows = list(json.loads(proc.stdout)["grid"]["tiles"])
    assert sorted(rows) == ["plain", "Жёлтый"]
    with Image.open(out) as image:
        plain = label_strip(image, rows.index("plain"), 96)
    assert not np.array_equal(ink(plain), rendered("plain", dejavu_sans(), 96))  # Pillow's


@pytest.mark.parametrize("bad", [["--max-rows", "0"], ["--tile", "8"], ["--per-class", "0"]])
def test_grid_sizes_below_one_row_or_tile_are_refused_in_one_line(tmp_path, bad):
    root = class_folder(tmp_path / "folder", ["a"])
    result = CliRunner().invoke(
        main, ["inspect", str(root), "--grid", str(tmp_path / "x.png"), *bad]
    )
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "--max-rows must be 1 or more" in result.output


def captioned_folder(root: Path, caption: str) -> Path:
    """One class folder with one image and a txt sidecar holding ``caption``."""
    class_folder(root, ["photos"])
    (root / "photos" / "0.txt").write_text(caption, encoding="utf-8")
    return root


def caption_strip(sheet: Image.Image, tile: int) -> np.ndarray:
    """The first caption line under the first tile."""
    top = GAP // 2 + tile + LABEL_HEIGHT
    return np.asarray(sheet.crop((GAP // 2, top, GAP // 2 + tile, top + LABEL_HEIGHT)))


def test_a_caption_no_installed_font_draws_is_named_in_one_warning_and_still_written(
    tmp_path, monkeypatch, caplog
):
    fonts_seen(monkeypatch, tmp_path / "fonts", [])  # no CJK font, on any machine
    caption = "富士山の写真"
    root = captioned_folder(tmp_path / "folder", caption)
    out = tmp_path / "sheet.png"
    with caplog.at_level(logging.WARNING, logger="convert.tile_text"):
        sheet = contact_sheet(root, out, per_class=1, tile=96, caption="txt")
    assert sheet.captions == {"photos": [caption]} and out.is_file()
    warnings = [r.getMessage() for r in caplog.records if r.name == "convert.tile_text"]
    assert warnings == [
        f"inspect --grid: no installed font draws {caption} ({len(caption)} characters, "
        "drawn as boxes): install a font that has them (Chinese, Japanese, Korean on "
        "Debian or Ubuntu: apt-get install fonts-noto-cjk)"
    ]
    with Image.open(out) as image:
        drawn = ink(caption_strip(image, 96))
    assert np.array_equal(drawn, ink(caption_strip_of(caption, dejavu_sans(), 96)))  # boxes


def caption_strip_of(text: str, font: ImageFont.FreeTypeFont, tile: int) -> np.ndarray:
    """``text`` drawn as a caption line by Pillow in ``font`` alone."""
    strip = Image.new("RGB", (tile, LABEL_HEIGHT), BACKGROUND)
    ImageDraw.Draw(strip).text((LABEL_PADDING, 2), text, (200, 200, 150), font)
    return np.asarray(strip)


def test_a_character_dejavu_sans_lacks_is_drawn_by_an_installed_font_that_has_it(
    tmp_path, monkeypatch
):
    arc = "\u2312"  # ⌒: not in DejaVu Sans, in DejaVu Sans Mono (matplotlib ships both)
    fonts_seen(monkeypatch, tmp_path / "fonts", [mpl_font("DejaVuSansMono.ttf")])
    if shutil.which("fc-list") is None:
        pytest.skip("fc-list is not installed: the grid looks through no installed font")
    root = captioned_folder(tmp_path / "folder", f"a{arc}b")
    out = tmp_path / "sheet.png"
    contact_sheet(root, out, per_class=1, tile=96, caption="txt")
    with Image.open(out) as image:
        drawn = ink(caption_strip(image, 96))
    boxed = ink(caption_strip_of(f"a{arc}b", dejavu_sans(), 96))
    assert drawn.shape[1] > 0 and not np.array_equal(drawn, boxed)  # not DejaVu's box
    plain = ink(caption_strip_of("a", dejavu_sans(), 96))  # and "a" still DejaVu's own
    assert np.array_equal(drawn[:, : plain.shape[1]][-plain.shape[0] :], plain)
