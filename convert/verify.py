"""``imgpack verify``: check that a dataset on disk is the one its manifest describes.

The quick check reads every byte once: the manifest's fields, each shard's size and
SHA-256 (and its sidecars'), then opens each intact shard to count its samples and labels.
The deep check also reads every sample back through the format's reader, decodes it,
checks its shape and recomputes the content checksum, which catches what a byte-exact
shard cannot: a writer that stored the wrong thing. Shards that fail their checksum are
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
from readers.images.decode import decode_image
from readers.manifest import Manifest, load_manifest
from readers.storage.remote import StorageError

__all__ = ["Problem", "VerifyReport", "verify_dataset"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong: where (a file, or ``file[index]``) and what."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


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
        report.problems.append(Problem(f"{root}/{spec.MANIFEST_NAME}", str(e)))
        return report
    report.shards = len(manifest.shards)
    _check_totals(manifest, report)
    dataset = DATASETS[manifest.format](manifest)
    intact = [
        k
        for k in range(len(manifest.shards))
        if _cached(dataset, k, report) and _check_files(manifest, k, report)
    ]
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
                report.problems.append(Problem(where, f"cannot open: {e}"))
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


def _cached(dataset: ImageDataset, k: int, report: VerifyReport) -> bool:
    """For a remote dataset, shard ``k`` copied into the local cache to be checked there."""
    try:
        dataset.cache_shard(k)
    except StorageError:
        raise
    except (spec.DatasetError, OSError) as e:
        report.problems.append(Problem(f"{dataset.manifest.location}/shard {k}", str(e)))
        return False
    return True


def _check_totals(manifest: Manifest, report: VerifyReport) -> None:
    where = f"{manifest.location}/{spec.MANIFEST_NAME}"
    recorded = manifest.recorded_samples
    if recorded != manifest.num_samples:
        report.problems.append(
            Problem(where, f"num_samples {recorded} != {manifest.num_samples} in the shards")
        )


def _check_files(manifest: Manifest, k: int, report: VerifyReport) -> bool:
    """Size and SHA-256 of shard ``k`` and its sidecars; True if all match."""
    info = manifest.shards[k]
    path = manifest.shard_path(k)
    try:
        size = path.stat().st_size
    except OSError as e:
        report.problems.append(Problem(str(path), f"missing or unreadable: {e.strerror}"))
        return False
    if size != info.bytes:
        report.problems.append(
            Problem(str(path), f"is {size} bytes, the manifest says {info.bytes}: truncated?")
        )
        return False
    files = {path: info.sha256}
    files.update({Path(str(path) + s): h for s, h in info.sidecars.items()})
    ok = True
    for file, expected in files.items():
        try:
            actual = file_sha256(file)
        except OSError as e:
            report.problems.append(Problem(str(file), f"missing or unreadable: {e.strerror}"))
            ok = False
            continue
        if actual != expected:
            report.problems.append(
                Problem(str(file), "SHA-256 does not match the manifest: corrupt or modified")
            )
            ok = False
    return ok


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

    def check(i: int) -> tuple[bytes, str | None]:
        try:
            value = reader.read(i)
            path = reader.path(i)
            pixels = value if isinstance(value, np.ndarray) else decode_image(value)
        except (ValueError, OSError) as e:  # the reader's own errors name shard[i] already
            return b"", str(e).removeprefix(f"{where}[{i}]: ")
        digest = spec.sample_digest(int(labels[i]), path, value)
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
