"""The conversion job as a plain function: scan, prepare in parallel, write in order.

Worker processes read, decode, resize, crop and encode; the main process only writes, in
sample order, so the output does not depend on ``workers``. Shards appear under their final
names only when complete, and the manifest ``imgpack.json`` is written last, atomically.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from convert.process import Prepared, Transform, prepare
from convert.scan import Sample, scan_folder
from convert.writers import WRITERS, Layout, Record, ShardedOutput
from readers import __version__, spec
from readers.decode import decoder_name

__all__ = ["ConvertOptions", "ConvertResult", "convert_folder", "default_workers"]

log = logging.getLogger(__name__)

ERRORS_NAME = "errors.jsonl"
DEFAULT_SHARD_SIZE = {"pt": 10_000, "wds": 10_000, "hdf5": None, "lmdb": None}
DEFAULT_SHARD_BYTES = {"pt": 1 << 30, "wds": 1 << 30, "hdf5": None, "lmdb": None}


def default_workers() -> int:
    """Usable CPUs of this process (respects taskset/cgroup affinity)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class ConvertOptions:
    """Everything that decides what a conversion writes (recorded in the manifest)."""

    format: str
    encoding: str = "jpeg"
    resize: int | None = None
    center_crop: int | None = None
    quality: int = 90
    shard_size: int | None = None  # None: the format's default
    shard_bytes: int | None = None
    shuffle: bool = False
    seed: int = 0
    compression: str | None = None

    def validate(self) -> None:
        """Raise ValueError naming the bad option and the fix."""
        if self.format not in spec.FORMATS:
            raise ValueError(f"unknown format {self.format!r}: choose from {spec.FORMATS}")
        if self.encoding not in spec.ENCODINGS:
            raise ValueError(f"unknown encoding {self.encoding!r}: choose from {spec.ENCODINGS}")
        if self.encoding == "original" and (self.resize or self.center_crop):
            raise ValueError(
                "--encoding original stores the source bytes unchanged: drop --resize and "
                "--center-crop, or use --encoding jpeg or raw"
            )
        for name in ("resize", "center_crop", "shard_size", "shard_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be a positive number, not {value}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be between 1 and 100, not {self.quality}")
        if self.compression is not None and self.format != "hdf5":
            raise ValueError("--compression applies to --format hdf5 only")
        if self.compression not in (None, "gzip", "lzf"):
            raise ValueError(f"unknown compression {self.compression!r}: use gzip or lzf")

    @property
    def transform(self) -> Transform:
        return Transform(self.encoding, self.resize, self.center_crop, self.quality)

    def shard_limits(self) -> tuple[int | None, int | None]:
        return (
            self.shard_size or DEFAULT_SHARD_SIZE[self.format],
            self.shard_bytes or DEFAULT_SHARD_BYTES[self.format],
        )


