"""``imgpack verify``: check that a dataset on disk is the one its manifest describes.

The quick check reads every byte once: the manifest's fields, each shard's size and
SHA-256 (and its sidecars'), then opens each intact shard to count its samples and labels.
The deep check also reads every sample back through the format's reader, decodes it,
checks its shape, reads and decodes each of its fields (each value checked against its
CRC-32 by the shard's field columns, an array against the schema's dtype and shape) and
recomputes the content checksum, which catches what a byte-exact shard cannot: a writer
that stored the wrong thing. Shards that fail their checksum are
not opened: a corrupt file is reported, never parsed.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from convert.ledger import ContentDigest
from convert.options import default_workers
from convert.writers.base import file_sha256
from readers import DATASETS, spec
from readers.dataset import ImageDataset, ShardReader
from readers.fields import Schema, decode
from readers.formats.field_columns import FieldColumn, ScalarColumn
from readers.images.decode import decode_image
from readers.manifest import Manifest, load_manifest
from readers.storage.location import Location
from readers.storage.remote import RemoteFolder, StorageError

__all__ = ["Problem", "VerifyReport", "check_stored_files", "verify_dataset"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong: where (a file, or ``file[index]``) and what."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"

    @classmethod
    def of(cls, error: Exception, where: str, names: tuple[str, ...], what: str = "") -> Problem:
        """The problem a reader's error describes, found at ``where``: when its text starts
        by naming a file (``file: reason``) under one of ``names`` (the dataset's URL or
        folders), that file, named once, and the reason; ``what`` goes before the reason."""
        named, sep, reason = str(error).partition(": ")
        if sep and named.startswith(names):
            return cls(named, what + reason)
        return cls(where, what + str(error))


@dataclass
class VerifyReport:
    """What ``verify_dataset`` checked and found."""

    root: str | os.PathLike[str]
    shards: int = 0
    samples: int = 0
    deep: bool = False
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_dataset(
    root: str | os.PathLike[str], deep: bool = False, progress: bool | None = None
) -> VerifyReport:
    """Check the dataset at ``root``; every problem found is in the report, none raised
    but a StorageError (the store could not be reached: the check did not happen)."""
    report = VerifyReport(root, deep=deep)
    try:
        manifest = load_manifest(root)
    except StorageError:
        raise  # nothing was checked: no problem of the dataset's
    except (spec.DatasetError, ValueError, OSError) as e:
        where = f"{root}/{spec.MANIFEST_NAME}"
        report.problems.append(Problem.of(e, where, (os.fspath(root), os.path.abspath(root))))
        return report
    report.shards = len(manifest.shards)
    _check_totals(manifest, report)
    dataset = DATASETS[manifest.format](manifest)
    intact = []
    for k, problems in enumerate(check_stored_files(dataset)):
        report.problems += problems
        if not problems:
            intact.append(k)
    per_class: Counter[int] = Counter()
    content = ContentDigest()  # of the samples read back, folded shard by shard
    bar = tqdm(
        total=manifest.num_samples if deep else 0,
        unit="img",
        desc="verify --deep",
        disable=not deep or (None if progress is None else not progress),
    )
    with bar:
        for k in intact:
            where = str(manifest.shard_path(k))
            try:
                reader = dataset.shard(k)  # opened, and its sample count checked
            except spec.DatasetError as e:
                report.problems.append(
                    Problem.of(e, where, _names(manifest.location), "cannot open: ")
                )
                content.fold(k, b"")  # its samples are missing from the checksum
                continue
            labels = np.asarray(reader.labels)
            if manifest.classes:
                bad = (labels < 0) | (labels >= len(manifest.classes))
            else:  # converted with --unlabeled
                bad = labels != spec.UNLABELED
            for i in np.flatnonzero(bad)[:10]:
                report.problems.append(Problem(f"{where}[{i}]", f"label {labels[i]} out of range"))
            per_class.update(labels.tolist())
            report.samples += len(labels)
            if deep:
                first = sum(s.samples for s in manifest.shards[:k])
                digests = _check_samples(
                    manifest, reader, labels, (where, first), report, bar.update
                )
                content.fold(k, b"".join(digests))
    if len(intact) == len(manifest.shards):
        _check_counts(manifest, per_class, report)
        if deep and content.hexdigest() != manifest.content_sha256:
            report.problems.append(
                Problem(
                    f"{manifest.location}/{spec.MANIFEST_NAME}",
                    "content_sha256 does not match the samples read back",
                )
            )
    return report


def check_stored_files(dataset: ImageDataset, workers: int | None = None) -> list[list[Problem]]:
    """The problems of each shard's files as stored, in shard order (no problem: intact):
    sizes and SHA-256s against the manifest. A URL dataset's objects are first sized in
    the store, then copied into the local cache (checked against their SHA-256s as they
    download) and checked there, one shard at a time (a copy another thread's download
    evicted from a full cache would read as missing); local files on ``workers`` threads
    (default: the usable CPUs).

    Raises:
        StorageError: the store could not be reached (nothing was checked).
    """
    shards = range(len(dataset.manifest.shards))
    threads = 1 if dataset.manifest.url else workers or default_workers()
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda k: _shard_problems(dataset, k), shards))


def _shard_problems(dataset: ImageDataset, k: int) -> list[Problem]:
    manifest, location = dataset.manifest, dataset.manifest.location
    if location.remote is not None:
        problems = _remote_problems(manifest, k, location.remote)
        if problems:
            return problems
        try:
            dataset.cache_shard(k)
        except StorageError:
            raise
        except (spec.DatasetError, OSError) as e:
            return [Problem.of(e, location.where(manifest.shards[k].path), _names(location))]
    return _file_problems(manifest, k)


def _names(location: Location) -> tuple[str, str]:
    """How a reader's errors name the files of the dataset at ``location``: by its URL or
    local folder, or for a URL by its cache folder."""
    return str(location), str(location.folder)


def _remote_problems(manifest: Manifest, k: int, remote: RemoteFolder) -> list[Problem]:
    """Shard ``k`` and its sidecars in the store: there, and the shard of its size."""
    info, location = manifest.shards[k], manifest.location
    expected = {info.path: info.bytes, **{info.path + s: None for s in info.sidecars}}
    problems = []
    for name, size in expected.items():
        found = remote.size(name)
        if found is None:
            problems.append(Problem(location.where(name), "missing"))
        elif size is not None and found != size:
            problems.append(
                Problem(
                    location.where(name), f"is {found} bytes, the manifest says {size}: truncated?"
                )
            )
    return problems


def _check_totals(manifest: Manifest, report: VerifyReport) -> None:
    where = f"{manifest.location}/{spec.MANIFEST_NAME}"
    recorded = manifest.recorded_samples
    if recorded != manifest.num_samples:
        report.problems.append(
            Problem(where, f"num_samples {recorded} != {manifest.num_samples} in the shards")
        )


def _file_problems(manifest: Manifest, k: int) -> list[Problem]:
    """Size and SHA-256 of the local files of shard ``k`` and its sidecars."""
    info = manifest.shards[k]
    path = manifest.shard_path(k)
    try:
        size = path.stat().st_size
    except OSError as e:
        return [Problem(str(path), f"missing or unreadable: {e.strerror}")]
    if size != info.bytes:
        return [Problem(str(path), f"is {size} bytes, the manifest says {info.bytes}: truncated?")]
    files = {path: info.sha256}
    files.update({Path(str(path) + s): h for s, h in info.sidecars.items()})
    problems = []
    for file, expected in files.items():
        try:
            actual = file_sha256(file)
        except OSError as e:
            problems.append(Problem(str(file), f"missing or unreadable: {e.strerror}"))
            continue
        if actual != expected:
            problems.append(
                Problem(str(file), "SHA-256 does not match the manifest: corrupt or modified")
            )
    return problems


def _check_counts(manifest: Manifest, per_class: Counter[int], report: VerifyReport) -> None:
    recorded = manifest.samples_per_class or {}
    for i, name in enumerate(manifest.classes):
        if name in recorded and recorded[name] != per_class[i]:
            report.problems.append(
                Problem(
                    f"{manifest.location}/{spec.MANIFEST_NAME}",
                    f"class {name!r}: {per_class[i]} samples in the shards, "
                    f"samples_per_class says {recorded[name]}",
                )
            )


def _check_samples(
    manifest: Manifest,
    reader: ShardReader,
    labels: np.ndarray,
    location: tuple[str, int],
    report: VerifyReport,
    advance: Callable[[int], object],
) -> list[bytes]:
    """Decode every sample of one shard (in threads) and return their content digests;
    ``location`` is the shard's path and the dataset index of its first sample."""
    where, first = location
    columns = _field_columns(manifest.fields, reader, where, report)

    def check(i: int) -> tuple[bytes, str | None]:
        try:
            value = reader.read(i)
            path = reader.path(i)
            fields = [(name, _field_bytes(column, i)) for name, column in columns]
            pixels = value if isinstance(value, np.ndarray) else decode_image(value)
        except (ValueError, OSError) as e:  # the reader's own errors name shard[i] already
            return b"", str(e).removeprefix(f"{where}[{i}]: ")
        digest = spec.sample_digest(int(labels[i]), path, value, fields)
        shape = tuple(pixels.shape)
        if pixels.dtype != np.uint8 or len(shape) != 3 or shape[2] != 3:
            return digest, f"decodes to {pixels.dtype} {shape}, not uint8 HxWx3"
        if manifest.shape is not None and shape != manifest.shape:
            return digest, f"decodes to shape {shape}, the manifest says {manifest.shape}"
        return digest, None

    digests = []
    with ThreadPoolExecutor(default_workers()) as pool:
        for i, (digest, problem) in enumerate(pool.map(check, range(len(labels)))):
            if problem is not None:
                report.problems.append(Problem(f"{where}[{i}] (sample {first + i})", problem))
            digests.append(digest)
            advance(1)
    return digests


