"""The multiprocessing context of the tests of spawned DataLoader workers.

``make test`` runs them with ``spawn``: each worker a fresh interpreter that imports torch
anew, the larger part of its start. ``make check`` sets ``IMGPACK_TEST_SPAWN=forkserver``:
the workers are forked from a server process that imported torch once and nothing else, so
they start as fresh as spawn's (the dataset pickled to them, the main module imported by
path, nothing of the test's process inherited) without paying torch's import each.
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.context import BaseContext

__all__ = ["spawn_context"]


def spawn_context() -> BaseContext:
    """``spawn``, or the forkserver (torch preloaded) that ``IMGPACK_TEST_SPAWN`` asks for."""
    method = os.environ.get("IMGPACK_TEST_SPAWN", "spawn")
    if method not in ("spawn", "forkserver"):
        raise ValueError(f"IMGPACK_TEST_SPAWN={method!r}: spawn or forkserver")
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(["torch"])
    return context
