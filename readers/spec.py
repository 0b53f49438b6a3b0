"""The on-disk contract of every imgpack format, defined once.

Writers (``convert.writers``) and readers (``readers``) import the names below; neither
spells a file name, key or dataset name of its own. The manifest ``imgpack.json`` at the
root of a dataset is written last and is where every reader starts.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ENCODINGS",
    "FORMATS",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "UNLABELED",
    "DatasetError",
    "Layout",
    "Manifest",
    "ShardInfo",
    "StorageKind",
    "content_sha256",
    "json_text",
    "load_manifest",
    "sample_digest",
    "shard_name",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "imgpack.json"
FORMATS = ("pt", "hdf5", "lmdb", "wds")
ENCODINGS = ("raw", "jpeg", "original")
SHARD_SUFFIX = {"pt": ".pt", "hdf5": ".h5", "lmdb": ".lmdb", "wds": ".tar"}
SHARD_PREFIX = "shard-"
TMP_PREFIX = ".tmp-"  # a shard or manifest being written; renamed when complete
# While a conversion runs: its lock, and its journal of completed shards (what --resume
# keeps). Both are removed once the manifest is in place.
LOCK_NAME = ".imgpack.lock"
JOURNAL_NAME = ".imgpack-journal.jsonl"

# The label of every sample of a dataset converted with --unlabeled (its class list is empty).
UNLABELED = -1

# Per-sample key: fixed width so that lexicographic key order is index order (LMDB, tar).
SAMPLE_KEY = "{:010d}"

# pt: a dict of tensors saved with torch.save, loaded with weights_only=True, mmap=True.
PT_IMAGES = "images"  # uint8 [N, H, W, 3] when every sample is raw with one shape
PT_DATA = "data"  # uint8 [total bytes]: encoded bytes or flattened raw pixels, back to back
PT_OFFSETS = "offsets"  # int64 [N + 1]: sample i is data[offsets[i]:offsets[i + 1]]
PT_SHAPES = "shapes"  # int64 [N, 3]: per-sample H, W, C for raw pixels of varying shape
PT_LABELS = "labels"  # int64 [N]
PT_PATHS = "paths"  # uint8 [total bytes]: UTF-8 source paths, back to back (surrogateescape)
PT_PATH_OFFSETS = "path_offsets"  # int64 [N + 1]

# hdf5: datasets in the root group; class names and encoding as file attributes.
H5_IMAGES = "images"  # uint8 [N, H, W, 3] (one chunk per sample) or vlen uint8 [N]
H5_SHAPES = "shapes"  # int64 [N, 3] when raw pixels vary in shape
H5_LABELS = "labels"  # int64 [N]
H5_PATHS = "paths"  # vlen UTF-8 str [N]; bytes that are not UTF-8 kept (surrogateescape)
H5_ATTR_CLASSES = "classes"
H5_ATTR_ENCODING = "encoding"
H5_ATTR_VERSION = "imgpack_format_version"

# lmdb: one key per sample (SAMPLE_KEY, ASCII) whose value is the stored bytes, plus
# metadata keys that sort after every sample key ("_" > "9").
LMDB_LABELS = b"__labels__"  # int64 little-endian [N]
LMDB_SHAPES = b"__shapes__"  # int64 little-endian [N, 3], raw pixels only
LMDB_PATHS = b"__paths__"  # ASCII JSON list of N source paths (\udcXX: bytes not UTF-8)

# wds: members KEY.<ext> (image), KEY.cls (label as ASCII digits), KEY.path.txt (source
# path); beside each tar an index for random access, SHARD.tar + WDS_INDEX_SUFFIX.
WDS_LABEL_EXT = "cls"
WDS_PATH_EXT = "path.txt"  # UTF-8 source path; bytes that are not UTF-8 kept (surrogateescape)
WDS_RAW_EXT = "npy"
WDS_IMAGE_EXTS = ("jpg", "png", "bmp", "ppm", "pgm", "tif", "webp", WDS_RAW_EXT)
WDS_INDEX_SUFFIX = ".idx.json"
# The index: a JSON object of per-sample lists, in this order (data offset and size of
# the image member, its extension, label, source path).
WDS_INDEX_COLUMNS = ("offsets", "sizes", "exts", "labels", "paths")


class DatasetError(ValueError):
    """A dataset on disk is missing, incomplete, corrupt or of an unsupported version."""


def shard_name(fmt: str, index: int) -> str:
    """File name of shard ``index`` of format ``fmt``, e.g. ``shard-000003.tar``."""
    return f"{SHARD_PREFIX}{index:06d}{SHARD_SUFFIX[fmt]}"


def sample_digest(label: int, path: str, data: bytes | memoryview | np.ndarray) -> bytes:
    """SHA-256 of one stored sample: label, source path and the stored value (encoded bytes,
    or uint8 HWC pixels with their shape). Independent of format and shard layout."""
    if isinstance(data, np.ndarray):  # raw pixels
        kind = "raw:" + "x".join(map(str, data.shape))
        payload = memoryview(np.ascontiguousarray(data)).cast("B")
    else:
        kind, payload = "encoded", memoryview(data)
    digest = hashlib.sha256(f"{label}\0{path}\0{kind}\0".encode("utf-8", "surrogateescape"))
    digest.update(payload)
    return digest.digest()


def content_sha256(digests: Iterable[bytes]) -> str:
    """The manifest's ``content_sha256``: SHA-256 over every sample's digest, in order."""
    total = hashlib.sha256()
    for d in digests:
        total.update(d)
    return total.hexdigest()


class StorageKind(enum.Enum):
    """How a dataset stores its samples, decided once (:attr:`Layout.kind`)."""

    FIXED_PIXELS = "fixed-pixels"  # raw uint8 pixels, one [H, W, 3] for every sample
    VARIABLE_PIXELS = "variable-pixels"  # raw uint8 pixels, a shape per sample
    ENCODED = "encoded"  # encoded image bytes (jpeg, or the source's own)


@dataclass(frozen=True)
class Layout:
    """How samples are stored: the one object a format's writer and its shard reader
    both receive, so that each format's two halves read the same decisions."""

    encoding: str
    shape: tuple[int, int, int] | None  # the fixed [H, W, 3] of raw pixels, else None
    classes: tuple[str, ...]
    compression: str | None = None  # hdf5 only

    @property
    def kind(self) -> StorageKind:
        if self.encoding != "raw":
            return StorageKind.ENCODED
        return StorageKind.FIXED_PIXELS if self.shape is not None else StorageKind.VARIABLE_PIXELS


