"""Options that several commands share, declared once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

__all__ = ["chosen_fields", "field_options", "progress_option"]

progress_option = click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar [default: on when stderr is a terminal].",
)


def field_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--fields``, ``--no-fields`` and ``--metadata``: what a sample carries beside its
    image and label (readers.open_dataset(..., fields=...) reads them back)."""
    for option in reversed(
        (
            click.option(
                "--fields",
                metavar="A,B",
                help="Keep only these fields (comma-separated names) of what the source "
                "carries beside the image and label: a WebDataset member's extension (txt, "
                "json, caption.txt), a Parquet column, a folder's sidecar extension or "
                "--metadata column. An unknown name is an error listing those there are "
                "[default: every field].",
            ),
            click.option(
                "--no-fields",
                is_flag=True,
                help="Store images and labels only: no captions, sidecars or other columns.",
            ),
            click.option(
                "--metadata",
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                help="For an image folder: a CSV, JSON lines (.jsonl) or Parquet file of "
                "fields, one row per image, its 'path' column relative to SRC; each other "
                "column becomes a field. Kinds: a CSV column is int if every non-empty cell "
                "is an integer, else float if every one is a number, else text (an empty "
                "cell: missing); JSON lines: strings text, integers int, other numbers float, "
                "lists and objects json; Parquet: by column type. A row naming no image is a "
                "bad row (--on-error); an image with no row has those fields missing (read "
                "back as None); a column whose values mix kinds is an error naming both.",
            ),
        )
    ):
        command = option(command)
    return command


def chosen_fields(fields: str | None, no_fields: bool) -> tuple[str, ...] | None:
    """ConvertOptions.fields from ``--fields``/``--no-fields``: None keeps every field."""
    if fields is not None and no_fields:
        raise click.UsageError("--fields and --no-fields exclude each other: choose one")
    if no_fields:
        return ()
    if fields is None:
        return None
    names = tuple(name.strip() for name in fields.split(",") if name.strip())
    if not names:
        raise click.UsageError("--fields: give at least one field name (or use --no-fields)")
    return names
