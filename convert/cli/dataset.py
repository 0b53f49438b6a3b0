"""``imgpack info`` and ``imgpack verify``: what a dataset holds, and whether it is intact."""

from __future__ import annotations

import json

import click

from convert.field_views import schema_lines
from readers.manifest import Manifest, load_manifest

__all__ = ["describe", "info", "verify"]


def describe(manifest: Manifest) -> str:
    """A person-readable account of a manifest."""
    m = manifest
    shape = "variable" if manifest.shape is None else "x".join(map(str, manifest.shape))
    total_bytes = sum(s.bytes for s in manifest.shards)
    lines = [
        f"dataset    {manifest.url or manifest.root}",
        f"format     {m.format} (format version {m.format_version}, "
        f"imgpack {m.imgpack_version or '?'})",
        f"encoding   {m.encoding}, images {shape} {m.dtype}",
        f"samples    {m.num_samples} written, {m.skipped or 0} skipped",
        *([f"written by {_converted_with(m.converted_with)}"] if m.converted_with else []),
        f"bytes      {total_bytes:,} in {len(manifest.shards)} shard(s)",
        f"checksum   {m.content_sha256 or '?'}",
        *([f"source     {m.source.get('kind')} {m.source.get('location')}"] if m.source else []),
        f"fields     {len(m.fields) or 'none'}",
        *schema_lines(m.fields),
        f"classes    {len(manifest.classes)}",
    ]
    per_class = m.samples_per_class or {}
    width = max((len(c) for c in manifest.classes), default=0)
    lines += [f"  {c:<{width}}  {per_class.get(c, '?')}" for c in manifest.classes]
    lines.append("shards")
    lines += [f"  {s.path}  {s.samples} samples  {s.bytes:,} bytes" for s in manifest.shards]
    lines.append("options    " + json.dumps(m.options, sort_keys=True))
    return "\n".join(lines)


def _converted_with(done: dict) -> str:
    """The manifest's ``converted_with`` in words: what decoded, what encoded (whether
    the JPEGs carry restart markers), how many workers."""
    parts = [f"{k.replace('_', ' ')} {v}" for k, v in sorted(done.items()) if k != "workers"]
    return ", ".join([*parts, f"{done['workers']} workers"] if "workers" in done else parts)


@click.command()
@click.argument("dst")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest itself.")
def info(dst: str, as_json: bool) -> None:
    """Show what the imgpack dataset at DST (a folder or a URL) holds: format and its
    version, the fields' schema, samples per class, shards."""
    manifest = load_manifest(dst)
    click.echo(json.dumps(manifest.to_json(), indent=1) if as_json else describe(manifest))


@click.command()
@click.argument("dst")
@click.option(
    "--deep",
    is_flag=True,
    help="Also read back and decode every sample and every field value, check the image's "
    "shape and recompute the content checksum (as slow as one epoch of reading).",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar for --deep [default: on when stderr is a terminal].",
)
def verify(dst: str, deep: bool, progress: bool | None) -> None:
    """Check that the dataset at DST is intact: the manifest, each shard's size and
    SHA-256, sample counts and labels; with --deep, every sample and its fields too. For a URL, each
    shard is downloaded into the reader cache (~/.cache/imgpack) to be checked.

    Prints one line per problem (file or file[index], and what is wrong) and exits
    with status 1 if there is any, 0 if the dataset is exactly what its manifest says.
    """
    from convert.verify import verify_dataset  # opens the dataset: torch, which info needs not

    report = verify_dataset(dst, deep=deep, progress=progress)
    for problem in report.problems:
        click.echo(str(problem))
    if not report.ok:
        raise click.ClickException(f"{len(report.problems)} problem(s) found in {dst}")
    what = (
        "every sample and field decoded, content checksum matches"
        if deep
        else "sizes and checksums"
    )
    click.echo(f"OK: {report.samples} samples in {report.shards} shard(s) ({what})")
