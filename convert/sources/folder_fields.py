"""An image folder's fields: sidecar files beside each image, and the ``--metadata`` file's
columns (:mod:`convert.sources.metadata`), joined into the scan's schema and a
:class:`~convert.sources.metadata.FieldTable` the workers read through.

A sidecar is a file beside an image named by the image's stem and an extension that is no
image extension: ``x.jpg`` + ``x.txt``, ``x.json``, ``x.caption.txt`` (img2dataset's
``files`` layout); the field is named by that extension (``txt``, ``json``,
``caption.txt``) and its kind comes from it as for a WebDataset member
(:func:`readers.fields.extension_kind`). A name matching two images' stems (``a.b.txt``
beside ``a.jpg`` and ``a.b.jpg``) belongs to the longer one; an extension that cannot name
a field (``x.txt~``, :func:`readers.fields.check_name`) makes no sidecar: the file is
ignored, as every other non-image file always was. Sidecars are never samples:
the scan takes only image extensions, and the class folders stay the sub-folders. Each
folder holding samples is listed once more to find them; ``--no-fields`` skips that.
"""

from __future__ import annotations

import dataclasses
import os
from array import array
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from convert.options import ConvertOptions
from convert.samples import Sample, SampleTable
from convert.scan import IMG_EXTENSIONS, Scan
from convert.sources.base import select_fields
from convert.sources.metadata import FieldTable, Metadata
from readers.fields import FieldSpec, check_name, extension_kind

__all__ = ["Sidecars", "folder_fields"]


@dataclasses.dataclass
class Sidecars:
    """The sidecar extensions each sample has: distinct sets of them (``kinds``) and each
    sample's set by number (4 bytes a sample)."""

    kinds: list[tuple[str, ...]]
    of_sample: array

    @classmethod
    def find(cls, root: Path, samples: Sequence[Sample]) -> Sidecars:
        """The sidecars of ``samples`` below ``root``, each folder listed once in turn."""
        kinds: dict[tuple[str, ...], int] = {(): 0}
        of_sample = array("I")
        folder, found = None, {}
        for sample in samples:
            where, name = os.path.split(sample.relpath)
            if where != folder:
                folder, found = where, _sidecars_in(root / where)
            stem = os.path.splitext(name)[0]
            exts = tuple(sorted(found.get(stem, ())))
            of_sample.append(kinds.setdefault(exts, len(kinds)))
        return cls(list(kinds), of_sample)

    def extensions(self) -> list[str]:
        return sorted({ext for exts in self.kinds for ext in exts})


def _sidecars_in(folder: Path) -> dict[str, list[str]]:
    """``{image stem: [sidecar extension, ...]}`` of one folder's files."""
    try:
        names = os.listdir(folder)
    except OSError:
        return {}  # the scan reported it
    images = [n for n in names if n.lower().endswith(IMG_EXTENSIONS)]
    stems = {os.path.splitext(n)[0] for n in images}
    found: dict[str, list[str]] = {}
    for name in names:
        if name.startswith(".") or name.lower().endswith(IMG_EXTENSIONS):
            continue
        end = len(name)
        while (dot := name.rfind(".", 0, end)) > 0:  # the longest stem first
            if name[:dot] in stems:
                if _can_name(name[dot + 1 :]):
                    found.setdefault(name[:dot], []).append(name[dot + 1 :])
                break
            end = dot
    return found


def _can_name(extension: str) -> bool:
    try:
        check_name(extension, "sidecar")
    except ValueError:
        return False
    return True


def folder_fields(
    root: Path, scan: Scan, options: ConvertOptions, owner: object
) -> tuple[Scan, FieldTable | None]:
    """``scan`` with its fields (the schema, each sample numbered by its position) and
    the table the workers read them through; None without fields."""
    if options.fields == ():  # --no-fields: nothing is listed or read
        return scan, None
    sidecars = Sidecars.find(root, scan.samples)
    metadata = Metadata.read(options.metadata) if options.metadata else None
    found = {ext: FieldSpec(extension_kind(ext)) for ext in sidecars.extensions()}
    for name, field_spec in (metadata.fields if metadata else {}).items():
        if name in found:
            raise ValueError(
                f"{options.metadata}: column {name!r} is also the extension of sidecar files "
                f"in {root}: rename the column, or choose with --fields"
            )
        found[name] = field_spec
    origins = {name: f"{options.metadata}: column" for name in metadata.fields} if metadata else {}
    fields = select_fields(str(root), found, options, origins)  # a sidecar's name is valid
    problems = list(scan.problems)
    table = _table(scan.samples, fields, sidecars, metadata, problems, owner)
    if table is None:
        return dataclasses.replace(scan, fields=fields), None
    samples = SampleTable.of(Sample(s.relpath, s.label, at) for at, s in enumerate(scan.samples))
    return dataclasses.replace(scan, samples=samples, problems=problems, fields=fields), table


def _table(
    samples: Sequence[Sample],
    fields: dict[str, FieldSpec],
    sidecars: Sidecars,
    metadata: Metadata | None,
    problems: list[dict[str, str]],
    owner: object,
) -> FieldTable | None:
    """The field table of ``samples``; a metadata row naming no sample is a problem."""
    if not fields:
        return None
    names = list(fields)
    rows = np.full((len(samples), 2 * len(names)), -1, dtype=np.int64)
    rows[:, 0::2] = 0
    chunks: list[bytes] = []
    offset = 0
    if metadata is not None:
        by_path = metadata.rows_by_path()
        wanted = [(f, metadata.values[n]) for f, n in enumerate(names) if n in metadata.values]
        for at, sample in enumerate(samples):
            row = by_path.pop(sample.relpath, None)
            if row is None:
                continue  # an image with no metadata row: its metadata fields are missing
            for f, values in wanted:
                value = values[row]
                if value is not None:
                    rows[at, 2 * f : 2 * f + 2] = (offset, len(value))
                    chunks.append(value)
                    offset += len(value)
        for path, row in sorted(by_path.items(), key=lambda item: item[1]):
            problems.append(
                {
                    "path": path,
                    "error": f"{metadata.file}: {metadata.places[row]}: {path!r} names no "
                    "image below SRC: its row is ignored",
                }
            )
    side = [(f, n, fields[n].kind) for f, n in enumerate(names) if n not in _columns(metadata)]
    for f, ext, _ in side:
        has = np.array([ext in exts for exts in sidecars.kinds], dtype=bool)
        present = has[np.frombuffer(sidecars.of_sample, dtype=np.uint32)]
        rows[present, 2 * f + 1] = 0
    return FieldTable.write(rows, chunks, side, owner)


def _columns(metadata: Metadata | None) -> set[str]:
    return set(metadata.fields) if metadata is not None else set()
