"""Where a conversion's samples are prepared and its shards written (``--executor``).

``local``: a process pool on this machine (``convert.executors.local``), shards written in
sample order. ``ray``: shards planned up front (``convert.executors.planned``) and written
as Ray tasks (``convert.executors.ray_tasks``, the only module that imports Ray).
"""

from __future__ import annotations

import importlib.util

from convert.executors.local import WorkerDiedError
from convert.options import ConvertOptions

__all__ = ["EXECUTORS", "RAY_HINT", "WorkerDiedError", "check_executor"]

EXECUTORS = ("local", "ray")
RAY_HINT = (
    "--executor ray needs Ray: pip install -e '.[ray]' in the imgpack checkout "
    "(or pip install 'ray>=2.9')"
)


def check_executor(
    executor: str, ray_address: str | None, options: ConvertOptions, workers: int | None
) -> None:
    """Refuse, before anything is touched, what the executor cannot do."""
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}: choose from {EXECUTORS}")
    if executor != "ray":
        if ray_address:
            raise ValueError("--ray-address needs --executor ray")
        return
    if importlib.util.find_spec("ray") is None:  # an optional extra: looked for, not imported
        raise ValueError(RAY_HINT)
    if options.shard_bytes:
        raise ValueError(
            "--shard-bytes cannot be planned before the images are prepared: with --executor "
            "ray shards are planned by count; use --shard-size N (N = SIZE / bytes per sample)"
        )
    if ray_address and workers:
        raise ValueError(
            "--workers sizes a new local Ray instance; the cluster at --ray-address has its "
            "own CPUs: drop --workers"
        )
