"""The on-disk contract of every imgpack format, defined once.

Writers (``convert.writers``) and readers (``readers``) import the names below; neither
spells a file name, key or dataset name of its own. The manifest ``imgpack.json`` at the
root of a dataset is written last and is where every reader starts; its typed form and
its parsing are :mod:`readers.manifest`.
"""

from __future__ import annotations

import enum
import hashlib
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from readers.fields import FieldSpec

__all__ = [
    "ENCODINGS",
    "FORMATS",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "SIZES_VERSION",
    "UNLABELED",
    "DatasetError",
    "Layout",
    "ShardInfo",
    "StorageKind",
    "content_sha256",
    "field_key",
    "lmdb_field_key",
    "sample_crc",
    "sample_digest",
    "sample_nbytes",
    "shard_name",
    "wds_field_ext",
]

# 2: sample fields (readers.fields) and every sample's stored image size. Datasets of
# version 1 have neither and read as before (their sizes come from the stored images).
FORMAT_VERSION = 2
SIZES_VERSION = 2  # the first version whose shards record every sample's stored size
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

# Encoded samples (jpeg, original) carry the CRC-32 of their stored bytes (sample_crc),
# written at conversion and checked by every read path: a JPEG with damaged entropy-coded
# data often still decodes. Raw pixels carry none (a check would cost several times the
# batch gather; see docs/FORMATS.md). Shards written before these existed have none either:
# readers check what a shard records.

# pt: a dict of tensors saved with torch.save, loaded with weights_only=True, mmap=True.
PT_IMAGES = "images"  # uint8 [N, H, W, 3] when every sample is raw with one shape
PT_DATA = "data"  # uint8 [total bytes]: encoded bytes or flattened raw pixels, back to back
PT_OFFSETS = "offsets"  # int64 [N + 1]: sample i is data[offsets[i]:offsets[i + 1]]
PT_SHAPES = "shapes"  # int64 [N, 3]: per-sample H, W, C for raw pixels of varying shape
PT_LABELS = "labels"  # int64 [N]
PT_PATHS = "paths"  # uint8 [total bytes]: UTF-8 source paths, back to back (surrogateescape)
PT_PATH_OFFSETS = "path_offsets"  # int64 [N + 1]
PT_CRCS = "crcs"  # int64 [N]: sample_crc of each encoded sample
PT_SIZES = "sizes"  # int64 [N, 2]: each stored image's height and width (version 2)

# hdf5: datasets in the root group; class names and encoding as file attributes.
H5_IMAGES = "images"  # uint8 [N, H, W, 3] (one chunk per sample) or vlen uint8 [N]
H5_SHAPES = "shapes"  # int64 [N, 3] when raw pixels vary in shape
H5_LABELS = "labels"  # int64 [N]
H5_PATHS = "paths"  # vlen UTF-8 str [N]; bytes that are not UTF-8 kept (surrogateescape)
H5_CRCS = "crcs"  # uint32 [N]: sample_crc of each encoded sample
H5_SIZES = "sizes"  # int64 [N, 2]: each stored image's height and width (version 2)
H5_FIELDS = "fields"  # the group of field columns: fields/<name>/<part> (FIELD_PARTS)
H5_ATTR_CLASSES = "classes"
H5_ATTR_ENCODING = "encoding"
H5_ATTR_VERSION = "imgpack_format_version"

# lmdb: one key per sample (SAMPLE_KEY, ASCII) whose value is the stored bytes, plus
# metadata keys that sort after every sample key ("_" > "9").
LMDB_LABELS = b"__labels__"  # int64 little-endian [N]
LMDB_SHAPES = b"__shapes__"  # int64 little-endian [N, 3], raw pixels only
LMDB_PATHS = b"__paths__"  # ASCII JSON list of N source paths (\udcXX: bytes not UTF-8)
LMDB_CRCS = b"__crcs__"  # uint32 little-endian [N]: sample_crc of each encoded sample
LMDB_SIZES = b"__sizes__"  # int64 little-endian [N, 2]: stored height and width (version 2)

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
WDS_CRC_COLUMN = "crcs"  # after them, for encoded samples: sample_crc of each image member
WDS_SIZE_COLUMNS = ("heights", "widths")  # after those: each stored image's size (version 2)
WDS_FIELDS_KEY = "fields"  # the index's object of field columns: {name: {part: [...]}}
WDS_RESERVED_EXTS = (WDS_LABEL_EXT, WDS_PATH_EXT, *WDS_IMAGE_EXTS)  # no field's member

