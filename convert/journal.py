"""The journal of completed shards that ``--resume`` starts from.

The journal (``spec.JOURNAL_NAME``, JSON lines) starts with a header naming the options
and the source's sample list, then gains one entry per shard once that shard is renamed
into place: the shard's manifest entry, how far into the sample list it reaches, the files
skipped on the way and each sample's content digest. ``--resume`` keeps the shards whose
entries are intact and whose files still verify, and starts again after the last one, so
the resumed dataset is the one an uninterrupted run writes. A torn last line (a kill
mid-write) is ignored: its shard is redone.

:class:`Journal` keeps it in a local DST as one file; a bucket DST keeps it beside its
shards (``convert.output.remote.RemoteJournal``, one object per entry named by
:func:`entry_name`), so that ``--resume`` works from any machine. Both are a
:class:`JournalStore`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from convert.samples import Sample
from convert.writers.base import file_sha256
from readers import spec

__all__ = [
    "ENTRY_PREFIX",
    "IMPLIED_BY_OLDER_RECORDS",
    "JOURNAL_VERSION",
    "Journal",
    "JournalStore",
    "ShardEntry",
    "entry_name",
    "fold_sample",
    "parse_header",
    "resumable_entries",
    "same_options",
    "shard_files",
    "source_fingerprint",
]

JOURNAL_VERSION = 1
ENTRY_PREFIX = ".imgpack-journal-"  # a remote journal's entry objects: entry_name()

log = logging.getLogger(__name__)


def fold_sample(digest: Any, sample: Sample) -> None:
    """Add one source file (path and label) to a running SHA-256 of the sample list."""
    digest.update(f"{sample.label}\0{sample.relpath}\0".encode("utf-8", "surrogateescape"))


def source_fingerprint(samples: Sequence[Sample]) -> str:
    """SHA-256 of the ordered sample list (paths and labels)."""
    digest = hashlib.sha256()
    for sample in samples:
        fold_sample(digest, sample)
    return digest.hexdigest()


@dataclass
class ShardEntry:
    """One completed shard as the journal records it; ``end`` is the position in the
    sample list where the next shard starts, ``source`` the fingerprint of the sample list
    up to there (what a resume must find unchanged), ``errors`` the files skipped on the way;
    ``stored``, for a bucket DST, the size and the store's checksum of each uploaded file
    (what a resume compares without downloading it)."""

    shard: spec.ShardInfo
    end: int
    source: str
    errors: list[dict[str, str]] = field(default_factory=list)
    per_class: dict[int, int] = field(default_factory=dict)
    shapes: list[list[int]] = field(default_factory=list)
    digests: bytes = b""
    stored: dict[str, list[Any]] = field(default_factory=dict)  # name -> [size, checksum]

    def to_json(self) -> dict[str, Any]:
        return {
            "shard": asdict(self.shard),
            "end": self.end,
            "source": self.source,
            "errors": self.errors,
            "per_class": {str(k): v for k, v in self.per_class.items()},
            "shapes": self.shapes,
            "digests": self.digests.hex(),
            "stored": self.stored,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ShardEntry:
        return cls(
            shard=spec.ShardInfo(**raw["shard"]),
            end=int(raw["end"]),
            source=str(raw["source"]),
            errors=list(raw["errors"]),
            per_class={int(k): int(v) for k, v in raw["per_class"].items()},
            shapes=[list(s) for s in raw["shapes"]],
            digests=bytes.fromhex(raw["digests"]),
            stored=dict(raw.get("stored", {})),
        )

    def verifies(self, dst: Path) -> bool:
        """True if the shard and its sidecars are on disk exactly as recorded."""
        shard = self.shard
        paths = {dst / shard.path: shard.sha256}
        paths.update({dst / (shard.path + s): h for s, h in shard.sidecars.items()})
        if len(self.digests) != 32 * shard.samples:
            return False
        try:
            if (dst / shard.path).stat().st_size != shard.bytes:
                return False
            return all(file_sha256(p) == h for p, h in paths.items())
        except OSError:
            return False


def shard_files(shard: spec.ShardInfo) -> list[str]:
    """The names of a shard's files: the shard, then its sidecars."""
    return [shard.path, *(shard.path + suffix for suffix in shard.sidecars)]


