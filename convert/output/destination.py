"""Where a conversion writes: the :class:`Destination` protocol, the local folder that
implements it (:class:`LocalDestination`; a bucket's is ``convert.output.remote``), the
folder's lock, and the files that finish a dataset.

A run refuses a folder it may not use (another run's, one holding files imgpack did not
write, a non-empty one without ``--overwrite`` or ``--resume``) before touching anything.
The manifest ``imgpack.json`` is written last, atomically: its presence marks a complete
dataset. (The journal of completed shards is ``convert.journal``.)

The folder's lock is ``convert.output.lock``.
"""

from __future__ import annotations

import errno
import json
import logging
import shutil
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from convert.journal import ENTRY_PREFIX, Journal, JournalStore, ShardEntry, shard_files
from convert.options import ConvertOptions, ConvertResult
from convert.output.lock import DestinationLock
from readers import __version__, spec
from readers.images.decode import decoder_name, encoder_name
from readers.manifest import Manifest, json_text, load_manifest
from readers.storage.location import Location

__all__ = [
    "ERRORS_NAME",
    "Destination",
    "LocalDestination",
    "Upload",
    "claim_destination",
    "delete_written",
    "disk_full",
    "kept_files",
    "refuse_contents",
    "refuse_dst_at_source_url",
    "refuse_dst_in_src",
    "remove_if_empty",
    "write_errors",
    "write_manifest",
    "written_by_imgpack",
]

ERRORS_NAME = "errors.jsonl"

log = logging.getLogger(__name__)

Upload = Callable[[Path, spec.ShardInfo], dict[str, list[Any]]]
"""Puts a completed shard and its sidecars, lying in a local folder, where they belong (a
bucket) and frees their space there; returns what :attr:`ShardEntry.stored` records. A
picklable object, so that the Ray task that wrote a shard uploads it from its own node."""


class Destination(Protocol):
    """Where a conversion's dataset goes, a local folder or a bucket's: the pipeline writes
    the shards into ``folder`` and asks the destination for the rest, in this order:
    ``claim``, ``is_complete``, ``verifies``, ``keep_only``, ``publish`` (each shard),
    ``finish``, ``release``, then ``cleanup`` after a run that completed."""

    folder: Path  # where shards are written: DST itself, or a bucket DST's staging folder
    journal: JournalStore
    staged: bool  # True: ``folder`` is on this machine only, and shards go up from it
    upload: Upload | None  # how a shard written in another folder goes up (None: no bucket)

    @property
    def dst(self) -> Path | str:
        """DST as the result names it: the folder, or the URL."""
        ...

    def claim(self, src: Path | None, overwrite: bool, resume: bool) -> None:
        """Lock DST for this run, refusing (with nothing touched) one it may not write
        (``src``: the local folder the source lives in, if any)."""
        ...

    def is_complete(self) -> bool:
        """True if DST holds a complete dataset (its manifest)."""
        ...

    def manifest(self) -> Manifest:
        """The manifest of the complete dataset at DST."""
        ...

    def verifies(self, entry: ShardEntry) -> bool:
        """True if a journaled shard is still at DST as recorded."""
        ...

    def keep_only(self, kept: Sequence[ShardEntry]) -> None:
        """Delete what an earlier run wrote at DST, except the ``kept`` shards."""
        ...

    def publish(
        self, shard: spec.ShardInfo, uploaded: dict[str, list[Any]] | None
    ) -> dict[str, list[Any]]:
        """Put a completed shard in ``folder`` where it belongs, before it is journaled, or,
        where its writer uploaded it (``uploaded``: what it recorded), check that it is
        there; returns what :attr:`ShardEntry.stored` records."""
        ...

    def finish(self) -> None:
        """The manifest is written in ``folder``: make the dataset complete at DST."""
        ...

    def release(self) -> None:
        """Let go of DST (the lock; a folder this run made and left empty)."""
        ...

    def cleanup(self) -> None:
        """After a run that completed: remove what only the run needed."""
        ...


class LocalDestination:
    """A DST folder on this machine (or one every node mounts): shards are renamed into
    place in it and the journal is a file there (:class:`~convert.journal.Journal`)."""

    staged = False
    upload = None  # every shard is renamed into place in DST

    def __init__(self, dst: Path) -> None:
        self.dst = self.folder = dst
        self.journal = Journal(dst)
        self._made = not dst.exists()  # by this run, which removes it if left empty
        self._lock: DestinationLock | None = None

    def claim(self, src: Path | None, overwrite: bool, resume: bool) -> None:
        """Refuse a DST inside SRC, then lock DST (:func:`claim_destination`)."""
        if src is not None:
            refuse_dst_in_src(src, self.folder)
        self._lock = claim_destination(self.folder, overwrite, resume)

    def is_complete(self) -> bool:
        return (self.folder / spec.MANIFEST_NAME).is_file()

    def manifest(self) -> Manifest:
        return load_manifest(self.folder)

    def verifies(self, entry: ShardEntry) -> bool:
        return entry.verifies(self.folder)

    def keep_only(self, kept: Sequence[ShardEntry]) -> None:
        delete_written(self.folder, keep=kept_files(kept))

    def publish(
        self, shard: spec.ShardInfo, uploaded: dict[str, list[Any]] | None
    ) -> dict[str, list[Any]]:
        return {}  # renamed into place already

    def finish(self) -> None:
        pass  # the manifest, written last, completes the dataset

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
        if self._made:
            remove_if_empty(self.folder)  # refused, or failed before writing anything

    def cleanup(self) -> None:
        pass  # everything left is the dataset