@dataclass(frozen=True)
class ShardInfo:
    """One shard as the manifest lists it; ``sidecars`` maps the suffix of each file kept
    beside the shard (the wds index) to its SHA-256."""

    path: str
    samples: int
    bytes: int
    sha256: str
    sidecars: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Manifest:
    """What ``imgpack.json`` says about a dataset, typed: the one description that the
    readers, ``imgpack info``, ``verify`` and ``--resume`` read (as attributes), and that
    the converter writes (:meth:`write`). ``to_json`` gives back the dict ``from_json``
    read, key for key."""

    root: Path
    format: str
    encoding: str
    shape: tuple[int, int, int] | None  # (H, W, 3), or None for "variable"
    classes: tuple[str, ...]
    shards: tuple[ShardInfo, ...]
    format_version: int = FORMAT_VERSION
    imgpack_version: str | None = None
    dtype: str = "uint8"
    samples_per_class: dict[str, int] | None = None
    recorded_samples: int | None = None  # the "num_samples" field as written
    written: int | None = None
    skipped: int | None = None
    content_sha256: str | None = None
    source_fingerprint: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # of the conversion
    converted_with: dict[str, Any] | None = None
    errors_file: str | None = None
    url: str | None = None  # read from this URL; ``root`` is then its local cache mirror

    @property
    def num_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @cached_property
    def layout(self) -> Layout:
        """The storage layout the writers used (``shape`` here: images' shape when they all
        share one, whatever the encoding; in the layout: fixed raw pixels only)."""
        stored = self.shape if self.encoding == "raw" else None
        return Layout(self.encoding, stored, self.classes, self.options.get("compression"))

    @property
    def location(self) -> str:
        """Where the dataset is, for messages: its URL, or its folder."""
        return self.url or str(self.root)

    def shard_path(self, index: int) -> Path:
        return self.root / self.shards[index].path

    def to_json(self) -> dict[str, Any]:
        """The manifest as ``imgpack.json`` holds it (optional fields only when set)."""
        out: dict[str, Any] = {
            "format": self.format,
            "format_version": self.format_version,
            "imgpack_version": self.imgpack_version,
            "encoding": self.encoding,
            "shape": list(self.shape) if self.shape is not None else "variable",
            "dtype": self.dtype,
            "classes": list(self.classes),
            "samples_per_class": self.samples_per_class,
            "num_samples": self.recorded_samples,
            "written": self.written,
            "skipped": self.skipped,
            "content_sha256": self.content_sha256,
            "source_fingerprint": self.source_fingerprint,
            "shards": [asdict(s) for s in self.shards],
            "options": self.options,
            "converted_with": self.converted_with,
            "errors_file": self.errors_file,
        }
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_json(
        cls, root: Path, raw: Any, expect_format: str | None = None, path: str | None = None
    ) -> Manifest:
        """Validate ``raw`` (the parsed ``imgpack.json`` of the dataset at ``root``);
        DatasetError names the file and the field."""
        return _parse_manifest(root, path or root / MANIFEST_NAME, raw, expect_format)

    def write(self) -> None:
        """Write ``root/imgpack.json`` atomically (a temporary file, fsync, rename)."""
        tmp = self.root / (TMP_PREFIX + MANIFEST_NAME)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json_text(self.to_json(), indent=1))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / MANIFEST_NAME)


