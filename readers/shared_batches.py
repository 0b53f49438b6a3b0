"""Worker batches handed to the training process through buffers that are reused, not made
anew for every batch.

Left to torch, each batch a DataLoader worker builds lives in a fresh shared-memory segment:
the worker creates it and faults in (zero-fills) every page, passes its file descriptor
over a socket, and the training process maps it and faults every page in again before the
segment is freed. For a 9.6 MB batch of 64 224x224 crops that is thousands of page faults
on each side per batch, about as costly as decoding a tenth of the batch.

Here each worker keeps :data:`SLOTS` batch buffers in one shared-memory file
(:class:`WorkerBatchPool`). :func:`readers.collate` hands a batch built in one of them over
as a :class:`HandedBatch`, which pickles to a few numbers (and the file's descriptor the
first time) and unpickles in the training process as ``(images, labels)``: ``images`` a view
of that process's own mapping of the same file, mapped once per worker. Each slot has a flag
in the file. The worker sets it when it takes the slot, and the training process clears it
when the last tensor using the slot is freed (a finalizer on the array under the tensor's
storage, so views, ``.numpy()`` and the like keep it taken). The worker reuses only a clear
slot, so a batch is never overwritten while anyone can still see it. When every slot is
taken (a loop that keeps its batches), the batch is built the usual way instead.

The training process lets go of a worker's mapping when that worker has ended and no tensor
uses it: checked when a slot is released, when a new worker's file arrives, and by
:class:`readers.Loader` at the end of each epoch.
"""

from __future__ import annotations

import mmap
import os
import secrets
import threading
import weakref
from dataclasses import dataclass
from multiprocessing import reduction, util
from typing import Any

import numpy as np
import torch

__all__ = [
    "SLOTS",
    "HandedBatch",
    "WorkerBatchPool",
    "release_ended_pools",
    "this_worker_pool",
    "worker_pool",
]

SLOTS = 4  # per worker: two batches in the queue (prefetch), one in use, one being built
_PAGE = mmap.PAGESIZE
_FREE, _TAKEN = 0, 1
_ENDED = _PAGE - 1  # header byte the worker sets as it exits


