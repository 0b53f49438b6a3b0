"""Conversion on Ray (``imgpack convert --executor ray``): planned shards as Ray tasks.

The driver (the ``imgpack convert`` process) plans the shards
(``convert.executors.planned``) and, for each, submits preparation tasks over chunks of its
samples (:func:`convert.executors.pool.prepare_samples`, the local executor's code) and one
write task that receives their results and returns a
:class:`~convert.executors.planned.ShardOutcome`. Ray runs a write task where most of its
prepared samples are (its arguments' node), on any node of the cluster:

- a DST that every node mounts (or one machine's folder): the task writes the shard into
  it, renamed into place when complete;
- an object-store DST: the task writes the shard into a temporary folder of its node
  (``TMPDIR``), uploads it and its sidecars from there with that node's credentials and
  the run's storage options (:class:`convert.output.remote.ShardUploader`), and returns what
  the journal records of the objects. No shard passes through the driver, whose network link
  would otherwise carry every output byte of the cluster.

The driver journals each completed shard only once it is in place (uploaded) and writes the
manifest last. A few shards are in flight at a time, enough to keep every CPU of the
cluster busy, so the object store holds a bounded number of prepared samples whatever the
folder's size.

Failures: a task that raises or whose worker dies is run again by Ray (``max_retries``);
a bad image is an error string, recorded (``skip``) or stopping the run (``fail``: the
remaining tasks end with the run's Ray job, or are cancelled inside a caller's ``ray.init``,
see :func:`run_shards`); a driver that dies leaves its journaled shards for ``--resume``.

This module imports Ray; ``convert.pipeline`` imports it only for ``--executor ray``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import ray
import torch
from ray.exceptions import RayError, RayTaskError
from tqdm import tqdm

from convert.executors.planned import PlannedLedger, ShardOutcome, ShardTask, write_shard
from convert.executors.pool import WorkerDiedError, prepare_samples
from convert.output.destination import Upload
from convert.process import Prepared, Transform
from convert.samples import Sample, SampleTable
from convert.sources import SampleReader
from convert.temp_folders import TempFolder, sweep_temp_folders
from convert.writers import Layout

__all__ = ["ShardJob", "connected", "run_shards"]

CHUNK = 64  # files per preparation task: 64 decodes outweigh Ray's cost per task
RETRIES = 3  # runs of a task after the first, when its worker died or it raised OSError
CANCEL_WAIT_S = 10.0  # how long a stopping run waits for cancelled writes to clean up

log = logging.getLogger(__name__)


@contextlib.contextmanager
def connected(address: str | None, cpus: int | None) -> Iterator[tuple[int, bool]]:
    """Ray for one run: the instance this process already joined (``ray.init`` by the
    caller), the cluster at ``address`` (or ``RAY_ADDRESS``), or a new local instance with
    ``cpus`` CPUs. Yields the cluster's CPU count, and whether this run joined Ray itself:
    it then leaves afterwards, which ends its job and so every task still running."""
    started = not ray.is_initialized()
    address = address or os.environ.get("RAY_ADDRESS")
    on_sigterm = signal.getsignal(signal.SIGTERM)
    if started and address:
        ray.init(address=address)
    elif started:
        ray.init(num_cpus=cpus, include_dashboard=False)
    if started and threading.current_thread() is threading.main_thread():
        # ray.init replaces the SIGTERM handler with one that ends the process on the spot:
        # keep the caller's (the CLI's stops the run as Ctrl-C does)
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield max(1, int(ray.cluster_resources().get("CPU", 1))), started
    finally:
        if started:
            ray.shutdown()


@dataclass(frozen=True)
class ShardJob:
    """What every shard of a run shares: where the samples come from and go, and the recipe."""

    reader: SampleReader
    dst: Path  # the folder the write tasks write into, unless they upload
    samples: SampleTable
    transform: Transform
    layout: Layout
    upload: Upload | None  # a bucket DST's: each write task uploads its shard from its node


def run_shards(
    job: ShardJob,
    ledger: PlannedLedger,
    *,
    stop_on_error: bool,
    cpus: int,
    bar: tqdm,
    cancel_on_stop: bool,
) -> dict[str, str] | None:
    """Write every shard ``ledger`` still lacks, as Ray tasks, reporting each to it (and
    ``bar``). Returns the first bad file's error when ``stop_on_error``, else None.

    A run that stops early (that error, Ctrl-C, any exception) cancels the tasks still
    running when ``cancel_on_stop``: on a Ray instance the caller joined, whose job goes on.
    Otherwise the run's own job ends as it leaves Ray, and its tasks with it: ``ray.cancel``
    of a task that is completing can end the driver process (Ray 2.60's check "Tried to
    complete task that was not pending", seen here on about 1 stop in 10 under load)."""
    plan = ledger.plan
    chunk = min(CHUNK, plan.size)
    retry = {"max_retries": RETRIES, "retry_exceptions": [OSError]}  # I/O can be transient
    prepare = ray.remote(num_cpus=1, **retry)(_prepare)
    # Writing is I/O and hashing, ~1% of the work: it takes no CPU slot from preparation,
    # as the local executor's main process takes none from its workers.
    write = ray.remote(num_cpus=0, **retry)(_write)
    # Absolute paths: a task's working directory is not the driver's.
    folder = os.path.abspath(job.dst)
    running: dict[ray.ObjectRef, list[ray.ObjectRef]] = {}  # write task -> its preparations

    def submit(index: int) -> None:
        task = plan.task(index, job.samples, folder, job.layout, stop_on_error)
        chosen = job.samples[task.start : task.start + len(task.relpaths)]
        parts = [
            prepare.remote(job.reader, job.transform, chosen[i : i + chunk])
            for i in range(0, len(chosen), chunk)
        ]
        running[write.remote(task, job.upload, *parts)] = parts

    todo = iter(ledger.todo())
    in_flight = max(2, math.ceil(2 * cpus * chunk / plan.size))  # 2 chunks per CPU queued
    try:
        for index in itertools.islice(todo, in_flight):
            submit(index)
        while running:
            [ref], _ = ray.wait(list(running), num_returns=1)
            del running[ref]
            outcome = _outcome(ref)
            if stop_on_error and outcome.tally.errors:
                return outcome.tally.errors[0]
            if outcome.shard is not None:
                how = "written and uploaded" if outcome.stored is not None else "written"
                log.debug("%s %s on Ray node %s", outcome.shard.path, how, outcome.node)
            ledger.completed(outcome)
            bar.update(len(plan.span(outcome.index)))
            for index in itertools.islice(todo, 1):
                submit(index)
    finally:
        if cancel_on_stop:
            _cancel(running)
    return None


def _prepare(
    reader: SampleReader, transform: Transform, samples: list[Sample]
) -> list[Prepared | str]:
    torch.set_num_threads(1)  # parallelism comes from the tasks
    return prepare_samples(reader, transform, samples)


def _write(task: ShardTask, upload: Upload | None, *parts: list[Prepared | str]) -> ShardOutcome:
    """Write one shard into ``task.folder``, or, with ``upload``, into a temporary folder of
    this node and upload it from there (the folder is removed, whatever happens)."""
    prepared = itertools.chain.from_iterable(parts)
    if upload is None:
        outcome = write_shard(task, prepared)
    else:
        sweep_temp_folders()  # what killed tasks left on this node (the driver's sweeps its own)
        folder = TempFolder("shard")
        try:
            outcome = write_shard(replace(task, folder=folder.path), prepared)
            if outcome.shard is not None:
                outcome.stored = upload(Path(folder.path), outcome.shard)
        finally:
            folder.remove()
    outcome.node = ray.get_runtime_context().get_node_id()
    return outcome


def _outcome(ref: ray.ObjectRef) -> ShardOutcome:
    """A write task's result; its own exception (an OSError: a full disk...) once Ray's
    retries are spent, or WorkerDiedError when its worker kept dying."""
    try:
        return ray.get(ref)
    except RayTaskError as e:
        raise (e.cause if isinstance(e.cause, Exception) else e) from None
    except RayError as e:
        raise WorkerDiedError(f"a Ray task failed ({e}): rerun with --resume") from e


def _cancel(running: dict[ray.ObjectRef, list[ray.ObjectRef]]) -> None:
    """Cancel the tasks of a stopping run and give the writes a moment to remove their
    temporary files (a write cancelled while running stops with KeyboardInterrupt)."""
    if not running:
        return
    for write, parts in running.items():
        for ref in (write, *parts):
            ray.cancel(ref)
    writes = list(running)
    ready, _ = ray.wait(writes, num_returns=len(writes), timeout=CANCEL_WAIT_S)
    for ref in ready:  # retrieved, so that Ray does not report them as unhandled errors
        with contextlib.suppress(RayError):
            ray.get(ref)
