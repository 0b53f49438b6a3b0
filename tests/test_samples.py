"""The converter's compact sample table and its running content checksum: the same samples
as a list of ``Sample`` (indexing, slices, a shuffle, odd file names), at a fraction of the
memory, and the manifest's ``content_sha256`` folded from shards completing in any order."""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import tracemalloc

import pytest

from convert.ledger import ContentDigest
from convert.samples import Sample, SampleTable
from readers import spec

NAMES = [
    "n01440764/n01440764_10026.JPEG",
    "çà/été.jpg",  # not ASCII
    os.fsdecode(b"raw/\xff\xfe.jpg"),  # not UTF-8: kept as os gives it (surrogateescape)
    "a/b/c/deep.png",
    "",  # the blob's offsets must not merge neighbours
    "z.webp",
]


def _samples() -> list[Sample]:
    return [Sample(name, i % 3) for i, name in enumerate(NAMES)]


def test_a_table_reads_as_the_list_of_its_samples() -> None:
    samples = _samples()
    table = SampleTable.of(samples)
    assert len(table) == len(samples) and list(table) == samples and table == samples
    assert [table[i] for i in range(-len(samples), len(samples))] == samples + samples
    for chosen in (slice(2, 5), slice(None, None, 2), slice(4, 1, -1), slice(3, 3), slice(9, 12)):
        assert list(table[chosen]) == samples[chosen], chosen
        assert isinstance(table[chosen], SampleTable)
    assert list(table.relpaths()) == NAMES and table.relpaths()[1:3] == NAMES[1:3]
    assert table.relpaths()[-1] == NAMES[-1]
    assert list(table.relpaths(2)) == NAMES[2:] and table.relpaths(2)[1:3] == NAMES[3:5]
    assert table.relpaths(2)[0] == NAMES[2] and len(table.relpaths(99)) == 0
    order = list(range(len(samples)))
    random.Random(7).shuffle(order)
    assert list(table.take(order)) == [samples[i] for i in order]
    for bad in (len(samples), -len(samples) - 1):
        with pytest.raises(IndexError):
            table[bad]
        with pytest.raises(IndexError):
            table.relpaths()[bad]
    assert table[2].relpath.encode("utf-8", "surrogateescape") == b"raw/\xff\xfe.jpg"


def test_a_table_costs_its_paths_bytes_and_12_more_per_sample() -> None:
    count = 100_000
    names = [f"class{i % 1000:03d}/image_{i:08d}.JPEG" for i in range(count)]
    path_bytes = sum(map(len, names))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        table = SampleTable()
        for i, name in enumerate(names):
            table.append(name, i % 1000)
        table_bytes = tracemalloc.get_traced_memory()[0] - before
        before = tracemalloc.get_traced_memory()[0]
        # A scan makes a new string per path (os.path.relpath): so does this.
        listed = [Sample((name + "/")[:-1], i % 1000) for i, name in enumerate(names)]
        list_bytes = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # The buffers grow by doubling: up to 2x of paths and offsets, never a Python object.
    assert table.nbytes() == path_bytes + 12 * count
    assert table_bytes < 2 * table.nbytes(), table_bytes / count
    assert list_bytes > 3 * table.nbytes()  # a list: a pointer, a Sample and a str each
    assert len(listed) == len(table)


def test_the_content_checksum_folds_shards_completing_in_any_order() -> None:
    shards = [os.urandom(32 * n) for n in (3, 0, 5, 1)]  # a shard of bad files holds none
    expected = spec.content_sha256(
        shard[i : i + 32] for shard in shards for i in range(0, len(shard), 32)
    )
    assert expected == hashlib.sha256(b"".join(shards)).hexdigest()
    for order in ([0, 1, 2, 3], [3, 1, 2, 0], [2, 0, 3, 1]):
        digest = ContentDigest()
        for index in order:
            digest.fold(index, shards[index])
        assert digest.hexdigest() == expected, order
    gap = ContentDigest()
    gap.fold(0, shards[0])
    gap.fold(2, shards[2])
    with pytest.raises(RuntimeError, match="shard 1 never completed"):
        gap.hexdigest()


def test_a_dataset_sources_positions_travel_with_its_samples() -> None:
    samples = [Sample(f"a/{k}.jpg", k % 3, 100 + k) for k in range(7)]
    table = SampleTable.of(samples)
    assert list(table) == samples and table[4].index == 104
    assert list(table[2:5]) == samples[2:5]
    assert list(table.take([6, 0, 3])) == [samples[6], samples[0], samples[3]]
    assert pickle.loads(pickle.dumps(table)) == table
    with pytest.raises(ValueError, match="with and without a source index"):
        table.append("b/x.jpg", 0)
    files = SampleTable.of([Sample("b/1.jpg", 0)])
    assert files[0].index is None
    with pytest.raises(ValueError, match="with and without a source index"):
        files.append("b/2.jpg", 0, 5)
