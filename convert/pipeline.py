"""The conversion job as a plain function: scan, prepare in parallel, write in order.

Worker processes read, decode, resize, crop and encode; the main process only writes, in
sample order, so the output does not depend on ``workers``. Shards appear under their final
names only when complete, each is then recorded in a journal (``convert.journal``) that
``resume`` starts from, and the manifest ``imgpack.json`` is written last, atomically.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from convert.destination import (
    ERRORS_NAME,
    claim_destination,
    delete_written,
    disk_full,
    refuse_dst_in_src,
    write_errors,
    write_manifest,
)
from convert.executors import check_executor
from convert.executors.local import WorkerDiedError, prepared_in_order
from convert.executors.planned import PlannedLedger, ShardPlan, resumable_planned
from convert.journal import (
    Journal,
    Ledger,
    ShardEntry,
    resumable_entries,
    same_options,
    shard_files,
    source_fingerprint,
)
from convert.options import (
    ON_ERROR,
    ConvertOptions,
    ConvertResult,
    default_workers,
)
from convert.remote import RemoteDestination
from convert.scan import Sample, Scan, scan_source
from convert.writers import WRITERS, Layout, Record, ShardedOutput
from readers import spec
from readers.manifest import load_manifest
from readers.storage.remote import StorageError, is_url, local_path

__all__ = ["BadInputError", "ConversionInterrupted", "WorkerDiedError", "convert_folder"]

log = logging.getLogger(__name__)


class BadInputError(ValueError):
    """A source file could not be converted and ``on_error="fail"`` stops the run."""


class ConversionInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the run; the completed shards are kept for ``--resume``."""

    def __init__(self, shards: int, samples: int) -> None:
        super().__init__(f"{shards} shard(s) with {samples} samples are complete")
        self.shards, self.samples = shards, samples


# --- the job ------------------------------------------------------------------------------
def convert_folder(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    options: ConvertOptions,
    workers: int | None = None,
    overwrite: bool = False,
    resume: bool = False,
    on_error: str = "skip",
    progress: bool | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    staging: str | os.PathLike[str] | None = None,
    executor: str = "local",
    ray_address: str | None = None,
) -> ConvertResult:
    """Convert the ImageNet-layout folder ``src`` into an imgpack dataset at ``dst``.

    ``dst`` may be a URL (``s3://bucket/prefix``): the run stages each shard in
    ``staging`` (default under ``~/.cache/imgpack/staging``) and uploads it when complete,
    the manifest last, and keeps its journal in the bucket (``convert.remote``);
    ``storage_options`` go to fsspec. ``dst`` is claimed before ``src`` is scanned.

    Args:
        overwrite: replace what an earlier conversion wrote at ``dst``.
        resume: finish an interrupted conversion into ``dst``: keep its completed shards
            that verify and convert the rest (a complete one is left as it is).
        on_error: ``"skip"`` bad files (listed in ``errors.jsonl``) or ``"fail"`` on the
            first one, raising BadInputError.
        progress: show a tqdm bar (None: only when stderr is a terminal).
        executor: ``"local"`` (a process pool) or ``"ray"``: planned shards as Ray tasks
            (``convert.executors.planned``, ``convert.executors.ray_tasks``) on the cluster at
            ``ray_address`` (None: the one this process joined, else ``RAY_ADDRESS``, else
            a new local instance with ``workers`` CPUs).

    Raises:
        ValueError, FileNotFoundError, FileExistsError: with the bad input and the fix.
        OSError: a write failed; on a full disk the message says how to resume.
        StorageError: the object store could not be used (the URL and the cause, and how
            many shards are uploaded for ``resume``).
    """
    options.validate()
    if on_error not in ON_ERROR:
        raise ValueError(f"unknown on_error {on_error!r}: choose from {ON_ERROR}")
    if overwrite and resume:
        raise ValueError("--overwrite and --resume exclude each other: choose one")
    check_executor(executor, ray_address, options, workers)
    remote = RemoteDestination(str(dst), storage_options, staging) if is_url(dst) else None
    src = Path(src)
    dst = remote.staging if remote is not None else local_path(dst)
    if remote is None:
        refuse_dst_in_src(src, dst)
    workers = workers or default_workers()
    ours = remote is not None or not dst.exists()  # a folder this run may remove if empty
    # The destination first: a busy, forbidden or missing one is refused before the scan,
    # which takes minutes on ImageNet.
    lock = remote.claim(overwrite, resume) if remote else claim_destination(dst, overwrite, resume)
    try:
        scan, samples = _scan(src, options)
        if on_error == "fail" and scan.problems:
            raise _bad_input(scan.problems[0], resumable=False)
        header = {
            "options": json.loads(json.dumps(asdict(options))),
            "source_fingerprint": source_fingerprint(samples),
            "classes": scan.classes,
        }
        plan = ShardPlan.of(options, samples) if executor == "ray" else None
        if plan is not None:
            header["plan"] = plan.header()
        complete = remote.is_complete() if remote else (dst / spec.MANIFEST_NAME).is_file()
        if resume and complete:
            return _already_complete(dst, header, remote)
        journal = remote.journal if remote else Journal(dst)
        verifies = remote.verifies if remote else lambda entry: entry.verifies(dst)
        if not resume:
            kept = []
        elif plan is not None:
            kept = resumable_planned(journal, header, plan, verifies)
        else:
            kept = resumable_entries(journal, header["options"], samples, verifies)
        delete_written(dst, keep={spec.LOCK_NAME, *_files_of(kept)})
        if remote is not None:
            remote.keep_only(kept)
        journal.start(header, kept)
        fingerprint = header["source_fingerprint"]
        job = _Job(
            src, dst, options, scan, samples, fingerprint, workers, on_error, progress, remote
        )
        publish = remote.publish if remote else None
        if plan is not None:
            result = _run_on_ray(job, PlannedLedger(journal, plan, kept, publish), ray_address)
        else:
            result = _run(job, Ledger(journal, kept, samples, publish))
    finally:
        lock.release()
        if ours and dst.is_dir() and not any(dst.iterdir()):
            dst.rmdir()  # refused, or failed before writing anything
    if remote is not None:
        shutil.rmtree(remote.staging, ignore_errors=True)  # (after the lock inside it)
        result.dst = remote.url
    return result


