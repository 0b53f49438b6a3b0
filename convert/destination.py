"""The folder a conversion writes: claiming it, its lock, and its journal of completed shards.

A run refuses a folder it may not use (another run's, one holding files imgpack did not
write, a non-empty one without ``--overwrite`` or ``--resume``) before touching anything.

The journal (``spec.JOURNAL_NAME``, JSON lines) starts with a header naming the options
and the source's sample list, then gains one entry per shard once that shard is renamed
into place: the shard's manifest entry, how far into the sample list it reaches, the files
skipped on the way and each sample's content digest. ``--resume`` keeps the shards whose
entries are intact and whose files still verify, and starts again after the last one, so
the resumed dataset is the one an uninterrupted run writes. A torn last line (a kill
mid-write) is ignored: its shard is redone.

The lock is a POSIX record lock on ``spec.LOCK_NAME``: the kernel drops it when its process
dies, even by SIGKILL, so a stale lock file never blocks ``--resume``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from convert.options import ConvertOptions, ConvertResult
from convert.scan import Sample
from convert.writers.base import file_sha256
from readers import __version__, spec
from readers.decode import decoder_name

__all__ = [
    "ERRORS_NAME",
    "DestinationBusy",
    "DestinationLock",
    "Journal",
    "ShardEntry",
    "claim_destination",
    "delete_written",
    "fold_sample",
    "resumable_entries",
    "same_options",
    "source_fingerprint",
    "write_errors",
    "write_manifest",
]

JOURNAL_VERSION = 1
ERRORS_NAME = "errors.jsonl"

log = logging.getLogger(__name__)


class DestinationBusy(FileExistsError):
    """Another conversion holds the lock on DST."""


def fold_sample(digest: Any, sample: Sample) -> None:
    """Add one source file (path and label) to a running SHA-256 of the sample list."""
    digest.update(f"{sample.label}\0{sample.relpath}\0".encode("utf-8", "surrogateescape"))


def source_fingerprint(samples: Sequence[Sample]) -> str:
    """SHA-256 of the ordered sample list (paths and labels)."""
    digest = hashlib.sha256()
    for sample in samples:
        fold_sample(digest, sample)
    return digest.hexdigest()


class DestinationLock:
    """Exclusive right to write into a dataset folder, held by this process."""

    def __init__(self, dst: Path) -> None:
        self.path = dst / spec.LOCK_NAME
        self._fd: int | None = None

    def holder(self) -> int | None:
        """The pid of another process holding the lock, or None (no file needed)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return _read_pid(fd)
        finally:
            os.close(fd)  # closing releases a lock this process took just now
        return None

    def acquire(self) -> None:
        """Take the lock (creating the file) or raise DestinationBusy naming the holder;
        a no-op when this object holds it already."""
        if self._fd is not None:
            return
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pid = _read_pid(fd)
                os.close(fd)
                raise DestinationBusy(
                    f"{self.path.parent}: another imgpack convert (pid {pid}) is writing "
                    "here; wait for it to finish or stop it first"
                ) from None
            try:  # the holder may have removed the file before we locked it: retry
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Remove the lock file and let go (a no-op if not held)."""
        if self._fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None


@dataclass
class ShardEntry:
    """One completed shard as the journal records it; ``end`` is the position in the
    sample list where the next shard starts, ``source`` the fingerprint of the sample list
    up to there (what a resume must find unchanged), ``errors`` the files skipped on the way."""

    shard: spec.ShardInfo
    end: int
    source: str
    errors: list[dict[str, str]] = field(default_factory=list)
    per_class: dict[int, int] = field(default_factory=dict)
    shapes: list[list[int]] = field(default_factory=list)
    digests: bytes = b""

    def to_json(self) -> dict[str, Any]:
        return {
            "shard": asdict(self.shard),
            "end": self.end,
            "source": self.source,
            "errors": self.errors,
            "per_class": {str(k): v for k, v in self.per_class.items()},
            "shapes": self.shapes,
            "digests": self.digests.hex(),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ShardEntry:
        return cls(
            shard=spec.ShardInfo(**raw["shard"]),
            end=int(raw["end"]),
            source=str(raw["source"]),
            errors=list(raw["errors"]),
            per_class={int(k): int(v) for k, v in raw["per_class"].items()},
            shapes=[list(s) for s in raw["shapes"]],
            digests=bytes.fromhex(raw["digests"]),
        )

    def verifies(self, dst: Path) -> bool:
        """True if the shard and its sidecars are on disk exactly as recorded."""
        shard = self.shard
        paths = {dst / shard.path: shard.sha256}
        paths.update({dst / (shard.path + s): h for s, h in shard.sidecars.items()})
        if len(self.digests) != 32 * shard.samples:
            return False
        try:
            if (dst / shard.path).stat().st_size != shard.bytes:
                return False
            return all(file_sha256(p) == h for p, h in paths.items())
        except OSError:
            return False


class Journal:
    """Append-only record of a conversion's completed shards (see the module docstring)."""

    def __init__(self, dst: Path) -> None:
        self.path = dst / spec.JOURNAL_NAME

    def start(self, header: dict[str, Any], entries: Sequence[ShardEntry] = ()) -> None:
        """Write a fresh journal holding ``header`` and ``entries`` (atomically)."""
        tmp = self.path.with_name(spec.TMP_PREFIX + self.path.name)
        lines = [{"journal_version": JOURNAL_VERSION, **header}]
        lines += [e.to_json() for e in entries]
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def append(self, entry: ShardEntry) -> None:
        """Record a completed shard durably before going on."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry.to_json()) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def load(self) -> tuple[dict[str, Any], list[ShardEntry]]:
        """The header and the intact entries, in order (stopping at a torn line)."""
        with open(self.path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError as e:
            raise spec.DatasetError(f"{self.path}: unreadable journal: {e}") from e
        if header.get("journal_version") != JOURNAL_VERSION:
            raise spec.DatasetError(f"{self.path}: unknown journal version")
        entries = []
        for line in lines[1:]:
            try:
                entries.append(ShardEntry.from_json(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                break  # the line being written when the run stopped
        return header, entries

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


# --- claiming the folder and choosing what to keep ---------------------------------------
def _written_by_imgpack(path: Path) -> bool:
    name = path.name
    return name in (spec.MANIFEST_NAME, ERRORS_NAME, spec.LOCK_NAME, spec.JOURNAL_NAME) or (
        name.startswith((spec.SHARD_PREFIX, spec.TMP_PREFIX))
    )


def delete_written(dst: Path, keep: set[str]) -> None:
    """Delete what imgpack wrote in ``dst``, except the names in ``keep``."""
    for path in dst.iterdir():
        if path.name in keep or not _written_by_imgpack(path):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def claim_destination(dst: Path, overwrite: bool, resume: bool) -> DestinationLock:
    """Lock ``dst`` for this run, refusing (with nothing touched) a folder it may not use:
    another run's, one holding files imgpack did not write, or a non-empty one without
    ``overwrite`` or ``resume``."""
    if dst.exists() and not dst.is_dir():
        raise FileExistsError(f"{dst}: exists and is not a folder")
    lock = DestinationLock(dst)
    existing = [p for p in dst.iterdir() if p.name != spec.LOCK_NAME] if dst.is_dir() else []
    if (dst / spec.LOCK_NAME).exists():
        lock.acquire()  # raises DestinationBusy while another run holds it
    try:
        foreign = sorted(p.name for p in existing if not _written_by_imgpack(p))
        if existing and not (overwrite or resume):
            what = (
                "an interrupted conversion"
                if (dst / spec.JOURNAL_NAME).exists()
                else "a dataset"
                if (dst / spec.MANIFEST_NAME).exists()
                else "other files"
                if foreign
                else "files of an earlier conversion"
            )
            raise FileExistsError(
                f"{dst}: folder is not empty (holds {what}): pass --resume to finish an "
                "interrupted conversion or --overwrite to replace it"
            )
        if foreign:
            raise FileExistsError(
                f"{dst}: holds files imgpack did not write ({', '.join(foreign[:3])}); "
                "refusing to write there: choose an empty or new DST"
            )
    except BaseException:
        lock.release()
        raise
    dst.mkdir(parents=True, exist_ok=True)
    lock.acquire()
    return lock


def resumable_entries(
    dst: Path, options: dict[str, Any], samples: Sequence[Sample]
) -> list[ShardEntry]:
    """The completed shards of an interrupted run into ``dst`` that this run can keep: in
    order, as long as each still verifies and the source files up to its end (paths and
    labels; a file removed after the bad one that stopped the run is fine) are unchanged."""
    journal = Journal(dst)
    if not journal.path.exists():
        return []
    started, entries = journal.load()
    same_options(journal.path, started.get("options", {}), options)
    kept: list[ShardEntry] = []
    source = hashlib.sha256()
    for entry in entries:
        for sample in samples[kept[-1].end if kept else 0 : entry.end]:
            fold_sample(source, sample)
        if entry.end > len(samples) or source.hexdigest() != entry.source:
            log.warning("source files before %s changed: redoing from there", entry.shard.path)
            break
        if not entry.verifies(dst):
            log.warning("%s does not verify: redoing from there", entry.shard.path)
            break
        kept.append(entry)
    return kept


def same_options(path: Path, recorded: dict[str, Any], options: dict[str, Any]) -> None:
    """Refuse to resume (or to call complete) a run with other options, naming each."""
    changed = [
        f"{k.replace('_', '-')} {recorded.get(k)!r} -> {options.get(k)!r}"
        for k in options
        if recorded.get(k) != options.get(k)
    ]
    if changed:
        raise ValueError(
            f"{path}: cannot resume: {'; '.join(changed)}; rerun with the options of the "
            "interrupted run, or pass --overwrite to start again"
        )


# --- the files that finish a dataset ----------------------------------------------------
def write_errors(path: Path, errors: list[dict[str, str]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(map(spec.json_text, errors))


def write_manifest(
    dst: Path,
    options: ConvertOptions,
    classes: list[str],
    entries: list[ShardEntry],
    result: ConvertResult,
    workers: int,
    journal: Journal,
) -> None:
    """Write ``imgpack.json``, last and atomically: its presence marks a complete dataset."""
    shapes = {tuple(s) for e in entries for s in e.shapes}
    # Raw pixels: the stored layout (fixed only with --center-crop). Encoded: what decodes.
    if options.encoding == "raw":
        shape = options.transform.output_shape()
    else:
        shape = next(iter(shapes)) if len(shapes) == 1 else None
    per_class = Counter()
    for e in entries:
        per_class.update(e.per_class)
    header, _ = journal.load()
    spec.Manifest(
        root=dst,
        format=options.format,
        encoding=options.encoding,
        shape=shape,
        classes=tuple(classes),
        shards=tuple(e.shard for e in entries),
        imgpack_version=__version__,
        samples_per_class={c: per_class[i] for i, c in enumerate(classes)},
        recorded_samples=result.written,
        written=result.written,
        skipped=result.skipped,
        content_sha256=spec.content_sha256(e.digests for e in entries),
        source_fingerprint=header["source_fingerprint"],
        options=json.loads(json.dumps(asdict(options))),
        converted_with={"workers": workers, "jpeg_decoder": decoder_name()},
        errors_file=ERRORS_NAME if result.skipped else None,
    ).write()
