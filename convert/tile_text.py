"""The text under a contact sheet's tiles: the font (DejaVu Sans, which matplotlib ships:
Latin, Greek, Cyrillic and more; Pillow's own font has ASCII glyphs only), a class name
fitted into its tile's width with an ellipsis, and a caption wrapped into a few lines."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from PIL import ImageFont

__all__ = [
    "CAPTION_LINES",
    "ELLIPSIS",
    "LABEL_FONT_SIZE",
    "bundled_font",
    "fit_label",
    "label_font",
    "wrap_caption",
]

log = logging.getLogger(__name__)

LABEL_FONT_SIZE = 11  # DejaVu Sans at 11 px: ascent 11 + descent 3 fit the strip
ELLIPSIS = "…"
CAPTION_LINES = 3  # lines of a --caption field under a tile, the last one ellipsed


def bundled_font() -> Path | None:
    """matplotlib's DejaVu Sans, found without importing matplotlib; None without it."""
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    font = Path(next(iter(spec.submodule_search_locations)), "mpl-data/fonts/ttf/DejaVuSans.ttf")
    return font if font.is_file() else None


def label_font(size: int = LABEL_FONT_SIZE) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """The font of the tiles' labels: DejaVu Sans, else Pillow's own with a warning."""
    font = bundled_font()
    if font is not None:
        return ImageFont.truetype(str(font), size)
    log.warning(
        "inspect --grid: class names drawn in Pillow's font, which has ASCII glyphs only "
        "(other letters show as boxes): for DejaVu Sans, pip install -e '.[plot]' in the "
        "imgpack checkout (or pip install matplotlib)"
    )
    return ImageFont.load_default(size)


def fit_label(text: str, font: ImageFont.FreeTypeFont | ImageFont.ImageFont, width: float) -> str:
    """``text`` if it is at most ``width`` pixels long in ``font``, else its longest prefix
    that fits with an ellipsis after it ("" when not even the ellipsis fits)."""
    if font.getlength(text) <= width:
        return text
    fits, too_long = 0, len(text)  # prefix lengths: the ellipsed one fits / does not
    while too_long - fits > 1:
        middle = (fits + too_long) // 2
        if font.getlength(text[:middle].rstrip() + ELLIPSIS) <= width:
            fits = middle
        else:
            too_long = middle
    fitted = text[:fits].rstrip() + ELLIPSIS
    return fitted if font.getlength(fitted) <= width else ""


def wrap_caption(
    text: str,
    font: ImageFont.FreeTypeFont | ImageFont.ImageFont,
    width: float,
    lines: int = CAPTION_LINES,
) -> list[str]:
    """``text`` in at most ``lines`` lines of at most ``width`` pixels: broken between
    words (inside a word longer than a line, as CJK text without spaces is), the last line
    ending in an ellipsis when text remains."""
    words, out = text.split(), []
    while words and len(out) < lines - 1:
        if font.getlength(words[0]) > width:  # a word longer than the line: break it
            cut = max(1, len(fit_label(words[0], font, width).removesuffix(ELLIPSIS)))
            out.append(words[0][:cut])
            words[0] = words[0][cut:]
            continue
        n = 1
        while n < len(words) and font.getlength(" ".join(words[: n + 1])) <= width:
            n += 1
        out.append(" ".join(words[:n]))
        words = words[n:]
    if words:
        out.append(fit_label(" ".join(words), font, width))
    return [line for line in out if line]