def _scan(src: Path, options: ConvertOptions) -> tuple[Scan, list[Sample]]:
    """The source's samples, in writing order (shuffled when asked)."""
    scan = scan_source(
        src,
        include_hidden=options.include_hidden,
        classes=options.classes,
        labels_file=Path(options.labels_file) if options.labels_file else None,
        unlabeled=options.unlabeled,
    )
    samples = scan.samples
    if options.shuffle:
        order = list(range(len(samples)))
        random.Random(options.seed).shuffle(order)
        samples = [samples[i] for i in order]
    return scan, samples


def _files_of(entries: list[ShardEntry]) -> list[str]:
    return [name for e in entries for name in shard_files(e.shard)]


def _bad_input(error: dict[str, str], resumable: bool) -> BadInputError:
    how = "rerun with --resume" if resumable else "rerun"
    return BadInputError(
        f"{error['error']} [stopped by --on-error fail: fix or remove {error['path']} and "
        f"{how}{'' if resumable else ', or use --on-error skip'}]"
    )


@dataclass(frozen=True)
class _Job:
    """A conversion as asked: the source's samples in writing order and how to write them."""

    src: Path
    dst: Path
    options: ConvertOptions
    scan: Scan
    samples: list[Sample]  # shuffled when asked
    fingerprint: str  # of the sample list, which --resume checks
    workers: int
    on_error: str
    progress: bool | None
    remote: RemoteDestination | None = None  # the bucket folder that ``dst`` stages for


def _run(job: _Job, ledger: Ledger) -> ConvertResult:
    """Write the samples after the kept shards in this process, then the manifest."""
    options = job.options
    output = ShardedOutput(
        job.dst,
        options.format,
        WRITERS[options.format],
        _layout(job),
        *options.shard_limits(),
        done=[e.shard for e in ledger.entries],
    )
    return _finish(job, ledger, lambda: _write_samples(job, ledger, output), output.abort)


def _run_on_ray(job: _Job, ledger: PlannedLedger, ray_address: str | None) -> ConvertResult:
    """Write the shards the ledger lacks as Ray tasks, then the manifest."""
    from convert.executors import ray_tasks  # Ray is an optional extra

    with ray_tasks.connected(ray_address, job.workers) as cpus:
        job = replace(job, workers=cpus)

        def write() -> None:
            with _progress_bar(job, ledger.kept_positions()) as bar:
                error = ray_tasks.run_shards(
                    ray_tasks.ShardJob(
                        job.src, job.dst, job.samples, job.options.transform, _layout(job)
                    ),
                    ledger,
                    stop_on_error=job.on_error == "fail",
                    writes_here=job.remote is not None,
                    cpus=cpus,
                    bar=bar,
                )
            if error is not None:
                raise _bad_input(error, resumable=True)

        return _finish(job, ledger, write, abort=lambda: None)


