"""Options that several commands share, declared once."""

from __future__ import annotations

import click

__all__ = ["progress_option"]

progress_option = click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar [default: on when stderr is a terminal].",
)
