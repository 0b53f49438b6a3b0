"""``--executor local``: a process pool on this machine prepares the samples
(``convert.executors.pool``) and this process writes them, in sample order, so the output
does not depend on ``workers``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from convert.executors.pool import prepared_in_order
from convert.job import Job, bad_input
from convert.journal import JournalStore, ShardEntry, resumable_entries
from convert.ledger import Publish, SequentialLedger
from convert.options import ConvertOptions
from convert.samples import SampleTable
from convert.writers import WRITERS, Record, ShardedOutput
from readers import spec

__all__ = ["LocalExecutor"]

log = logging.getLogger(__name__)


class LocalExecutor:
    """One run on this machine: a process pool prepares the samples, this process writes
    them in sample order (shards cut by ``--shard-size``/``--shard-bytes``), and a resume
    keeps the unbroken run of completed shards from the start."""

    def __init__(
        self, options: ConvertOptions, samples: SampleTable, ray_address: str | None
    ) -> None:
        self.samples = samples
        self._ledger: SequentialLedger | None = None

    @staticmethod
    def check(options: ConvertOptions, workers: int | None, ray_address: str | None) -> None:
        if ray_address:
            raise ValueError("--ray-address needs --executor ray")

    def header(self) -> dict[str, Any]:
        return {}

    def resumable(
        self,
        journal: JournalStore,
        header: dict[str, Any],
        verifies: Callable[[ShardEntry], bool],
    ) -> list[ShardEntry]:
        return resumable_entries(journal, header["options"], self.samples, verifies)

    def start(
        self, journal: JournalStore, kept: Sequence[ShardEntry], publish: Publish
    ) -> SequentialLedger:
        self._ledger = SequentialLedger(journal, list(kept), self.samples, publish)
        return self._ledger

    def write(self, job: Job) -> int:
        """The samples after the kept shards, prepared by ``job.workers`` processes."""
        if self._ledger is None:
            raise RuntimeError("LocalExecutor.write before start")
        ledger, options = self._ledger, job.options
        output = ShardedOutput(
            job.folder,
            options.format,
            WRITERS[options.format],
            job.layout(),
            *options.shard_limits(),
            done=[e.shard for e in ledger.entries],
        )
        try:
            _write_samples(job, ledger, output)
        except BaseException:
            output.abort()  # frees the space of the shard being written
            raise
        return job.workers


def _write_samples(job: Job, ledger: SequentialLedger, output: ShardedOutput) -> None:
    """The loop: each prepared sample, in order, into the output or the error list."""
    start = ledger.start
    bar = job.progress_bar(start)
    positions = range(start, len(job.samples))
    todo = map(job.samples.__getitem__, positions)  # made one at a time, not copied
    names = tuple(job.scan.fields)
    stream = prepared_in_order(job.reader, job.samples, job.options.transform, job.workers, start)
    with bar, contextlib.closing(stream):
        for position, sample, prepared in zip(positions, todo, stream, strict=True):
            bar.update()
            if isinstance(prepared, str):
                error = {"path": sample.relpath, "error": prepared}
                if job.on_error == "fail":
                    raise bad_input(error, resumable=True)
                ledger.skipped(sample, error)
                log.warning("skipped %s", prepared)
                continue
            key = spec.SAMPLE_KEY.format(ledger.written_samples)
            record = Record(
                key,
                prepared.data,
                prepared.ext,
                sample.label,
                sample.relpath,
                prepared.shape[:2],
                dict(zip(names, prepared.fields, strict=True)),
            )
            finished = output.add(record)
            if finished is not None:
                ledger.completed(finished, position)
            ledger.written(sample, record, prepared.shape)
    finished = output.close()
    if finished is not None:
        ledger.completed(finished, len(job.samples))