def _field_columns(
    schema: Schema, reader: ShardReader, where: str, report: VerifyReport
) -> list[tuple[str, FieldColumn | None]]:
    """The shard's column of each field of the manifest's ``schema``, in its order: None
    for one the shard lacks or whose typed column fails its CRC-32 (each a problem of the
    shard's; their samples then miss from the content checksum's match)."""
    columns: list[tuple[str, FieldColumn | None]] = []
    held = reader.fields
    for name in held:
        if name not in schema:
            report.problems.append(Problem(where, f"holds field {name!r}, not in the manifest"))
    for name in schema:
        column = held.get(name)
        if column is None:
            report.problems.append(Problem(where, f"holds no field {name!r} of the manifest"))
        elif isinstance(column, ScalarColumn):
            try:
                column.scalars()  # the whole column's CRC-32, checked once
            except spec.DatasetError as e:
                report.problems.append(Problem(where, str(e).removeprefix(f"{where}: ")))
                column = None
        columns.append((name, column))
    return columns


def _field_bytes(column: FieldColumn | None, i: int) -> bytes | None:
    """Field value ``i``'s canonical bytes, read (CRC-checked) and decoded; a ValueError
    naming the field when it does not decode or an array is not of the schema's dtype and
    shape."""
    if column is None:  # a problem of the shard's already
        return None
    data = column.raw([i])[0]
    value = decode(column.spec.kind, data, f"field {column.name!r}")
    fixed = column.spec
    if value is not None and column.spec.kind == "array":
        if fixed.dtype is not None and value.dtype.str != fixed.dtype:
            raise ValueError(f"field {column.name!r}: dtype {value.dtype.str}, not {fixed.dtype}")
        if fixed.shape is not None and tuple(value.shape) != fixed.shape:
            shape = tuple(value.shape)
            raise ValueError(f"field {column.name!r}: shape {shape}, not {fixed.shape}")
    return data
