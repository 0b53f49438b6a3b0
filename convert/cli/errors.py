"""The one place where the library's errors become exit codes."""

from __future__ import annotations

from typing import NoReturn

import click

__all__ = ["ImgpackGroup", "fail", "one_line"]


class ImgpackGroup(click.Group):
    """The one place where the library's errors become exit codes: a user's mistake or a
    storage fault (ValueError, as DatasetError and StorageError are, or OSError) is a
    one-line ``Error: ...`` and exit status 1; with ``imgpack --debug``, the traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except (ValueError, OSError) as e:
            fail(ctx, e)


def fail(ctx: click.Context, error: Exception, exit_code: int = 1) -> NoReturn:
    """A user's mistake as a one-line error, or the traceback with ``imgpack --debug``
    (for a command's own errors of other kinds, too: matplotlib missing for a plot);
    ``exit_code`` for a command whose status 1 means something else (``diff``: 2)."""
    if ctx.obj and ctx.obj.get("debug"):
        raise error
    exception = click.ClickException(one_line(error))
    exception.exit_code = exit_code
    raise exception from error


def one_line(error: Exception) -> str:
    """The error's message; for one a DataLoader worker raised, which torch re-raises with
    the worker's whole traceback as its message ("Caught DatasetError in DataLoader worker
    process 0. Original Traceback ..."), the original message: its last line."""
    message = str(error)
    if not (message.startswith("Caught ") and "Original Traceback" in message):
        return message
    last = message.rstrip().rsplit("\n", 1)[-1]
    return last.split(f"{type(error).__name__}: ", 1)[-1]