@dataclass
class ConvertResult:
    """The outcome of a conversion, as the summary line and the manifest report it."""

    dst: Path
    written: int = 0
    skipped: int = 0
    bytes: int = 0
    seconds: float = 0.0
    errors: list[dict[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        rate = self.written / self.seconds if self.seconds else 0.0
        return (
            f"written {self.written}, skipped {self.skipped}, {self.bytes / 1e6:.1f} MB "
            f"in {self.seconds:.1f} s ({rate:.0f} images/s) -> {self.dst}"
        )


# --- work done in each worker process ---------------------------------------------------
_worker_state: dict[str, Any] = {}


def _init_worker(src: str, transform: Transform) -> None:
    torch.set_num_threads(1)  # parallelism comes from the worker processes
    _worker_state.update(src=src, transform=transform)


def _prepare_one(relpath: str) -> Prepared | str:
    """Prepare one file; a bad file gives its error message instead of raising."""
    path = os.path.join(_worker_state["src"], relpath)
    try:
        with open(path, "rb") as f:
            data = f.read()
        if not data:
            raise ValueError(f"{relpath}: empty file")
        return prepare(data, relpath, _worker_state["transform"])
    except (OSError, ValueError) as e:
        return str(e)


def _prepared_stream(
    src: Path, samples: list[Sample], transform: Transform, workers: int
) -> Iterator[Prepared | str]:
    """Prepared samples in input order, from a process pool (or in-process for 1 worker)."""
    relpaths = [s.relpath for s in samples]
    if workers <= 1:  # in this process, on one core as asked: torch's threads too
        threads = torch.get_num_threads()
        _init_worker(str(src), transform)
        try:
            yield from map(_prepare_one, relpaths)
        finally:
            torch.set_num_threads(threads)
        return
    chunksize = max(1, min(16, len(relpaths) // (workers * 8)))
    with multiprocessing.Pool(workers, _init_worker, (str(src), transform)) as pool:
        yield from pool.imap(_prepare_one, relpaths, chunksize=chunksize)


# --- the job ------------------------------------------------------------------------------
def _written_by_imgpack(path: Path) -> bool:
    name = path.name
    return name in (spec.MANIFEST_NAME, ERRORS_NAME) or name.startswith(
        (spec.SHARD_PREFIX, spec.TMP_PREFIX)
    )


def prepare_destination(dst: Path, overwrite: bool) -> None:
    """Create ``dst``, refusing a non-empty folder unless ``overwrite``, and even then
    deleting only what an earlier conversion wrote."""
    if dst.exists() and not dst.is_dir():
        raise FileExistsError(f"{dst}: exists and is not a folder")
    existing = list(dst.iterdir()) if dst.is_dir() else []
    if existing:
        if not overwrite:
            raise FileExistsError(f"{dst}: folder is not empty: pass --overwrite to replace it")
        foreign = [p.name for p in existing if not _written_by_imgpack(p)]
        if foreign:
            raise FileExistsError(
                f"{dst}: holds files imgpack did not write ({', '.join(sorted(foreign)[:3])}); "
                "refusing to delete them: choose an empty or new DST"
            )
        for path in existing:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    dst.mkdir(parents=True, exist_ok=True)


def convert_folder(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    options: ConvertOptions,
    workers: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    on_sample: Callable[[int], None] | None = None,
) -> ConvertResult:
    """Convert the ImageNet-layout folder ``src`` into an imgpack dataset at ``dst``.

    Args:
        progress: show a tqdm bar (None: only when stderr is a terminal).
        on_sample: called with the running count after each written sample.

    Raises:
        ValueError, FileNotFoundError, FileExistsError: with the bad input and the fix.
    """
    options.validate()
    src, dst = Path(src), Path(dst)
    workers = workers or default_workers()
    classes, samples = scan_folder(src)
    order = list(range(len(samples)))
    if options.shuffle:
        random.Random(options.seed).shuffle(order)
    samples = [samples[i] for i in order]
    prepare_destination(dst, overwrite)

    result = ConvertResult(dst)
    start = time.perf_counter()
    layout = Layout(
        options.encoding, options.transform.output_shape(), tuple(classes), options.compression
    )
    output = ShardedOutput(
        dst, options.format, WRITERS[options.format], layout, *options.shard_limits()
    )
    content = hashlib.sha256()
    per_class = [0] * len(classes)
    shapes: set[tuple[int, ...]] = set()
    bar = tqdm(
        total=len(samples),
        unit="img",
        desc=f"{options.format}/{options.encoding}",
        disable=None if progress is None else not progress,
        smoothing=0.1,
    )
    with bar:
        stream = _prepared_stream(src, samples, options.transform, workers)
        for sample, prepared in zip(samples, stream, strict=True):
            bar.update()
            if isinstance(prepared, str):
                result.skipped += 1
                result.errors.append({"path": sample.relpath, "error": prepared})
                log.warning("skipped %s", prepared)
                continue
            record = Record(
                spec.SAMPLE_KEY.format(result.written),
                prepared.data,
                prepared.ext,
                sample.label,
                sample.relpath,
            )
            output.add(record)
            _update_content_hash(content, record)
            shapes.add(prepared.shape)
            per_class[sample.label] += 1
            result.written += 1
            result.bytes += record.nbytes
            if on_sample is not None:
                on_sample(result.written)
    shards = output.close()
    if result.errors:
        _write_errors(dst / ERRORS_NAME, result.errors)
    if not shards:
        raise ValueError(f"{src}: no image could be converted (see {dst / ERRORS_NAME})")
    result.seconds = time.perf_counter() - start
    # Raw pixels: the stored layout (fixed only with --center-crop). Encoded: what decodes.
    shape = (
        layout.shape
        if options.encoding == "raw"
        else (next(iter(shapes)) if len(shapes) == 1 else None)
    )
    _write_manifest(
        dst, options, classes, per_class, shards, shape, content.hexdigest(), result, workers
    )
    return result


def _update_content_hash(digest: Any, record: Record) -> None:
    """Fold one sample into the dataset's content checksum (independent of file layout)."""
    data = record.data.tobytes() if not isinstance(record.data, bytes) else record.data
    header = f"{record.label}\0{record.path}\0{record.ext}\0{len(data)}\0"
    digest.update(header.encode("utf-8", "surrogateescape"))
    digest.update(data)


def _write_errors(path: Path, errors: list[dict[str, str]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for error in errors:
            f.write(json.dumps(error, ensure_ascii=False) + "\n")


def _write_manifest(
    dst: Path,
    options: ConvertOptions,
    classes: list[str],
    per_class: list[int],
    shards: list[spec.ShardInfo],
    shape: tuple[int, ...] | None,
    content_sha256: str,
    result: ConvertResult,
    workers: int,
) -> None:
    manifest = {
        "format": options.format,
        "format_version": spec.FORMAT_VERSION,
        "imgpack_version": __version__,
        "encoding": options.encoding,
        "shape": list(shape) if shape is not None else "variable",
        "dtype": "uint8",
        "classes": classes,
        "samples_per_class": dict(zip(classes, per_class, strict=True)),
        "num_samples": result.written,
        "written": result.written,
        "skipped": result.skipped,
        "content_sha256": content_sha256,
        "shards": [asdict(s) for s in shards],
        "options": asdict(options),
        "converted_with": {"workers": workers, "jpeg_decoder": decoder_name()},
    }
    if result.skipped:
        manifest["errors_file"] = ERRORS_NAME
    tmp = dst / (spec.TMP_PREFIX + spec.MANIFEST_NAME)
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dst / spec.MANIFEST_NAME)
