"""What ``torchvision.datasets.ImageFolder`` offers beyond indexing, which training scripts
read (``classes``, ``class_to_idx``, ``targets``, ``samples``, ``imgs``): a mixin of
:class:`readers.ImageDataset`, computed from the shards' labels and paths on first use."""

from __future__ import annotations

from functools import cached_property

from readers.formats import ShardReader
from readers.manifest import Manifest

__all__ = ["ImageFolderAttributes"]


class ImageFolderAttributes:
    """ImageFolder's attributes over :attr:`manifest` and the shards of :meth:`shard`."""

    manifest: Manifest

    def shard(self, index: int) -> ShardReader:
        raise NotImplementedError

    def source_path(self, index: int) -> str:
        raise NotImplementedError

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.manifest.classes)}

    @cached_property
    def targets(self) -> list[int]:
        """All labels in index order, a list like ``ImageFolder.targets`` (read once)."""
        shards = range(len(self.manifest.shards))
        return [int(x) for k in shards for x in self.shard(k).labels]

    @cached_property
    def samples(self) -> list[tuple[str, int]]:
        """``(source path, label)`` per sample, like ``ImageFolder.samples`` (paths relative
        to the converted folder; read once)."""
        return [(self.source_path(i), y) for i, y in enumerate(self.targets)]

    @property
    def imgs(self) -> list[tuple[str, int]]:
        """:attr:`samples`, under the alias ``ImageFolder`` also gives it."""
        return self.samples
