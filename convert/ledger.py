"""A run's bookkeeping: what the shards written so far add up to, and what is journaled.

Each executor keeps its own (:class:`SequentialLedger` for shards that complete in sample
order; ``convert.executors.planned.PlannedLedger`` for planned ones, in any order); the
pipeline reads either through the :class:`Ledger` protocol, to report the result, write
the manifest and say what an interrupted run kept.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from convert.journal import JournalStore, ShardEntry, fold_sample
from convert.samples import Sample
from convert.writers import Record
from readers import spec

__all__ = ["ContentDigest", "Ledger", "Publish", "SequentialLedger", "Tally"]


class Ledger(Protocol):
    """What a run's bookkeeping tells the pipeline, whichever executor wrote the shards."""

    kept_samples: int  # samples in the shards kept from an interrupted run

    @property
    def entries(self) -> list[ShardEntry]:
        """The completed shards, kept ones included, in sample order."""
        ...

    @property
    def errors(self) -> list[dict[str, str]]:
        """The files skipped so far, in sample order."""
        ...

    @property
    def written_samples(self) -> int:
        """Samples in the completed shards, kept ones included."""
        ...

    def content_sha256(self) -> str:
        """The manifest's ``content_sha256`` of the completed shards (all of them, done)."""
        ...


class ContentDigest:
    """The manifest's ``content_sha256`` (``spec.content_sha256``: SHA-256 over every
    sample's digest, in sample order), folded as shards complete: a shard's per-sample
    digests are added once every shard before it is, then dropped, so that the main process
    keeps none of the 32 bytes a sample for long. Shards are numbered in sample order; one
    that completes early waits, with its digests, for those before it."""

    def __init__(self) -> None:
        self._total = hashlib.sha256()
        self._next = 0  # the shard folded next
        self._waiting: dict[int, bytes] = {}

    def fold(self, index: int, digests: bytes) -> None:
        """Shard ``index`` completed with these per-sample digests (b"": it holds none)."""
        self._waiting[index] = digests
        while self._next in self._waiting:
            self._total.update(self._waiting.pop(self._next))
            self._next += 1

    def hexdigest(self) -> str:
        if self._waiting:
            raise RuntimeError(f"shard {self._next} never completed: no content checksum")
        return self._total.hexdigest()


@dataclass
class Tally:
    """What the samples of the shard being written add up to: its journal entry's tallies
    (kept by :class:`SequentialLedger`, or by the task that writes a planned shard)."""

    errors: list[dict[str, str]] = field(default_factory=list)
    per_class: Counter[int] = field(default_factory=Counter)
    shapes: set[tuple[int, ...]] = field(default_factory=set)
    digests: bytearray = field(default_factory=bytearray)

    def written(self, record: Record, shape: tuple[int, ...]) -> None:
        self.digests += spec.sample_digest(
            record.label, record.path, record.data, record.fields.items()
        )
        self.per_class[record.label] += 1
        self.shapes.add(shape)

    def entry(
        self, shard: spec.ShardInfo, end: int, source: str, stored: dict[str, list[Any]]
    ) -> ShardEntry:
        """The journal entry of ``shard``, complete with these tallies."""
        shapes = [list(s) for s in sorted(self.shapes)[:2]]  # two tell "variable" apart
        per_class, digests = dict(self.per_class), bytes(self.digests)
        return ShardEntry(shard, end, source, self.errors, per_class, shapes, digests, stored)


Publish = Callable[[spec.ShardInfo, dict[str, list[Any]] | None], dict[str, list[Any]]]
"""Where a completed shard goes before it is journaled (an upload, for a bucket DST), given
what its writer recorded if it uploaded the shard itself (a Ray task: then only checked);
returns what :attr:`ShardEntry.stored` records."""


class SequentialLedger:
    """The bookkeeping of a run whose shards complete in sample order (the local executor's):
    the completed shards (kept ones first), the running digest of the sample list that each
    journal entry records, and the tally of the shard being written. The conversion loop
    reports to it; it publishes each completed shard and journals it."""

    def __init__(
        self,
        journal: JournalStore,
        kept: list[ShardEntry],
        samples: Sequence[Sample],
        publish: Publish,
    ) -> None:
        self.journal = journal
        self.publish = publish  # where a completed shard goes before it is journaled
        self._content = ContentDigest()
        self.entries: list[ShardEntry] = []
        for entry in kept:
            self._keep(entry)
        self.start = kept[-1].end if kept else 0  # the position where this run starts
        self.kept_samples = sum(e.shard.samples for e in kept)
        self.written_samples = self.kept_samples  # the next sample's key
        self._source = hashlib.sha256()
        for sample in samples[: self.start]:
            fold_sample(self._source, sample)
        self._tally = Tally()

    def skipped(self, sample: Sample, error: dict[str, str]) -> None:
        self._tally.errors.append(error)
        fold_sample(self._source, sample)

    def written(self, sample: Sample, record: Record, shape: tuple[int, ...]) -> None:
        self.written_samples += 1
        fold_sample(self._source, sample)
        self._tally.written(record, shape)

    def completed(self, shard: spec.ShardInfo, end: int) -> None:
        """``shard`` is in place and ends before position ``end``: publish it (an upload,
        for a remote DST), then journal it."""
        stored = self.publish(shard, None)
        entry = self._tally.entry(shard, end, self._source.hexdigest(), stored)
        self.journal.append(entry)
        self._keep(entry)
        self._tally = Tally()

    def _keep(self, entry: ShardEntry) -> None:
        """Add a completed shard: its digests to the content checksum, the rest to
        ``entries``."""
        self._content.fold(len(self.entries), entry.digests)
        self.entries.append(replace(entry, digests=b""))

    def content_sha256(self) -> str:
        return self._content.hexdigest()

    @property
    def errors(self) -> list[dict[str, str]]:
        """Files skipped so far, in order, kept shards' included."""
        return [*(x for e in self.entries for x in e.errors), *self._tally.errors]
