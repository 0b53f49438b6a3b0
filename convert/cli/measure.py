"""``imgpack bench`` and ``imgpack tune``: measure reads and DataLoader settings (the work is in
``convert.measure`` and ``readers.feeding.tune``; this only parses and reports)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from tqdm import tqdm

from convert.cli.errors import fail
from convert.measure import bench as measure
from convert.measure import report
from readers.feeding import tune as tuning
from readers.feeding.wait import WAIT_SHARE, keeps_up
from readers.manifest import load_manifest
from readers.storage.remote import is_url

__all__ = ["bench", "recommended_call", "tune", "verdict"]


def _worker_counts(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a list like 0,2,4") from None
    if not counts or min(counts) < 0:
        raise click.BadParameter(f"{value!r}: worker counts are 0 or more")
    return counts


def _existing_paths(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> list[Path | str]:
    """Local paths that exist, or URLs (checked when opened)."""
    missing = [v for v in value if not is_url(v) and not Path(v).exists()]
    if missing:
        raise click.BadParameter(f"{missing[0]!r} does not exist")
    return [v if is_url(v) else Path(v) for v in value]


@click.command()
@click.argument("paths", nargs=-1, required=True, callback=_existing_paths)
@click.option("--samples", default=1000, show_default=True, help="Random reads per latency run.")
@click.option("--batch-size", default=64, show_default=True, help="Samples per batch read.")
@click.option(
    "--workers",
    default="0,2",
    show_default=True,
    callback=_worker_counts,
    help="DataLoader worker counts to measure, comma-separated.",
)
@click.option("--repeats", default=3, show_default=True, help="Timed runs of every figure.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random indices.")
@click.option(
    "--seconds",
    default=1.0,
    show_default=True,
    help="Timed seconds of each DataLoader measurement.",
)
@click.option(
    "--crop",
    type=click.IntRange(min=1),
    help="Centre-crop images to this size in the DataLoader runs, as training would: "
    "datasets through the readers' crop=readers.CenterCrop(SIZE), decoded straight into "
    "the batch; the image folder decodes each file whole and cuts the same box (zero-padded "
    "where smaller, as torchvision's CenterCrop); a dataset stored at that size already is "
    "read without a crop. Without it, images of different sizes travel as lists.",
)
@click.option(
    "--cold",
    is_flag=True,
    help="Drop the page cache of each dataset's own files before every timed run "
    "(posix_fadvise, no root needed), to measure the storage rather than memory.",
)
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write every figure.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(path_type=Path),
    help="Draw latency CDFs and throughput bars to this PNG (needs matplotlib: "
    "pip install -e '.[plot]' in the checkout).",
)
@click.option("--progress/--no-progress", default=None, help="Progress bar [default: on a tty].")
@click.pass_context
def bench(
    ctx: click.Context,
    paths: list[Path | str],
    samples: int,
    batch_size: int,
    workers: tuple[int, ...],
    repeats: int,
    seed: int,
    seconds: float,
    crop: int | None,
    cold: bool,
    json_path: Path | None,
    plot_path: Path | None,
    progress: bool | None,
) -> None:
    """Which backend reads fastest on this machine's storage? Measure each PATH: an
    imgpack dataset (any format) or a plain image folder (the baseline: open + decode
    per file, as a training script does). A dataset URL (s3://...) is first copied into
    the reader cache, so its figures are local reads, except the WdsStream's, which reads
    byte ranges from the bucket.

    \b
    Per PATH: latency of one random read without decoding ("raw", p50-p99.9 in µs) and
    with decoding to a uint8 tensor, batch reads of --batch-size random samples,
    sequential reads, and DataLoader samples/s for each --workers value (wds also as a
    WdsStream). Medians of --repeats runs; warm page cache unless --cold.

    \b
    imgpack bench /data/in1k-pt /data/in1k-wds ~/imagenet/train --workers 0,2,4 --plot b.png
    """
    disable = None if progress is None else not progress  # None: on when stderr is a tty
    if plot_path is not None:
        try:
            report.pyplot()
        except RuntimeError as e:
            fail(ctx, e)
    bar = tqdm(total=measure.steps(list(paths), repeats, workers), disable=disable, unit="step")
    results = []
    for path in paths:
        bar.set_description(measure.path_name(path))
        results.append(
            measure.bench_path(
                path,
                samples=samples,
                batch_size=batch_size,
                workers=workers,
                repeats=repeats,
                seed=seed,
                seconds=seconds,
                crop=crop,
                cold=cold,
                tick=lambda _what: bar.update(),
            )
        )
    bar.close()
    click.echo(report.format_table(report.columns(workers), report.table_rows(results, workers)))
    for r in results:
        if r["cache_notes"]:
            click.echo(f"{r['path']}: page cache before each cold run: {r['cache_notes'][-1]}")
        for note in r["notes"]:
            click.echo(f"note: {note}")
    click.echo(
        "cache: "
        + ("cold (dropped before each timed run)" if cold else "warm (an untimed pass first)")
    )
    if json_path is not None:
        document = {"machine": report.machine_facts(list(paths)), "results": results}
        json_path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        click.echo(f"every figure: {json_path}")
    if plot_path is not None:
        report.plot(results, workers, plot_path)
        click.echo(f"plot: {plot_path}")


def verdict(best: tuning.Trial, step_ms: float, encoding: str) -> str:
    """One line on whether loading is the bottleneck, from the wait measured with ``best``
    (the recommended setting) while a ``step_ms`` step ran after each batch, with what to
    try for a dataset stored with ``encoding``."""
    wait, share = best.wait_ms or 0.0, (best.wait_ms or 0.0) / step_ms
    if keeps_up(best.wait_ms, step_ms):
        return (
            f"loading is not the bottleneck: with {best.setting} the training loop waited "
            f"{wait:.1f} ms per {step_ms:g} ms step ({100 * share:.1f} %; up to "
            f"{100 * WAIT_SHARE:g} % counts as keeping up), so the sweep stopped there."
        )
    overlap = " (without workers, loading does not overlap the step)"
    cheaper = "a cheaper encoding (raw), " if encoding != "raw" else ""
    return (
        f"loading IS the bottleneck: no setting kept the wait within {100 * WAIT_SHARE:g} % "
        f"of the {step_ms:g} ms step. Recommended: {best.setting} (the cheapest within "
        f"{WAIT_SHARE * step_ms:g} ms of the least wait), which waited {wait:.1f} ms per "
        f"{step_ms:g} ms step ({100 * share:.0f} %) and loads {best.ratio or 0:.2f}x as fast "
        f"as the model computes{overlap if not best.setting.num_workers else ''}. Consider "
        f"{cheaper}a smaller stored size, or more CPU cores (or fewer other jobs on them)."
    )


def recommended_call(path: Path, batch_size: int, crop: int | None, best: tuning.Trial) -> str:
    """The ``readers.make_loader(...)`` call to paste, with the crop the figures were
    measured with."""
    arguments = [repr(str(path)), f"batch_size={batch_size}"]
    if crop:
        arguments.append(f"crop=readers.CenterCrop({crop})")
    arguments += [f"{k}={v!r}" for k, v in best.setting.kwargs().items()]
    return f"readers.make_loader({', '.join(arguments)})"


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--step-ms",
    type=click.FloatRange(min=0, min_open=True),
    help="Your model's compute time per batch, in ms. Each setting is then also measured "
    "with a step of that length after every batch: loading is not the bottleneck when the "
    f"training loop waits at most {100 * WAIT_SHARE:g} % of the step for the next "
    "batch (the loader's rate alone cannot say: without workers loading does not overlap "
    "the step), and the sweep stops at the cheapest setting that does.",
)
@click.option(
    "--batch-size",
    default=64,
    show_default=True,
    type=click.IntRange(min=1),
    help="Samples per batch.",
)
@click.option(
    "--seconds",
    default=0.5,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Timed seconds per setting, for the rate and again for the wait; raise it on a "
    "busy machine, where one short run is noisy.",
)
@click.option(
    "--crop",
    type=click.IntRange(min=1),
    help="Centre-crop images to this size while decoding, with crop=readers.CenterCrop(SIZE) "
    "as training would (zero-padded where smaller; the figures include the crop's cost), "
    "and print it in the recommended call; a dataset stored at that size already is "
    "measured without it. Images of one size stack into one tensor; without a crop, images "
    "of different sizes travel as lists.",
)
def tune(
    path: Path,
    step_ms: float | None,
    batch_size: int,
    seconds: float,
    crop: int | None,
) -> None:
    """Which DataLoader settings keep the GPU busy? Measure num_workers, decode_threads,
    prefetch_factor (and pin_memory with CUDA) on the dataset at PATH, cheapest first, and
    print the readers.make_loader call to paste. With --step-ms it stops at the first
    setting that keeps up; without, it measures all and picks the cheapest within 5 % of
    the fastest rate.

    \b
    imgpack tune /data/in1k-pt --step-ms 40 --batch-size 256 --crop 224
    """
    manifest = load_manifest(path)  # not a dataset: that error alone, before the table
    center_crop = measure.crop_for(manifest.shape, crop)
    if crop and center_crop is None:
        click.echo(f"{path} stores {crop}x{crop} images already: measured without crop=")
        crop = None
    head = f"{'setting':<58} {'samples/s':>9} {'first batch ms':>14}"
    if step_ms:
        head += f" {'wait ms/batch':>13} {'wait % of step':>14} {'loader/compute':>14}"
    click.echo(head)

    def show(t: tuning.Trial) -> None:
        row = f"{t.setting!s:<58} {t.samples_per_s:>9,.0f} {t.first_batch_ms:>14,.0f}"
        if step_ms and t.wait_ms is not None:
            row += f" {t.wait_ms:>13.1f} {100 * t.wait_ms / step_ms:>14.1f} {t.ratio:>13.2f}x"
        click.echo(row)

    trials = tuning.sweep(path, batch_size, step_ms, seconds, report=show, crop=center_crop)
    best = tuning.recommend(trials, step_ms)
    if step_ms:
        click.echo(verdict(best, step_ms, manifest.encoding))
    if best.setting.num_workers:
        click.echo(
            f"persistent_workers=True: without it every epoch pays the "
            f"{best.first_batch_ms:,.0f} ms its workers took to start."
        )
    click.echo("recommended:")
    click.echo(recommended_call(path, batch_size, crop, best))
