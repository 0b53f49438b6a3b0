"""``--executor ray``: shards planned up front (``convert.executors.planned``) and written as
Ray tasks (``convert.executors.ray_tasks``, imported only when a run starts: Ray is an
optional extra, looked for with ``importlib.util.find_spec`` when the run is checked)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from convert.executors.planned import PlannedLedger, ShardPlan, resumable_planned
from convert.job import Job, bad_input
from convert.journal import JournalStore, ShardEntry
from convert.ledger import Publish
from convert.options import ConvertOptions
from convert.samples import SampleTable

__all__ = ["RAY_HINT", "RayExecutor"]

RAY_HINT = (
    "--executor ray needs Ray: pip install -e '.[ray]' in the imgpack checkout "
    "(or pip install 'ray>=2.9')"
)


class RayExecutor:
    """One run on a Ray cluster: every shard planned from the sample list, written by its
    own tasks in any order; a resume keeps every completed shard of the same plan."""

    def __init__(
        self, options: ConvertOptions, samples: SampleTable, ray_address: str | None
    ) -> None:
        self.plan = ShardPlan.of(options, samples)
        self.ray_address = ray_address
        self._ledger: PlannedLedger | None = None

    @staticmethod
    def check(options: ConvertOptions, workers: int | None, ray_address: str | None) -> None:
        if importlib.util.find_spec("ray") is None:  # looked for, not imported
            raise ValueError(RAY_HINT)
        if options.shard_bytes:
            raise ValueError(
                "--shard-bytes cannot be planned before the images are prepared: with "
                "--executor ray shards are planned by count; use --shard-size N (N = SIZE / "
                "bytes per sample)"
            )
        if ray_address and workers:
            raise ValueError(
                "--workers sizes a new local Ray instance; the cluster at --ray-address has "
                "its own CPUs: drop --workers"
            )

    def header(self) -> dict[str, Any]:
        return {"plan": self.plan.header()}

    def resumable(
        self,
        journal: JournalStore,
        header: dict[str, Any],
        verifies: Callable[[ShardEntry], bool],
    ) -> list[ShardEntry]:
        return resumable_planned(journal, header, self.plan, verifies)

    def start(
        self, journal: JournalStore, kept: Sequence[ShardEntry], publish: Publish
    ) -> PlannedLedger:
        self._ledger = PlannedLedger(journal, self.plan, list(kept), publish)
        return self._ledger

    def write(self, job: Job) -> int:
        """The shards the ledger lacks, as Ray tasks on the cluster at ``ray_address``
        (None: the one this process joined, else ``RAY_ADDRESS``, else a new local
        instance with ``job.workers`` CPUs); returns the cluster's CPU count."""
        from convert.executors import ray_tasks  # imports Ray

        if self._ledger is None:
            raise RuntimeError("RayExecutor.write before start")
        ledger = self._ledger
        with ray_tasks.connected(self.ray_address, job.workers) as (cpus, joined_here):
            job = replace(job, workers=cpus)
            with job.progress_bar(ledger.kept_positions()) as bar:
                error = ray_tasks.run_shards(
                    ray_tasks.ShardJob(
                        job.reader,
                        job.folder,
                        job.samples,
                        job.options.transform,
                        job.layout(),
                        job.upload,
                    ),
                    ledger,
                    stop_on_error=job.on_error == "fail",
                    cpus=cpus,
                    bar=bar,
                    cancel_on_stop=not joined_here,
                )
        if error is not None:
            raise bad_input(error, resumable=True)
        return cpus
