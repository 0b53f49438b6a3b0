"""A conversion as asked, once its source is scanned: what every executor is handed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from convert.options import ConvertOptions
from convert.output.destination import Upload
from convert.samples import SampleTable
from convert.scan import Scan
from convert.sources import SampleReader, SampleSource
from convert.writers import Layout

__all__ = ["BadInputError", "Job", "bad_input"]


class BadInputError(ValueError):
    """A source file could not be converted and ``on_error="fail"`` stops the run."""


def bad_input(error: dict[str, str], resumable: bool) -> BadInputError:
    """The error that stops a run at the bad file ``error`` names, with how to go on."""
    how = "rerun with --resume" if resumable else "rerun"
    return BadInputError(
        f"{error['error']} [stopped by --on-error fail: fix or remove {error['path']} and "
        f"{how}{'' if resumable else ', or use --on-error skip'}]"
    )


@dataclass(frozen=True)
class Job:
    """The source's samples in writing order and how to write them."""

    source: SampleSource
    folder: Path  # where the shards are written: DST, or a bucket DST's staging folder
    options: ConvertOptions
    scan: Scan
    samples: SampleTable  # shuffled when asked
    fingerprint: str  # of the sample list, which --resume checks
    workers: int
    on_error: str
    progress: bool | None
    upload: Upload | None  # a bucket DST's: how a shard written elsewhere (a Ray node) goes up

    @property
    def reader(self) -> SampleReader:
        """What the workers read the samples through."""
        return self.source.reader()

    def layout(self) -> Layout:
        """What every shard's writer is told about the samples."""
        options = self.options
        return Layout(
            options.encoding,
            options.transform.output_shape(self.scan.fixed_shape),
            tuple(self.scan.classes),
            options.compression,
            tuple(self.scan.fields.items()),
        )

    def progress_bar(self, initial: int) -> tqdm:
        """The bar of samples done, starting at ``initial`` (those kept from before)."""
        options = self.options
        return tqdm(
            total=len(self.samples),
            initial=initial,
            unit="img",
            desc=f"{options.format}/{options.encoding}",
            disable=None if self.progress is None else not self.progress,
            smoothing=0.1,
        )
