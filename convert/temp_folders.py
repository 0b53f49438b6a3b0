"""The temporary folders a conversion keeps its intermediate files in (the process pool's
spool, a foreign source's span tables and staged images, a Ray task's shard before upload),
and the sweep that removes those a killed conversion left behind.

A run removes its folders when it ends, but a SIGKILL (the OOM killer, ``kill -9``, a lost
node) ends it without a word, and each kill used to leave its folders in the temporary
directory for good. So each folder is held by an exclusive ``flock`` of the process that made
it, for as long as the folder lives: the kernel drops the lock when that process and the
workers it forked are gone, however they died. A folder of ours whose lock can be taken
belongs to no one, and :func:`sweep_temp_folders`, called as each conversion starts, removes
it (locks work across processes of one kernel, so two conversions never take each other's).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

__all__ = ["PREFIX", "make_temp_folder", "remove_temp_folder", "sweep_temp_folders"]

PREFIX = "imgpack-"
"""Every temporary folder's name starts so: ``imgpack-<kind>-<random>``."""

GRACE_SECONDS = 60.0
"""A folder changed less than this long ago is never swept: between ``mkdtemp`` and its
``flock`` a new folder is briefly unlocked."""

_HELD: dict[str, int] = {}  # folder -> the descriptor whose flock holds it


def make_temp_folder(kind: str, where: str | None = None) -> str:
    """A new folder ``imgpack-<kind>-*`` in ``where`` (None: the temporary directory),
    held by this process (and the processes it forks) until :func:`remove_temp_folder`."""
    folder = tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-", dir=where)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new: no one else can hold it yet
    _HELD[folder] = fd
    return folder


def remove_temp_folder(folder: str | os.PathLike[str]) -> None:
    """Remove a folder :func:`make_temp_folder` made, then let go of its lock."""
    shutil.rmtree(folder, ignore_errors=True)
    fd = _HELD.pop(os.fspath(folder), None)
    if fd is not None:
        os.close(fd)


def sweep_temp_folders(where: str | None = None) -> list[Path]:
    """Remove the folders of ours in ``where`` (None: the temporary directory) that no
    process holds: this user's, unchanged for :data:`GRACE_SECONDS`, their lock free.
    Returns the folders removed. Anything that cannot be looked at is left alone."""
    root = Path(where or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        candidates = [p for p in root.iterdir() if p.name.startswith(PREFIX)]
        for folder in candidates:
            if _abandoned(folder, time.time()):
                removed.append(folder)
    return removed


def _abandoned(folder: Path, now: float) -> bool:
    """Whether ``folder`` was left by a dead process; if so it is removed, under its lock."""
    try:
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        if now - info.st_mtime < GRACE_SECONDS:
            return False
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: a live conversion's
        os.close(fd)
        return False
    try:
        shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(fd)
    return not folder.exists()
