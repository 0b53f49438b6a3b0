"""The converter's table of source samples, compact: what its main process holds per file
for the whole run.

A list of :class:`~convert.scan.Sample` objects costs ~200 bytes a file (the object, its
path string, the list's pointer): 20 GB at 100 M files. :class:`SampleTable` holds the
same in three flat buffers: every relative path's UTF-8 bytes in one blob (undecodable
names kept with ``surrogateescape``, as ``os`` gives them), 8-byte end offsets and 4-byte
labels, so ~12 bytes a file beside the path's own bytes. It is a ``Sequence[Sample]``:
indexing makes the :class:`Sample` asked for, slicing and :meth:`SampleTable.take` make
another table, so code written for a list of samples reads it unchanged.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

__all__ = ["Sample", "SampleTable"]

_ENCODING = ("utf-8", "surrogateescape")


@dataclass(frozen=True, slots=True)
class Sample:
    """One source image: its path relative to SRC, its class index and, for a dataset
    source, its position there (made on demand from a :class:`SampleTable`, which holds
    them)."""

    relpath: str
    label: int
    index: int | None = None  # the sample's index in a source dataset; None: a file


class SampleTable(Sequence[Sample]):
    """Relative paths and labels of the source's samples, in order (see the module
    docstring); :meth:`append` adds one, as a scan finds it."""

    def __init__(self) -> None:
        self._blob = bytearray()
        self._ends = array("q")  # end of sample i's path in the blob
        self._labels = array("i")
        self._indices: array | None = None  # a dataset source's positions; None: files

    @classmethod
    def of(cls, samples: Iterable[Sample]) -> SampleTable:
        table = cls()
        for sample in samples:
            table.append(sample.relpath, sample.label, sample.index)
        return table

    def append(self, relpath: str, label: int, index: int | None = None) -> None:
        """Add a sample; every one has an ``index`` (a dataset source's) or none has."""
        if (index is None) != (self._indices is None) and len(self):
            raise ValueError(f"{relpath}: samples with and without a source index")
        if index is not None:
            if self._indices is None:
                self._indices = array("q")
            self._indices.append(index)
        self._blob += relpath.encode(*_ENCODING)
        self._ends.append(len(self._blob))
        self._labels.append(label)

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, index: int) -> Sample: ...

    @overload
    def __getitem__(self, index: slice) -> SampleTable: ...

    def __getitem__(self, index: int | slice) -> Sample | SampleTable:
        if isinstance(index, slice):
            return self._slice(range(len(self))[index])
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} of {len(self)}")
        return Sample(self.relpath(index), self._labels[index], self._index(index))

    def __iter__(self) -> Iterator[Sample]:
        blob, labels = self._blob, self._labels
        start = 0
        for i, end in enumerate(self._ends):
            yield Sample(blob[start:end].decode(*_ENCODING), labels[i], self._index(i))
            start = end

    def _index(self, i: int) -> int | None:
        return None if self._indices is None else self._indices[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SampleTable):
            return (self._blob, self._ends, self._labels, self._indices) == (
                other._blob,
                other._ends,
                other._labels,
                other._indices,
            )
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def __repr__(self) -> str:
        return f"SampleTable({len(self)} samples)"

    def relpath(self, index: int) -> str:
        """The relative path of sample ``index`` (no bounds check beyond the arrays')."""
        start = self._ends[index - 1] if index > 0 else 0
        return self._blob[start : self._ends[index]].decode(*_ENCODING)

    def relabel(self, new_of_old: Sequence[int]) -> None:
        """Replace every label ``k`` by ``new_of_old[k]`` (in place)."""
        self._labels = array("i", (new_of_old[k] for k in self._labels))

    def take(self, indices: Iterable[int]) -> SampleTable:
        """A new table of the samples at ``indices``, in that order (a shuffle, a slice)."""
        table = SampleTable()
        blob, ends, labels = self._blob, self._ends, self._labels
        out_blob, out_ends, out_labels = table._blob, table._ends, table._labels
        positions = None if self._indices is None else array("q")
        for i in indices:
            start = ends[i - 1] if i > 0 else 0
            out_blob += blob[start : ends[i]]
            out_ends.append(len(out_blob))
            out_labels.append(labels[i])
            if positions is not None:
                positions.append(self._indices[i])  # type: ignore[index]
        table._indices = positions
        return table

    def _slice(self, chosen: range) -> SampleTable:
        """``take(chosen)``, by copying buffers where the range is contiguous."""
        if chosen.step != 1 or not chosen:
            return self.take(chosen)
        table = SampleTable()
        base = self._ends[chosen.start - 1] if chosen.start > 0 else 0
        table._blob += self._blob[base : self._ends[chosen.stop - 1]]
        table._ends = array("q", (end - base for end in self._ends[chosen.start : chosen.stop]))
        table._labels = self._labels[chosen.start : chosen.stop]
        if self._indices is not None:
            table._indices = self._indices[chosen.start : chosen.stop]
        return table

    def relpaths(self, start: int = 0) -> Sequence[str]:
        """The relative paths from sample ``start`` on, as a read-only view (each decoded
        when read: no list of them is made)."""
        return _Relpaths(self, start)

    def nbytes(self) -> int:
        """Bytes the table's buffers hold (beside a small constant)."""
        positions = 0 if self._indices is None else 8 * len(self._indices)
        return len(self._blob) + 8 * len(self._ends) + 4 * len(self._labels) + positions


class _Relpaths(Sequence[str]):
    """:meth:`SampleTable.relpaths`: the paths without making a list of them."""

    def __init__(self, table: SampleTable, start: int) -> None:
        self._table = table
        self._start = min(max(start, 0), len(table))

    def __len__(self) -> int:
        return len(self._table) - self._start

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self._table.relpath(self._start + i) for i in range(len(self))[index]]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"path {index} of {len(self)}")
        return self._table.relpath(self._start + index)