def _layout(job: _Job) -> Layout:
    options = job.options
    return Layout(
        options.encoding,
        options.transform.output_shape(),
        tuple(job.scan.classes),
        options.compression,
    )


def _finish(
    job: _Job,
    ledger: Ledger | PlannedLedger,
    write: Callable[[], None],
    abort: Callable[[], None],
) -> ConvertResult:
    """Run ``write`` (the shards), then write the manifest; on any failure, ``abort`` the
    shard being written and keep the completed ones for ``--resume``."""
    start_time = time.perf_counter()
    dst = job.dst
    try:
        write()
        result = _result(job, ledger, time.perf_counter() - start_time)
        write_manifest(
            job.dst,
            job.options,
            job.scan.classes,
            ledger.entries,
            result,
            job.workers,
            job.fingerprint,
        )
        if job.remote is not None:
            job.remote.finish()  # the errors file and the manifest, last
    except BaseException as e:
        abort()  # frees the space of the shard being written
        done = ledger.entries
        if disk_full(dst, e):
            raise OSError(
                errno.ENOSPC,
                f"{dst}: no space left on device ({e}); {len(done)} completed shard(s) "
                "are kept: free some space and rerun the same command with --resume",
            ) from e
        if isinstance(e, KeyboardInterrupt) and not isinstance(e, ConversionInterrupted):
            raise ConversionInterrupted(len(done), sum(x.shard.samples for x in done)) from e
        if isinstance(e, StorageError) and job.remote is not None and done:
            uploaded = f"{len(done)} shard(s) are uploaded: rerun with --resume"
            raise StorageError(f"{e}; {uploaded}", url=e.url, cause=e.cause) from e
        raise
    ledger.journal.remove()
    return result


def _write_samples(job: _Job, ledger: Ledger, output: ShardedOutput) -> None:
    """The loop: each prepared sample, in order, into the output or the error list."""
    start, options = ledger.start, job.options
    bar = _progress_bar(job, start)
    todo = job.samples[start:]
    stream = prepared_in_order(job.src, [s.relpath for s in todo], options.transform, job.workers)
    with bar, contextlib.closing(stream):
        positions = range(start, len(job.samples))
        for position, sample, prepared in zip(positions, todo, stream, strict=True):
            bar.update()
            if isinstance(prepared, str):
                error = {"path": sample.relpath, "error": prepared}
                if job.on_error == "fail":
                    raise _bad_input(error, resumable=True)
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


def _progress_bar(job: _Job, initial: int) -> tqdm:
    options = job.options
    return tqdm(
        total=len(job.samples),
        initial=initial,
        unit="img",
        desc=f"{options.format}/{options.encoding}",
        disable=None if job.progress is None else not job.progress,
        smoothing=0.1,
    )


def _result(job: _Job, ledger: Ledger | PlannedLedger, seconds: float) -> ConvertResult:
    """What the run did, with its errors (the scan's and the samples') written out."""
    errors = [*job.scan.problems, *ledger.errors]
    if errors:
        write_errors(job.dst / ERRORS_NAME, errors)
    if not ledger.entries:
        raise ValueError(f"{job.src}: no image could be converted (see {job.dst / ERRORS_NAME})")
    return ConvertResult(
        job.dst,
        written=ledger.written_samples,
        skipped=len(errors),
        bytes=sum(e.shard.bytes for e in ledger.entries),
        seconds=seconds,
        errors=errors,
        resumed=ledger.kept_samples,
        hidden=job.scan.hidden,
        empty_classes=job.scan.empty_classes,
    )


def _already_complete(
    dst: Path, header: dict[str, Any], remote: RemoteDestination | None
) -> ConvertResult:
    """The result of a ``--resume`` into a dataset that is complete: nothing to do."""
    where = remote.url if remote is not None else dst
    options = remote.folder.storage_options if remote is not None else None
    manifest = load_manifest(where, storage_options=options)
    same_options(f"{where}/{spec.MANIFEST_NAME}", manifest.options, header["options"])
    if manifest.source_fingerprint != header["source_fingerprint"]:
        raise ValueError(
            f"{where}: already complete, but the source folder's list of images has changed "
            "since: pass --overwrite to convert it again"
        )
    return ConvertResult(
        where,
        written=manifest.num_samples,
        skipped=manifest.skipped or 0,
        bytes=sum(s.bytes for s in manifest.shards),
        resumed=manifest.num_samples,
    )
