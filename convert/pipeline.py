"""The conversion job as a plain function: scan, prepare in parallel, write in order.

Worker processes read, decode, resize, crop and encode; the main process only writes, in
sample order, so the output does not depend on ``workers``. Shards appear under their final
names only when complete, each is then recorded in a journal (``convert.journal``) that
``resume`` starts from, and the manifest ``imgpack.json`` is written last, atomically.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import itertools
import json
import logging
import os
import random
import shutil
import signal
import time
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from tqdm import tqdm

from convert.destination import (
    ERRORS_NAME,
    Journal,
    ShardEntry,
    claim_destination,
    delete_written,
    fold_sample,
    resumable_entries,
    same_options,
    source_fingerprint,
    write_errors,
    write_manifest,
)
from convert.options import (
    ON_ERROR,
    ConvertOptions,
    ConvertResult,
    default_workers,
)
from convert.process import Prepared, Transform, prepare
from convert.scan import Sample, Scan, scan_source
from convert.writers import WRITERS, Layout, Record, ShardedOutput
from readers import spec

__all__ = ["BadInputError", "WorkerDiedError", "convert_folder"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


class BadInputError(ValueError):
    """A source file could not be converted and ``on_error="fail"`` stops the run."""


class WorkerDiedError(OSError):
    """A worker process died (killed, out of memory): the run stops, resumable."""


# --- work done in each worker process ---------------------------------------------------
_worker_state: dict[str, Any] = {}


def _init_worker(src: str, transform: Transform, max_pixels: int | None) -> None:
    torch.set_num_threads(1)  # parallelism comes from the worker processes
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process handles Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the CLI's handler: stop when told
    _die_with_parent()
    if max_pixels is not None:
        Image.MAX_IMAGE_PIXELS = max_pixels
    _worker_state.update(src=src, transform=transform)


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this worker when the main process dies (even by
    SIGKILL), so that a killed conversion leaves no orphan workers behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _prepare_one(relpath: str) -> Prepared | str:
    """Prepare one file; a bad file gives its error message instead of raising."""
    path = os.path.join(_worker_state["src"], relpath)
    try:
        with open(path, "rb") as f:
            data = f.read()
        if not data:
            raise ValueError(f"{relpath}: empty file")
        return prepare(data, relpath, _worker_state["transform"])
    except OSError as e:
        return f"{relpath}: cannot read: {e.strerror or e}"
    except ValueError as e:
        return str(e)


def _prepared_stream(
    src: Path, relpaths: list[str], transform: Transform, workers: int, max_pixels: int | None
) -> Iterator[Prepared | str]:
    """Prepared samples in input order, from a process pool (or in-process for 1 worker)."""
    if workers <= 1:  # in this process, on one core as asked: torch's threads too
        threads, limit = torch.get_num_threads(), Image.MAX_IMAGE_PIXELS
        torch.set_num_threads(1)
        if max_pixels is not None:
            Image.MAX_IMAGE_PIXELS = max_pixels
        _worker_state.update(src=str(src), transform=transform)
        try:
            yield from map(_prepare_one, relpaths)
        finally:
            torch.set_num_threads(threads)
            Image.MAX_IMAGE_PIXELS = limit
        return
    chunk = max(1, min(16, len(relpaths) // (workers * 8)))
    chunks = (relpaths[i : i + chunk] for i in range(0, len(relpaths), chunk))
    pool = ProcessPoolExecutor(
        workers, initializer=_init_worker, initargs=(str(src), transform, max_pixels)
    )
    try:
        # A bounded window of chunks in flight: memory stays flat whatever the folder size,
        # stopping early (an error, Ctrl-C) only waits for those, and a worker that dies
        # (the OOM killer) fails the run instead of hanging it, as Pool.imap would.
        in_flight: deque[Future[list[Prepared | str]]] = deque()
        for part in itertools.islice(chunks, 4 * workers):
            in_flight.append(pool.submit(_prepare_chunk, part))
        done = 0
        while in_flight:
            try:
                results = in_flight.popleft().result()
                for part in itertools.islice(chunks, 1):  # submit too raises once one died
                    in_flight.append(pool.submit(_prepare_chunk, part))
            except BrokenProcessPool as e:
                raise WorkerDiedError(
                    f"a worker process died while preparing {relpaths[done]} or the files "
                    "after it (killed, or out of memory?): rerun with --resume"
                ) from e
            done += len(results)
            yield from results
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # waits for the chunks running now


def _prepare_chunk(relpaths: list[str]) -> list[Prepared | str]:
    return [_prepare_one(relpath) for relpath in relpaths]


# --- the job ------------------------------------------------------------------------------
@dataclass
class _Tally:
    """What the samples since the last completed shard add up to."""

    errors: list[dict[str, str]] = field(default_factory=list)
    per_class: Counter[int] = field(default_factory=Counter)
    shapes: set[tuple[int, ...]] = field(default_factory=set)
    digests: bytearray = field(default_factory=bytearray)


class _Ledger:
    """The resume bookkeeping of a run: the completed shards (kept ones first), the running
    digest of the sample list that each journal entry records, and the tally of the shard
    being written. The conversion loop reports to it; it writes the journal."""

    def __init__(self, journal: Journal, kept: list[ShardEntry], samples: list[Sample]) -> None:
        self.journal = journal
        self.entries = list(kept)
        self.start = kept[-1].end if kept else 0  # the position where this run starts
        self._source = hashlib.sha256()
        for sample in samples[: self.start]:
            fold_sample(self._source, sample)
        self._tally = _Tally()

    def skipped(self, sample: Sample, error: dict[str, str]) -> None:
        self._tally.errors.append(error)
        fold_sample(self._source, sample)

    def written(self, sample: Sample, record: Record, shape: tuple[int, ...]) -> None:
        fold_sample(self._source, sample)
        self._tally.digests += spec.sample_digest(record.label, record.path, record.data)
        self._tally.per_class[sample.label] += 1
        self._tally.shapes.add(shape)

    def completed(self, shard: spec.ShardInfo, end: int) -> None:
        """``shard`` is in place and ends before position ``end``: journal it."""
        t = self._tally
        shapes = [list(s) for s in sorted(t.shapes)[:2]]  # two tell "variable" apart
        entry = ShardEntry(
            shard, end, self._source.hexdigest(), t.errors, dict(t.per_class), shapes,
            bytes(t.digests),
        )  # fmt: skip
        self.entries.append(entry)
        self.journal.append(entry)
        self._tally = _Tally()

    @property
    def errors(self) -> list[dict[str, str]]:
        """Files skipped so far, in order, kept shards' included."""
        return [*(x for e in self.entries for x in e.errors), *self._tally.errors]


