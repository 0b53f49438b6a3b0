"""The decode threads: a batch cut into one contiguous part per thread, and the map that
runs a function over items on them."""

from __future__ import annotations

import threading
import time

import pytest

from readers.images.pool import DecodePool, batch_parts


def test_batch_parts_cover_the_batch_in_order() -> None:
    for count in (0, 1, 3, 64, 65):
        for threads in (0, 1, 2, 3):
            parts = batch_parts(count, threads)
            assert [i for p in parts for i in range(count)[p]] == list(range(count))
            assert len(parts) == min(count, max(threads, 1))
            sizes = [p.stop - p.start for p in parts] or [0]
            assert max(sizes) - min(sizes) <= 1


def test_map_keeps_the_order_and_runs_on_the_pool() -> None:
    caller = threading.get_ident()
    seen = []
    both = threading.Barrier(2, timeout=10)  # each thread's first item waits for the other

    def square(x: int) -> int:
        seen.append(threading.get_ident())
        if x < 2:
            both.wait()
        return x * x

    assert DecodePool().map(square, list(range(10)), threads=2) == [x * x for x in range(10)]
    assert caller not in seen and len(set(seen)) == 2


def test_an_error_is_raised_only_once_every_slice_has_finished() -> None:
    # a decode thread left running after the batch's error raced with what came next (a
    # fork for DataLoader workers copied the locks it held: the child hung)
    finished = []

    def slow_or_bad(x: int) -> int:
        if x == 0:
            raise ValueError("sample 0")
        time.sleep(0.2)
        finished.append(x)
        return x

    with pytest.raises(ValueError, match="sample 0"):
        DecodePool().map(slow_or_bad, [0, 1], threads=2)
    assert finished == [1]
