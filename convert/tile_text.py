"""The text under a contact sheet's tiles: the font (DejaVu Sans, which matplotlib ships:
Latin, Greek, Cyrillic and more; Pillow's own font has ASCII glyphs only), a class name
fitted into its tile's width with an ellipsis, and a caption wrapped into a few lines.

DejaVu Sans has no CJK glyphs: :class:`TileFont` draws each character DejaVu lacks in the
first installed font that has it (the fonts ``fc-list`` lists, else those matplotlib's
``font_manager`` finds; each font's character map read with fontTools, which matplotlib
depends on), and says once which characters no installed font draws, never silent boxes.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from PIL import ImageDraw, ImageFont

__all__ = [
    "CAPTION_LINES",
    "ELLIPSIS",
    "LABEL_FONT_SIZE",
    "TileFont",
    "bundled_font",
    "fit_label",
    "installed_fonts",
    "label_font",
    "wrap_caption",
]

Font = ImageFont.FreeTypeFont | ImageFont.ImageFont
Ink = tuple[int, int, int]

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


def fit_label(text: str, font: Font | TileFont, width: float) -> str:
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
    font: Font | TileFont,
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


_FONT_SUFFIXES = (".ttf", ".otf", ".ttc", ".otc")
_SHOWN = 20  # characters a warning names at most


def installed_fonts() -> list[Path]:
    """The font files installed on this machine, as ``fc-list`` lists them, else as
    matplotlib's ``font_manager`` finds them (none without either); LastResort fonts,
    whose glyphs are boxes naming a block, left out."""
    files: list[str] = []
    if shutil.which("fc-list"):
        try:
            listed = subprocess.run(
                ["fc-list", "--format", "%{file}\n"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            files = listed.stdout.splitlines()
        except (OSError, subprocess.SubprocessError):
            files = []
    if not files and importlib.util.find_spec("matplotlib") is not None:
        from matplotlib import font_manager

        files = list(font_manager.findSystemFonts())
    return sorted(
        {
            Path(f)
            for f in files
            if f.lower().endswith(_FONT_SUFFIXES) and "lastresort" not in f.lower()
        }
    )


@functools.cache
def _codepoints(path: Path) -> frozenset[int]:
    """The characters the font file ``path`` (its first face) has glyphs for; none if
    fontTools cannot read it."""
    try:
        from fontTools.ttLib import TTFont

        with TTFont(str(path), fontNumber=0, lazy=True) as font:
            return frozenset(font.getBestCmap() or {})
    except Exception:  # any font file fontTools cannot parse (or fontTools missing)
        return frozenset()


class TileFont:
    """The tiles' text: ``primary`` (DejaVu Sans) for every character it has, each other
    one in the first of ``candidates()`` (installed fonts, looked through only when a
    character needs it) that has it, at the same size. Characters no font has are drawn
    in ``primary`` (a box) and kept in :attr:`missing` for :meth:`warn_missing`. A
    character Python does not count as printable (a control, private-use or unassigned
    code point, whose glyph, where a font has one, means something else in each font) is
    drawn in ``primary`` without asking another font: a box unless it is white space, and
    then kept in :attr:`unprintable`, which :meth:`warn_missing` names by code point."""

    def __init__(
        self,
        primary: Font,
        size: int = LABEL_FONT_SIZE,
        candidates: Callable[[], Sequence[Path]] = installed_fonts,
    ) -> None:
        self.primary, self.size = primary, size
        path = getattr(primary, "path", None)  # None: Pillow's own font, no fallback
        self._covers = _codepoints(Path(path)) if isinstance(path, str) else None
        self._candidates = candidates
        self._listed: list[Path] | None = None
        self._fallbacks: dict[Path, ImageFont.FreeTypeFont] = {}
        self._by_char: dict[str, Font] = {}
        self.missing: dict[str, None] = {}  # in the order met
        self.unprintable: dict[str, None] = {}  # in the order met

    def font_for(self, char: str) -> Font:
        """The font that draws ``char``."""
        if self._covers is None or ord(char) in self._covers:
            return self.primary
        if not char.isprintable():
            if not char.isspace():
                self.unprintable[char] = None
            return self.primary
        font = self._by_char.get(char)
        if font is None:
            font = self._fallback(char)
            self._by_char[char] = font
        return font

    def _fallback(self, char: str) -> Font:
        if self._listed is None:
            self._listed = list(self._candidates())
        for path in self._listed:
            if ord(char) in _codepoints(path):
                if path not in self._fallbacks:
                    self._fallbacks[path] = ImageFont.truetype(str(path), self.size)
                return self._fallbacks[path]
        self.missing[char] = None
        return self.primary

    def runs(self, text: str) -> list[tuple[str, Font]]:
        """``text`` cut where the font drawing it changes: ``(piece, font)`` in order."""
        out: list[tuple[str, Font]] = []
        for char in text:
            font = self.font_for(char)
            if out and out[-1][1] is font:
                out[-1] = (out[-1][0] + char, font)
            else:
                out.append((char, font))
        return out

    def getlength(self, text: str) -> float:
        """The width of ``text`` drawn by :meth:`draw`, in pixels."""
        return sum(font.getlength(piece) for piece, font in self.runs(text))

    def draw(
        self, draw: ImageDraw.ImageDraw, xy: tuple[float, float], text: str, fill: Ink
    ) -> None:
        """Draw ``text`` with its top-left at ``xy``, every piece on the primary font's
        baseline."""
        x, y = xy
        ascent = self.primary.getmetrics()[0] if hasattr(self.primary, "getmetrics") else 0
        for piece, font in self.runs(text):
            if font is self.primary:
                draw.text((x, y), piece, fill, font)
            else:
                draw.text((x, y + ascent), piece, fill, font, anchor="ls")
            x += font.getlength(piece)

    def warn_missing(self) -> None:
        """One warning naming the characters no installed font draws, and one naming the
        code points drawn as boxes because no font's glyph for them can be trusted."""
        if self.unprintable:
            log.warning(
                "inspect --grid: %s drawn as boxes: control, private-use or unassigned code "
                "points, which mean something else in each font",
                _listed([f"U+{ord(c):04X}" for c in self.unprintable], ", "),
            )
        if not self.missing:
            return
        chars = list(self.missing)
        shown = _listed(chars, "")
        log.warning(
            "inspect --grid: no installed font draws %s (%d character%s, drawn as boxes): "
            "install a font that has them (Chinese, Japanese, Korean on Debian or Ubuntu: "
            "apt-get install fonts-noto-cjk)",
            shown,
            len(chars),
            "" if len(chars) == 1 else "s",
        )


def _listed(items: list[str], separator: str) -> str:
    """The first :data:`_SHOWN` of ``items`` joined, and how many more there are."""
    more = f" and {len(items) - _SHOWN} more" if items[_SHOWN:] else ""
    return separator.join(items[:_SHOWN]) + more