def convert_folder(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    options: ConvertOptions,
    workers: int | None = None,
    overwrite: bool = False,
    resume: bool = False,
    on_error: str = "skip",
    progress: bool | None = None,
) -> ConvertResult:
    """Convert the ImageNet-layout folder ``src`` into an imgpack dataset at ``dst``.

    Args:
        overwrite: replace what an earlier conversion wrote at ``dst``.
        resume: finish an interrupted conversion into ``dst``: keep its completed shards
            that verify and convert the rest (a complete one is left as it is).
        on_error: ``"skip"`` bad files (listed in ``errors.jsonl``) or ``"fail"`` on the
            first one, raising BadInputError.
        progress: show a tqdm bar (None: only when stderr is a terminal).

    Raises:
        ValueError, FileNotFoundError, FileExistsError: with the bad input and the fix.
        OSError: a write failed; on a full disk the message says how to resume.
    """
    options.validate()
    if on_error not in ON_ERROR:
        raise ValueError(f"unknown on_error {on_error!r}: choose from {ON_ERROR}")
    if overwrite and resume:
        raise ValueError("--overwrite and --resume exclude each other: choose one")
    src, dst = Path(src), Path(dst)
    _refuse_dst_in_src(src, dst)
    workers = workers or default_workers()
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
    if on_error == "fail" and scan.problems:
        raise _bad_input(scan.problems[0], resumable=False)
    header = {
        "options": json.loads(json.dumps(asdict(options))),
        "source_fingerprint": source_fingerprint(samples),
        "classes": scan.classes,
    }

    lock = claim_destination(dst, overwrite, resume)
    try:
        if resume and (dst / spec.MANIFEST_NAME).is_file():
            return _already_complete(dst, header)
        kept = resumable_entries(dst, header["options"], samples) if resume else []
        journal = Journal(dst)
        delete_written(dst, keep={spec.LOCK_NAME, *_files_of(kept)})
        journal.start(header, kept)
        return _run(src, dst, options, scan, samples, kept, journal, workers, on_error, progress)
    finally:
        lock.release()


def _files_of(entries: list[ShardEntry]) -> list[str]:
    return [e.shard.path + s for e in entries for s in ["", *e.shard.sidecars]]


def _bad_input(error: dict[str, str], resumable: bool) -> BadInputError:
    how = "rerun with --resume" if resumable else "rerun"
    return BadInputError(
        f"{error['error']} [stopped by --on-error fail: fix or remove {error['path']} and "
        f"{how}{'' if resumable else ', or use --on-error skip'}]"
    )


