"""``imgpack diff``: are two datasets the same data, whatever their formats and encodings?

Two imgpack datasets (local or URL) are compared in three steps: the sample sets, matched
by source path (or by position, ``by_index``); the labels, by class name (so a dataset
whose classes were renumbered still matches) and the class lists themselves; then the
pixels of every matched pair, decoded as the readers serve them, as the mean absolute
difference per sample in levels of 0-255. Two ``raw`` datasets compare their stored pixels
(no decode); a pair whose shapes differ is a difference of its own. The fields' schemas
are compared, and each field both hold is compared pair by pair (:mod:`convert.field_diff`:
text and numbers exactly, json structurally, bytes and arrays by bytes). Equal content
checksums (which cover the fields) and schemas answer without decoding a sample
(:attr:`DiffReport.checksum_match`), but only once every shard of both sides has the size
and SHA-256 its manifest records (what ``imgpack verify`` checks first): a copy damaged
after its manifest was written is an error naming its shards, never "equivalent".
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from itertools import repeat
from typing import Any

import numpy as np
from tqdm import tqdm

import readers
from convert.field_diff import compared_fields, field_mismatches, schema_differences
from convert.options import default_workers
from convert.verify import check_stored_files
from readers import spec
from readers.spec import DatasetError

__all__ = ["DEFAULT_TOLERANCE", "DiffReport", "PixelDiff", "diff_datasets"]

DEFAULT_TOLERANCE = 8.0
"""Mean absolute difference per sample (levels of 0-255) under which two samples count as
the same image: on sample_data, JPEG at quality 75 against raw pixels measured 7.1 at most
at 64x64 (quality 90: 5.0; 2.6 at 256 px), while two different photos differ by tens."""

BATCH = 256  # pairs read per round: one merged read per shard for remote wds


@dataclass(frozen=True)
class PixelDiff:
    """One matched pair's pixel difference (``path``: A's source path)."""

    path: str
    mean_abs_diff: float
    index_a: int
    index_b: int


@dataclass
class DiffReport:
    """What :func:`diff_datasets` found; ``equivalent`` is the verdict."""

    a: str
    b: str
    tolerance: float
    samples_a: int
    samples_b: int
    checksum_match: bool = False
    classes_a: list[str] = field(default_factory=list)
    classes_b: list[str] = field(default_factory=list)
    matched: int = 0
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    label_mismatches: list[dict[str, Any]] = field(default_factory=list)
    schema_differences: list[str] = field(default_factory=list)  # the fields' (field_diff)
    fields_compared: list[str] = field(default_factory=list)
    field_mismatches: list[dict[str, Any]] = field(default_factory=list)  # one per value
    shape_mismatches: list[dict[str, Any]] = field(default_factory=list)
    compared: int = 0  # pairs whose pixels were compared
    identical: int = 0  # ... of them, with exactly the same pixels
    over_tolerance: int = 0
    max_diff: float = 0.0
    mean_diff: float = 0.0
    worst: list[PixelDiff] = field(default_factory=list)  # the largest differences first

    @property
    def same_classes(self) -> bool:
        return self.classes_a == self.classes_b

    @property
    def equivalent(self) -> bool:
        return self.checksum_match or not (
            self.only_in_a
            or self.only_in_b
            or self.label_mismatches
            or self.schema_differences
            or self.field_mismatches
            or self.shape_mismatches
            or self.over_tolerance
            or not self.same_classes
        )

    def classes_differ(self, shown: int = 5) -> str:
        """Which classes differ: the names only one side has, or else the first position
        where the same names stand in another order."""
        in_b, in_a = set(self.classes_b), set(self.classes_a)
        only = [
            f"only in {name}: {_listed(names, shown)}"
            for name, names in (
                ("A", [c for c in self.classes_a if c not in in_b]),
                ("B", [c for c in self.classes_b if c not in in_a]),
            )
            if names
        ]
        if only:
            return "; ".join(only)
        i = next(
            i for i, (x, y) in enumerate(zip(self.classes_a, self.classes_b, strict=True)) if x != y
        )
        return (
            f"the same {len(self.classes_a)} names in another order, from label {i}: "
            f"{self.classes_a[i]!r} in A, {self.classes_b[i]!r} in B"
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(equivalent=self.equivalent, same_classes=self.same_classes)
        return out

    def summary(self, shown: int = 5) -> str:
        """A person-readable account, ``shown`` names of each kind of difference at most."""
        verdict = "EQUIVALENT" if self.equivalent else "DIFFERENT"
        lines = [f"{verdict}: {self.a} ({self.samples_a} samples) vs {self.b} ({self.samples_b})"]
        if self.checksum_match:
            lines.append("content checksums are equal: the same samples, labels, pixels and fields")
            return "\n".join(lines)
        if not self.same_classes:
            lines.append(f"classes differ: {self.classes_differ(shown)}")
        for name, paths in (("A", self.only_in_a), ("B", self.only_in_b)):
            if paths:
                lines.append(f"only in {name}: {len(paths)} sample(s): {_listed(paths, shown)}")
        if self.label_mismatches:
            shown_labels = [
                f"{m['path']} ({m['a']} vs {m['b']})" for m in self.label_mismatches[:shown]
            ]
            more = len(self.label_mismatches) - len(shown_labels)
            lines.append(
                f"label mismatches: {len(self.label_mismatches)}: {', '.join(shown_labels)}"
                + (f", and {more} more" if more > 0 else "")
            )
        if self.schema_differences:
            lines.append(f"fields differ: {'; '.join(self.schema_differences)}")
        if self.field_mismatches:
            samples = len({m["index_a"] for m in self.field_mismatches})
            lines.append(
                f"field mismatches: {len(self.field_mismatches)} value(s) in {samples} "
                f"sample(s) (of {', '.join(self.fields_compared)}):"
            )
            lines += [
                f"  [{m['index_a']}] {m['path']}  {m['field']}: {m['a']} vs {m['b']}"
                for m in self.field_mismatches[:shown]
            ]
            if len(self.field_mismatches) > shown:
                lines.append(f"  and {len(self.field_mismatches) - shown} more")
        if self.shape_mismatches:
            first = self.shape_mismatches[0]
            lines.append(
                f"shape mismatches: {len(self.shape_mismatches)}, e.g. {first['path']} "
                f"{first['a']} vs {first['b']}"
            )
        lines.append(
            f"pixels: {self.compared} of {self.matched} matched pair(s) compared, "
            f"{self.identical} identical; mean abs diff {self.mean_diff:.2f}, max "
            f"{self.max_diff:.2f}; {self.over_tolerance} over the tolerance {self.tolerance:g}"
        )
        if self.worst:
            lines.append("worst:")
            lines += [f"  {w.path}  {w.mean_abs_diff:.2f}" for w in self.worst[:shown]]
        return "\n".join(lines)


def _listed(items: Sequence[str], shown: int = 5) -> str:
    more = len(items) - shown
    return ", ".join(items[:shown]) + (f", and {more} more" if more > 0 else "")


def diff_datasets(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    by_index: bool = False,
    tolerance: float = DEFAULT_TOLERANCE,
    worst: int = 5,
    progress: bool | None = None,
    workers: int | None = None,
) -> DiffReport:
    """Compare the datasets at ``a`` and ``b`` (see the module docstring), decoding on
    ``workers`` threads (default: the usable CPUs).

    Raises:
        ValueError (DatasetError, StorageError): a dataset cannot be read, a shard is not
            what its manifest says (on the checksum path), or source paths repeat so that
            they cannot match samples (use ``by_index``).
    """
    if tolerance < 0:
        raise ValueError(f"tolerance must be 0 or more, not {tolerance}")
    da, db = readers.open_dataset(a, decode_threads=1), readers.open_dataset(b, decode_threads=1)
    ma, mb = da.manifest, db.manifest
    report = DiffReport(
        str(ma.location),
        str(mb.location),
        tolerance,
        len(da),
        len(db),
        classes_a=list(ma.classes),
        classes_b=list(mb.classes),
        schema_differences=schema_differences(ma.fields, mb.fields),
        fields_compared=compared_fields(ma.fields, mb.fields),
    )
    same = report.same_classes and not report.schema_differences
    if ma.content_sha256 and ma.content_sha256 == mb.content_sha256 and same:
        for ds in (da, db):  # the checksums speak for the shards only if these are intact
            _check_stored(ds, workers)
        report.checksum_match = True
        report.matched = report.compared = report.identical = len(da)
        return report
    pairs = _match(da, db, by_index, report)
    report.matched = len(pairs)
    for i, j in pairs:
        label_a, label_b = _label_name(da, i), _label_name(db, j)
        if label_a != label_b:
            report.label_mismatches.append({"path": da.source_path(i), "a": label_a, "b": label_b})
    diffs: list[PixelDiff] = []
    disable = None if progress is None else not progress
    bar = tqdm(total=len(pairs), unit="pair", desc="diff", disable=disable)
    with bar, ThreadPoolExecutor(workers or default_workers()) as pool:
        for chunk in _chunks(pairs, BATCH):
            stored_a = da.read_stored([i for i, _ in chunk])  # in this thread: shard by shard
            stored_b = db.read_stored([j for _, j in chunk])
            report.field_mismatches += field_mismatches(da, db, chunk, report.fields_compared)
            compared = pool.map(_compare, repeat(da), repeat(db), chunk, stored_a, stored_b)
            for pair, (shape_a, shape_b, mad) in zip(chunk, compared, strict=True):
                bar.update()
                path = da.source_path(pair[0])
                if mad is None:
                    report.shape_mismatches.append({"path": path, "a": shape_a, "b": shape_b})
                else:
                    diffs.append(PixelDiff(path, mad, *pair))
    report.compared = len(diffs)
    report.identical = sum(d.mean_abs_diff == 0 for d in diffs)
    report.over_tolerance = sum(d.mean_abs_diff > tolerance for d in diffs)
    if diffs:
        report.max_diff = max(d.mean_abs_diff for d in diffs)
        report.mean_diff = sum(d.mean_abs_diff for d in diffs) / len(diffs)
    report.worst = sorted(
        (d for d in diffs if d.mean_abs_diff > 0), key=lambda d: -d.mean_abs_diff
    )[:worst]
    return report


def _check_stored(ds: readers.ImageDataset, workers: int | None) -> None:
    """Each shard of ``ds`` of the size and SHA-256 its manifest records (what ``imgpack
    verify`` checks first), or a DatasetError naming the damaged shards."""
    problems = [str(p) for shard in check_stored_files(ds, workers) for p in shard]
    if problems:
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise DatasetError(
            "; ".join(problems[:3])
            + f"{more} (imgpack verify {ds.manifest.location} lists every problem)"
        )


def _match(
    da: readers.ImageDataset, db: readers.ImageDataset, by_index: bool, report: DiffReport
) -> list[tuple[int, int]]:
    """The matched ``(index in A, index in B)`` pairs, in A's order; the rest is recorded
    in ``report`` as only in A or only in B."""
    paths_a, paths_b = [p for p, _ in da.samples], [p for p, _ in db.samples]
    if by_index:
        n = min(len(paths_a), len(paths_b))
        report.only_in_a = [f"[{i}] {p}" for i, p in enumerate(paths_a) if i >= n]
        report.only_in_b = [f"[{i}] {p}" for i, p in enumerate(paths_b) if i >= n]
        return [(i, i) for i in range(n)]
    for ds, paths in ((da, paths_a), (db, paths_b)):
        repeated = [p for p, count in Counter(paths).items() if count > 1]
        if repeated:
            raise ValueError(
                f"{ds.manifest.location}: source path {repeated[0]!r} names "
                f"{Counter(paths)[repeated[0]]} samples ({len(repeated)} repeated path(s)): "
                "match the samples by position with --by-index"
            )
    where_b = {p: j for j, p in enumerate(paths_b)}
    pairs = [(i, where_b[p]) for i, p in enumerate(paths_a) if p in where_b]
    in_a = set(paths_a)
    report.only_in_a = [p for p in paths_a if p not in where_b]
    report.only_in_b = [p for p in paths_b if p not in in_a]
    return pairs


def _label_name(ds: readers.ImageDataset, index: int) -> str | int:
    """A sample's class name (its number when the dataset has no such class)."""
    label = ds.targets[index]
    classes = ds.manifest.classes
    return classes[label] if label != spec.UNLABELED and 0 <= label < len(classes) else label


def _chunks(items: list[tuple[int, int]], size: int) -> Iterator[list[tuple[int, int]]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _compare(
    da: readers.ImageDataset, db: readers.ImageDataset, pair: tuple[int, int], a: Any, b: Any
) -> tuple[list[int], list[int], float | None]:
    """One pair's shapes and mean absolute difference (None when the shapes differ), from
    its stored values (on a decode thread; a damaged sample raises DatasetError naming it)."""
    x, y = _hwc(da, a, pair[0]), _hwc(db, b, pair[1])
    if x.shape != y.shape:
        return list(x.shape), list(y.shape), None
    mad = float(np.abs(x.astype(np.int16) - y.astype(np.int16)).mean())
    return list(x.shape), list(y.shape), mad


def _hwc(ds: readers.ImageDataset, value: Any, index: int) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    return ds.serve(value, index)[0].permute(1, 2, 0).numpy()
