"""``imgpack bench`` and ``imgpack tune``: measure reads and DataLoader settings (the work is in
``convert.bench`` and ``readers.tune``; this only parses and reports)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from tqdm import tqdm

from convert import bench as measure
from convert import bench_report as report
from readers import tune as tuning
from readers.spec import DatasetError
from readers.storage import is_url

__all__ = ["bench", "fail", "tune"]


def fail(ctx: click.Context, error: Exception) -> None:
    """A user's mistake as a one-line error, or the traceback with ``imgpack --debug``."""
    if ctx.obj and ctx.obj.get("debug"):
        raise error
    raise click.ClickException(str(error)) from error


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
    type=int,
    help="Centre-crop images to this size in the DataLoader runs, as training would, so "
    "that batches of images of different sizes stack (without it they travel as lists).",
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
    help="Draw latency CDFs and throughput bars to this PNG (needs imgpack[plot]).",
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
    bar = tqdm(total=measure.steps(list(paths), repeats, workers), disable=disable, unit="step")
    try:
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
    except (DatasetError, FileNotFoundError, ValueError) as e:
        fail(ctx, e)
    click.echo(
        report.format_table(report.headers(workers), list(report.iter_rows(results, workers)))
    )
    for r in results:
        if r["cache_notes"]:
            click.echo(f"{r['path']}: page cache before each cold run: {r['cache_notes'][-1]}")
    click.echo(
        "cache: "
        + ("cold (dropped before each timed run)" if cold else "warm (an untimed pass first)")
    )
    if json_path is not None:
        document = {"machine": report.machine_facts(list(paths)), "results": results}
        json_path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        click.echo(f"every figure: {json_path}")
    if plot_path is not None:
        try:
            report.plot(results, workers, plot_path)
        except RuntimeError as e:
            fail(ctx, e)
        click.echo(f"plot: {plot_path}")


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--step-ms",
    type=float,
    help="Your model's compute time per batch, in ms: tune then says whether loading is "
    "the bottleneck and stops at the cheapest setting that is 1.5x faster than compute.",
)
@click.option("--batch-size", default=64, show_default=True, help="Samples per batch.")
@click.option("--seconds", default=0.5, show_default=True, help="Timed seconds per setting.")
@click.option(
    "--crop",
    type=int,
    help="Centre-crop images to this size, as training would (images of one size stack "
    "into one tensor; without a crop, images of different sizes travel as lists).",
)
@click.pass_context
def tune(
    ctx: click.Context,
    path: Path,
    step_ms: float | None,
    batch_size: int,
    seconds: float,
    crop: int | None,
) -> None:
    """Which DataLoader settings keep the GPU busy? Measure num_workers, decode_threads,
    prefetch_factor (and pin_memory with CUDA) on the dataset at PATH, cheapest first, and
    print the keyword arguments to paste into readers.make_loader.

    \b
    imgpack tune /data/in1k-pt --step-ms 40 --batch-size 256
    """
    head = f"{'setting':<58} {'samples/s':>9} {'first batch ms':>14}"
    if step_ms:
        head += f" {'wait ms/batch':>13} {'loader/compute':>15}"
    click.echo(head)

    def show(t: tuning.Trial) -> None:
        row = f"{t.setting!s:<58} {t.samples_per_s:>9,.0f} {t.first_batch_ms:>14,.0f}"
        if t.wait_ms is not None:
            row += f" {t.wait_ms:>13.1f} {t.ratio:>14.2f}x"
        click.echo(row)

    try:
        transform = measure.CentreCrop(crop) if crop else None
        trials = tuning.sweep(path, batch_size, step_ms, seconds, report=show, transform=transform)
    except (DatasetError, ValueError) as e:
        fail(ctx, e)
    best = tuning.recommend(trials, step_ms)
    if step_ms:
        top = max(t.ratio or 0 for t in trials)
        if (best.ratio or 0) >= tuning.HEADROOM:
            click.echo(
                f"loading is not the bottleneck: {best.setting} loads {best.ratio:.1f}x as "
                f"fast as the model computes ({step_ms:g} ms per batch); past "
                f"{tuning.HEADROOM}x more loader work buys nothing, so the sweep stopped."
            )
        else:
            click.echo(
                f"loading IS the bottleneck: the best setting loads {top:.2f}x as fast as the "
                f"model computes; the GPU waits {best.wait_ms:.1f} ms per batch. Consider a "
                "cheaper encoding (raw), a smaller stored size, or more CPU cores."
            )
    if best.setting.num_workers:
        click.echo(
            f"persistent_workers=True: without it every epoch pays the "
            f"{best.first_batch_ms:,.0f} ms its workers took to start."
        )
    click.echo(
        "recommended" + (f" (with your {crop}-pixel crop as transform=)" if crop else "") + ":"
    )
    click.echo(
        f"readers.make_loader({str(path)!r}, batch_size={batch_size}, **{best.setting.kwargs()!r})"
    )