def entry_name(shard: spec.ShardInfo) -> str:
    """The name of a remote journal's entry object for ``shard``."""
    return f"{ENTRY_PREFIX}{shard.path}.json"


def parse_header(text: str, where: str) -> dict[str, Any]:
    """A journal's first line, checked; DatasetError naming ``where`` if it is not one."""
    try:
        header = json.loads(text)
    except json.JSONDecodeError as e:
        raise spec.DatasetError(f"{where}: unreadable journal: {e}") from e
    if not isinstance(header, dict) or header.get("journal_version") != JOURNAL_VERSION:
        raise spec.DatasetError(f"{where}: unknown journal version")
    return header


class JournalStore(Protocol):
    """Where a conversion's journal is kept: a local file, or objects in the bucket."""

    @property
    def location(self) -> str: ...

    def exists(self) -> bool: ...

    def start(self, header: dict[str, Any], entries: Sequence[ShardEntry] = ()) -> None: ...

    def append(self, entry: ShardEntry) -> None: ...

    def load(self) -> tuple[dict[str, Any], list[ShardEntry]]: ...

    def remove(self) -> None: ...


class Journal:
    """Append-only record of a conversion's completed shards in a local DST (see the
    module docstring)."""

    def __init__(self, dst: Path) -> None:
        self.path = dst / spec.JOURNAL_NAME

    @property
    def location(self) -> str:
        return str(self.path)

    def exists(self) -> bool:
        return self.path.exists()

    def start(self, header: dict[str, Any], entries: Sequence[ShardEntry] = ()) -> None:
        """Write a fresh journal holding ``header`` and ``entries`` (atomically)."""
        tmp = self.path.with_name(spec.TMP_PREFIX + self.path.name)
        lines = [{"journal_version": JOURNAL_VERSION, **header}]
        lines += [e.to_json() for e in entries]
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def append(self, entry: ShardEntry) -> None:
        """Record a completed shard durably before going on."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry.to_json()) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def load(self) -> tuple[dict[str, Any], list[ShardEntry]]:
        """The header and the intact entries, in order (stopping at a torn line)."""
        with open(self.path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        header = parse_header(lines[0], self.location)
        entries = []
        for line in lines[1:]:
            try:
                entries.append(ShardEntry.from_json(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                break  # the line being written when the run stopped
        return header, entries

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def resumable_entries(
    journal: JournalStore,
    options: dict[str, Any],
    samples: Sequence[Sample],
    verifies: Callable[[ShardEntry], bool],
) -> list[ShardEntry]:
    """The completed shards of an interrupted run that this run can keep: in order, with
    no gap, as long as each still ``verifies`` (its files are the ones recorded) and the
    source files up to its end (paths and labels; a file removed after the bad one that
    stopped the run is fine) are unchanged."""
    if not journal.exists():
        return []
    started, entries = journal.load()
    same_options(journal.location, started.get("options", {}), options)
    kept: list[ShardEntry] = []
    source = hashlib.sha256()
    for entry in entries:
        start = kept[-1].end if kept else 0
        if entry.end - start != entry.shard.samples + len(entry.errors):
            log.warning("no journal entry before %s: redoing from there", entry.shard.path)
            break
        for sample in samples[start : entry.end]:
            fold_sample(source, sample)
        if entry.end > len(samples) or source.hexdigest() != entry.source:
            log.warning("source files before %s changed: redoing from there", entry.shard.path)
            break
        if not verifies(entry):
            log.warning("%s does not verify: redoing from there", entry.shard.path)
            break
        kept.append(entry)
    return kept


# Options added since runs were first recorded: what a record without one did.
IMPLIED_BY_OLDER_RECORDS = {
    "restart_markers": False,
    "fields": None,
    "metadata": None,
    "schema": {},
}


def same_options(path: str | Path, recorded: dict[str, Any], options: dict[str, Any]) -> None:
    """Refuse to resume (or to call complete) a run with other options, naming each."""
    recorded = {**IMPLIED_BY_OLDER_RECORDS, **recorded}
    changed = [
        f"{k.replace('_', '-')} {recorded.get(k)!r} -> {options.get(k)!r}"
        for k in options
        if recorded.get(k) != options.get(k)
    ]
    if changed:
        raise ValueError(
            f"{path}: cannot resume: {'; '.join(changed)}; rerun with the options of the "
            "interrupted run, or pass --overwrite to start again"
        )