def _round_up(size: int) -> int:
    return -(-size // _PAGE) * _PAGE


class WorkerBatchPool:
    """:data:`SLOTS` buffers of ``slot_bytes`` each in one shared-memory file, kept by one
    DataLoader worker process: the header page holds one flag per slot and the ended byte."""

    def __init__(self, slot_bytes: int) -> None:
        self.token = secrets.token_hex(8)
        self.slot_bytes = _round_up(slot_bytes)
        self.size = _PAGE + SLOTS * self.slot_bytes
        self.fd = os.memfd_create("imgpack-batches", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.size)
        self.memory = mmap.mmap(self.fd, self.size)
        self.header = np.frombuffer(self.memory, np.uint8, count=_PAGE)
        self._generations = [0] * SLOTS
        self._handed: set[tuple[int, int]] = set()  # (slot, generation) now the consumer's
        self._addresses: dict[int, tuple[int, int]] = {}  # data address -> (slot, generation)
        self._fd_sent = False
        util.Finalize(self, _mark_ended, args=(self.header,), exitpriority=100)

    def take(self, nbytes: int) -> torch.Tensor | None:
        """A 1-D uint8 tensor of ``nbytes`` over a free slot, or None when none is free or
        the batch is larger than a slot."""
        if nbytes > self.slot_bytes or nbytes <= 0:
            return None
        for slot in range(SLOTS):
            if self.header[slot] == _FREE:
                break
        else:
            return None
        self.header[slot] = _TAKEN
        self._generations[slot] += 1
        generation = self._generations[slot]
        array = np.frombuffer(self.memory, np.uint8, count=nbytes, offset=self.offset(slot))
        weakref.finalize(array, self._dropped, slot, generation)
        tensor = torch.from_numpy(array)
        self._addresses[tensor.data_ptr()] = (slot, generation)
        return tensor

    def hand_over(self, images: torch.Tensor, labels: torch.Tensor) -> HandedBatch | None:
        """``(images, labels)`` as a :class:`HandedBatch` when ``images`` lies in a slot
        taken here, else None."""
        storage = images.untyped_storage()
        found = self._addresses.get(storage.data_ptr())
        if found is None or storage.nbytes() > self.slot_bytes:
            return None
        slot, generation = found
        return HandedBatch(self, slot, generation, images, labels)

    def handed(self, slot: int, generation: int) -> Any:
        """Record that the consumer now owns ``slot``; the descriptor of this file to send
        with it the first time (None after)."""
        self._handed.add((slot, generation))
        if self._fd_sent:
            return None
        self._fd_sent = True
        return reduction.DupFd(self.fd)

    def offset(self, slot: int) -> int:
        return _PAGE + slot * self.slot_bytes

    def _dropped(self, slot: int, generation: int) -> None:
        """The worker's last tensor over ``slot`` is gone: free the slot unless it was
        handed over (then the consumer frees it)."""
        self._addresses = {a: s for a, s in self._addresses.items() if s != (slot, generation)}
        if (slot, generation) in self._handed:
            self._handed.discard((slot, generation))
        elif self._generations[slot] == generation:
            self.header[slot] = _FREE


def _mark_ended(header: np.ndarray) -> None:
    header[_ENDED] = 1


class HandedBatch(tuple):
    """A worker's ``(images, labels)`` whose images lie in a pool slot. In the worker it is
    that tuple; it pickles to where the images are and unpickles in the training process as
    ``(images, labels)`` over that process's own mapping of the pool's file."""

    pool: WorkerBatchPool
    slot: int
    generation: int

    def __new__(
        cls,
        pool: WorkerBatchPool,
        slot: int,
        generation: int,
        images: torch.Tensor,
        labels: torch.Tensor,
    ) -> HandedBatch:
        batch = super().__new__(cls, (images, labels))
        batch.pool, batch.slot, batch.generation = pool, slot, generation
        return batch

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        images, labels = self
        layout = (
            str(images.dtype).removeprefix("torch."),
            tuple(images.shape),
            images.stride(),
            images.storage_offset(),
            images.untyped_storage().nbytes(),
        )
        pool = self.pool
        fd = pool.handed(self.slot, self.generation)
        place = (pool.token, os.getpid(), fd, pool.size, pool.offset(self.slot))
        labels_as = (labels.numpy().tobytes(), str(labels.dtype).removeprefix("torch."))
        return _received_batch, (place, self.slot, layout, labels_as)


@dataclass(eq=False)
class _MappedPool:
    """The training process's mapping of one worker's pool file."""

    memory: mmap.mmap
    header: np.ndarray
    pid: int
    live: int = 0  # slots whose tensors are alive here

    def ended(self) -> bool:
        if self.header[_ENDED]:
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        return False


_mapped: dict[str, _MappedPool] = {}
_lock = threading.Lock()  # the main thread and a pin-memory thread both unpickle batches


def _received_batch(
    place: tuple[str, int, Any, int, int],
    slot: int,
    layout: tuple[str, tuple[int, ...], tuple[int, ...], int, int],
    labels_as: tuple[bytes, str],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpickle a :class:`HandedBatch`: ``(images, labels)``, the images a view of slot
    ``slot`` of this process's mapping of the worker's pool."""
    token, pid, fd, size, offset = place
    dtype_name, shape, stride, storage_offset, nbytes = layout
    with _lock:
        pool = _mapped.get(token)
        if pool is None:
            if fd is None:
                raise RuntimeError(
                    f"a batch from DataLoader worker process {pid} names a shared batch pool "
                    "this process never received: was a batch of it lost in transit?"
                )
            _release_ended_locked()
            pool = _map(fd.detach(), size, pid)
            _mapped[token] = pool
        pool.live += 1
    array = np.frombuffer(pool.memory, np.uint8, count=nbytes, offset=offset)
    weakref.finalize(array, _released, token, pool, slot)
    dtype = getattr(torch, dtype_name)
    images = torch.from_numpy(array).view(dtype).as_strided(shape, stride, storage_offset)
    labels, labels_dtype = labels_as
    return images, torch.frombuffer(bytearray(labels), dtype=getattr(torch, labels_dtype))


def _map(fd: int, size: int, pid: int) -> _MappedPool:
    try:
        memory = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    return _MappedPool(memory, np.frombuffer(memory, np.uint8, count=_PAGE), pid)


def _released(token: str, pool: _MappedPool, slot: int) -> None:
    """The last tensor over ``slot`` here is gone: give the slot back to its worker."""
    pool.header[slot] = _FREE
    with _lock:
        pool.live -= 1
        if pool.live == 0 and _mapped.get(token) is pool and pool.ended():
            del _mapped[token]


def release_ended_pools() -> int:
    """Unmap the pools of workers that have ended once no tensor here uses them; how many
    are still mapped."""
    with _lock:
        _release_ended_locked()
        return len(_mapped)


def _release_ended_locked() -> None:
    for token, pool in list(_mapped.items()):
        if pool.live == 0 and pool.ended():
            del _mapped[token]


_worker_pools: dict[int, WorkerBatchPool | None] = {}  # by process id: forks start afresh


def worker_pool(nbytes: int) -> WorkerBatchPool | None:
    """This worker process's pool, made at its first batch (slots of that batch's size), or
    None where shared-memory files cannot be made (off Linux)."""
    pid = os.getpid()
    if pid not in _worker_pools:
        try:
            made = WorkerBatchPool(nbytes) if hasattr(os, "memfd_create") else None
        except OSError:
            made = None
        _worker_pools[pid] = made
    return _worker_pools[pid]


def this_worker_pool() -> WorkerBatchPool | None:
    """This process's pool if :func:`worker_pool` made one."""
    return _worker_pools.get(os.getpid())
