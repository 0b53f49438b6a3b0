"""``--executor local``: samples prepared by worker processes that read, decode, resize,
crop and encode, and written by this process in sample order (:class:`LocalExecutor`).

Each chunk of files travels to a worker with the folder it lies in and the recipe
(:class:`convert.process.Transform`, which carries the decompression-bomb limit too):
nothing reaches a worker through a module global or a process-wide setting, so one worker
(run in the caller's process) behaves as a pool does and leaves the caller as it was.

A worker's prepared chunk comes back as a file in a private spool folder, and only the
file's name crosses the pool's result pipe. A write of under ``PIPE_BUF`` bytes to a pipe
is atomic, so a worker killed at any moment (the OOM killer) leaves no half-written
message: with megabytes of pixels in the pipe, the pool's reader thread waited forever
for the rest of one, and the run hung instead of stopping resumably.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import os
import pickle
import signal
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import torch

from convert.job import Job, bad_input
from convert.journal import JournalStore, ShardEntry, resumable_entries
from convert.ledger import Publish, SequentialLedger
from convert.options import ConvertOptions
from convert.process import Prepared, Transform, prepare
from convert.scan import Sample
from convert.writers import WRITERS, Record, ShardedOutput
from readers import spec

__all__ = ["LocalExecutor", "WorkerDiedError", "prepare_files", "prepared_in_order"]

_PR_SET_PDEATHSIG = 1

log = logging.getLogger(__name__)


class WorkerDiedError(OSError):
    """A worker process died (killed, out of memory): the run stops, resumable."""


def prepare_files(src: str, transform: Transform, relpaths: list[str]) -> list[Prepared | str]:
    """Prepare files of ``src`` in order; a bad file gives its error message, not a raise."""
    return [_prepare_file(src, transform, relpath) for relpath in relpaths]


def _prepare_into_spool(src: str, transform: Transform, relpaths: list[str], spool: str) -> str:
    """:func:`prepare_files` in a worker, its results written to a new file in ``spool``;
    returns the file's path (a short message, written to the result pipe atomically)."""
    results = prepare_files(src, transform, relpaths)
    fd, path = tempfile.mkstemp(dir=spool, suffix=".prepared")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(results, f, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def _take_from_spool(path: str) -> list[Prepared | str]:
    """The results a worker left in ``path`` (the converter's own file: never a dataset's
    bytes), removing the file."""
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    finally:
        os.unlink(path)


def _prepare_file(src: str, transform: Transform, relpath: str) -> Prepared | str:
    try:
        with open(os.path.join(src, relpath), "rb") as f:
            data = f.read()
        if not data:
            raise ValueError(f"{relpath}: empty file")
        return prepare(data, relpath, transform)
    except OSError as e:
        return f"{relpath}: cannot read: {e.strerror or e}"
    except ValueError as e:
        return str(e)


def prepared_in_order(
    src: Path, relpaths: list[str], transform: Transform, workers: int
) -> Iterator[Prepared | str]:
    """Prepared samples in input order, from a process pool (or in-process for 1 worker)."""
    if workers <= 1:  # in this process, on one core as asked: torch's threads too
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for relpath in relpaths:
                yield _prepare_file(str(src), transform, relpath)
        finally:
            torch.set_num_threads(threads)
        return
    chunk = max(1, min(16, len(relpaths) // (workers * 8)))
    chunks = (relpaths[i : i + chunk] for i in range(0, len(relpaths), chunk))
    spool = tempfile.TemporaryDirectory(prefix="imgpack-prepared-")
    pool = ProcessPoolExecutor(workers, initializer=_init_worker)

    def submit(part: list[str]) -> Future[str]:
        return pool.submit(_prepare_into_spool, str(src), transform, part, spool.name)

    try:
        # A bounded window of chunks in flight: memory stays flat whatever the folder size,
        # stopping early (an error, Ctrl-C) only waits for those, and a worker that dies
        # (the OOM killer) fails the run instead of hanging it, as Pool.imap would.
        in_flight: deque[Future[str]] = deque(map(submit, itertools.islice(chunks, 4 * workers)))
        done = 0
        while in_flight:
            try:
                results = _take_from_spool(in_flight.popleft().result())
                in_flight.extend(map(submit, itertools.islice(chunks, 1)))  # raises once one died
            except BrokenProcessPool as e:
                raise WorkerDiedError(
                    f"a worker process died while preparing {relpaths[done]} or the files "
                    "after it (killed, or out of memory?): rerun with --resume"
                ) from e
            done += len(results)
            yield from results
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # waits for the chunks running now
        spool.cleanup()


def _init_worker() -> None:
    torch.set_num_threads(1)  # parallelism comes from the worker processes
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the CLI's handler: stop when told
    _die_with_parent()


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this worker when the main process dies (even by
    SIGKILL), so that a killed conversion leaves no orphan workers behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class LocalExecutor:
    """One run on this machine: a process pool prepares the samples, this process writes
    them in sample order (shards cut by ``--shard-size``/``--shard-bytes``), and a resume
    keeps the unbroken run of completed shards from the start."""

    def __init__(
        self, options: ConvertOptions, samples: list[Sample], ray_address: str | None
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
    todo = job.samples[start:]
    stream = prepared_in_order(
        job.src, [s.relpath for s in todo], job.options.transform, job.workers
    )
    with bar, contextlib.closing(stream):
        positions = range(start, len(job.samples))
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
            record = Record(key, prepared.data, prepared.ext, sample.label, sample.relpath)
            finished = output.add(record)
            if finished is not None:
                ledger.completed(finished, position)
            ledger.written(sample, record, prepared.shape)
    finished = output.close()
    if finished is not None:
        ledger.completed(finished, len(job.samples))
