"""Where samples are prepared: worker processes that read, decode, resize, crop and encode
(the local executor's pool; the Ray tasks call the same :func:`prepare_samples`).

Each chunk of samples travels to a worker with the source's reader
(:class:`convert.sources.SampleReader`: the folder they lie in, or the dataset they are
read from) and the recipe (:class:`convert.process.Transform`, which carries the
decompression-bomb limit too):
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
import dataclasses
import itertools
import os
import pickle
import signal
import sys
import tempfile
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from convert.process import Prepared, Transform, prepare
from convert.scan import Sample
from convert.sources.base import SampleReader, WithFields
from convert.temp_folders import TempFolder
from readers import spec

__all__ = ["WorkerDiedError", "prepare_samples", "prepared_in_order"]

FIRST_CHUNK = 16  # samples a task prepares, until their size is known
MAX_CHUNK = 64
CHUNK_BYTES = 4 << 20  # what a task's prepared samples should come to

_PR_SET_PDEATHSIG = 1


class WorkerDiedError(OSError):
    """A worker process died (killed, out of memory): the run stops, resumable."""


def prepare_samples(
    reader: SampleReader, transform: Transform, samples: Sequence[Sample]
) -> list[Prepared | str]:
    """Read and prepare ``samples`` in order; a bad one gives its error message, not a
    raise."""
    return [
        stored if isinstance(stored, str) else _prepare_one(stored, sample.relpath, transform)
        for sample, stored in zip(samples, reader.read(samples), strict=True)
    ]


def _prepare_into_spool(
    reader: SampleReader, transform: Transform, samples: Sequence[Sample], spool: str
) -> str:
    """:func:`prepare_samples` in a worker, its results written to a new file in ``spool``;
    returns the file's path (a short message, written to the result pipe atomically)."""
    results = prepare_samples(reader, transform, samples)
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


def _prepare_one(
    stored: bytes | np.ndarray | WithFields, name: str, transform: Transform
) -> Prepared | str:
    """The image prepared, its fields (if the reader gave any) passed on unchanged."""
    image = stored.image if isinstance(stored, WithFields) else stored
    try:
        prepared = prepare(image, name, transform)
    except ValueError as e:
        return str(e)
    if isinstance(stored, WithFields):
        return dataclasses.replace(prepared, fields=stored.fields)
    return prepared


def prepared_in_order(
    reader: SampleReader,
    samples: Sequence[Sample],
    transform: Transform,
    workers: int,
    start: int = 0,
) -> Iterator[Prepared | str]:
    """``samples[start:]`` prepared, in input order, from a process pool (or in-process for
    1 worker); chunks of them travel to the workers, the table is never copied whole."""
    chunks = _Chunks(samples, start, workers)
    if workers <= 1:  # in this process, on one core as asked: torch's threads too, once here
        torch, threads = None, 0  # torch's own count, to give back; not imported for this
        try:
            for part in chunks:
                if torch is None and "torch" in sys.modules:
                    torch = sys.modules["torch"]
                    threads = torch.get_num_threads()
                    torch.set_num_threads(1)
                yield from prepare_samples(reader, transform, part)
        finally:
            if torch is not None:
                torch.set_num_threads(threads)
        return
    spool = TempFolder("prepared")
    pool = ProcessPoolExecutor(workers, initializer=_init_worker)

    def submit(part: Sequence[Sample]) -> Future[str]:
        return pool.submit(_prepare_into_spool, reader, transform, part, spool.path)

    try:
        # A bounded window of chunks in flight: memory stays flat whatever the folder size,
        # stopping early (an error, Ctrl-C) only waits for those, and a worker that dies
        # (the OOM killer) fails the run instead of hanging it, as Pool.imap would.
        in_flight: deque[Future[str]] = deque(map(submit, itertools.islice(chunks, 4 * workers)))
        done = 0
        while in_flight:
            try:
                results = _take_from_spool(in_flight.popleft().result())
                chunks.fit(results)
                in_flight.extend(map(submit, itertools.islice(chunks, 1)))  # raises once one died
            except BrokenProcessPool as e:
                raise WorkerDiedError(
                    f"a worker process died while preparing {samples[start + done].relpath} or "
                    "the files "
                    "after it (killed, or out of memory?): rerun with --resume"
                ) from e
            done += len(results)
            yield from results
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # waits for the chunks running now
        spool.remove()


class _Chunks:
    """The samples from ``start`` in consecutive chunks, each of the size in force when it
    is taken: FIRST_CHUNK, then as many as come to about CHUNK_BYTES prepared. Resized JPEGs
    then travel MAX_CHUNK at a time, so that a task's fixed costs weigh less (2-worker
    conversions 1.015x as fast side by side; 64 against 16 always, 1.03-1.05x); big raw
    images one at a time, so that the spool stays small (16 of them were hundreds of MB).
    At most an eighth of a worker's share, so that a small run still spreads over the
    workers."""

    def __init__(self, samples: Sequence[Sample], start: int, workers: int) -> None:
        self.samples, self.next = samples, start
        self.most = max(1, min(MAX_CHUNK, (len(samples) - start) // (max(workers, 1) * 8)))
        self.size = min(FIRST_CHUNK, self.most)

    def __iter__(self) -> _Chunks:
        return self

    def __next__(self) -> Sequence[Sample]:
        if self.next >= len(self.samples):
            raise StopIteration
        part = self.samples[self.next : self.next + self.size]
        self.next += len(part)
        return part

    def fit(self, results: Sequence[Prepared | str]) -> None:
        """Size the chunks taken from now on by what ``results`` (one chunk's) weighed."""
        nbytes = sum(spec.sample_nbytes(r.data) for r in results if not isinstance(r, str))
        if nbytes:
            self.size = max(1, min(self.most, CHUNK_BYTES * len(results) // nbytes))


def _init_worker() -> None:
    # Parallelism comes from the worker processes: one torch thread each, whether torch came
    # with the fork or a sample's resize imports it here later (it reads the variable then).
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the CLI's handler: stop when told
    _die_with_parent()


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this worker when the main process dies (even by
    SIGKILL), so that a killed conversion leaves no orphan workers behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
