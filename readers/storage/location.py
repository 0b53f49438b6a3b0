"""Where a dataset is, resolved once: a local folder, or a URL with its local cache mirror.

:func:`readers.open_dataset`, :func:`readers.make_loader` and :func:`readers.load_manifest`
build one :class:`Location` from what the user passed (a path, a path to ``imgpack.json``,
a ``file://`` or ``s3://`` URL, and the storage options) and hand that value down: the
manifest records it, and every shard is opened through it. A URL dataset thus has one
:class:`RemoteFolder` and one :class:`ShardCache`, and its manifest is fetched once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from readers.spec import MANIFEST_NAME, DatasetError, ShardInfo
from readers.storage.cache import ShardCache, parse_size
from readers.storage.remote import RemoteFolder, is_url, local_path

__all__ = ["Location"]


@dataclass(frozen=True)
class Location:
    """A dataset's place. ``folder`` is always local: the dataset itself, or for a URL the
    cache folder that mirrors it (where its shards are copied before they are opened).
    Picklable: a DataLoader worker gets the same value. Two locations are equal when they
    name the same folder (a mirror's name is a hash of its URL)."""

    folder: Path
    remote: RemoteFolder | None = field(default=None, compare=False)
    cache: ShardCache | None = field(default=None, compare=False)

    @classmethod
    def of(
        cls,
        root: str | os.PathLike[str] | Location,
        *,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
    ) -> Location:
        """The location ``root`` names. A relative path is made absolute here, so the
        dataset keeps working after ``os.chdir`` (Hydra changes the directory of each
        run); a path to the manifest itself stands for its folder."""
        if isinstance(root, Location):
            root.check_options(
                storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit
            )
            return root
        if is_url(root):
            url = str(root).rstrip("/").removesuffix("/" + MANIFEST_NAME)
            cache = ShardCache(cache_dir, cache_limit)
            return cls(cache.mirror(url), RemoteFolder(url, storage_options), cache)
        folder = local_path(root).absolute()
        if folder.name == MANIFEST_NAME and folder.is_file():
            folder = folder.parent
        return cls(folder)

    def check_options(
        self,
        *,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
    ) -> None:
        """Refuse options given beside this location, resolved already, that it does not
        hold: they would be dropped without a word. The ones it holds (the same storage
        options, cache folder or limit it was opened with) are taken as they are.

        Raises:
            ValueError: naming the location and the options, and where to pass them.
        """
        held = self.remote.storage_options if self.remote is not None else {}
        cache = self.cache
        unlike = {
            "storage_options=": storage_options is not None and dict(storage_options) != held,
            "cache_dir=": cache_dir is not None
            and (cache is None or Path(cache_dir).absolute() != cache.folder),
            "cache_limit=": cache_limit is not None
            and (cache is None or parse_size(cache_limit) != cache.limit),
        }
        named = [name for name, differs in unlike.items() if differs]
        if named:
            how = "a local folder" if self.remote is None else "opened with other options"
            raise ValueError(
                f"{self}: {' and '.join(named)} given beside a dataset or manifest opened "
                f"already ({how}) would not be used: pass them to readers.open_dataset or "
                "readers.load_manifest where it is opened, or pass its path or URL instead"
            )

    @property
    def url(self) -> str | None:
        """The dataset's URL, or None for a local folder."""
        return self.remote.url if self.remote is not None else None

    def __str__(self) -> str:
        """The URL, or the folder: how messages name the dataset."""
        return self.url or str(self.folder)

    def where(self, name: str) -> str:
        """How messages name the file ``name`` of the dataset."""
        return self.remote.url_of(name) if self.remote is not None else str(self.folder / name)

    def shard_file(self, info: ShardInfo, index: int) -> Path:
        """The local file of shard ``index`` (``info`` from the manifest), checked to have
        the manifest's size: for a URL copied first (with its sidecars) into the cache.

        The size is checked before a format library opens the file: it may mmap it and
        die of SIGBUS on a page past a cut (LMDB does), or read the wrong bytes.
        """
        self.fetch(info, index)
        path = self.folder / info.path
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise DatasetError(f"{path}: shard {index} listed in the manifest is missing") from None
        if size != info.bytes:
            raise DatasetError(
                f"{path}: shard {index} is {size} bytes but the manifest says {info.bytes}: "
                "truncated or modified since the conversion (run imgpack verify)"
            )
        return path

    def fetch(self, info: ShardInfo, index: int) -> None:
        """Copy shard ``index`` and its sidecars into the cache, checked against their
        SHA-256s (a no-op for a local folder)."""
        if self.remote is None or self.cache is None:
            return
        names = {info.path: info.sha256, **{info.path + s: h for s, h in info.sidecars.items()}}
        try:
            self.cache.fetch(self.remote, names, {info.path: info.bytes})
        except FileNotFoundError as e:
            if e.filename in names and e.filename != info.path:  # a sidecar: the wds index
                raise DatasetError(
                    f"{self.where(e.filename)}: the index of shard {index} is missing (the "
                    "shard cannot be read without it; copy the dataset folder whole, or "
                    "convert again)"
                ) from None
            raise DatasetError(
                f"{self.where(info.path)}: shard {index} listed in the manifest is missing"
            ) from None

    def __repr__(self) -> str:
        return f"Location({str(self)!r})"
