"""WebDataset tars made by other tools (``webdataset.ShardWriter``, ``tarp``, ``img2dataset``)
as a sample source.

A sample is the run of members sharing a key (``convert.sources.tar_members``): the image
is its ``jpg``/``jpeg``/``png``/``webp`` member, the label the member ``--label-key`` names
(default ``cls``) holding a class number or name, or a value inside a JSON member
(``--label-key json.label``). Integer labels are stored as those integers (class names
``"0"`` .. ``"K-1"``, or ``--classes FILE``; ``convert.sources.labels``). The scan reads
every tar once, in order, and records where each image lies; workers then read just those
bytes (``pread``, or merged range requests for a URL). A compressed tar (``.tar.gz``,
``.tgz``) is decompressed once by the scan, its images staged in a temporary file.

A key met again (later in the tar, in another tar, or as a second set of members in a row)
is a duplicate: its sample is listed in ``errors.jsonl`` and left out, never dropped
silently (``webdataset`` itself raises there).
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from convert.options import ConvertOptions
from convert.samples import Sample, SampleTable
from convert.scan import Scan
from convert.sources.base import (
    Stored,
    WithFields,
    position,
    refuse_folder_options,
    select_fields,
)
from convert.sources.files import FileSource, Spans, split_url
from convert.sources.labels import LabelField, Labels
from convert.sources.tar_members import (
    IMAGE_EXTS,
    TAR_SUFFIXES,
    Member,
    Staging,
    TarSample,
    split_name,
    walk,
)
from readers.fields import FieldSpec, canonical, extension_kind
from readers.storage.remote import is_url

__all__ = ["DEFAULT_LABEL_KEY", "IMAGE_EXTS", "TAR_SUFFIXES", "TarReader", "WebDatasetSource"]

DEFAULT_LABEL_KEY = "cls"


@dataclass(frozen=True)
class TarReader:
    """Reads each sample's image bytes (and its fields' members, made canonical) from its
    tar, or a compressed tar's staged file, by the offsets the scan recorded."""

    tars: tuple[str, ...]  # local paths (absolute) or URLs
    spans: Spans
    fields: tuple[tuple[str, str], ...] = ()  # (extension, kind) of each field, spans' order

    def read(self, samples: Sequence[Sample]) -> list[Stored]:
        rows = self.spans.rows()
        out: list[Stored] = [""] * len(samples)
        by_tar: dict[int, list[int]] = {}
        for k, sample in enumerate(samples):
            by_tar.setdefault(int(rows[position(sample), 0]), []).append(k)
        for tar, ks in by_tar.items():
            spans = [_member_spans(rows[position(samples[k])]) for k in ks]
            wanted = [span for sample_spans in spans for span in sample_spans if span[1] >= 0]
            try:
                data = iter(
                    self._ranges(self.tars[tar], [s for s, _ in wanted], [n for _, n in wanted])
                )
            except (OSError, ValueError) as e:
                for k in ks:
                    out[k] = f"{samples[k].relpath}: cannot read from {self.tars[tar]}: {e}"
                continue
            for k, sample_spans in zip(ks, spans, strict=True):
                values = [next(data) if n >= 0 else None for _, n in sample_spans]
                out[k] = self._stored(samples[k].relpath, values)
        return out

    def _stored(self, name: str, values: list[bytes | None]) -> Stored:
        """One sample's image and fields from its members' bytes, or its error."""
        image = values[0]
        if not image:
            return f"{name}: empty image member"
        if not self.fields:
            return image
        try:
            fields = tuple(
                None if value is None else canonical(kind, value, f"{name}: its .{ext} member")
                for (ext, kind), value in zip(self.fields, values[1:], strict=True)
            )
        except ValueError as e:
            return str(e)
        return WithFields(image, fields)

    @staticmethod
    def _ranges(tar: str, starts: list[int], sizes: list[int]) -> list[bytes]:
        if is_url(tar):
            folder, name = split_url(tar)
            ends = [s + n for s, n in zip(starts, sizes, strict=True)]
            return folder.read_ranges(name, starts, ends)
        fd = os.open(tar, os.O_RDONLY)
        try:
            values = [os.pread(fd, n, s) for s, n in zip(starts, sizes, strict=True)]
        finally:
            os.close(fd)
        if any(len(v) != n for v, n in zip(values, sizes, strict=True)):
            raise ValueError("the tar is shorter than when it was scanned: modified since")
        return values


