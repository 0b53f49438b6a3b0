"""``imgpack inspect``: what a dataset (or an image folder) holds, for a person to check.

:func:`summarize` reads the manifest and the index, never every sample: the counts per
class and the stored bytes come from the manifest (for a folder: the scan and the files'
sizes), the image shapes from the manifest when they are fixed, else from the headers of a
seeded sample of at most ``shape_samples`` images (no decode). :func:`contact_sheet`
draws, with Pillow, a grid of ``per_class`` seeded samples of each class, one row per
class (the first ``max_rows`` classes unless ``classes`` names them; a dataset without
classes: one row, :data:`UNLABELED_ROW`), each tile labelled with its class name: a glance
tells whether labels and pixels are right after a conversion. Labels are drawn in DejaVu
Sans, a name too long for its tile ending in an ellipsis inside it
(:mod:`convert.tile_text`). A dataset's fields are shown as its schema and the first few
values of each (:mod:`convert.field_views`); ``caption=`` writes a text field under each
tile, wrapped to the tile's width in at most :data:`CAPTION_LINES` lines.
"""

from __future__ import annotations

import io
import os
import random
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

import readers
from convert.field_views import caption_field, captions, examples, schema_lines
from convert.options import ConvertOptions
from convert.scan import Sample
from convert.sources import DatasetSource, SampleSource, open_source
from convert.sources.base import Stored, WithFields
from convert.tile_text import (
    CAPTION_LINES,
    ELLIPSIS,
    LABEL_FONT_SIZE,
    TileFont,
    bundled_font,
    fit_label,
    label_font,
    wrap_caption,
)
from readers import spec
from readers.fields import parse_schema, schema_json

__all__ = [
    "CAPTION_LINES",
    "ELLIPSIS",
    "GAP",
    "LABEL_FONT_SIZE",
    "LABEL_HEIGHT",
    "LABEL_PADDING",
    "MAX_ROWS",
    "UNLABELED_ROW",
    "Sheet",
    "Summary",
    "bundled_font",
    "contact_sheet",
    "fit_label",
    "label_font",
    "summarize",
    "wrap_caption",
]

LABEL_HEIGHT = 16  # pixels of the strip under each tile that names its class
LABEL_PADDING = 3  # pixels left and right of a label, inside its tile's width
GAP = 4  # pixels between two cells (a tile and its label)
MAX_ROWS = 64  # classes drawn unless named: 1,000 rows made a 626 MB sheet
UNLABELED_ROW = "(unlabeled)"  # the one row of a dataset without classes
_LAYOUT_ONLY = ConvertOptions(spec.FORMATS[0])  # a folder's scan reads no other option


@dataclass
class Summary:
    """What :func:`summarize` found (``shapes``: over ``shapes_from`` samples)."""

    location: str
    kind: str  # the source kind: "imgpack", "folder", "webdataset", "parquet"
    format: str | None
    encoding: str | None
    samples: int
    classes: list[str]
    samples_per_class: dict[str, int]
    stored_bytes: int
    shapes_from: str  # "manifest", or "headers of N samples"
    shapes: dict[str, Any] = field(default_factory=dict)
    content_sha256: str | None = None
    source: dict[str, Any] | None = None  # what the dataset was converted from
    fields: dict[str, Any] = field(default_factory=dict)  # the schema (manifest's "fields")
    field_values: dict[str, list[str]] = field(default_factory=dict)  # the first few, one line

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self, shown: int = 3) -> str:
        """A person-readable account; ``shown`` smallest and largest classes."""
        what = f"imgpack {self.format}, {self.encoding}" if self.kind == "imgpack" else self.kind
        lines = [
            f"{self.location}  ({what})",
            f"samples    {self.samples:,}",
            f"bytes      {self.stored_bytes:,} stored"
            + (
                f", {self.stored_bytes / self.samples / 1e3:.1f} kB a sample"
                if self.samples
                else ""
            ),
            f"shapes     {_shapes_line(self.shapes)}  (from {self.shapes_from})",
            f"classes    {len(self.classes)}",
        ]
        if self.samples_per_class:
            counts = sorted(self.samples_per_class.items(), key=lambda kv: (kv[1], kv[0]))
            smallest = ", ".join(f"{c} {n}" for c, n in counts[:shown])
            largest = ", ".join(f"{c} {n}" for c, n in reversed(counts[-shown:]))
            if counts[0][1] == counts[-1][1]:
                lines.append(f"  {counts[0][1]:,} samples in every class")
            else:
                lines += [f"  smallest {smallest}", f"  largest  {largest}"]
        if self.fields:
            lines.append(f"fields     {len(self.fields)}")
            schema = parse_schema(self.fields, "fields")
            for line, name in zip(schema_lines(schema), schema, strict=True):
                lines += [line, *(f"      {v}" for v in self.field_values.get(name, []))]
        if self.source:
            lines.append(
                f"converted from {self.source.get('location')} ({self.source.get('kind')})"
            )
        if self.content_sha256:
            lines.append(f"checksum   {self.content_sha256}")
        return "\n".join(lines)


