"""The conversion job as a plain function: claim DST, scan, write the shards, finish.

One straight path for every SRC, DST and executor: a
:class:`~convert.sources.SampleSource` (an image folder, an imgpack dataset...) gives the
samples and the reader the workers read them through; a
:class:`~convert.output.destination.Destination` (a local folder, or a bucket's through
``convert.output.remote``) says where the shards go and what is already there; an
:class:`~convert.executors.Executor` (``--executor``) prepares the samples and writes the
shards, reporting each to its :class:`~convert.ledger.Ledger`. Shards appear under their
final names only when complete, each is then recorded in a journal (``convert.journal``)
that ``resume`` starts from, and the manifest ``imgpack.json`` is written last, atomically.
"""

from __future__ import annotations

import errno
import json
import os
import random
import time
from dataclasses import asdict
from typing import Any

from convert.executors import EXECUTORS, Executor, check_executor
from convert.job import Job, bad_input
from convert.journal import same_options, source_fingerprint
from convert.ledger import Ledger
from convert.options import ON_ERROR, ConvertOptions, ConvertResult, default_workers
from convert.output.destination import (
    ERRORS_NAME,
    Destination,
    LocalDestination,
    disk_full,
    refuse_dst_at_source_url,
    write_errors,
    write_manifest,
)
from convert.output.remote import RemoteDestination
from convert.samples import SampleTable
from convert.scan import Scan
from convert.sources import SampleSource, open_source
from convert.temp_folders import sweep_temp_folders
from readers import spec
from readers.fields import Schema
from readers.storage.remote import StorageError, is_url, local_path

