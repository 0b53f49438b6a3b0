"""Planned shards: the conversion split up front, for executors whose shards complete out of
order (``convert.executors.ray_tasks``).

Shard ``i`` holds the samples at positions ``[i*S, (i+1)*S)`` of the ordered sample list,
S being ``shard_size`` (or the format's default; :data:`PLANNED_SHARD_SIZE` for hdf5 and
lmdb, whose local default is one file). A shard's name and content thus depend only on the
source and the options, never on which other shards are done, so each can be written by its
own task. A file that cannot be converted leaves its shard one sample short (a shard whose
every file is bad leaves no file, and a gap in the shard names); a sample's key is its
position in the sample list, unique and in order, with gaps where files were skipped.

Bookkeeping: the journal's header records the plan; an entry is a
:class:`~convert.journal.ShardEntry` whose ``end`` is the shard's planned end and whose
``source`` is the fingerprint of that shard's own slice of the sample list (the local
executor's covers everything before ``end``). Entries are appended as shards complete, in
any order; ``--resume`` keeps every entry that matches the plan and whose files verify,
and writes the rest.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from convert.journal import JournalStore, ShardEntry, same_options, source_fingerprint
from convert.ledger import ContentDigest, Publish, Tally
from convert.options import DEFAULT_SHARD_SIZE, ConvertOptions
from convert.process import Prepared
from convert.samples import Sample
from convert.writers import WRITERS, Layout, Record, ShardWriter
from convert.writers.base import discard_shard, place_shard
from readers import spec

__all__ = [
    "PLANNED_SHARD_SIZE",
    "PlannedLedger",
    "ShardOutcome",
    "ShardPlan",
    "ShardTask",
    "resumable_planned",
    "write_shard",
]

PLANNED_SHARD_SIZE = 10_000  # samples per shard where the local default is one file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardTask:
    """What writing one planned shard needs, passed to the task explicitly (picklable)."""

    folder: str  # where the shard file goes: DST itself on one machine or a shared filesystem
    # (a bucket DST's shard goes into a temporary folder of the node that writes it)
    fmt: str
    layout: Layout
    index: int
    start: int  # position of the first sample in the sample list (its key)
    labels: list[int]
    relpaths: list[str]
    stop_on_error: bool  # on_error "fail": write nothing once a file is bad


@dataclass
class ShardOutcome:
    """What a task did: the shard in place (None when no sample was written), its tallies,
    and, if the task uploaded the shard itself, what it recorded of the objects (None: the
    driver publishes it)."""

    index: int
    shard: spec.ShardInfo | None
    tally: Tally = field(default_factory=Tally)
    stored: dict[str, list[Any]] | None = None
    node: str = ""  # the Ray node that wrote it (and uploaded it, where ``stored`` is set)


@dataclass(frozen=True)
class ShardPlan:
    """Which samples go into which shard (see the module docstring)."""

    fmt: str
    size: int  # samples per shard
    total: int  # samples in the list
    fingerprints: tuple[str, ...]  # of each shard's slice of the sample list

    @classmethod
    def of(cls, options: ConvertOptions, samples: Sequence[Sample]) -> ShardPlan:
        """The plan for ``samples``: one O(N) pass over them for the slices' fingerprints."""
        size = options.shard_size or DEFAULT_SHARD_SIZE[options.format] or PLANNED_SHARD_SIZE
        slices = (samples[i : i + size] for i in range(0, len(samples), size))
        fingerprints = tuple(map(source_fingerprint, slices))
        return cls(options.format, size, len(samples), fingerprints)

    def header(self) -> dict[str, Any]:
        """What the journal's header records, so that a resume finds the same plan."""
        return {"executor": "planned", "shard_size": self.size}

    def span(self, index: int) -> range:
        """Positions of shard ``index``'s samples in the sample list."""
        return range(index * self.size, min((index + 1) * self.size, self.total))

    def task(
        self, index: int, samples: Sequence[Sample], folder: str, layout: Layout, stop: bool
    ) -> ShardTask:
        span = self.span(index)
        chosen = samples[span.start : span.stop]
        return ShardTask(
            folder,
            self.fmt,
            layout,
            index,
            span.start,
            [s.label for s in chosen],
            [s.relpath for s in chosen],
            stop,
        )

    def index_of(self, entry: ShardEntry) -> int | None:
        """The shard a journal entry is for, if it is one of this plan's."""
        index = (entry.end - 1) // self.size
        if not 0 <= index < len(self.fingerprints) or entry.source != self.fingerprints[index]:
            return None
        planned = entry.end == self.span(index).stop
        return index if planned and entry.shard.path == spec.shard_name(self.fmt, index) else None