def _shapes_line(shapes: dict[str, Any]) -> str:
    if not shapes:
        return "?"
    if shapes["distinct"] == 1:
        h, w, _ = shapes["most_common"][0][0]
        return f"all {h}x{w}"
    height, width = shapes["height"], shapes["width"]
    return (
        f"{shapes['distinct']} distinct; height {height['min']}-{height['max']} (median "
        f"{height['median']:g}), width {width['min']}-{width['max']} (median {width['median']:g})"
    )


def summarize(path: str | os.PathLike[str], *, shape_samples: int = 1000, seed: int = 0) -> Summary:
    """The summary of the dataset or image folder at ``path`` (see the module docstring);
    the fields' first values are read from the first samples (a URL dataset's first shard
    is fetched for them, as any read of it is)."""
    source = open_source(path)
    if isinstance(source, DatasetSource):
        m = source.manifest
        summary = Summary(
            str(m.location),
            source.kind,
            m.format,
            m.encoding,
            m.num_samples,
            list(m.classes),
            dict(m.samples_per_class or {}),
            sum(s.bytes for s in m.shards),
            "manifest",
            content_sha256=m.content_sha256,
            source=m.source,
            fields=schema_json(m.fields),
            field_values=examples(source, m.fields, []),
        )
        if m.shape is not None:
            summary.shapes = _shape_stats([m.shape] * m.num_samples)
            return summary
        samples = source.scan(_LAYOUT_ONLY).samples
    else:
        scan = source.scan(_LAYOUT_ONLY)
        samples = scan.samples
        per_class = Counter(s.label for s in samples)
        summary = Summary(
            source.where,
            source.kind,
            None,
            None,
            len(samples),
            list(scan.classes),
            {c: per_class[i] for i, c in enumerate(scan.classes)},
            source.stored_bytes(samples),
            "",
            fields=schema_json(scan.fields),
            field_values=examples(source, scan.fields, samples),
        )
    chosen = _seeded_sample(samples, shape_samples, seed)
    summary.shapes = _shape_stats(_stored_shapes(source, chosen))
    summary.shapes_from = f"headers of {len(chosen)} sample(s)"
    return summary


def _seeded_sample(samples: Sequence[Sample], n: int, seed: int) -> list[Sample]:
    if len(samples) <= n:
        return list(samples)
    return sorted(
        random.Random(seed).sample(list(samples), n), key=lambda s: (s.index or 0, s.relpath)
    )


def _stored_shapes(source: SampleSource, samples: list[Sample]) -> list[tuple[int, int, int]]:
    """``[H, W, 3]`` of each readable sample, from its pixels' shape or its image header."""
    shapes = []
    for stored in source.reader().read(samples):
        if isinstance(stored, WithFields):
            stored = stored.image
        if isinstance(stored, np.ndarray):
            shapes.append(tuple(stored.shape))
        elif isinstance(stored, bytes):
            try:
                with Image.open(io.BytesIO(stored)) as img:
                    shapes.append((img.height, img.width, 3))
            except (OSError, ValueError):
                continue  # unreadable: not a shape; verify and convert name it
    return shapes


def _shape_stats(shapes: list[tuple[int, ...]]) -> dict[str, Any]:
    if not shapes:
        return {}
    counts = Counter(tuple(s) for s in shapes)
    heights, widths = [s[0] for s in shapes], [s[1] for s in shapes]
    return {
        "distinct": len(counts),
        "height": {"min": min(heights), "median": statistics.median(heights), "max": max(heights)},
        "width": {"min": min(widths), "median": statistics.median(widths), "max": max(widths)},
        "most_common": [[list(s), n] for s, n in counts.most_common(5)],
    }


@dataclass
class Sheet:
    """What :func:`contact_sheet` drew: the grid's classes (rows) and its tiles' paths;
    ``left_out``: the classes not drawn because no ``classes`` were named and the dataset
    has more than ``max_rows``."""

    path: str
    size: tuple[int, int]  # (width, height) in pixels
    classes: list[str]
    tiles: dict[str, list[str]]  # class -> the source paths drawn, in column order
    unreadable: list[str] = field(default_factory=list)
    left_out: int = 0
    captions: dict[str, list[str | None]] = field(default_factory=dict)  # class -> --caption