__all__ = ["ConversionInterrupted", "convert_folder"]


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
    """Convert ``src`` into an imgpack dataset at ``dst``: an ImageNet-layout folder, an
    imgpack dataset of any format (a folder holding ``imgpack.json``, or its URL), whose
    labels, class names and source paths carry over, WebDataset tars of other tools or
    Hugging Face Parquet files (:func:`convert.sources.open_source` says which is which).

    ``dst`` may be a URL (``s3://bucket/prefix``): the run stages each shard in
    ``staging`` (default under ``~/.cache/imgpack/staging``) and uploads it when complete,
    the manifest last, and keeps its journal in the bucket (``convert.output.remote``);
    ``storage_options`` go to fsspec. ``dst`` is claimed before ``src`` is scanned.

    Args:
        overwrite: replace what an earlier conversion wrote at ``dst``.
        resume: finish an interrupted conversion into ``dst``: keep its completed shards
            that verify and convert the rest (a complete one is left as it is).
        on_error: ``"skip"`` bad files (listed in ``errors.jsonl``) or ``"fail"`` on the
            first one, raising BadInputError.
        progress: show a tqdm bar (None: only when stderr is a terminal).
        executor: a name in :data:`convert.executors.EXECUTORS`: ``"local"`` (a process
            pool) or ``"ray"`` (planned shards as Ray tasks on the cluster at
            ``ray_address``; None: the one this process joined, else ``RAY_ADDRESS``, else
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
    destination: Destination = (
        RemoteDestination(str(dst), storage_options, staging)
        if is_url(dst)
        else LocalDestination(local_path(dst))
    )
    source = open_source(src, options.label_key, options.split)
    if is_url(dst) and is_url(source.where):
        refuse_dst_at_source_url(source.where, str(dst))
    # The destination first: a busy, forbidden or missing one is refused before the scan,
    # which takes minutes on ImageNet.
    destination.claim(source.local_folder, overwrite, resume)
    sweep_temp_folders()  # the spools and staged files of killed runs
    try:
        scan, samples = _scan(source, options)
        if on_error == "fail" and scan.problems:
            raise bad_input(scan.problems[0], resumable=False)
        run = EXECUTORS[executor](options, samples, ray_address)
        header = {
            "options": _compared(asdict(options), scan.fields),
            "source_fingerprint": source_fingerprint(samples),
            "classes": scan.classes,
            **run.header(),
        }
        if resume and destination.is_complete():
            result = _already_complete(destination, header)
        else:
            ledger = _start(run, destination, header, resume)
            job = Job(
                source=source,
                folder=destination.folder,
                options=options,
                scan=scan,
                samples=samples,
                fingerprint=header["source_fingerprint"],
                workers=workers or default_workers(),
                on_error=on_error,
                progress=progress,
                upload=destination.upload,
            )
            result = _finish(job, destination, run, ledger)
    finally:
        destination.release()
    destination.cleanup()
    return result


def _start(run: Executor, destination: Destination, header: dict[str, Any], resume: bool) -> Ledger:
    """The run's ledger, from the shards of an interrupted run that it keeps (``resume``),
    the journal started. The kept entries, with their 32 bytes a sample, are the ledger's
    to fold and drop: none stays referenced here for the rest of the run."""
    journal = destination.journal
    kept = run.resumable(journal, header, destination.verifies) if resume else []
    destination.keep_only(kept)
    journal.start(header, kept)
    return run.start(journal, kept, destination.publish)


def _compared(options: dict[str, Any], schema: Schema) -> dict[str, Any]:
    """What a resume finds unchanged: the options (JSON values) and the fields stored, by
    kind (an array's dtype and shape are only known once written)."""
    kinds = {name: field_spec.kind for name, field_spec in schema.items()}
    return json.loads(json.dumps({**options, "schema": kinds}))


def _scan(source: SampleSource, options: ConvertOptions) -> tuple[Scan, SampleTable]:
    """The source's samples, in writing order (shuffled when asked)."""
    scan = source.scan(options)
    samples = scan.samples
    if options.shuffle:
        order = list(range(len(samples)))
        random.Random(options.seed).shuffle(order)
        samples = scan.samples = samples.take(order)  # one table held, not two
    return scan, samples


def _finish(job: Job, destination: Destination, run: Executor, ledger: Ledger) -> ConvertResult:
    """Write the shards, then the manifest; on any failure, keep the completed shards for
    ``--resume`` and say so."""
    start_time = time.perf_counter()
    try:
        workers = run.write(job)
        result = _result(job, destination, ledger, time.perf_counter() - start_time)
        write_manifest(
            job.folder,
            job.options,
            job.layout(),
            ledger.entries,
            result,
            workers,
            job.fingerprint,
            ledger.content_sha256(),
            job.source.record(),
        )
        destination.finish()  # a bucket's: the errors file and the manifest, last
    except BaseException as e:
        done = ledger.entries
        if disk_full(job.folder, e):
            raise OSError(
                errno.ENOSPC,
                f"{job.folder}: no space left on device ({e}); {len(done)} completed shard(s) "
                "are kept: free some space and rerun the same command with --resume",
            ) from e
        if isinstance(e, KeyboardInterrupt) and not isinstance(e, ConversionInterrupted):
            raise ConversionInterrupted(len(done), sum(x.shard.samples for x in done)) from e
        if isinstance(e, StorageError) and destination.staged and done:
            uploaded = f"{len(done)} shard(s) are uploaded: rerun with --resume"
            raise StorageError(f"{e}; {uploaded}", url=e.url, cause=e.cause) from e
        raise
    destination.journal.remove()
    return result


def _result(job: Job, destination: Destination, ledger: Ledger, seconds: float) -> ConvertResult:
    """What the run did, with its errors (the scan's and the samples') written out."""
    errors = [*job.scan.problems, *ledger.errors]
    if errors:
        write_errors(job.folder / ERRORS_NAME, errors)
    if not ledger.entries:
        errors_file = job.folder / ERRORS_NAME
        raise ValueError(f"{job.source.where}: no image could be converted (see {errors_file})")
    return ConvertResult(
        destination.dst,
        written=ledger.written_samples,
        skipped=len(errors),
        bytes=sum(e.shard.bytes for e in ledger.entries),
        seconds=seconds,
        errors=errors,
        resumed=ledger.kept_samples,
        hidden=job.scan.hidden,
        empty_classes=job.scan.empty_classes,
    )


def _already_complete(destination: Destination, header: dict[str, Any]) -> ConvertResult:
    """The result of a ``--resume`` into a dataset that is complete: nothing to do."""
    where = destination.dst
    manifest = destination.manifest()
    recorded = _compared(manifest.options, manifest.fields)
    same_options(f"{where}/{spec.MANIFEST_NAME}", recorded, header["options"])
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
