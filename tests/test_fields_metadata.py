"""``ds.metadata()`` over many shards: the table's columns are copies out of the shards
(never views of their mapped pages), and a ``pt`` shard's pages are let go once its part of
the table is made, so that the shards passed do not stay resident beside the table."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import numpy as np
import pytest

import readers
from tests.test_fields_reading import folder_values, number
from tests.test_fields_sources import convert, metadata_csv, sidecar_folder


def resident_pages(span: tuple[int, int]) -> int:
    """How many pages of the addresses ``span`` this process has mapped in (the present bit
    of /proc/self/pagemap, which a process may read of itself)."""
    page = mmap.PAGESIZE
    first, last = span[0] // page, -(-span[1] // page)
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = np.frombuffer(pagemap.read((last - first) * 8), dtype="<u8")
    return int(((entries >> np.uint64(63)) & np.uint64(1)).sum())


def tensor_span(shard: object) -> tuple[int, int]:
    """The addresses a pt shard's tensors span in its mapping."""
    tensors = [t for t in shard._t.values() if t.nbytes]  # type: ignore[attr-defined]
    return min(t.data_ptr() for t in tensors), max(t.data_ptr() + t.nbytes for t in tensors)


@pytest.fixture(scope="module")
def pt_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("metadata")
    src = sidecar_folder(root / "folder")
    dst = root / "pt"
    options = {"metadata": str(metadata_csv(root / "meta.csv")), "shard_size": 3}
    convert(src, dst, "pt", on_error="fail", encoding="jpeg", resize=32, **options)
    return dst


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/pagemap")
def test_metadata_lets_the_pt_shards_pages_go_and_owns_its_columns(pt_dataset):
    ds = readers.open_dataset(pt_dataset)
    assert len(ds.manifest.shards) == 2
    spans = []
    for k in range(2):  # every shard mapped, and pages of each read
        assert ds.shard(k).fields["txt"].value(0) is not None
        spans.append(tensor_span(ds.shard(k)))
    assert all(resident_pages(span) > 0 for span in spans)
    table = ds.metadata()
    assert [resident_pages(span) for span in spans] == [0, 0]
    for name in table.column_names:  # no column is a view of a shard's pages
        for chunk in table[name].chunks:
            for buffer in chunk.buffers():
                if buffer is not None:
                    assert not any(lo <= buffer.address < hi for lo, hi in spans), name
    # The pages let go are read again on use: the same values as the table's.
    rows = table.to_pylist()
    for i in range(len(ds)):
        expected = folder_values(number(ds, i))
        assert rows[i]["txt"] == expected["txt"] == ds.shard(i // 3).fields["txt"].value(i % 3)
        assert rows[i]["score"] == expected["score"]
    assert resident_pages(spans[0]) > 0
