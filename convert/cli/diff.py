"""``imgpack diff``: parse the options, call :func:`convert.diff.diff_datasets`, report."""

from __future__ import annotations

import json

import click

from convert.cli.errors import fail
from convert.cli.options import progress_option
from convert.diff import DEFAULT_TOLERANCE, diff_datasets

__all__ = ["diff"]


@click.command()
@click.argument("a")
@click.argument("b")
@click.option(
    "--by-index",
    is_flag=True,
    help="Match samples by position instead of by source path (for datasets whose paths "
    "repeat, or were never recorded).",
)
@click.option(
    "--tolerance",
    type=float,
    default=DEFAULT_TOLERANCE,
    show_default=True,
    metavar="LEVELS",
    help="Largest mean absolute pixel difference per sample (levels of 0-255, after "
    "decoding) that still counts as the same image: JPEG at quality 75 against raw "
    "measured up to 7.1 on sample_data at 64x64; 0 asks for identical pixels.",
)
@click.option(
    "--worst",
    type=int,
    default=5,
    show_default=True,
    metavar="N",
    help="How many of the most different samples (and of each other kind of difference) to name.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON, for scripts.")
@progress_option
@click.pass_context
def diff(
    ctx: click.Context,
    a: str,
    b: str,
    by_index: bool,
    tolerance: float,
    worst: int,
    as_json: bool,
    progress: bool | None,
) -> None:
    """Compare the imgpack datasets A and B (folders or URLs, of any formats and
    encodings): the samples, matched by source path; their labels, by class name, and the
    class lists; the fields' schemas, and each field both hold (text and numbers exactly,
    json structurally, bytes and arrays by bytes), naming each sample and field that
    differ; then the pixels of each pair, decoded, within --tolerance. Equal content
    checksums and schemas answer without decoding, once each shard's size and SHA-256
    match its manifest (as imgpack verify checks them).

    Exits with status 0 when the two are equivalent, 1 when they differ, 2 on an error
    (a dataset that cannot be read, or a shard that is not what its manifest says).
    """
    try:
        report = diff_datasets(
            a, b, by_index=by_index, tolerance=tolerance, worst=worst, progress=progress
        )
    except (ValueError, OSError) as e:
        fail(ctx, e, exit_code=2)
    click.echo(json.dumps(report.to_json(), indent=1) if as_json else report.summary(worst))
    ctx.exit(0 if report.equivalent else 1)
