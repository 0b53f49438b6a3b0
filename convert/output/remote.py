"""An object-store DST (``s3://bucket/prefix``, anything fsspec reaches).

The run is claimed before the source is scanned: the bucket must exist, the folder must
be one this run may write (empty, or ``--resume``/``--overwrite``), and a local staging
folder is locked. Shards are written into the staging folder exactly as into a local DST
(renamed into place when complete); each completed shard with its sidecars is uploaded,
then deleted locally, *before* the journal records it: a shard the journal names is in the
bucket, whole. (A Ray task that writes a shard uploads it itself, the same way, from its
own node: :class:`ShardUploader`.) ``errors.jsonl`` and then ``imgpack.json`` go up last,
so a reader never sees a partial dataset. Staging therefore holds about one shard.

The journal lives in the bucket beside the shards (:class:`RemoteJournal`): a header object
written when the run starts and one object per completed shard, written after its upload.
So ``--resume`` works from any machine, or after the staging folder is lost (a spot
instance's disk): it keeps every journaled shard whose objects still have the recorded
size and the store's checksum (the ETag, for S3; nothing is downloaded) and uploads the
rest. Nothing stops two machines from writing one DST at once: the staging lock is local.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convert.journal import (
    ENTRY_PREFIX,
    JOURNAL_VERSION,
    ShardEntry,
    entry_name,
    parse_header,
    shard_files,
)
from convert.output.destination import (
    ERRORS_NAME,
    delete_written,
    kept_files,
    refuse_contents,
    remove_if_empty,
)
from convert.output.lock import DestinationLock
from readers import spec
from readers.manifest import Manifest, load_manifest
from readers.storage.cache import ShardCache
from readers.storage.remote import RemoteFolder, StorageError

__all__ = ["RemoteDestination", "RemoteJournal", "ShardUploader"]

log = logging.getLogger(__name__)


class RemoteJournal:
    """The journal of a conversion into a bucket, kept there: the header as
    ``spec.JOURNAL_NAME`` and each entry as its own object (:func:`entry_name`). An object
    is stored whole or not at all, so no entry is ever torn."""

    def __init__(self, folder: RemoteFolder) -> None:
        self.folder = folder

    @property
    def location(self) -> str:
        return self.folder.url_of(spec.JOURNAL_NAME)

    def exists(self) -> bool:
        return self.folder.size(spec.JOURNAL_NAME) is not None

    def start(self, header: dict[str, Any], entries: Sequence[ShardEntry] = ()) -> None:
        """Write the header; ``entries`` (kept from an earlier run) are in the bucket
        already, read from it, and :meth:`RemoteDestination.keep_only` kept them."""
        line = json.dumps({"journal_version": JOURNAL_VERSION, **header}) + "\n"
        self.folder.write(spec.JOURNAL_NAME, line.encode())

    def append(self, entry: ShardEntry) -> None:
        self.folder.write(entry_name(entry.shard), json.dumps(entry.to_json()).encode())

    def load(self) -> tuple[dict[str, Any], list[ShardEntry]]:
        """The header and the entries that parse, in sample order."""
        header = parse_header(self.folder.read(spec.JOURNAL_NAME).decode(), self.location)
        found = self.folder.read_many(self._entry_names())
        entries = []
        for name, data in found.items():
            try:
                entries.append(ShardEntry.from_json(json.loads(data)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                log.warning("%s: unreadable journal entry: its shard is redone", name)
        return header, sorted(entries, key=lambda e: e.end)

    def remove(self) -> None:
        self.folder.delete([spec.JOURNAL_NAME, *self._entry_names()])

    def _entry_names(self) -> list[str]:
        return [n for n in self.folder.names() if n.startswith(ENTRY_PREFIX)]


@dataclass(frozen=True)
class ShardUploader:
    """Uploads a completed shard and its sidecars from a local folder into the bucket
    folder, deleting each local file once it is up: a
    :data:`~convert.output.destination.Upload`.
    Picklable (the folder's URL and storage options): the task that wrote a shard on a
    Ray node uploads it from there, with that node's credentials and these options."""

    remote: RemoteFolder

    def __call__(self, folder: Path, shard: spec.ShardInfo) -> dict[str, list[Any]]:
        """Upload ``shard``'s files from ``folder``; returns each object's size and the
        store's checksum, for the journal."""
        stored: dict[str, list[Any]] = {}
        for name in shard_files(shard):
            self.remote.upload(folder / name, name)
            (folder / name).unlink()
            stat = self.remote.stat(name)
            if stat is None:
                raise FileNotFoundError(f"{self.remote.url_of(name)}: missing just after upload")
            stored[name] = list(stat)
        return stored


class RemoteDestination:
    """The bucket folder a conversion writes, its journal, and the local folder it stages
    in: a :class:`~convert.output.destination.Destination`."""

    staged = True

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        staging: str | os.PathLike[str] | None = None,
    ) -> None:
        self.remote = RemoteFolder(url, storage_options)
        self.journal = RemoteJournal(self.remote)
        self.upload = ShardUploader(self.remote)
        default = ShardCache().folder_for("staging", self.remote.url)
        self.folder = Path(staging or default).absolute()
        self._lock = DestinationLock(self.folder, shown_as=self.remote.url)

    @property
    def dst(self) -> str:
        return self.remote.url

    def claim(self, src: Path | None, overwrite: bool, resume: bool) -> None:
        """Lock the staging folder and refuse, before anything is written or scanned, a
        DST this run may not write into: a missing bucket, a non-empty folder without
        ``overwrite`` or ``resume``, objects imgpack did not write. What an earlier run
        left in the staging folder is this run's to clear, never a reason to refuse."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()  # raises DestinationBusy while another run here holds it
        try:
            if not self.remote.bucket_exists():
                raise FileNotFoundError(
                    f"{self.dst}: no bucket {self.remote.bucket!r}: create it first, or "
                    "check the URL and AWS_ENDPOINT_URL"
                )
            refuse_contents(self.dst, self.remote.names(), overwrite, resume)
        except BaseException:
            self._lock.release()
            with contextlib.suppress(OSError):
                self.folder.rmdir()  # made just now, and empty
            raise

    def is_complete(self) -> bool:
        return self.remote.size(spec.MANIFEST_NAME) is not None

    def manifest(self) -> Manifest:
        return load_manifest(self.remote.url, storage_options=self.remote.storage_options)

    def keep_only(self, kept: Sequence[ShardEntry]) -> None:
        """Delete what an earlier run wrote, except the ``kept`` shards and their journal
        entries: the manifest first, so that no reader sees a dataset losing its shards;
        and what it left in the staging folder."""
        delete_written(self.folder, keep=kept_files(kept))
        keep = {spec.JOURNAL_NAME}
        for entry in kept:
            keep |= {*shard_files(entry.shard), entry_name(entry.shard)}
        doomed = [n for n in self.remote.names() if n not in keep]
        if spec.MANIFEST_NAME in doomed:
            self.remote.delete([spec.MANIFEST_NAME])
        self.remote.delete([n for n in doomed if n != spec.MANIFEST_NAME])

    def publish(
        self, shard: spec.ShardInfo, uploaded: dict[str, list[Any]] | None
    ) -> dict[str, list[Any]]:
        """Upload a completed shard and its sidecars from the staging folder, then free
        their space there; returns each object's size and checksum in the store. A shard
        that a Ray task ``uploaded`` from its node is looked at instead (a HEAD request a
        file): this process must see every object as the task recorded it, or the nodes
        write into another store than the journal's (another endpoint)."""
        if uploaded is None:
            return self.upload(self.folder, shard)
        differing = self._differing(shard, uploaded)
        if differing is not None:
            url, found = self.remote.url_of(differing), self.remote.stat(differing)
            raise StorageError(
                f"{url}: a Ray task uploaded it ({uploaded.get(differing)}: size, checksum) "
                f"but this process finds {list(found) if found else 'no such object'}: the "
                "Ray nodes must reach the bucket at the endpoint this process uses "
                "(AWS_ENDPOINT_URL, storage options)",
                url=url,
                cause="uploaded elsewhere",
            )
        return uploaded

    def verifies(self, entry: ShardEntry) -> bool:
        """A journaled shard is still in the bucket as uploaded: every object at its
        recorded size and store checksum (re-hashing would download it)."""
        return self._differing(entry.shard, entry.stored) is None

    def _differing(self, shard: spec.ShardInfo, recorded: dict[str, list[Any]]) -> str | None:
        """The first of ``shard``'s files that is not in the bucket at the ``recorded``
        size and store checksum, or None."""
        for name in shard_files(shard):
            if name not in recorded or self.remote.stat(name) != tuple(recorded[name]):
                return name
        return None

    def finish(self) -> None:
        """Upload the errors file and then the manifest, which marks the dataset complete."""
        for name in (ERRORS_NAME, spec.MANIFEST_NAME):
            if (self.folder / name).exists():
                self.remote.upload(self.folder / name, name)

    def release(self) -> None:
        self._lock.release()
        remove_if_empty(self.folder)

    def cleanup(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)  # one shard's space at most
