"""``imgpack inspect``: parse the options, call :mod:`convert.inspection`, report."""

from __future__ import annotations

import json
from pathlib import Path

import click

from convert.inspection import MAX_ROWS, contact_sheet, summarize

__all__ = ["inspect"]


@click.command()
@click.argument("path")
@click.option(
    "--grid",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE.png",
    help="Also draw a contact sheet into FILE.png: one row per class, --per-class seeded "
    "samples each, every tile labelled with its class name.",
)
@click.option(
    "--per-class", type=int, default=8, show_default=True, metavar="N", help="Tiles per class."
)
@click.option(
    "--classes",
    metavar="NAME,...",
    help="The classes to draw, comma-separated, in this order [default: the first "
    "--max-rows classes].",
)
@click.option(
    "--max-rows",
    type=int,
    default=MAX_ROWS,
    show_default=True,
    metavar="N",
    help="Classes drawn, one row each, when --classes does not name them.",
)
@click.option(
    "--caption",
    metavar="FIELD",
    help="With --grid: write the text field FIELD (a caption) under each tile, wrapped to "
    "the tile's width.",
)
@click.option("--tile", type=int, default=96, show_default=True, metavar="PX", help="Tile size.")
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the samples drawn and read."
)
@click.option(
    "--shape-samples",
    type=int,
    default=1000,
    show_default=True,
    metavar="N",
    help="Images whose headers give the shapes when the manifest does not fix one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def inspect(
    path: str,
    grid: Path | None,
    per_class: int,
    classes: str | None,
    caption: str | None,
    tile: int,
    max_rows: int,
    seed: int,
    shape_samples: int,
    as_json: bool,
) -> None:
    """Summarize what PATH holds, an imgpack dataset of any format (a folder or a URL) or
    a plain image folder: samples, classes, encoding, stored bytes, image shapes and their
    spread, the smallest and largest classes, the fields' schema and the first values of
    each. It reads the manifest and the index, and the headers of at most --shape-samples
    images, never decoding everything.
    """
    if caption is not None and grid is None:
        raise click.UsageError("--caption writes under the tiles of a --grid: add --grid FILE.png")
    summary = summarize(path, shape_samples=shape_samples, seed=seed)
    out, text = summary.to_json(), summary.describe()
    if grid is not None:
        chosen = [c.strip() for c in classes.split(",") if c.strip()] if classes else None
        sheet = contact_sheet(
            path,
            grid,
            per_class=per_class,
            classes=chosen,
            seed=seed,
            tile=tile,
            max_rows=max_rows,
            caption=caption,
        )
        out["grid"] = {
            "path": sheet.path,
            "size": list(sheet.size),
            "tiles": sheet.tiles,
            "classes_left_out": sheet.left_out,
            **({"caption": caption, "captions": sheet.captions} if caption else {}),
        }
        tiles = sum(map(len, sheet.tiles.values()))
        note = f"; {len(sheet.unreadable)} unreadable" if sheet.unreadable else ""
        text += f"\ngrid       {grid}: {tiles} tiles, {sheet.size[0]}x{sheet.size[1]} px{note}"
        if sheet.left_out:  # on stderr too with --json
            total = len(sheet.classes) + sheet.left_out
            capped = (
                f"grid: the first {len(sheet.classes)} of {total:,} classes, one "
                "row each: name the ones to draw with --classes NAME,... (or raise --max-rows)"
            )
            text += f"\n{capped}"
            if as_json:
                click.echo(capped, err=True)
    click.echo(json.dumps(out, indent=1) if as_json else text)
