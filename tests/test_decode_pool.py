"""The decode threads' pipeline: parts read on the calling thread, in order, while earlier
parts decode on the pool; the first failing part, in order, raises."""

from __future__ import annotations

import threading
import time

import pytest

from readers.images.pool import PARTS_PER_THREAD, DecodePool, batch_parts


def test_batch_parts_cover_the_batch_in_order() -> None:
    for count in (0, 1, 3, 64, 65):
        for threads in (1, 2, 3):
            parts = batch_parts(count, threads)
            assert [i for p in parts for i in range(count)[p]] == list(range(count))
            assert len(parts) == min(count, 1 if threads == 1 else threads * PARTS_PER_THREAD)
            sizes = [p.stop - p.start for p in parts] or [0]
            assert max(sizes) - min(sizes) <= 1


def test_pipeline_produces_in_order_here_and_consumes_on_the_pool() -> None:
    produced, consumed = [], {}
    caller = threading.get_ident()

    def produce(part: int) -> int:
        assert threading.get_ident() == caller
        produced.append(part)
        return part * 10

    def consume(part: int, value: int) -> None:
        consumed[part] = (value, threading.get_ident())

    DecodePool().pipeline(produce, consume, range(6), threads=2)
    assert produced == list(range(6))
    assert {p: v for p, (v, _) in consumed.items()} == {p: p * 10 for p in range(6)}
    assert caller not in {t for _, t in consumed.values()}


def test_the_first_failing_part_raises_after_every_started_part_finished() -> None:
    finished = []

    def consume(part: int, _: None) -> None:
        time.sleep(0.05 * (3 - part))  # the later parts finish first
        finished.append(part)
        if part in (1, 2):
            raise ValueError(f"part {part}")

    with pytest.raises(ValueError, match="part 1"):
        DecodePool().pipeline(lambda part: None, consume, range(3), threads=2)
    assert sorted(finished) == [0, 1, 2]


def test_a_read_error_comes_after_the_parts_before_it() -> None:
    def produce(part: int) -> int:
        if part == 2:
            raise OSError("read of part 2")
        return part

    def consume(part: int, _: int) -> None:
        if part == 1:
            raise ValueError("decode of part 1")

    with pytest.raises(ValueError, match="decode of part 1"):
        DecodePool().pipeline(produce, consume, range(4), threads=2)
    consumed = []
    with pytest.raises(OSError, match="read of part 2"):
        DecodePool().pipeline(produce, lambda p, _: consumed.append(p), range(4), threads=2)
    assert sorted(consumed) == [0, 1]  # nothing after the part that could not be read
