"""Where this process stands: its rank and world size, and whether it is a DataLoader worker.

Every lookup of ``torch.distributed``, ``RANK``/``WORLD_SIZE`` and ``get_worker_info`` in
the readers is here. :func:`readers.make_loader` resolves a :class:`Placement` once and
passes the value to the sampler or stream it builds; a sampler or stream built by hand
resolves its own (again at ``set_epoch``, since a process group may exist by then), unless
given one. ``detect`` is the hook: tests and launchers that know better pass a Placement.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from torch.utils.data import get_worker_info

from readers.cpus import usable_cpus

__all__ = ["Placement", "current_worker", "default_decode_threads", "visible_world_size"]


@dataclass(frozen=True)
class Placement:
    """This training process's ``rank`` of ``world_size``."""

    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in a world of size {self.world_size}")

    @classmethod
    def detect(cls, rank: int | None = None, world_size: int | None = None) -> Placement:
        """Explicit arguments first, then an initialised ``torch.distributed`` group, then
        ``RANK``/``WORLD_SIZE``, else rank 0 of 1.

        Call it in the training process, never inside a DataLoader worker: a worker started
        with ``spawn`` has neither the process group nor (under ``mp.spawn``) the variables.
        """
        if (rank is None) != (world_size is None):
            raise ValueError("pass both rank= and world_size=, or neither")
        if rank is not None and world_size is not None:
            return cls(rank, world_size)
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        if "WORLD_SIZE" in os.environ:
            return cls(int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"]))
        return cls()

    @classmethod
    def fixed(
        cls, rank: int | None, world_size: int | None, placement: Placement | None
    ) -> Placement | None:
        """The placement explicit arguments fix (``placement``, or ``rank``/``world_size``),
        or None when the process must detect its own, each time it places itself."""
        if placement is None and (rank, world_size) != (None, None):
            return cls.detect(rank, world_size)
        return placement

    @classmethod
    def for_loader(
        cls, distributed: bool | None, rank: int | None, world_size: int | None
    ) -> Placement:
        """:func:`readers.make_loader`'s rule: ``distributed=False`` is rank 0 of 1 whatever
        the process sees; ``True`` requires a world to be visible."""
        if distributed is False:
            return cls()
        placed = cls.detect(rank, world_size)
        if distributed and rank is None and placed == cls() and "WORLD_SIZE" not in os.environ:
            raise ValueError(
                "distributed=True but torch.distributed is not initialised and neither "
                "RANK/WORLD_SIZE nor rank=/world_size= are set"
            )
        return placed


def visible_world_size() -> int | None:
    """The world size a DataLoader worker can see for itself (a forked process group, or
    the environment), to catch a stream placed before the group existed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else None


def current_worker() -> Any:
    """The DataLoader worker this code runs in (torch's ``WorkerInfo``: ``id``,
    ``num_workers``...), or None in the training process."""
    return get_worker_info()


def default_decode_threads() -> int:
    """Decode threads per batch: every usable CPU in the training process, 1 inside a
    DataLoader worker (the workers already use the cores)."""
    if current_worker() is not None:
        return 1
    return usable_cpus()