# --- claiming the folder and choosing what to keep ---------------------------------------
def written_by_imgpack(name: str) -> bool:
    """True for the names a conversion writes in its DST (and may delete there)."""
    return name in (spec.MANIFEST_NAME, ERRORS_NAME, spec.LOCK_NAME, spec.JOURNAL_NAME) or (
        name.startswith((spec.SHARD_PREFIX, spec.TMP_PREFIX, ENTRY_PREFIX))
    )


def refuse_contents(where: str, names: Collection[str], overwrite: bool, resume: bool) -> None:
    """Refuse a DST (a folder, or a bucket's) holding ``names``, its lock aside, that this
    run may not write into: a non-empty one without ``overwrite`` or ``resume``, or one
    holding anything imgpack did not write."""
    foreign = sorted(n for n in names if not written_by_imgpack(n))
    if names and not (overwrite or resume):
        what = (
            "an interrupted conversion"
            if spec.JOURNAL_NAME in names
            else "a dataset"
            if spec.MANIFEST_NAME in names
            else "other files"
            if foreign
            else "files of an earlier conversion"
        )
        raise FileExistsError(
            f"{where}: folder is not empty (holds {what}): pass --resume to finish an "
            "interrupted conversion or --overwrite to replace it"
        )
    if foreign:
        raise FileExistsError(
            f"{where}: holds files imgpack did not write ({', '.join(foreign[:3])}); "
            "refusing to write there: choose an empty or new DST"
        )


def delete_written(dst: Path, keep: set[str]) -> None:
    """Delete what imgpack wrote in ``dst``, except the names in ``keep``."""
    for path in dst.iterdir():
        if path.name in keep or not written_by_imgpack(path.name):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def kept_files(kept: Sequence[ShardEntry]) -> set[str]:
    """What a resumed run keeps in its folder: the lock and the ``kept`` shards' files."""
    return {spec.LOCK_NAME, *(name for e in kept for name in shard_files(e.shard))}


def remove_if_empty(folder: Path) -> None:
    """Remove ``folder`` if it is an empty folder."""
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


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
        refuse_contents(str(dst), [p.name for p in existing], overwrite, resume)
    except BaseException:
        lock.release()
        raise
    dst.mkdir(parents=True, exist_ok=True)
    lock.acquire()
    return lock


def refuse_dst_in_src(src: Path, dst: Path) -> None:
    """DST inside SRC would be scanned as a class folder by the next run on SRC."""
    src_real, dst_real = src.resolve(), dst.resolve()
    if dst_real == src_real:
        raise ValueError(f"{dst}: DST is SRC itself; write the dataset to a new folder outside it")
    if dst_real.is_relative_to(src_real):
        raise ValueError(
            f"{dst}: DST is inside SRC ({src}); the next conversion of SRC would take it for a "
            "class folder and shift every label: choose a DST outside SRC"
        )


def refuse_dst_at_source_url(source: str, dst: str) -> None:
    """A DST URL that is the source's own (or inside it): ``--overwrite`` would delete the
    source dataset before it is read."""
    src_url, dst_url = source.rstrip("/"), dst.rstrip("/")
    if dst_url == src_url or dst_url.startswith(src_url + "/"):
        raise ValueError(f"{dst}: DST is SRC ({source}) or inside it; write to a new URL")


def disk_full(dst: Path, error: BaseException) -> bool:
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


# --- the files that finish a dataset ----------------------------------------------------
def write_errors(path: Path, errors: list[dict[str, str]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(map(json_text, errors))


def converted_with(options: ConvertOptions, workers: int, resizes: bool) -> dict[str, Any]:
    """The manifest's ``converted_with``: the workers, the JPEG decoder (its crop kernel
    when the kernel resized) and, for ``jpeg`` samples, the encoder (whether they carry
    restart markers)."""
    done: dict[str, Any] = {"workers": workers, "jpeg_decoder": decoder_name(crop=resizes)}
    if options.encoding == "jpeg":
        done["jpeg_encoder"] = encoder_name(options.restart_markers)
    return done


def write_manifest(
    dst: Path,
    options: ConvertOptions,
    layout: spec.Layout,
    entries: list[ShardEntry],
    result: ConvertResult,
    workers: int,
    source_fingerprint: str,
    content_sha256: str,
    source: dict[str, Any] | None = None,
) -> None:
    """Write ``imgpack.json``, last and atomically: its presence marks a complete dataset;
    ``source`` is what it records of a source other than an image folder."""
    shapes = {tuple(s) for e in entries for s in e.shapes}
    # Raw pixels: the stored layout (fixed only with --center-crop). Encoded: what decodes.
    if options.encoding == "raw":
        shape = layout.shape
    else:
        shape = next(iter(shapes)) if len(shapes) == 1 else None
    classes = layout.classes
    per_class = Counter()
    for e in entries:
        per_class.update(e.per_class)
    resizes = options.resize is not None and options.encoding != "original"  # by the kernel
    Manifest(
        location=Location(dst),
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
        content_sha256=content_sha256,
        source_fingerprint=source_fingerprint,
        options=json.loads(json.dumps(asdict(options))),
        converted_with=converted_with(options, workers, resizes),
        errors_file=ERRORS_NAME if result.skipped else None,
        source=source,
        fields=dict(layout.fields),
    ).write()