def _run(
    src: Path,
    dst: Path,
    options: ConvertOptions,
    scan: Scan,
    samples: list[Sample],
    kept: list[ShardEntry],
    journal: Journal,
    workers: int,
    on_error: str,
    progress: bool | None,
) -> ConvertResult:
    """Write the samples after the ``kept`` shards, journaling each completed shard."""
    start_time = time.perf_counter()
    ledger = _Ledger(journal, kept, samples)
    start = ledger.start
    layout = Layout(
        options.encoding, options.transform.output_shape(), tuple(scan.classes), options.compression
    )
    output = ShardedOutput(
        dst,
        options.format,
        WRITERS[options.format],
        layout,
        *options.shard_limits(),
        done=[e.shard for e in kept],
    )
    written = sum(e.shard.samples for e in kept)
    bar = tqdm(
        total=len(samples),
        initial=start,
        unit="img",
        desc=f"{options.format}/{options.encoding}",
        disable=None if progress is None else not progress,
        smoothing=0.1,
    )
    relpaths = [s.relpath for s in samples[start:]]
    stream = _prepared_stream(src, relpaths, options.transform, workers, options.max_pixels)
    try:
        with bar, contextlib.closing(stream):
            for position, sample, prepared in zip(
                range(start, len(samples)), samples[start:], stream, strict=True
            ):
                bar.update()
                if isinstance(prepared, str):
                    error = {"path": sample.relpath, "error": prepared}
                    if on_error == "fail":
                        raise _bad_input(error, resumable=True)
                    ledger.skipped(sample, error)
                    log.warning("skipped %s", prepared)
                    continue
                key = spec.SAMPLE_KEY.format(written)
                record = Record(key, prepared.data, prepared.ext, sample.label, sample.relpath)
                finished = output.add(record)
                if finished is not None:
                    ledger.completed(finished, position)
                ledger.written(sample, record, prepared.shape)
                written += 1
        finished = output.close()
        if finished is not None:
            ledger.completed(finished, len(samples))
        entries = ledger.entries
        errors = [*scan.problems, *ledger.errors]
        if errors:
            write_errors(dst / ERRORS_NAME, errors)
        if not entries:
            raise ValueError(f"{src}: no image could be converted (see {dst / ERRORS_NAME})")
        result = ConvertResult(
            dst,
            written=written,
            skipped=len(errors),
            bytes=sum(e.shard.bytes for e in entries),
            seconds=time.perf_counter() - start_time,
            errors=errors,
            resumed=sum(e.shard.samples for e in kept),
            hidden=scan.hidden,
            empty_classes=scan.empty_classes,
        )
        write_manifest(dst, options, scan.classes, entries, result, workers, journal)
    except BaseException as e:
        full = _disk_full(dst, e)
        output.abort()  # frees the space of the shard being written
        entries = ledger.entries
        if isinstance(e, KeyboardInterrupt):
            samples_done = sum(x.shard.samples for x in entries)
            e.add_note(f"{len(entries)} shard(s) with {samples_done} samples are complete")
        if full:
            raise OSError(
                errno.ENOSPC,
                f"{dst}: no space left on device ({e}); {len(entries)} completed shard(s) "
                "are kept: free some space and rerun the same command with --resume",
            ) from e
        raise
    journal.remove()
    return result


def _disk_full(dst: Path, error: BaseException) -> bool:
    """True if ``error`` comes from a full disk. LMDB reports one as an I/O error, so
    beyond ENOSPC/EDQUOT, a write error with under 1 MiB free also counts."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if not isinstance(error, Exception) or isinstance(error, ValueError):
        return False
    try:
        return shutil.disk_usage(dst).free < 1 << 20
    except OSError:
        return False


def _refuse_dst_in_src(src: Path, dst: Path) -> None:
    """DST inside SRC would be scanned as a class folder by the next run on SRC."""
    src_real, dst_real = src.resolve(), dst.resolve()
    if dst_real == src_real:
        raise ValueError(f"{dst}: DST is SRC itself; write the dataset to a new folder outside it")
    if dst_real.is_relative_to(src_real):
        raise ValueError(
            f"{dst}: DST is inside SRC ({src}); the next conversion of SRC would take it for a "
            "class folder and shift every label: choose a DST outside SRC"
        )


def _already_complete(dst: Path, header: dict[str, Any]) -> ConvertResult:
    """The result of a ``--resume`` into a dataset that is complete: nothing to do."""
    manifest = spec.load_manifest(dst)
    same_options(dst / spec.MANIFEST_NAME, manifest.options, header["options"])
    if manifest.source_fingerprint != header["source_fingerprint"]:
        raise ValueError(
            f"{dst}: already complete, but the source folder's list of images has changed "
            "since: pass --overwrite to convert it again"
        )
    return ConvertResult(
        dst,
        written=manifest.num_samples,
        skipped=manifest.skipped or 0,
        bytes=sum(s.bytes for s in manifest.shards),
        resumed=manifest.num_samples,
    )