def contact_sheet(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    per_class: int = 8,
    classes: Sequence[str] | None = None,
    seed: int = 0,
    tile: int = 96,
    max_rows: int = MAX_ROWS,
    caption: str | None = None,
) -> Sheet:
    """Draw ``per_class`` samples of each class of the dataset or folder at ``path`` (the
    first ``max_rows`` classes, or those ``classes`` names), chosen with ``seed``, into the
    PNG ``out``: one row per class, each tile the image fitted into ``tile`` pixels and
    labelled with its class name, and with the text field ``caption`` under it when named
    (ValueError for a field that is not there or not text)."""
    if per_class < 1 or tile < 16 or max_rows < 1:
        raise ValueError(
            "--per-class and --max-rows must be 1 or more and --tile 16 or more, not "
            f"{per_class}, {max_rows}, {tile}"
        )
    source = open_source(path)
    scan = source.scan(_LAYOUT_ONLY)
    schema = source.manifest.fields if isinstance(source, DatasetSource) else scan.fields
    if caption is not None:
        caption_field(source.where, schema, caption)
    rows_of = {c: i for i, c in enumerate(scan.classes)} or {UNLABELED_ROW: spec.UNLABELED}
    names = list(classes) if classes else list(rows_of)[:max_rows]
    unknown = [c for c in names if c not in rows_of]
    if unknown:
        raise ValueError(
            f"{source.where}: no class {unknown[0]!r} (classes: {', '.join(scan.classes[:10])}"
            f"{', ...' if len(scan.classes) > 10 else ''})"
        )
    by_class: dict[int, list[Sample]] = {}
    for sample in scan.samples:
        by_class.setdefault(sample.label, []).append(sample)
    rows = []
    for name in names:  # each class seeded alone: its row is the same whatever else is drawn
        members = by_class.get(rows_of[name], [])
        rows.append(random.Random(f"{seed}:{name}").sample(members, min(per_class, len(members))))
    cell_width = tile + GAP
    cell_height = tile + LABEL_HEIGHT * (1 + (CAPTION_LINES if caption else 0)) + GAP
    sheet = Image.new("RGB", (per_class * cell_width, len(names) * cell_height), (32, 32, 32))
    draw, font = ImageDraw.Draw(sheet), TileFont(label_font())
    text_width = tile - 2 * LABEL_PADDING
    left_out = 0 if classes else len(rows_of) - len(names)
    result = Sheet(str(out), sheet.size, names, {}, left_out=left_out)
    reader = source.reader()
    for row, (name, chosen) in enumerate(zip(names, rows, strict=True)):
        result.tiles[name] = [s.relpath for s in chosen]
        label = fit_label(name, font, text_width)
        values = reader.read(chosen)
        texts = captions(source, schema, chosen, values, caption) if caption else []
        result.captions[name] = texts
        for column, (sample, stored) in enumerate(zip(chosen, values, strict=True)):
            left, top = column * cell_width + GAP // 2, row * cell_height + GAP // 2
            thumb = _thumbnail(stored, tile)
            if thumb is None:
                result.unreadable.append(sample.relpath)
                said = fit_label("unreadable", font, text_width)
                font.draw(draw, (left + LABEL_PADDING, top + tile // 2), said, (255, 80, 80))
            else:
                sheet.paste(
                    thumb, (left + (tile - thumb.width) // 2, top + (tile - thumb.height) // 2)
                )
            font.draw(draw, (left + LABEL_PADDING, top + tile + 2), label, (240, 240, 240))
            text = texts[column] if texts else None
            for n, line in enumerate(wrap_caption(text or "", font, text_width)):
                at = (left + LABEL_PADDING, top + tile + 2 + LABEL_HEIGHT * (n + 1))
                font.draw(draw, at, line, (200, 200, 150))
    sheet.save(out, format="PNG")
    font.warn_missing()
    return result


def _thumbnail(stored: Stored, tile: int) -> Image.Image | None:
    """The image fitted into ``tile`` x ``tile``, or None if it cannot be decoded."""
    if isinstance(stored, WithFields):
        stored = stored.image
    if isinstance(stored, str):
        return None
    try:
        pixels = stored if isinstance(stored, np.ndarray) else readers.decode_image(stored)
    except ValueError:
        return None
    image = Image.fromarray(pixels)
    image.thumbnail((tile, tile))
    return image
