"""The manifest ``imgpack.json``, typed: :class:`Manifest` and :func:`load_manifest`.

The converter writes it last (:meth:`Manifest.write`); ``info``, ``verify``, ``--resume``
and every reader start from it and read its fields as attributes. The names and layouts it
refers to are :mod:`readers.spec`'s. Where a dataset is (a local folder, or a URL and its
cache mirror) is a :class:`readers.storage.location.Location`, resolved once and recorded
in the manifest.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from readers.fields import FieldSpec, parse_schema, schema_json
from readers.spec import (
    ENCODINGS,
    FORMAT_VERSION,
    FORMATS,
    JOURNAL_NAME,
    LOCK_NAME,
    MANIFEST_NAME,
    SHARD_PREFIX,
    TMP_PREFIX,
    DatasetError,
    Layout,
    ShardInfo,
)
from readers.storage.location import Location

__all__ = ["Manifest", "json_text", "load_manifest"]


@dataclass(frozen=True)
class Manifest:
    """What ``imgpack.json`` says about a dataset, typed: the one description that the
    readers, ``imgpack info``, ``verify`` and ``--resume`` read (as attributes), and that
    the converter writes (:meth:`write`). ``to_json`` gives back the dict ``from_json``
    read, key for key."""

    location: Location
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
    source: dict[str, Any] | None = None  # a dataset converted from another: where from
    fields: dict[str, FieldSpec] = field(default_factory=dict)  # readers.fields.Schema

    @property
    def num_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @cached_property
    def layout(self) -> Layout:
        """The storage layout the writers used (``shape`` here: images' shape when they all
        share one, whatever the encoding; in the layout: fixed raw pixels only)."""
        stored = self.shape if self.encoding == "raw" else None
        return Layout(
            self.encoding,
            stored,
            self.classes,
            self.options.get("compression"),
            tuple(self.fields.items()),
        )

    @property
    def root(self) -> Path:
        """The local folder the shard files are opened in: the dataset's, or for a URL
        the cache folder mirroring it."""
        return self.location.folder

    @property
    def url(self) -> str | None:
        """The URL the dataset was read from, or None for a local folder."""
        return self.location.url

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
            "source": self.source,
            "fields": schema_json(self.fields) if self.fields else None,
        }
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_json(
        cls, root: Path | Location, raw: Any, expect_format: str | None = None
    ) -> Manifest:
        """Validate ``raw`` (the parsed ``imgpack.json`` of the dataset at ``root``);
        DatasetError names the file and the field."""
        return _parse_manifest(Location.of(root), raw, expect_format)

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
    root: str | os.PathLike[str] | Location,
    expect_format: str | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Manifest:
    """Read and validate ``root/imgpack.json``; raise DatasetError naming the file if bad.

    ``root`` is a dataset folder, a path to its manifest, a URL (``s3://...``, read through
    fsspec with ``storage_options``; the manifest's ``root`` is then the folder of
    ``cache_dir`` where readers keep their copies of its shards, :mod:`readers.storage.cache`),
    or a :class:`Location` already resolved. The manifest is read once, here."""
    location = Location.of(root, storage_options=storage_options, cache_dir=cache_dir)
    if location.remote is not None:
        return _parse_manifest(location, _read_remote(location), expect_format)
    root = location.folder
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
    return _parse_manifest(location, raw, expect_format)


def _read_remote(location: Location) -> Any:
    """The parsed ``imgpack.json`` at a URL (one GET), or DatasetError saying why not."""
    remote, url = location.remote, location.url
    assert remote is not None
    try:
        text = remote.read(MANIFEST_NAME)
    except FileNotFoundError:
        names = remote.names()
        if any(n.startswith(SHARD_PREFIX) for n in names):
            raise DatasetError(
                f"{url}: incomplete dataset (shards but no {MANIFEST_NAME}): a conversion "
                "into it is running or was interrupted (rerun it with --resume)"
            ) from None
        if names:
            what = f"not an imgpack dataset (no {MANIFEST_NAME})"
        elif not remote.bucket_exists():
            what = f"no such dataset (no bucket {remote.bucket!r})"
        else:
            what = "no such dataset"
        raise DatasetError(f"{url}: {what}") from None
    try:
        return json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{location.where(MANIFEST_NAME)}: unreadable manifest: {e}") from e


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


def _parse_manifest(location: Location, raw: Any, expect_format: str | None) -> Manifest:
    def bad(why: str) -> DatasetError:
        return DatasetError(f"{location.where(MANIFEST_NAME)}: {why}")

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
        location=location,
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
        source=_optional(raw, "source", dict, bad),
        fields=_schema(raw, bad),
    )


def _schema(raw: dict[str, Any], bad: Any) -> dict[str, FieldSpec]:
    try:
        return parse_schema(raw.get("fields"), "fields")
    except ValueError as e:
        raise bad(str(e)) from None


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
