"""The conversion's preparation pool: the chunks of samples its tasks take."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from convert.executors.pool import CHUNK_BYTES, FIRST_CHUNK, MAX_CHUNK, _Chunks, prepared_in_order
from convert.process import Prepared, Transform
from convert.scan import Sample
from convert.sources import FolderReader


def prepared(nbytes: int) -> Prepared:
    return Prepared(bytes(nbytes), "jpg", (1, 1, 3))


def test_chunks_take_every_sample_once_in_order_at_the_size_in_force() -> None:
    samples = list(range(10_000))
    chunks = _Chunks(samples, 7, workers=2)
    parts = [next(chunks)]
    assert parts[0] == samples[7 : 7 + FIRST_CHUNK]
    weighed = [
        ([prepared(25_000)] * FIRST_CHUNK, MAX_CHUNK),  # resized JPEGs: the largest chunks
        ([prepared(3 * CHUNK_BYTES)] * 2, 1),  # huge raw images: one at a time
        ([prepared(CHUNK_BYTES // 10)] * 5 + ["bad.jpg: not an image"], 12),  # errors weigh 0
        (["bad.jpg: not an image"], 12),  # nothing to go by: the size stays
    ]
    for results, size in weighed:
        chunks.fit(results)
        parts.append(next(chunks))
        assert len(parts[-1]) == size
    parts += list(chunks)
    assert [s for part in parts for s in part] == samples[7:]


@pytest.mark.parametrize("n, workers, most", [(100, 2, 6), (10, 4, 1), (100_000, 2, MAX_CHUNK)])
def test_a_small_run_still_spreads_over_the_workers(n: int, workers: int, most: int) -> None:
    chunks = _Chunks(list(range(n)), 0, workers)
    chunks.fit([Prepared(np.zeros((2, 2, 3), np.uint8), "raw", (2, 2, 3))] * 4)
    assert len(next(chunks)) == most


def test_an_in_process_run_uses_one_torch_thread_and_gives_the_count_back(sample_data) -> None:
    # --workers 1 runs on one core as asked, torch's intra-op threads too (once torch is
    # here: the run imports it only for an image the kernel does not resize)
    samples = [
        Sample(str(p.relative_to(sample_data)), 0) for p in sorted(sample_data.glob("*/*.*g"))
    ]
    transform = Transform("raw", 32, None, 90, True, None)
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        run = prepared_in_order(FolderReader(str(sample_data)), samples, transform, 1)
        assert not isinstance(next(run), str)
        assert torch.get_num_threads() == 1
        rest = list(run)
        assert len(rest) == len(samples) - 1 and not any(isinstance(r, str) for r in rest)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
