"""The ``imgpack`` command: one module per command group (``convert``, ``info``/``verify``,
``bench``/``tune``) that parses and reports; the work is in the library. A user's mistake
or a storage fault becomes an exit code in ``convert.cli.errors`` only."""

from __future__ import annotations

import logging

import click

from convert.cli.convert import convert
from convert.cli.dataset import info, verify
from convert.cli.diff import diff
from convert.cli.errors import ImgpackGroup
from convert.cli.inspect import inspect
from convert.cli.measure import bench, tune
from readers import __version__

__all__ = ["main"]


@click.group(cls=ImgpackGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="imgpack")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Convert image folders into fast training formats and inspect the result.

    \b
    imgpack convert ~/imagenet/train /data/in1k-pt --format pt --encoding raw \\
        --resize 256 --center-crop 224
    imgpack info /data/in1k-pt
    imgpack verify /data/in1k-pt --deep
    imgpack diff /data/in1k-pt s3://bucket/in1k-wds
    imgpack inspect /data/in1k-pt --grid sheet.png
    """
    ctx.obj = {"debug": debug}
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING, format="imgpack: %(message)s"
    )


for command in (convert, info, verify, diff, inspect, bench, tune):
    main.add_command(command)