# Fields (readers.fields): each shard stores each field of the schema as one column of N
# values, in parts named below, under the format's own names: pt f"fields.{name}.{part}"
# (field_key), hdf5 the dataset fields/<name>/<part>, lmdb the key
# f"__fields.{name}.{part}__" (lmdb_field_key), wds the index's fields/<name>/<part> lists,
# the values themselves tar members KEY.<wds_field_ext(name, kind)>. Variable kinds (text,
# json, bytes, array) store canonical bytes with a CRC-32 per value, checked on every read;
# int and float a typed column with one CRC-32 over it, checked when a process first reads
# it. A missing value (None) has valid = 0 and no bytes.
FIELD_DATA = "data"  # uint8 [total]: the values' canonical bytes back to back (not wds)
FIELD_OFFSETS = "offsets"  # int64 [N + 1] (wds: [N], each value's data offset in the tar)
FIELD_SIZES = "sizes"  # wds only: int64 [N], bytes of each value's member
FIELD_CRCS = "crcs"  # uint32 [N]: sample_crc of each value's canonical bytes (0 if missing)
FIELD_VALID = "valid"  # uint8 [N]: 1 where the sample has a value, 0 where it is missing
FIELD_VALUES = "values"  # int64 or float64 [N]: an int or float field's values (0 if missing)
FIELD_CRC = "crc"  # uint32 [1]: zlib.crc32 of the values' bytes, then of valid's bytes
VARIABLE_FIELD_PARTS = (FIELD_DATA, FIELD_OFFSETS, FIELD_CRCS, FIELD_VALID)
SCALAR_FIELD_PARTS = (FIELD_VALUES, FIELD_VALID, FIELD_CRC)


class DatasetError(ValueError):
    """A dataset on disk is missing, incomplete, corrupt or of an unsupported version."""


def shard_name(fmt: str, index: int) -> str:
    """File name of shard ``index`` of format ``fmt``, e.g. ``shard-000003.tar``."""
    return f"{SHARD_PREFIX}{index:06d}{SHARD_SUFFIX[fmt]}"


def field_key(name: str, part: str) -> str:
    """The pt key of part ``part`` of field ``name``: ``fields.<name>.<part>``."""
    return f"fields.{name}.{part}"


def lmdb_field_key(name: str, part: str) -> bytes:
    """The LMDB key of part ``part`` of field ``name`` (sorts after every sample key)."""
    return f"__fields.{name}.{part}__".encode("ascii")


def wds_field_ext(name: str, kind: str) -> str:
    """The tar member extension of field ``name`` of ``kind``: the name itself where
    ``webdataset``'s decoders read it as that kind (``txt``, ``caption.txt``, ``json``) and
    it is not the image's, label's or path's, else the name and the kind's extension
    (``caption.txt``, ``score.json``, ``emb.npy``, ``blob.bin``), so that
    ``webdataset.WebDataset(tars).decode()`` gives each field's value."""
    from readers.fields import extension_kind  # spec stays importable without torch

    if extension_kind(name) == kind and name not in WDS_RESERVED_EXTS:
        return name
    return f"{name}.{_KIND_EXT[kind]}"


_KIND_EXT = {
    "text": "txt",
    "json": "json",
    "int": "json",
    "float": "json",
    "bytes": "bin",
    "array": "npy",
}


def sample_digest(
    label: int,
    path: str,
    data: bytes | memoryview | np.ndarray,
    fields: Iterable[tuple[str, bytes | memoryview | None]] = (),
) -> bytes:
    """SHA-256 of one stored sample: label, source path, the stored value (encoded bytes,
    or uint8 HWC pixels with their shape) and its fields' canonical bytes (``(name, bytes
    or None)`` in the schema's order; a sample without fields digests as in version 1).
    Independent of format and shard layout."""
    if isinstance(data, np.ndarray):  # raw pixels
        kind = "raw:" + "x".join(map(str, data.shape))
        payload = memoryview(np.ascontiguousarray(data)).cast("B")
    else:
        kind, payload = "encoded", memoryview(data)
    digest = hashlib.sha256(f"{label}\0{path}\0{kind}\0".encode("utf-8", "surrogateescape"))
    digest.update(payload)
    for name, value in fields:  # each: its name, then its length (-1: missing) and bytes
        size = -1 if value is None else len(value)
        digest.update(f"\0{name}\0{size}\0".encode("ascii"))
        if value is not None:
            digest.update(value)
    return digest.digest()


def sample_nbytes(data: bytes | memoryview | np.ndarray) -> int:
    """Bytes of one stored value: encoded bytes, or raw pixels."""
    return data.nbytes if isinstance(data, np.ndarray) else len(data)


def sample_crc(data: bytes | memoryview | np.ndarray) -> int:
    """CRC-32 of an encoded sample's stored bytes, as the shard records it (a small share
    of decoding the same JPEG)."""
    return zlib.crc32(data)


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
    fields: tuple[tuple[str, FieldSpec], ...] = ()  # the schema's (name, spec) pairs, sorted

    @property
    def schema(self) -> Mapping[str, FieldSpec]:
        """The fields every sample carries (:data:`readers.fields.Schema`)."""
        return dict(self.fields)

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
