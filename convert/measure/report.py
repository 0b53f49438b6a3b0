"""What ``imgpack bench`` reports: the table, the plot, and the machine and storage facts
that go with every figure in its JSON."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np
import torch

import readers
from convert.measure.bench import PERCENTILES, path_name
from readers.cpus import usable_cpus
from readers.storage.remote import is_url

__all__ = [
    "TABLE_WIDTH",
    "Column",
    "Row",
    "columns",
    "format_table",
    "machine_facts",
    "plot",
    "storage_of",
    "table_rows",
]

TABLE_WIDTH = 120  # characters: a terminal's width, and the issue's
MIN_LABEL = 24  # characters of a path's label before the columns split into blocks
BLOCK_LABEL = 40  # characters of a path's label once they have
SEPARATOR = 2  # spaces before each column


def machine_facts(paths: list[Path]) -> dict[str, Any]:
    """CPU count, library versions and, where the system says, each path's storage."""
    import h5py
    import lmdb
    import PIL
    import webdataset

    return {
        "cpus": usable_cpus(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pillow": PIL.__version__,
        "h5py": h5py.__version__,
        "lmdb": lmdb.__version__,
        "webdataset": webdataset.__version__,
        "jpeg_decoder": readers.decoder_name(),
        "crop_decoder": readers.decoder_name(crop=True),
        "imgpack": readers.__version__,
        "storage": {str(p): storage_of(p) for p in paths},
    }


def storage_of(path: Path | str) -> dict[str, Any]:
    """The filesystem and block device holding ``path``, as far as /proc and /sys tell
    (for a URL, its scheme: the figures are of the reader cache's copies)."""
    if is_url(path):
        return {"url": str(path), "scheme": str(path).split("://", 1)[0]}
    facts: dict[str, Any] = {}
    real = str(Path(path).resolve())
    mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    best = max((m for m in mounts if real.startswith(m[1])), key=lambda m: len(m[1]), default=None)
    if best:
        facts.update(device=best[0], mount=best[1], filesystem=best[2])
    dev = os.stat(real).st_dev
    block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for name, rel in (("rotational", "queue/rotational"), ("model", "device/model")):
        for base in (block, block / ".."):
            if (base / rel).is_file():
                facts[name] = (base / rel).read_text().strip()
                break
    return facts


@dataclass(frozen=True)
class Column:
    """One figure of the table: its group's heading, its own, and its key in the figures."""

    group: str
    name: str
    key: str


def columns(workers: tuple[int, ...]) -> list[Column]:
    """The table's figures, in order, grouped under shared headings to keep it narrow."""
    return [
        *(Column("raw read µs", f"p{p:g}", f"stored_p{p:g}_us") for p in PERCENTILES),
        *(Column("decoded µs", f"p{p:g}", f"decoded_p{p:g}_us") for p in (50.0, 99.0)),
        Column("batch", "ms", "batch_ms"),
        Column("sequential", "/s", "sequential_samples_per_s"),
        Column("sequential", "MB/s", "sequential_mb_per_s"),
        *(Column("DataLoader samples/s", f"w={w}", f"loader_w{w}_samples_per_s") for w in workers),
    ]


@dataclass(frozen=True)
class Row:
    """One row of the table and one series of the plot's bars: ``figures`` (medians) by
    the columns' keys, of ``results[path]``, read as a stream or not."""

    label: str
    figures: dict[str, float]
    path: int
    stream: bool = False


def table_rows(results: list[dict[str, Any]], workers: tuple[int, ...]) -> list[Row]:
    """One row per path, labelled ``name (kind)``, with its median figures, and one more
    for a wds dataset read as a stream (``... stream``: its stream rates as the DataLoader
    figures, nothing else)."""
    rows = []
    for k, r in enumerate(results):
        medians = {key: v["median"] for key, v in r["figures"].items()}
        label = f"{path_name(r['path'])} ({r['kind']})"
        rows.append(Row(label, medians, k))
        if f"stream_w{workers[0]}_samples_per_s" in medians:
            stream = {f"loader_w{w}_samples_per_s": medians[f"stream_w{w}_samples_per_s"]
                      for w in workers}  # fmt: skip
            rows.append(Row(f"{label} stream", stream, k, stream=True))
    return rows


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend; checked before a bench runs, so
    that a missing matplotlib is said before minutes of measuring, not after."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(
            "--plot needs matplotlib: pip install -e '.[plot]' in the imgpack checkout "
            "(or pip install matplotlib)"
        ) from None
    return plt