def json_text(value: Any, indent: int | None = None) -> str:
    """JSON with UTF-8 text as is; a name that is not valid UTF-8 keeps its bytes as
    ``\\udcXX`` escapes, which ``json.loads`` turns back into the ``os.fsdecode`` name."""
    text = json.dumps(value, ensure_ascii=False, indent=indent)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, indent=indent)
    return text + "\n"


def load_manifest(
    root: str | os.PathLike[str],
    expect_format: str | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Manifest:
    """Read and validate ``root/imgpack.json``; raise DatasetError naming the file if bad.

    A relative ``root`` is made absolute here, so the dataset keeps working after
    ``os.chdir`` (Hydra changes the directory of each run); a path to the manifest itself
    stands for its folder. A URL (``s3://...``) is read through fsspec with
    ``storage_options``; the manifest's ``root`` is then the folder of ``cache_dir`` where
    readers keep their copies of its shards (:mod:`readers.cache`)."""
    from readers.storage import is_url, local_path  # (they import this module)

    if is_url(root):
        from readers.cache import load_remote_manifest

        return load_remote_manifest(str(root), expect_format, storage_options, cache_dir)
    root = local_path(root).absolute()
    if root.name == MANIFEST_NAME and root.is_file():
        root = root.parent
    path = root / MANIFEST_NAME
    if not root.exists():
        raise DatasetError(f"{root}: no such dataset folder")
    if not root.is_dir():
        raise DatasetError(f"{root}: not a dataset folder (a file)")
    if not path.is_file():
        if _conversion_running(root):
            raise DatasetError(
                f"{root}: a conversion into this folder is still running (no {MANIFEST_NAME} "
                "yet): wait for it to finish"
            )
        if any(
            p.name.startswith((SHARD_PREFIX, TMP_PREFIX)) or p.name == JOURNAL_NAME
            for p in root.iterdir()
        ):
            raise DatasetError(
                f"{root}: incomplete conversion (no {MANIFEST_NAME}): rerun the same "
                "imgpack convert command with --resume"
            )
        raise DatasetError(f"{root}: not an imgpack dataset (no {MANIFEST_NAME})")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{path}: unreadable manifest: {e}") from e
    return _parse_manifest(root, path, raw, expect_format)


def _conversion_running(root: Path) -> bool:
    """True if a live ``imgpack convert`` holds the folder's lock (a POSIX lock, which the
    kernel drops when that process dies: a stale lock file does not count)."""
    import fcntl

    try:
        fd = os.open(root / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _parse_manifest(root: Path, path: str | Path, raw: Any, expect_format: str | None) -> Manifest:
    def bad(why: str) -> DatasetError:
        return DatasetError(f"{path}: {why}")

    if not isinstance(raw, dict):
        raise bad("manifest is not a JSON object")
    version = raw.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise bad(f"invalid format_version {version!r}")
    if version > FORMAT_VERSION:
        raise bad(
            f"format_version {version} is newer than this imgpack reads ({FORMAT_VERSION}): "
            "upgrade imgpack"
        )
    fmt = raw.get("format")
    if fmt not in FORMATS:
        raise bad(f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if expect_format is not None and fmt != expect_format:
        raise bad(f"dataset is {fmt!r}, not {expect_format!r}: use readers.open_dataset")
    encoding = raw.get("encoding")
    if encoding not in ENCODINGS:
        raise bad(f"unknown encoding {encoding!r}")
    shape = raw.get("shape")
    if shape == "variable":
        shape = None
    elif not (
        isinstance(shape, list)
        and len(shape) == 3
        and all(isinstance(d, int) and d > 0 for d in shape)
        and shape[2] == 3
    ):
        raise bad(f'invalid shape {shape!r}: expected [H, W, 3] or "variable"')
    classes = raw.get("classes")
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise bad("classes must be a list of strings")
    shards = raw.get("shards")
    if not isinstance(shards, list):
        raise bad("shards must be a list")
    infos = []
    for i, s in enumerate(shards):
        try:
            info = ShardInfo(
                path=s["path"],
                samples=s["samples"],
                bytes=s["bytes"],
                sha256=s["sha256"],
                sidecars=s.get("sidecars", {}),
            )
        except (TypeError, KeyError) as e:
            raise bad(f"shard {i}: missing field {e}") from None
        if not isinstance(info.samples, int) or info.samples < 0:
            raise bad(f"shard {i}: invalid sample count {info.samples!r}")
        if not isinstance(info.bytes, int) or info.bytes < 0:
            raise bad(f"shard {i}: invalid byte size {info.bytes!r}")
        if not _is_sha256(info.sha256) or not (
            isinstance(info.sidecars, dict) and all(map(_is_sha256, info.sidecars.values()))
        ):
            raise bad(f"shard {i}: invalid sha256 or sidecars")
        if not isinstance(info.path, str) or not all(
            _is_confined(info.path + suffix) and "/" not in suffix
            for suffix in ["", *info.sidecars]
        ):
            raise bad(f"shard {i}: path {info.path!r} is not a file inside the dataset folder")
        infos.append(info)
    _check_summary(raw, bad)
    if raw.get("dtype", "uint8") != "uint8":
        raise bad(f"unsupported dtype {raw['dtype']!r} (imgpack stores uint8)")
    return Manifest(
        root=root,
        format=fmt,
        encoding=encoding,
        shape=tuple(shape) if shape is not None else None,
        classes=tuple(classes),
        shards=tuple(infos),
        format_version=version,
        imgpack_version=_optional(raw, "imgpack_version", str, bad),
        dtype=raw.get("dtype", "uint8"),
        samples_per_class=raw.get("samples_per_class"),
        recorded_samples=raw.get("num_samples"),
        written=raw.get("written"),
        skipped=raw.get("skipped"),
        content_sha256=raw.get("content_sha256"),
        source_fingerprint=raw.get("source_fingerprint"),
        options=_optional(raw, "options", dict, bad) or {},
        converted_with=_optional(raw, "converted_with", dict, bad),
        errors_file=_optional(raw, "errors_file", str, bad),
    )


def _optional(raw: dict[str, Any], name: str, kind: type, bad: Any) -> Any:
    value = raw.get(name)
    if value is not None and not isinstance(value, kind):
        raise bad(f"{name} must be a {kind.__name__}, not {type(value).__name__}")
    return value


def _check_summary(raw: dict[str, Any], bad: Any) -> None:
    """The manifest's summary fields, when present: counts and checksums of the right kind
    (readers do not use them, but ``imgpack verify`` and ``info`` do)."""
    for name in ("num_samples", "written", "skipped"):
        value = raw.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad(f"invalid {name} {value!r}")
    per_class = raw.get("samples_per_class", {})
    if not isinstance(per_class, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in per_class.items()
    ):
        raise bad("samples_per_class must map class names to counts")
    for name in ("content_sha256", "source_fingerprint"):
        if name in raw and not _is_sha256(raw[name]):
            raise bad(f"invalid {name} {raw[name]!r}")


def _is_sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in _HEX for c in value)


_HEX = frozenset("0123456789abcdef")


def _is_confined(rel: str) -> bool:
    """True if ``rel`` names a plain relative path with no way out of the dataset folder."""
    p = Path(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts and "\\" not in rel