def write_shard(task: ShardTask, prepared: Iterable[Prepared | str]) -> ShardOutcome:
    """Write the task's prepared samples (in order; a str is a bad file's error) as one shard:
    under a temporary name of its own, renamed into place once complete."""
    folder = Path(task.folder)
    name = spec.shard_name(task.fmt, task.index)
    tmp = folder / f"{spec.TMP_PREFIX}{secrets.token_hex(4)}-{name}"  # one per attempt
    outcome = ShardOutcome(task.index, None)
    writer: ShardWriter | None = None
    written = 0
    try:
        items = zip(task.labels, task.relpaths, prepared, strict=True)
        for position, (label, relpath, item) in enumerate(items, start=task.start):
            if isinstance(item, str):
                outcome.tally.errors.append({"path": relpath, "error": item})
                if task.stop_on_error:
                    discard_shard(writer, tmp)
                    return outcome
                continue
            key = spec.SAMPLE_KEY.format(position)
            fields = dict(zip(task.layout.schema, item.fields, strict=True))
            record = Record(key, item.data, item.ext, label, relpath, item.shape[:2], fields)
            if writer is None:
                writer = WRITERS[task.fmt](tmp, task.layout)
            writer.add(record)
            outcome.tally.written(record, item.shape)
            written += 1
        if writer is not None:
            sidecars = writer.close()
            outcome.shard = place_shard(tmp, folder / name, sidecars, written)
    except BaseException:
        discard_shard(writer, tmp)
        raise
    return outcome


class PlannedLedger:
    """The bookkeeping of a planned run: the shards done (kept ones and those completed
    since, in any order) and the errors of shards that wrote no file. It publishes each
    completed shard (an upload, for a remote DST) and journals it; ``entries``, ``errors``
    and the counts come out in sample order."""

    def __init__(
        self,
        journal: JournalStore,
        plan: ShardPlan,
        kept: list[ShardEntry],
        publish: Publish,
    ) -> None:
        self.journal = journal
        self.plan = plan
        self.publish = publish  # where a completed shard goes before it is journaled
        self._done: dict[int, ShardEntry] = {}
        self._content = ContentDigest()
        for entry in kept:
            index = plan.index_of(entry)
            if index is not None:
                self._keep(index, entry)
        self._empty: dict[int, list[dict[str, str]]] = {}  # shards whose every file was bad
        self.kept_samples = self.written_samples

    def todo(self) -> list[int]:
        """The shards still to write, in order."""
        return [i for i in range(len(self.plan.fingerprints)) if i not in self._done]

    def kept_positions(self) -> int:
        """How many positions of the sample list the kept shards cover (for progress)."""
        return sum(len(self.plan.span(i)) for i in self._done)

    def completed(self, outcome: ShardOutcome) -> None:
        """Record a shard a task wrote (published, or checked where the task uploaded it,
        then journaled), or the errors of one that wrote no file."""
        for error in outcome.tally.errors:
            log.warning("skipped %s", error["error"])
        index = outcome.index
        if outcome.shard is None:  # not journaled: a resume reads its bad files again
            self._empty[index] = outcome.tally.errors
            self._content.fold(index, b"")
            return
        stored = self.publish(outcome.shard, outcome.stored)
        end = self.plan.span(index).stop
        entry = outcome.tally.entry(outcome.shard, end, self.plan.fingerprints[index], stored)
        self.journal.append(entry)
        self._keep(index, entry)

    def _keep(self, index: int, entry: ShardEntry) -> None:
        """Add a completed shard: its digests to the content checksum, the rest to the
        shards done."""
        self._content.fold(index, entry.digests)
        self._done[index] = replace(entry, digests=b"")

    def content_sha256(self) -> str:
        return self._content.hexdigest()

    @property
    def entries(self) -> list[ShardEntry]:
        return [self._done[i] for i in sorted(self._done)]

    @property
    def errors(self) -> list[dict[str, str]]:
        """Files skipped, in sample order."""
        by_shard = {**self._empty, **{i: e.errors for i, e in self._done.items()}}
        return [error for i in sorted(by_shard) for error in by_shard[i]]

    @property
    def written_samples(self) -> int:
        return sum(e.shard.samples for e in self._done.values())


def resumable_planned(
    journal: JournalStore,
    header: dict[str, Any],
    plan: ShardPlan,
    verifies: Callable[[ShardEntry], bool],
) -> list[ShardEntry]:
    """The shards of an interrupted planned run that this run can keep: every journaled
    one that is in this plan (same slice of an unchanged sample list) and that
    ``verifies`` (its files are the ones recorded), in order."""
    if not journal.exists():
        return []
    started, entries = journal.load()
    same_options(journal.location, started.get("options", {}), header["options"])
    if started.get("plan") != header["plan"]:
        where = journal.location
        log.warning("%s: another executor or shard size wrote it: redoing every shard", where)
        return []
    kept: dict[int, ShardEntry] = {}
    for entry in entries:
        index = plan.index_of(entry)
        if index is None:
            log.warning("source files of %s changed: redoing it", entry.shard.path)
        elif not verifies(entry):
            log.warning("%s does not verify: redoing it", entry.shard.path)
        else:
            kept.setdefault(index, entry)
    return [kept[i] for i in sorted(kept)]
