"""``imgpack convert``: parse the options, call :func:`convert.convert_folder` (any source:
``convert.sources``), report."""

from __future__ import annotations

import signal
from pathlib import Path

import click

from convert.cli.options import chosen_fields, field_options, progress_option
from convert.executors import EXECUTORS
from convert.options import ON_ERROR, ConvertOptions, default_workers
from convert.pipeline import ConversionInterrupted, convert_folder
from readers import spec
from readers.manifest import load_manifest
from readers.storage.cache import parse_size

__all__ = ["convert", "parse_bytes"]


def parse_bytes(text: str) -> int:
    """``"500MB"`` -> 500_000_000; ``"1GiB"`` -> 2**30; a plain number is bytes."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@click.command()
@click.argument("src")
@click.argument("dst")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(spec.FORMATS),
    required=True,
    help="pt: mmap'd torch shards, fastest random reads. hdf5: one portable file. "
    "lmdb: key-value store, fast random reads. wds: WebDataset tars for "
    "streaming from disk or object storage.",
)
@click.option(
    "--encoding",
    type=click.Choice(spec.ENCODINGS),
    default="jpeg",
    show_default=True,
    help="raw: decoded uint8 pixels, no decode at train time but ~10x the bytes. "
    "jpeg: re-encode after resizing. original: source bytes unchanged "
    "(checked to decode).",
)
@click.option(
    "--resize",
    type=int,
    metavar="S",
    help="Resize the shorter side to S pixels, keeping the aspect ratio. A JPEG at least 5x "
    "as large is first decoded scaled down in the DCT domain, as far as keeps it 2.5x S "
    "(faster; within half a level of torchvision's pixels) unless --exact-resize.",
)
@click.option(
    "--exact-resize",
    is_flag=True,
    help="Decode every image at full size before --resize (torchvision's exact pixels; "
    "slower on large JPEGs).",
)
@click.option(
    "--center-crop",
    type=int,
    metavar="C",
    help="Crop the central CxC square after resizing (zero-padded if smaller). "
    "Raw pixels have one fixed shape only with this option; without it each "
    "sample keeps its own shape.",
)
@click.option(
    "--classes",
    "classes_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The class list, one name per line, in label order (e.g. the training set's, so "
    "that a validation folder missing a class keeps the same labels). A sub-folder not in "
    "it is an error; a listed class without a folder is reported. For a dataset SRC: its "
    "labels are renumbered by class name; for WebDataset or Parquet: the names of the "
    "class numbers 0, 1, ...",
)
@click.option(
    "--classes-from",
    metavar="DATASET",
    help="Take the class list from an existing imgpack dataset, a folder or a URL (e.g. the "
    "converted training set).",
)
@click.option(
    "--labels",
    "labels_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Take each image's class from this CSV or TSV file of relative_path,label_name "
    "rows (header optional) instead of from class folders: ImageNet's flat validation "
    "folder, for one. Images it does not list are reported, not converted.",
)
@click.option(
    "--file-list",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Convert exactly the files this CSV or TSV file lists below SRC, in its order, "
    "without listing SRC (a billion files need no directory walk): rows of relative_path "
    "(unlabeled) or relative_path,label_name (classes: the sorted label names, or "
    "--classes). A listed file that is missing or unreadable is a bad file (--on-error).",
)
@click.option(
    "--unlabeled",
    is_flag=True,
    help="Convert every image below SRC, in any layout, with label -1 and no classes.",
)
@click.option(
    "--label-key",
    metavar="KEY",
    help="For a WebDataset SRC: the member extension holding each sample's label, a class "
    "number or name (cls, txt), or a key inside a JSON member (json.label) [default: cls]. "
    "For a Parquet SRC: the label column [default: the ClassLabel feature, else 'label']. "
    "Integer labels are stored as they are (class names 0..K-1, or --classes FILE).",
)
@click.option(
    "--split",
    metavar="NAME",
    help="For a Parquet SRC downloaded from the Hugging Face Hub: the split to convert "
    "(its files SPLIT-NNNNN-of-NNNNN.parquet, also under data/); needed when SRC holds "
    "several.",
)
@field_options
@click.option(
    "--include-hidden",
    is_flag=True,
    help="Also read entries whose name starts with '.', which are skipped by default "
    "(.ipynb_checkpoints, macOS ._* files): unlike torchvision's ImageFolder, a hidden "
    "folder does not become class 0.",
)
@click.option(
    "--quality", type=int, default=90, show_default=True, help="JPEG quality for --encoding jpeg."
)
@click.option(
    "--restart-markers/--no-restart-markers",
    default=True,
    show_default=True,
    help="With --encoding jpeg, a restart marker every MCU (16 px): the same pixels and about "
    "4% more bytes, and crop= reads that entropy-decode only the crop's neighbourhood, not "
    "every row above it (faster, most for RandomResizedCrop; docs/BENCHMARKS.md). Written "
    "where the compiled kernel is built; --no-restart-markers for the smallest files.",
)
@click.option(
    "--shard-size",
    type=int,
    metavar="N",
    help="Samples per shard [default: 10000 for pt and wds; one file for hdf5 and lmdb, "
    "which --resume can only redo whole: give long runs a size].",
)
@click.option(
    "--shard-bytes",
    type=str,
    metavar="SIZE",
    help="Start a new shard before one passes SIZE of sample data, e.g. 512MB "
    "[default: 1GiB for pt and wds].",
)
@click.option(
    "--workers",
    type=int,
    metavar="N",
    help=f"Processes decoding and encoding [default: usable CPUs, {default_workers()} here].",
)
@click.option(
    "--executor",
    type=click.Choice(tuple(EXECUTORS)),
    default="local",
    show_default=True,
    help="local: a process pool on this machine. ray: shards as Ray tasks (pip install -e "
    "'.[ray]' in the checkout), planned by --shard-size [default 10000 for every format: hdf5 and "
    "lmdb then write one file per shard]; see docs/SCALING.md.",
)
@click.option(
    "--ray-address",
    metavar="ADDR",
    help="With --executor ray: the cluster to run on (host:port, or 'auto') [default: "
    "RAY_ADDRESS, else a new local instance with --workers CPUs].",
)
@click.option(
    "--shuffle",
    is_flag=True,
    help="Write samples in a random order (fixed by --seed), so that reading a "
    "stream sequentially is already shuffled. Parquet SRC larger than 256 MiB has its image "
    "bytes staged once in TMPDIR (as many bytes as the images) for the workers to read.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for --shuffle.")
@click.option(
    "--compression",
    type=click.Choice(["gzip", "lzf"]),
    help="HDF5 only: compress each chunk (helps raw pixels; JPEG barely shrinks).",
)
@click.option(
    "--max-pixels",
    type=int,
    metavar="N",
    help="Skip images over N pixels (width x height) without decoding them, as "
    "decompression bombs [default: Pillow's limit, 89478485].",
)
@click.option(
    "--on-error",
    type=click.Choice(ON_ERROR),
    default="skip",
    show_default=True,
    help="skip: leave out files that cannot be read or decoded, listing each with its "
    "reason in DST/errors.jsonl. fail: stop at the first one, naming it (completed "
    "shards are kept for --resume).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Finish an interrupted conversion into DST (Ctrl-C, kill, full disk, "
    "--on-error fail): keep its completed shards that still verify and convert the "
    "rest. Needs the same SRC and options.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace an imgpack dataset at DST (only files imgpack wrote are deleted).",
)
@click.option(
    "--staging",
    type=click.Path(file_okay=False, path_type=Path),
    help="For a DST URL: the local folder each shard is written to before its upload "
    "(about one shard's space; the journal --resume needs is in the bucket, so any "
    "machine can resume) [default: ~/.cache/imgpack/staging/<hash of DST>].",
)
@progress_option
@click.pass_context
def convert(
    ctx: click.Context,
    src: str,
    dst: str,
    fmt: str,
    encoding: str,
    resize: int | None,
    classes_file: Path | None,
    classes_from: str | None,
    labels_file: Path | None,
    file_list: Path | None,
    unlabeled: bool,
    label_key: str | None,
    split: str | None,
    fields: str | None,
    no_fields: bool,
    metadata: Path | None,
    include_hidden: bool,
    exact_resize: bool,
    restart_markers: bool,
    center_crop: int | None,
    quality: int,
    shard_size: int | None,
    shard_bytes: str | None,
    workers: int | None,
    executor: str,
    ray_address: str | None,
    shuffle: bool,
    seed: int,
    compression: str | None,
    max_pixels: int | None,
    on_error: str,
    resume: bool,
    overwrite: bool,
    staging: Path | None,
    progress: bool | None,
) -> None:
    """Convert SRC, an image folder with one sub-folder per class, into DST.

    SRC may also be an imgpack dataset of any format, a folder holding imgpack.json or a
    URL: re-format, re-encode, resize, crop, re-shard or --shuffle it, with its labels,
    class names and source paths carried over; the new manifest records the source and
    its content checksum (raw to raw with no --resize/--center-crop keeps the checksum).
    Or WebDataset tars made by other tools (a folder of .tar files, a glob, a brace pattern
    such as 'shards/train-{0000..0099}.tar', or a URL; the image is the jpg/jpeg/png/webp
    member, the label the cls member or --label-key; a .tar.gz/.tgz is decompressed once
    by the scan, its images staged in TMPDIR for the workers), or Parquet files in the
    Hugging Face image layout ({bytes, path} image column, integer label; class names from
    the schema's ClassLabel, else --classes FILE, else the numbers).

    DST is a folder, or a URL such as s3://bucket/prefix (fsspec; credentials from the
    usual chain: AWS_* variables including AWS_ENDPOINT_URL, ~/.aws, instance roles).
    Each shard is then staged locally and uploaded when complete, the manifest last; the
    journal --resume starts from is kept in the bucket, so any machine can resume. DST is
    checked (busy, not empty, no such bucket) before SRC is scanned.

    Labels follow torchvision's ImageFolder: classes are the sorted sub-folder names.
    Files that cannot be decoded are skipped, counted, and listed in DST/errors.jsonl
    (see --on-error). Shards are renamed into place when complete and the manifest
    DST/imgpack.json is written last: readers start from it. An interrupted run
    (Ctrl-C, SIGTERM, SIGKILL, full disk) continues with the same command plus --resume;
    `imgpack verify DST` checks the result.
    """
    if classes_file and classes_from:
        raise click.UsageError("--classes and --classes-from exclude each other: choose one")
    classes = _class_list(classes_file, classes_from)
    options = ConvertOptions(
        format=fmt,
        encoding=encoding,
        resize=resize,
        exact_resize=exact_resize,
        restart_markers=restart_markers,
        include_hidden=include_hidden,
        classes=classes,
        labels_file=str(labels_file) if labels_file else None,
        file_list=str(file_list) if file_list else None,
        unlabeled=unlabeled,
        label_key=label_key,
        split=split,
        fields=chosen_fields(fields, no_fields),
        metadata=str(metadata) if metadata else None,
        center_crop=center_crop,
        quality=quality,
        shard_size=shard_size,
        shard_bytes=parse_bytes(shard_bytes) if shard_bytes else None,
        shuffle=shuffle,
        seed=seed,
        compression=compression,
        max_pixels=max_pixels,
    )
    for warning in options.warnings():
        click.echo(f"warning: {warning}", err=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # a scheduler's stop: as Ctrl-C
    try:
        result = convert_folder(
            src,
            dst,
            options,
            workers=workers,
            overwrite=overwrite,
            resume=resume,
            on_error=on_error,
            progress=progress,
            executor=executor,
            ray_address=ray_address,
            staging=staging,
        )
    except KeyboardInterrupt as e:  # ConversionInterrupted once the destination is claimed
        done = f": {e}" if isinstance(e, ConversionInterrupted) else ""
        click.echo(
            f"imgpack: interrupted{done}. To continue, rerun the same command with --resume.",
            err=True,
        )
        ctx.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    click.echo(result.summary() + _unlabeled_note(result.dst, label_key))
    if result.skipped:
        click.echo(f"{result.skipped} file(s) skipped: see {dst}/errors.jsonl", err=True)


def _unlabeled_note(dst: Path | str, label_key: str | None) -> str:
    """The summary's note for a WebDataset or Parquet source converted without labels
    because none was found: say so, and how to choose the label."""
    manifest = load_manifest(dst)
    kind = (manifest.source or {}).get("kind")
    if manifest.classes or kind not in ("webdataset", "parquet"):
        return ""
    field = "member" if kind == "webdataset" else "column"
    if label_key:
        return f"; unlabeled: no sample has a {label_key!r} label (--label-key names the {field})"
    looked = "'cls' member" if kind == "webdataset" else "ClassLabel or 'label' column"
    return f"; unlabeled: no {looked} found (--label-key names the label {field})"


def _class_list(classes_file: Path | None, classes_from: str | None) -> tuple[str, ...] | None:
    """The class list from a file (one name per line) or from an existing dataset."""
    if classes_from is not None:
        return load_manifest(classes_from).classes
    if classes_file is None:
        return None
    names = [line.strip() for line in classes_file.read_text(encoding="utf-8").splitlines()]
    names = [n for n in names if n]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if not names or repeated:
        why = f"repeats {', '.join(repeated[:3])}" if repeated else "lists no class"
        raise ValueError(f"{classes_file}: {why} (one class name per line, in label order)")
    return tuple(names)