def plot(results: list[dict[str, Any]], workers: tuple[int, ...], out: Path) -> list[str]:
    """Latency CDFs (log x) per path and throughput bars per row of the table, into
    ``out`` (a PNG); the bars' labels, as its legend shows them."""
    plt = pyplot()
    fig, (cdf, bars) = plt.subplots(1, 2, figsize=(13, 5))
    for k, r in enumerate(results):
        name = f"{path_name(r['path'])} ({r['kind']})"
        for kind, style in (("stored", "-"), ("decoded", "--")):
            lat = np.sort(r["latency_us"][kind])
            fraction = np.arange(1, len(lat) + 1) / len(lat)
            cdf.plot(lat, fraction, style, color=f"C{k}", label=f"{name} {kind}")
    cdf.set(xscale="log", xlabel="latency of one random read (µs)", ylabel="fraction of reads")
    cdf.set_title("random reads: solid = stored bytes, dashed = decoded")
    cdf.legend(fontsize=7)
    cdf.grid(True, which="both", alpha=0.3)
    keys = ["sequential_samples_per_s", *(f"loader_w{w}_samples_per_s" for w in workers)]
    labels = ["sequential", *(f"loader w={w}" for w in workers)]
    rows = table_rows(results, workers)
    width = 0.8 / max(1, len(rows))
    for k, row in enumerate(rows):  # a path's colour; its stream hatched, with no sequential
        drawn = [i for i, key in enumerate(keys) if key in row.figures]
        heights = [row.figures[keys[i]] for i in drawn]
        style = {"color": f"C{row.path}", "hatch": "//" if row.stream else None}
        bars.bar(np.array(drawn) + k * width, heights, width, label=row.label, **style)
    bars.set_xticks(np.arange(len(labels)) + width * (len(rows) - 1) / 2, labels)
    bars.set(ylabel="samples/s", yscale="log", title="throughput (medians)")
    legend = bars.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return [text.get_text() for text in legend.get_texts()]


def format_table(cols: list[Column], rows: list[Row], width: int = TABLE_WIDTH) -> str:
    """Right-aligned figures under their group headings, thousands separators, small
    figures with 2 decimals, every line at most ``width`` characters: path names are
    shortened in the middle first, then the columns go into blocks one after another."""
    cells = [[_cell(figures.get(c.key)) for c in cols] for figures in (r.figures for r in rows)]
    widths = [max(len(c.name), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    groups = [list(run) for _, run in groupby(range(len(cols)), key=lambda i: cols[i].group)]
    for group in groups:  # a heading wider than its columns: the extra shared out
        missing = max(0, SEPARATOR + len(cols[group[0]].group) - _span(widths, group))
        for k, i in enumerate(reversed(group)):
            widths[i] += (missing + k) // len(group)
    longest = max(len("path"), *(len(r.label) for r in rows))
    label_width = min(longest, max(MIN_LABEL, width - _span(widths, range(len(cols)))))
    if label_width + _span(widths, range(len(cols))) > width:  # blocks: room for the names
        label_width = min(longest, BLOCK_LABEL)
    budget = width - label_width
    blocks: list[list[int]] = [[]]
    for group in groups:  # a group stays in one block, unless it alone is too wide
        if blocks[-1] and _span(widths, blocks[-1] + group) > budget:
            blocks.append([])
        for i in group:
            if blocks[-1] and _span(widths, [*blocks[-1], i]) > budget:
                blocks.append([])
            blocks[-1].append(i)
    labels = [_shorten(r.label, label_width) for r in rows]
    return "\n\n".join(_block(cols, widths, block, labels, cells, label_width) for block in blocks)


def _span(widths: list[int], members: Iterable[int]) -> int:
    """Characters that these columns take, each with the separator before it."""
    return sum(widths[i] + SEPARATOR for i in members)


def _block(
    cols: list[Column],
    widths: list[int],
    block: list[int],
    labels: list[str],
    cells: list[list[str]],
    label_width: int,
) -> str:
    """One block of the table: the group headings, the column headings, the rows."""
    pad = " " * SEPARATOR
    groups = " " * label_width
    for group, run in groupby(block, key=lambda i: cols[i].group):  # over its first column
        span = _span(widths, run)
        groups += (pad + group).ljust(span)[:span]
    lines = [groups.rstrip(), "path".ljust(label_width)]
    lines[1] += "".join(pad + cols[i].name.rjust(widths[i]) for i in block)
    for label, row in zip(labels, cells, strict=True):
        lines.append(
            label.ljust(label_width) + "".join(pad + row[i].rjust(widths[i]) for i in block)
        )
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:,.2f}" if abs(value) < 10 else f"{value:,.0f}"


def _shorten(label: str, width: int) -> str:
    """``label`` in at most ``width`` characters: the path's name cut in its middle, so
    that its start, its end and the ``(kind)`` after it stay."""
    if len(label) <= width:
        return label
    name, _, kind = label.partition(" (")
    kind = f" ({kind}" if kind else ""
    keep = width - len(kind) - 1
    if keep < 2:
        return label[: width - 1] + "…"
    return name[: (keep + 1) // 2] + "…" + name[len(name) - keep // 2 :] + kind
