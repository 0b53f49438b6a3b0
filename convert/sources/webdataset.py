"""WebDataset tars made by other tools (``webdataset.ShardWriter``, ``tarp``, ``img2dataset``)
as a sample source.

A sample is the run of members sharing a key (the member name up to the first ``.`` of its
base name), a field is the rest: the image is the sample's ``jpg``/``jpeg``/``png``/``webp``
member, the label its ``cls`` member (or the one ``--label-key`` names) holding a class
number or a class name. The scan reads every tar once, in order (a local one by its
headers, skipping the image bytes; a remote one as a stream), and records where each image
lies; workers then read just those bytes (``pread``, or merged range requests for a URL).
Compressed tars cannot be read by byte range and are refused.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from convert.options import ConvertOptions
from convert.samples import Sample, SampleTable
from convert.scan import Scan
from convert.sources.base import Stored, position, refuse_folder_options
from convert.sources.files import FileSource, Spans, open_file, split_url
from convert.sources.labels import Labels
from readers.storage.remote import is_url

__all__ = ["DEFAULT_LABEL_KEY", "IMAGE_EXTS", "TarReader", "WebDatasetSource"]

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")  # in order of preference within a sample
DEFAULT_LABEL_KEY = "cls"


@dataclass(frozen=True)
class TarReader:
    """Reads each sample's image bytes from its tar, by the offsets the scan recorded."""

    tars: tuple[str, ...]  # local paths (absolute) or URLs
    spans: Spans

    def read(self, samples: Sequence[Sample]) -> list[Stored]:
        rows = self.spans.rows()
        out: list[Stored] = [""] * len(samples)
        by_tar: dict[int, list[int]] = {}
        for k, sample in enumerate(samples):
            by_tar.setdefault(int(rows[position(sample), 0]), []).append(k)
        for tar, ks in by_tar.items():
            spans = [rows[position(samples[k])] for k in ks]
            try:
                data = self._ranges(
                    self.tars[tar], [int(s[1]) for s in spans], [int(s[2]) for s in spans]
                )
            except (OSError, ValueError) as e:
                for k in ks:
                    out[k] = f"{samples[k].relpath}: cannot read from {self.tars[tar]}: {e}"
                continue
            for k, value in zip(ks, data, strict=True):
                out[k] = value if value else f"{samples[k].relpath}: empty image member"
        return out

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
    """The ``.tar`` shards that ``src`` names: a folder of them, one tar, a glob or a brace
    pattern, local or at a URL (see the module docstring)."""

    kind = "webdataset"
    suffix = ".tar"
    _spans: Spans | None = None

    def __init__(self, src: str, label_key: str | None = None) -> None:
        super().__init__(src, label_key or DEFAULT_LABEL_KEY)

    def scan(self, options: ConvertOptions) -> Scan:
        """Every sample with an image member, in tar order; one without is a problem."""
        refuse_folder_options(self.where, options)
        labels = Labels(self.where, self.label_key, options.classes)
        problems: list[dict[str, str]] = []
        rows: list[tuple[int, int, int]] = []
        paths: list[str] = []
        for number, tar in enumerate(self.files):
            for key, members, values in _samples(tar, self.label_key):
                image = next((members[e] for e in IMAGE_EXTS if e in members), None)
                if image is None:
                    problems.append(
                        {
                            "path": key,
                            "error": f"{key}: no image member ({'/'.join(IMAGE_EXTS)}) in {tar}",
                        }
                    )
                    continue
                paths.append(image.name)
                rows.append((number, image.offset_data, image.size))
                labels.add(image.name, values.get(self.label_key))
        if not rows:
            raise FileNotFoundError(
                f"{self.where}: no samples with an image member in {len(self.files)} tar(s)"
            )
        self._spans = Spans.write(np.array(rows), self)
        classes, numbers, left_out = labels.resolve()
        samples = SampleTable.of(
            Sample(path, label, index)
            for index, (path, label) in enumerate(zip(paths, numbers, strict=True))
            if label is not None
        )
        return Scan(classes, samples, problems + left_out)

    def reader(self) -> TarReader:
        if self._spans is None:
            raise RuntimeError("WebDatasetSource.reader before scan")
        return TarReader(self.files, self._spans)

    def record(self) -> dict[str, Any]:
        return {**super().record(), "label_key": self.label_key}


def _samples(tar: str, label_key: str):
    """``(key, {ext: TarInfo}, {label_key: bytes})`` of each sample of ``tar``, in order."""
    try:
        with open_file(tar) as f:
            mode = "r|" if is_url(tar) else "r:"
            with tarfile.open(fileobj=f, mode=mode) as tf:
                key: str | None = None
                members: dict[str, tarfile.TarInfo] = {}
                values: dict[str, bytes] = {}
                for member in tf:
                    if not member.isfile():
                        continue
                    folder, _, base = member.name.rpartition("/")
                    stem, dot, ext = base.partition(".")
                    if not dot or stem.startswith("__"):
                        continue
                    name = f"{folder}/{stem}" if folder else stem
                    if name != key:
                        if key is not None:
                            yield key, members, values
                        key, members, values = name, {}, {}
                    ext = ext.lower()
                    members[ext] = member
                    if ext == label_key:
                        values[ext] = tf.extractfile(member).read()
                if key is not None:
                    yield key, members, values
    except tarfile.TarError as e:
        raise ValueError(f"{tar}: not an uncompressed tar ({e})") from e
