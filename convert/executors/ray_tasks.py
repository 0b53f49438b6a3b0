"""Conversion on Ray (``imgpack convert --executor ray``): planned shards as Ray tasks.

The driver (the ``imgpack convert`` process) plans the shards
(``convert.executors.planned``) and, for each, submits preparation tasks over chunks of its
samples (:func:`convert.executors.pool.prepare_samples`, the local executor's code) and one
write task that receives their results, writes the shard into a folder it is given and
returns a :class:`~convert.executors.planned.ShardOutcome`. The driver
publishes each completed shard (``PlannedLedger.completed``: nothing to do for a DST that
every node mounts; an upload from the driver's staging folder for an object-store DST, whose
write tasks then run on the driver's node), journals it, and writes the manifest last. A
few shards are in flight at a time, enough to keep every CPU of the cluster busy, so the
object store holds a bounded number of prepared samples whatever the folder's size.

Failures: a task that raises or whose worker dies is run again by Ray (``max_retries``);
a bad image is an error string, recorded (``skip``) or stopping the run (``fail``: the
remaining tasks are cancelled); a driver that dies leaves its journaled shards for
``--resume``.

This module imports Ray; ``convert.pipeline`` imports it only for ``--executor ray``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import ray
import torch
from ray.exceptions import RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tqdm import tqdm

from convert.executors.planned import PlannedLedger, ShardOutcome, ShardTask, write_shard
from convert.executors.pool import WorkerDiedError, prepare_samples
from convert.process import Prepared, Transform
from convert.scan import Sample
from convert.sources import SampleReader
from convert.writers import Layout

__all__ = ["ShardJob", "connected", "run_shards"]

CHUNK = 64  # files per preparation task: ~0.5 s of work, so Ray's cost per task is noise
RETRIES = 3  # runs of a task after the first, when its worker died or it raised OSError
CANCEL_WAIT_S = 10.0  # how long a stopping run waits for cancelled writes to clean up


@contextlib.contextmanager
def connected(address: str | None, cpus: int | None) -> Iterator[int]:
    """Ray for one run: the instance this process already joined (``ray.init`` by the
    caller), the cluster at ``address`` (or ``RAY_ADDRESS``), or a new local instance with
    ``cpus`` CPUs (only that one is shut down afterwards). Yields the cluster's CPU count."""
    started = not ray.is_initialized()
    address = address or os.environ.get("RAY_ADDRESS")
    on_sigterm = signal.getsignal(signal.SIGTERM)
    if started and address:
        ray.init(address=address)
    elif started:
        ray.init(num_cpus=cpus, include_dashboard=False)
    if started and threading.current_thread() is threading.main_thread():
        # ray.init replaces the SIGTERM handler with one that ends the process on the spot:
        # keep the caller's (the CLI's stops the run as Ctrl-C does, cancelling the tasks)
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield max(1, int(ray.cluster_resources().get("CPU", 1)))
    finally:
        if started:
            ray.shutdown()


@dataclass(frozen=True)
class ShardJob:
    """What every shard of a run shares: where the samples come from and go, and the recipe."""

    reader: SampleReader
    dst: Path  # the folder the write tasks write into (a remote DST's staging folder)
    samples: list[Sample]
    transform: Transform
    layout: Layout


def run_shards(
    job: ShardJob,
    ledger: PlannedLedger,
    *,
    stop_on_error: bool,
    writes_here: bool,
    cpus: int,
    bar: tqdm,
) -> dict[str, str] | None:
    """Write every shard ``ledger`` still lacks, as Ray tasks, reporting each to it (and
    ``bar``); ``writes_here`` runs the write tasks on this node (the folder is local to
    it). Returns the first bad file's error when ``stop_on_error`` (the tasks still
    running are cancelled first), else None."""
    plan = ledger.plan
    chunk = min(CHUNK, plan.size)
    retry = {"max_retries": RETRIES, "retry_exceptions": [OSError]}  # I/O can be transient
    prepare = ray.remote(num_cpus=1, **retry)(_prepare)
    # Writing is I/O and hashing, ~1% of the work: it takes no CPU slot from preparation,
    # as the local executor's main process takes none from its workers.
    write = ray.remote(num_cpus=0, **retry)(_write)
    if writes_here:
        node = ray.get_runtime_context().get_node_id()
        write = write.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, False))
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
        running[write.remote(task, *parts)] = parts

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
            ledger.completed(outcome)
            bar.update(len(plan.span(outcome.index)))
            for index in itertools.islice(todo, 1):
                submit(index)
    finally:
        _cancel(running)
    return None


def _prepare(
    reader: SampleReader, transform: Transform, samples: list[Sample]
) -> list[Prepared | str]:
    torch.set_num_threads(1)  # parallelism comes from the tasks
    return prepare_samples(reader, transform, samples)


def _write(task: ShardTask, *parts: list[Prepared | str]) -> ShardOutcome:
    return write_shard(task, itertools.chain.from_iterable(parts))


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
