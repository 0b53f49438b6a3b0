"""An object-store DST (``s3://bucket/prefix``, anything fsspec reaches).

The run writes into a local staging folder exactly as into a local DST (the same lock,
shards renamed into place when complete, the same journal), and each completed shard with
its sidecars is uploaded, then deleted locally, *before* the journal records it: a shard
the journal names is in the bucket, whole. ``errors.jsonl`` and then ``imgpack.json`` go up
last, so a reader never sees a partial dataset. Staging therefore holds about one shard.

``--resume`` needs the staging folder's journal, so it runs where the interrupted run ran
(or with the same ``--staging``); it keeps the journaled shards still in the bucket at
their recorded size and uploads the rest. Without the journal it starts again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from convert.destination import ERRORS_NAME, written_by_imgpack
from convert.journal import ShardEntry
from readers import spec
from readers.cache import ShardCache
from readers.storage import RemoteFolder

__all__ = ["RemoteDestination"]


class RemoteDestination:
    """The bucket folder a conversion writes, and the local folder it stages in."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        staging: str | os.PathLike[str] | None = None,
    ) -> None:
        self.folder = RemoteFolder(url, storage_options)
        default = ShardCache().folder_for("staging", self.folder.url)
        self.staging = Path(staging or default).absolute()

    @property
    def url(self) -> str:
        return self.folder.url

    def check(self, overwrite: bool, resume: bool) -> None:
        """Refuse, before anything is written, a folder this run may not write into; with
        ``overwrite``, delete what an earlier conversion wrote there."""
        names = self.folder.names()
        foreign = [n for n in names if not written_by_imgpack(n)]
        if names and not (overwrite or resume):
            what = "a dataset" if spec.MANIFEST_NAME in names else "other files"
            raise FileExistsError(
                f"{self.url}: not empty (holds {what}): pass --resume to finish an "
                "interrupted conversion or --overwrite to replace it"
            )
        if foreign:
            raise FileExistsError(
                f"{self.url}: holds objects imgpack did not write ({', '.join(foreign[:3])}); "
                "refusing to write there: choose an empty or new DST"
            )
        if overwrite:
            self.folder.delete(names)

    def is_complete(self) -> bool:
        return self.folder.size(spec.MANIFEST_NAME) is not None

    def keep_only(self, keep: set[str]) -> None:
        """Delete the shards an interrupted run uploaded but did not journal."""
        self.folder.delete([n for n in self.folder.names() if n not in keep])

    def publish(self, shard: spec.ShardInfo) -> None:
        """Upload a completed shard and its sidecars, then free their staging space."""
        for name in (shard.path, *(shard.path + s for s in shard.sidecars)):
            self.folder.upload(self.staging / name, name)
            (self.staging / name).unlink()

    def verifies(self, entry: ShardEntry) -> bool:
        """A journaled shard is still in the bucket at its recorded size (re-hashing would
        download it; uploads are whole objects, so a size mismatch is a changed file)."""
        shard = entry.shard
        sidecars = [self.folder.size(shard.path + s) for s in shard.sidecars]
        return self.folder.size(shard.path) == shard.bytes and None not in sidecars

    def finish(self) -> None:
        """Upload the errors file and then the manifest, which marks the dataset complete."""
        for name in (ERRORS_NAME, spec.MANIFEST_NAME):
            if (self.staging / name).exists():
                self.folder.upload(self.staging / name, name)
