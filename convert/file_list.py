"""A source given as a list of its files (``--file-list FILE``): no walk of SRC.

A folder walk lists and stats every entry of SRC, which at a billion files on a network
filesystem takes hours; a dataset's own index (a LAION parquet export, a CSV of ImageNet's
training set) already names every file. The list is CSV or TSV (tab if the first line has
one), header optional (a first field ``path``, ``file``, ``image``...), one row per file:
``relative_path`` (unlabelled: ``spec.UNLABELED``, no classes) or
``relative_path,label_name`` (the classes are the sorted label names, or ``--classes``).
The samples are the rows, in the list's order; the list is read line by line into a
:class:`~convert.samples.SampleTable`, so the main process holds ~12 bytes a file beside
its path.

The list is trusted as the source: nothing is stat'ed or filtered (hidden names and other
extensions are converted as listed), and a listed file that is missing or unreadable is a
bad file when it is converted (``--on-error``: listed in ``errors.jsonl``, or the run
stops naming it). A path that leaves SRC, a row of the wrong shape and a path listed twice
are refused before anything is converted.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import os
from array import array
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from convert.samples import SampleTable
from convert.scan import HEADER_NAMES, Scan
from readers.spec import UNLABELED

__all__ = ["scan_file_list"]


def scan_file_list(src: Path, list_file: Path, classes: Sequence[str] | None = None) -> Scan:
    """The samples ``list_file`` names below ``src``, in its order (see the module
    docstring); ValueError naming the file and line of the first bad row."""
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: source folder does not exist or is not a folder")
    table = SampleTable()
    names: dict[str, int] = {}  # label name -> its number in order of first appearance
    hashes = array("Q")  # of each path, to find one listed twice without a set of paths
    labelled: bool | None = None
    try:
        with open(list_file, encoding="utf-8", newline="") as f:
            first = f.readline()
            delimiter = "\t" if "\t" in first else ","
            rows = csv.reader(itertools.chain([first], f), delimiter=delimiter)
            for number, row in enumerate(rows, 1):
                fields = [field.strip() for field in row]
                if not any(fields) or (number == 1 and fields[0].lower() in HEADER_NAMES):
                    continue
                if labelled is None:
                    labelled = len(fields) == 2
                if len(fields) != (2 if labelled else 1) or not all(fields):
                    shape = f"relative_path{delimiter}label_name" if labelled else "relative_path"
                    raise ValueError(f"{list_file}:{number}: expected {shape} (as the rows before)")
                rel = os.path.normpath(fields[0])
                if os.path.isabs(rel) or rel.split(os.sep)[0] == "..":
                    where = f"{list_file}:{number}"
                    raise ValueError(f"{where}: {fields[0]!r} is not a path inside SRC")
                label = names.setdefault(fields[1], len(names)) if labelled else UNLABELED
                table.append(rel, label)
                hashes.append(_path_hash(rel))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{list_file}: cannot read the file list: {e}") from e
    if not table:
        raise ValueError(f"{list_file}: lists no file (rows of relative_path[,label_name])")
    _refuse_repeats(list_file, table, hashes)
    scan = Scan([], table)
    if labelled:
        scan.classes = list(classes) if classes is not None else sorted(names)
        unknown = sorted(set(names) - set(scan.classes))
        if unknown:
            raise ValueError(f"{list_file}: label {unknown[0]!r} is not in the class list")
        index_of = {name: i for i, name in enumerate(scan.classes)}
        table.relabel([index_of[name] for name in names])  # first appearance -> class
    return scan


def _path_hash(rel: str) -> int:
    digest = hashlib.blake2b(rel.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _refuse_repeats(list_file: Path, table: SampleTable, hashes: array) -> None:
    """ValueError naming a path listed twice: paths whose 8-byte hashes are equal (found
    by sorting the hashes: 8 bytes a file) are compared."""
    ordered = np.sort(np.frombuffer(hashes, dtype=np.uint64))
    repeated = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    if not repeated:
        return
    seen: set[str] = set()
    for position, value in enumerate(hashes):
        if value in repeated:
            rel = table.relpath(position)
            if rel in seen:
                raise ValueError(f"{list_file}: {rel!r} is listed twice")
            seen.add(rel)