class WebDatasetSource(FileSource):
    """The tar shards that ``src`` names (``.tar``, ``.tar.gz``, ``.tgz``): a folder of them,
    one tar, a glob or a brace pattern, local or at a URL (see the module docstring)."""

    kind = "webdataset"
    suffix = ".tar"
    other_suffixes = TAR_SUFFIXES[1:]
    _spans: Spans | None = None
    _read_from: tuple[str, ...] = ()

    def __init__(self, src: str, label_key: str | None = None) -> None:
        super().__init__(src, label_key or DEFAULT_LABEL_KEY)
        self.label_field = LabelField.parse(self.label_key or DEFAULT_LABEL_KEY)
        self.fields: dict[str, FieldSpec] = {}  # the scan's schema

    def scan(self, options: ConvertOptions) -> Scan:
        """Every sample with an image member, in tar order; one without, or a duplicate
        key, is a problem."""
        refuse_folder_options(self.where, options)
        problems: list[dict[str, str]] = []
        rows: list[tuple[int, int, int]] = []
        paths: list[str] = []
        raw_labels: list[bytes | None] = []
        key_hashes = array("Q")  # of each sample's key, to find a repeated one: 8 bytes each
        members = _FieldMembers()
        staging = Staging(self)
        for number, tar in enumerate(self.files):
            for sample in walk(tar, number, self.label_field.member, staging):
                image = sample.image()
                if image is None:
                    error = f"{sample.key}: no image member ({'/'.join(IMAGE_EXTS)}) in {tar}"
                    problems.append({"path": sample.key, "error": error})
                    continue
                paths.append(image.name)
                rows.append((number, image.offset, image.size))
                raw_labels.append(sample.label)
                key_hashes.append(_key_hash(sample.key))
                members.add(tar, sample, image, self.label_field)
        if not rows:
            raise FileNotFoundError(
                f"{self.where}: no samples with an image member in {len(self.files)} tar(s)"
            )
        found = {ext: FieldSpec(extension_kind(ext)) for ext in members.columns}
        self.fields = select_fields(self.where, found, options, members.origins)
        self._read_from = tuple(staging.read_from(tar) for tar in self.files)
        self._spans = Spans.write(members.table(rows, self.fields), self)
        repeats = _repeated_keys(key_hashes, paths)
        labels = Labels(self.where, str(self.label_field), options.classes)
        for at, (path, raw) in enumerate(zip(paths, raw_labels, strict=True)):
            if at in repeats:
                why = self._duplicate(path, rows[at][0], rows[repeats[at]][0])
                problems.append({"path": path, "error": why})
            else:
                labels.add(path, self.label_field.value(raw, f"{self.where}: {path}"))
        classes, numbers, left_out = labels.resolve()
        kept = (i for i in range(len(paths)) if i not in repeats)
        samples = SampleTable.of(
            Sample(paths[i], label, i)
            for i, label in zip(kept, numbers, strict=True)
            if label is not None
        )
        return Scan(classes, samples, problems + left_out, fields=self.fields)

    def _duplicate(self, path: str, tar: int, first_tar: int) -> str:
        """Why the sample at ``path`` (in tar number ``tar``) is left out: its key repeats
        that of a sample in tar number ``first_tar``."""
        key = (split_name(path) or (path, ""))[0]
        before = "earlier in that tar" if tar == first_tar else f"in {self.files[first_tar]}"
        return (
            f"{path}: duplicate key {key!r} in {self.files[tar]} (a sample with that key came "
            f"{before}): left out, as webdataset would refuse it"
        )

    def reader(self) -> TarReader:
        if self._spans is None:
            raise RuntimeError("WebDatasetSource.reader before scan")
        kinds = tuple((ext, spec.kind) for ext, spec in self.fields.items())
        return TarReader(self._read_from, self._spans, kinds)

    def record(self) -> dict[str, Any]:
        return {**super().record(), "label_key": self.label_key}


class _FieldMembers:
    """Where each sample's field members lie, by extension: a column of (offset, size) per
    extension met (-1 where a sample has none), 16 bytes a sample and field; and where
    each extension was first met (``origins``), for an error about its name."""

    def __init__(self) -> None:
        self.columns: dict[str, tuple[array, array]] = {}
        self.origins: dict[str, str] = {}  # extension -> "TAR: member NAME"
        self.samples = 0

    def add(self, tar: str, sample: TarSample, image: Member, label: LabelField) -> None:
        """Record the members of ``sample`` (in ``tar``) other than its ``image`` and
        ``label`` member (a JSON member a label is read from stays a field: it holds more)."""
        for ext, member in sample.members.items():
            if member is image or (ext == label.member and not label.keys):
                continue
            if ext not in self.columns:
                self.origins[ext] = f"{tar}: member {member.name!r}"
                before = self.samples  # the samples before it: none had this member
                self.columns[ext] = (array("q", [0] * before), array("q", [-1] * before))
            offsets, sizes = self.columns[ext]
            offsets.append(member.offset)
            sizes.append(member.size)
        self.samples += 1
        for offsets, sizes in self.columns.values():
            if len(sizes) < self.samples:
                offsets.append(0)
                sizes.append(-1)

    def table(self, rows: list[tuple[int, int, int]], fields: Sequence[str]) -> np.ndarray:
        """The spans' table: ``rows`` and, for each of ``fields``, its (offset, size)."""
        columns = [np.array(rows, dtype=np.int64).reshape(-1, 3)]
        for ext in fields:
            offsets, sizes = self.columns[ext]
            columns += [np.frombuffer(column, np.int64)[:, None] for column in (offsets, sizes)]
        return np.hstack(columns)


def _member_spans(row: np.ndarray) -> list[tuple[int, int]]:
    """(offset, size) of a spans row's image, then of each field's member (size -1: none)."""
    return [(int(row[i]), int(row[i + 1])) for i in range(1, len(row), 2)]


def _key_hash(key: str) -> int:
    digest = hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _repeated_keys(hashes: array, paths: list[str]) -> dict[int, int]:
    """``{position: position of the first sample with its key}`` for each sample whose key
    came before: the keys of samples whose 8-byte hashes repeat (found by sorting the
    hashes) are compared."""
    ordered = np.sort(np.frombuffer(hashes, dtype=np.uint64))
    colliding = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    first: dict[str, int] = {}
    repeats: dict[int, int] = {}
    for at, value in enumerate(hashes):
        if value in colliding:
            key = (split_name(paths[at]) or (paths[at], ""))[0]
            if key in first:
                repeats[at] = first[key]
            else:
                first[key] = at
    return repeats
