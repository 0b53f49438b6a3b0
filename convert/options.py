"""What a conversion is asked to do (:class:`ConvertOptions`, recorded in the manifest)
and what it did (:class:`ConvertResult`): shared by the pipeline, the destination folder
and the command line, so that none of them imports another for its types."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from convert.process import Transform
from convert.writers import FORMAT_WRITERS
from readers import spec
from readers.cpus import usable_cpus

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "DEFAULT_SHARD_SIZE",
    "ON_ERROR",
    "ConvertOptions",
    "ConvertResult",
    "default_workers",
]

ON_ERROR = ("skip", "fail")
# Per format, from its one registration (convert.writers.FORMAT_WRITERS).
DEFAULT_SHARD_SIZE = {fmt: w.shard_size for fmt, w in FORMAT_WRITERS.items()}
DEFAULT_SHARD_BYTES = {fmt: w.shard_bytes for fmt, w in FORMAT_WRITERS.items()}
COMPRESSED_FORMATS = tuple(fmt for fmt, w in FORMAT_WRITERS.items() if w.compression)


def default_workers() -> int:
    """Usable CPUs of this process (respects taskset/cgroup affinity)."""
    return usable_cpus()


@dataclass(frozen=True)
class ConvertOptions:
    """Everything that decides what a conversion writes (recorded in the manifest)."""

    format: str
    encoding: str = "jpeg"
    resize: int | None = None
    center_crop: int | None = None
    quality: int = 90
    shard_size: int | None = None  # None: the format's default
    shard_bytes: int | None = None
    shuffle: bool = False
    seed: int = 0
    compression: str | None = None
    max_pixels: int | None = None  # None: Pillow's decompression-bomb limit
    exact_resize: bool = False  # else large JPEGs are decoded DCT-scaled before --resize
    include_hidden: bool = False  # else names starting with "." are skipped, as hidden
    classes: tuple[str, ...] | None = None  # the class list (labels); None: SRC's folders
    labels_file: str | None = None  # CSV/TSV of relative_path,label_name instead of folders
    unlabeled: bool = False  # every image, label spec.UNLABELED
    label_key: str | None = None  # a WebDataset or Parquet source's label field
    split: str | None = None  # the split of a Hugging Face Parquet source (--split)
    file_list: str | None = None  # the files to convert, listed (with labels): no walk of SRC
    restart_markers: bool = True  # a restart marker every MCU of the JPEGs it encodes
    fields: tuple[str, ...] | None = None  # the fields to keep; None: all, (): none
    metadata: str | None = None  # a folder's CSV / JSON lines / Parquet of fields (--metadata)

    def validate(self) -> None:
        """Raise ValueError naming the bad option and the fix."""
        if self.format not in spec.FORMATS:
            raise ValueError(f"unknown format {self.format!r}: choose from {spec.FORMATS}")
        if self.encoding not in spec.ENCODINGS:
            raise ValueError(f"unknown encoding {self.encoding!r}: choose from {spec.ENCODINGS}")
        if self.encoding == "original" and (self.resize or self.center_crop):
            raise ValueError(
                "--encoding original stores the source bytes unchanged: drop --resize and "
                "--center-crop, or use --encoding jpeg or raw"
            )
        for name in ("resize", "center_crop", "shard_size", "shard_bytes", "max_pixels"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be a positive number, not {value}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be between 1 and 100, not {self.quality}")
        if self.unlabeled and (self.labels_file or self.classes):
            raise ValueError("--unlabeled excludes --labels, --classes and --classes-from")
        if self.file_list and (self.labels_file or self.unlabeled):
            raise ValueError(
                "--file-list names the files and their labels (a row without one is "
                "unlabelled): drop --labels and --unlabeled"
            )
        if self.center_crop and self.resize and self.center_crop > self.resize:
            raise ValueError(
                f"--center-crop {self.center_crop} is larger than --resize {self.resize}: the "
                "crop would pad every image with black on its shorter side; use a crop no "
                "larger than the resize"
            )
        if self.metadata and self.file_list:
            raise ValueError("--metadata applies to a walked folder: drop --file-list")
        if self.compression is not None and self.format not in COMPRESSED_FORMATS:
            raise ValueError(
                f"--compression applies to --format {' '.join(COMPRESSED_FORMATS)} only"
            )
        if self.compression not in (None, "gzip", "lzf"):
            raise ValueError(f"unknown compression {self.compression!r}: use gzip or lzf")

    def warnings(self) -> list[str]:
        """Options that are valid but rarely what was meant, each with the likely fix."""
        if self.center_crop and not self.resize:
            c = self.center_crop
            return [
                f"--center-crop {c} without --resize keeps only the central {c}x{c} pixels "
                f"of each full-size image (a small patch of a large photo); for "
                f"torchvision's Resize + CenterCrop recipe add --resize "
                f"{round(c * 256 / 224)}"
            ]
        return []

    @property
    def transform(self) -> Transform:
        return Transform(
            self.encoding,
            self.resize,
            self.center_crop,
            self.quality,
            self.exact_resize,
            self.max_pixels,
            self.restart_markers,
        )

    def shard_limits(self) -> tuple[int | None, int | None]:
        return (
            self.shard_size or DEFAULT_SHARD_SIZE[self.format],
            self.shard_bytes or DEFAULT_SHARD_BYTES[self.format],
        )


@dataclass
class ConvertResult:
    """The outcome of a conversion, as the summary line and the manifest report it."""

    dst: Path | str  # a URL for an object-store DST
    written: int = 0
    skipped: int = 0
    bytes: int = 0
    seconds: float = 0.0
    errors: list[dict[str, str]] = field(default_factory=list)
    resumed: int = 0  # samples kept from an interrupted run
    hidden: list[str] = field(default_factory=list)  # skipped as hidden (names with ".")
    empty_classes: list[str] = field(default_factory=list)  # listed, with no folder in SRC

    def summary(self) -> str:
        if self.resumed and self.resumed == self.written and not self.seconds:
            return f"already complete: {self.written} samples in {self.dst}; nothing to do"
        rate = (self.written - self.resumed) / self.seconds if self.seconds else 0.0
        kept = f" (kept {self.resumed} from the interrupted run)" if self.resumed else ""
        hidden = ""
        if self.hidden:
            shown = ", ".join(self.hidden[:3]) + (", ..." if len(self.hidden) > 3 else "")
            hidden = f"; {len(self.hidden)} hidden entries not read ({shown}: --include-hidden)"
        if self.empty_classes:
            shown = ", ".join(self.empty_classes[:3])
            more = ", ..." if len(self.empty_classes) > 3 else ""
            hidden += f"; {len(self.empty_classes)} listed classes have no folder ({shown}{more})"
        return (
            f"written {self.written}{kept}, skipped {self.skipped}, "
            f"{self.bytes / 1e6:.1f} MB in {self.seconds:.1f} s ({rate:.0f} images/s) "
            f"-> {self.dst}{hidden}"
        )
