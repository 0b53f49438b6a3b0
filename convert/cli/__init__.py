"""The ``imgpack`` command: one module per command group (``convert``, ``info``/``verify``,
``diff``, ``inspect``, ``bench``/``tune``) that parses and reports; the work is in the
library. A user's mistake or a storage fault becomes an exit code in ``convert.cli.errors``
only.

A command's module is imported when that command runs (Click's lazily loaded subcommands),
so that ``imgpack --help`` and ``--version`` start without importing torch, the larger part
of a start (``tests/test_cli_startup.py``).
"""

from __future__ import annotations

import importlib
import logging

import click

from convert.cli.errors import ImgpackGroup
from readers import __version__

__all__ = ["COMMANDS", "main"]

COMMANDS = {
    "convert": (
        "convert.cli.convert",
        "Convert an image folder or dataset into pt, hdf5, lmdb or wds.",
    ),
    "info": ("convert.cli.dataset", "Show what a dataset holds: format, classes, shards."),
    "verify": ("convert.cli.dataset", "Check that a dataset is intact (sizes, SHA-256s, samples)."),
    "diff": ("convert.cli.diff", "Compare two datasets: samples, labels, classes and pixels."),
    "inspect": ("convert.cli.inspect", "Summarize a dataset or folder; draw a contact sheet."),
    "bench": ("convert.cli.measure", "Measure which backend reads fastest on this machine."),
    "tune": ("convert.cli.measure", "Measure which DataLoader settings keep the GPU busy."),
}
"""Each command: the module that defines it (under the command's own name) and the line
``imgpack --help`` lists it with, read without importing that module."""


class LazyGroup(ImgpackGroup):
    """Loads a command from its module in :data:`COMMANDS` only when it is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        command = getattr(importlib.import_module(COMMANDS[cmd_name][0]), cmd_name)
        return command if isinstance(command, click.Command) else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, COMMANDS[name][1]) for name in self.list_commands(ctx)])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
    if not debug:
        # A storage fault leaves fsspec's event loop with requests it never collects;
        # asyncio logs each ("Task exception was never retrieved", a traceback) after the
        # fault's own one-line error.
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
