"""Where a conversion's samples are prepared and its shards written (``--executor``).

``local``: a process pool on this machine (``convert.executors.pool``), shards written in
sample order (``convert.executors.local``). ``ray``: shards planned up front
(``convert.executors.planned``) and written as Ray tasks (``convert.executors.ray``; its
tasks in ``convert.executors.ray_tasks``, the only module that imports Ray). Each is an
:class:`Executor`, chosen by name from :data:`EXECUTORS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from convert.executors.local import LocalExecutor
from convert.executors.pool import WorkerDiedError
from convert.executors.ray import RAY_HINT, RayExecutor
from convert.job import Job
from convert.journal import JournalStore, ShardEntry
from convert.ledger import Ledger, Publish
from convert.options import ConvertOptions
from convert.samples import SampleTable

__all__ = ["EXECUTORS", "RAY_HINT", "Executor", "WorkerDiedError", "check_executor"]


class Executor(Protocol):
    """One run's way of preparing the samples and writing the shards, made once the source
    is scanned; the pipeline calls ``header``, ``resumable``, ``start`` and ``write`` in
    that order."""

    def __init__(
        self, options: ConvertOptions, samples: SampleTable, ray_address: str | None
    ) -> None: ...

    @staticmethod
    def check(options: ConvertOptions, workers: int | None, ray_address: str | None) -> None:
        """Refuse, before anything is touched, what this executor cannot do."""
        ...

    def header(self) -> dict[str, Any]:
        """What the journal's header records of this run's shards (a resume compares it)."""
        ...

    def resumable(
        self,
        journal: JournalStore,
        header: dict[str, Any],
        verifies: Callable[[ShardEntry], bool],
    ) -> list[ShardEntry]:
        """The completed shards of the interrupted run in ``journal`` that this run keeps:
        those that ``verifies`` (their files are the ones recorded) over unchanged sources."""
        ...

    def start(self, journal: JournalStore, kept: Sequence[ShardEntry], publish: Publish) -> Ledger:
        """The run's bookkeeping, from the ``kept`` shards on: each shard written is then
        published (an upload, for a bucket DST) and journaled."""
        ...

    def write(self, job: Job) -> int:
        """Write every shard the ledger lacks; returns how many CPUs prepared samples."""
        ...


EXECUTORS: dict[str, type[Executor]] = {"local": LocalExecutor, "ray": RayExecutor}


def check_executor(
    executor: str, ray_address: str | None, options: ConvertOptions, workers: int | None
) -> None:
    """Refuse, before anything is touched, an unknown executor or what it cannot do."""
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}: choose from {tuple(EXECUTORS)}")
    EXECUTORS[executor].check(options, workers, ray_address)
