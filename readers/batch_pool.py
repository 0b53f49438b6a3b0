"""Batch buffers that are reused, not allocated anew for every batch, in the training
process and in each DataLoader worker.

A fresh 9.6 MB batch (64 crops of 224x224) costs thousands of page faults before the decode
can write it: the allocator returns large blocks to the kernel when they are freed, and the
kernel zero-fills each page again at its first write. In a DataLoader worker it is worse.
Left to torch, each batch is a fresh shared-memory segment: the worker creates it and
faults in every page, passes its file descriptor over a socket, and the training process
maps it and faults every page in again before the segment is freed.

So each process keeps :data:`SLOTS` buffers per batch size (:class:`BatchPool`), and a
batch tensor is a view of a free one. A finalizer on the array under the tensor's storage
frees the slot when the last tensor using it is freed: views, slices and ``.numpy()`` keep
it taken, so a batch is never overwritten while anyone can still see it. When every slot is
taken (a loop that keeps its batches), the batch is allocated the usual way instead.

In a worker the buffers lie in one shared-memory file, and :func:`readers.collate` hands a
batch in them over as a :class:`HandedBatch`. It pickles to a few numbers (plus the file's
descriptor the first time, and the bytes of the labels and of any fields, which ride along)
and unpickles in the training process as ``(images, labels, *fields)``.
The images there are a view of that process's own mapping of the same file, mapped once
per worker. A flag per slot in the file says who holds it. The worker sets it when it takes
the slot; the training process clears it when its last tensor over the slot is freed. The
training process lets go of a worker's mapping when that worker has ended and no tensor
uses it. That is checked when a slot is released, when a new worker's file arrives, and by
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

__all__ = ["SLOTS", "BatchPool", "HandedBatch", "hand_over", "release_ended_pools", "take_batch"]

SLOTS = 4  # a worker's: two batches in the queue (prefetch), one in use, one being built
_PAGE = mmap.PAGESIZE
_FREE, _TAKEN = 0, 1
_ENDED = _PAGE - 1  # header byte the worker sets as it exits


def _round_up(size: int) -> int:
    return -(-size // _PAGE) * _PAGE


class BatchPool:
    """:data:`SLOTS` buffers of ``slot_bytes`` each in one memory map, whose header page
    holds a flag per slot (and, ``shared``, the byte its worker sets as it exits).
    ``shared``: a shared-memory file that the training process maps too (a worker's pool);
    else private memory, which a forked child gets a copy of."""

    def __init__(self, slot_bytes: int, shared: bool) -> None:
        self.token = secrets.token_hex(8)
        self.slot_bytes = _round_up(slot_bytes)
        self.size = _PAGE + SLOTS * self.slot_bytes
        self.shared = shared
        if shared:
            self.fd = os.memfd_create("imgpack-batches", os.MFD_CLOEXEC)
            os.ftruncate(self.fd, self.size)
            self.memory = mmap.mmap(self.fd, self.size)
        else:
            self.memory = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE)
        self.header = np.frombuffer(self.memory, np.uint8, count=_PAGE)
        if shared:
            util.Finalize(self, _mark_ended, args=(self.header,), exitpriority=100)
        self._generations = [0] * SLOTS
        self._handed: set[tuple[int, int]] = set()  # (slot, generation) now the consumer's
        self._fd_sent = False
        # re-entrant: a finaliser may free a slot in the middle of a take on its thread
        self._lock = threading.RLock()

    def take(self, nbytes: int) -> torch.Tensor | None:
        """A 1-D uint8 tensor of ``nbytes`` over a free slot, or None when none is free or
        the batch is larger than a slot."""
        if nbytes > self.slot_bytes or nbytes <= 0:
            return None
        with self._lock:
            free = [slot for slot in range(SLOTS) if self.header[slot] == _FREE]
            if not free:
                return None
            slot = free[0]
            self.header[slot] = _TAKEN
            self._generations[slot] += 1
            generation = self._generations[slot]
        array = np.frombuffer(self.memory, np.uint8, count=nbytes, offset=self.offset(slot))
        weakref.finalize(array, self._dropped, slot, generation)
        return torch.from_numpy(array)

    def hand_over(
        self, images: torch.Tensor, labels: torch.Tensor, fields: tuple[Any, ...] = ()
    ) -> HandedBatch | None:
        """``(images, labels, *fields)`` as a :class:`HandedBatch` when ``images`` lies in
        a slot taken here, else None."""
        storage = images.untyped_storage()
        slot, rest = divmod(storage.data_ptr() - self.header.ctypes.data - _PAGE, self.slot_bytes)
        if rest or not 0 <= slot < SLOTS or storage.nbytes() > self.slot_bytes:
            return None
        # the slot's latest take: it cannot be taken again while this tensor lives
        return HandedBatch(self, slot, self._generations[slot], images, labels, fields)

    def handed(self, slot: int, generation: int) -> Any:
        """Record that the consumer now owns ``slot``; the descriptor of this file to send
        with it the first time (None after)."""
        with self._lock:
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
        with self._lock:
            if (slot, generation) in self._handed:
                self._handed.discard((slot, generation))
            elif self._generations[slot] == generation:
                self.header[slot] = _FREE


def _mark_ended(header: np.ndarray) -> None:
    header[_ENDED] = 1


class HandedBatch(tuple):
    """A worker's ``(images, labels, *fields)`` whose images lie in a pool slot. In the
    worker it is that tuple; it pickles to where the images are (the labels and fields to
    their values) and unpickles in the training process as that tuple, the images over that
    process's own mapping of the pool's file."""

    pool: BatchPool
    slot: int
    generation: int

    def __new__(
        cls,
        pool: BatchPool,
        slot: int,
        generation: int,
        images: torch.Tensor,
        labels: torch.Tensor,
        fields: tuple[Any, ...] = (),
    ) -> HandedBatch:
        batch = super().__new__(cls, (images, labels, *fields))
        batch.pool, batch.slot, batch.generation = pool, slot, generation
        return batch

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        images, labels, *fields = self
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
        fields_as = tuple(_value_as(field) for field in fields)
        return _received_batch, (place, self.slot, layout, _tensor_as(labels), fields_as)


def _tensor_as(tensor: torch.Tensor) -> tuple[bytes, str, tuple[int, ...]]:
    """A small tensor as plain values (its bytes, dtype and shape), which pickle without
    a shared-memory segment of their own."""
    data = tensor.detach().contiguous().numpy().tobytes()
    return data, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)


def _tensor_from(data: bytes, dtype_name: str, shape: tuple[int, ...]) -> torch.Tensor:
    dtype = getattr(torch, dtype_name)
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).view(shape)


def _value_as(value: Any) -> tuple[bool, Any]:
    """A field's batch as it travels: a tensor as :func:`_tensor_as`, a list as it is."""
    return (True, _tensor_as(value)) if isinstance(value, torch.Tensor) else (False, value)


@dataclass(eq=False)
class _MappedPool:
    """The training process's mapping of one worker's pool file."""

    memory: mmap.mmap
    header: np.ndarray
    pid: int
    live: int = 0  # slots whose tensors are alive here

    def ended(self) -> bool:
        """Whether its worker has exited (it marks the file as it does) or is gone."""
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
# the main thread and a pin-memory thread both unpickle batches; re-entrant, as a finaliser
# may release a slot on a thread that holds it
_lock = threading.RLock()


def _received_batch(
    place: tuple[str, int, Any, int, int],
    slot: int,
    layout: tuple[str, tuple[int, ...], tuple[int, ...], int, int],
    labels_as: tuple[bytes, str, tuple[int, ...]],
    fields_as: tuple[tuple[bool, Any], ...] = (),
) -> tuple[Any, ...]:
    """Unpickle a :class:`HandedBatch`: ``(images, labels, *fields)``, the images a view of
    slot ``slot`` of this process's mapping of the worker's pool."""
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
    fields = (_tensor_from(*value) if tensor else value for tensor, value in fields_as)
    return images, _tensor_from(*labels_as), *fields


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


MAX_POOLS = 4  # batch sizes a process keeps slots for (train and validation, last batches)
MIN_PRIVATE = 256 << 10  # smaller batches come from malloc's free lists without faults
_pools: dict[int, list[BatchPool]] = {}  # by process id: a forked child starts afresh


def take_batch(nbytes: int, shared: bool) -> torch.Tensor | None:
    """A 1-D uint8 tensor of ``nbytes`` in a free slot of this process's pools (``shared``:
    in a DataLoader worker), or None when none is free, nor a new pool allowed."""
    if not shared and nbytes < MIN_PRIVATE:
        return None
    pools = _pools.setdefault(os.getpid(), [])
    fitting = sorted((p for p in pools if p.slot_bytes >= nbytes), key=lambda p: p.slot_bytes)
    for pool in fitting:
        tensor = pool.take(nbytes)
        if tensor is not None:
            return tensor
    if fitting or len(pools) >= MAX_POOLS or (shared and not hasattr(os, "memfd_create")):
        return None
    try:
        pool = BatchPool(nbytes, shared)
    except OSError:  # no memory for the map, too many open files
        return None
    pools.append(pool)
    return pool.take(nbytes)


def hand_over(
    images: torch.Tensor, labels: torch.Tensor, fields: tuple[Any, ...] = ()
) -> HandedBatch | None:
    """``(images, labels, *fields)`` as a :class:`HandedBatch` when ``images`` lies in a
    slot of one of this worker's shared pools, else None (always, outside a worker)."""
    for pool in _pools.get(os.getpid(), ()):
        if pool.shared:
            handed = pool.hand_over(images, labels, fields)
            if handed is not None:
                return handed
    return None
