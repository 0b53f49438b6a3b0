"""What ``imgpack bench`` reports: the table, the plot, and the machine and storage facts
that go with every figure in its JSON."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

import readers
from convert.measure.bench import PERCENTILES, path_name
from readers.storage.remote import is_url

__all__ = ["format_table", "headers", "iter_rows", "machine_facts", "plot", "storage_of"]


def machine_facts(paths: list[Path]) -> dict[str, Any]:
    """CPU count, library versions and, where the system says, each path's storage."""
    import h5py
    import lmdb
    import PIL
    import webdataset

    return {
        "cpus": len(os.sched_getaffinity(0)),
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


def iter_rows(results: list[dict[str, Any]], workers: tuple[int, ...]) -> Iterator[list[Any]]:
    """The table's rows: one per path, and one more for a wds dataset read as a stream."""
    for r in results:
        f = {k: v["median"] for k, v in r["figures"].items()}
        name = f"{path_name(r['path'])} ({r['kind']})"
        yield [
            name,
            *(f[f"stored_p{p:g}_us"] for p in PERCENTILES),
            *(f[f"decoded_p{p:g}_us"] for p in (50.0, 99.0)),
            f["batch_ms"],
            f["sequential_samples_per_s"],
            f["sequential_mb_per_s"],
            *(f[f"loader_w{w}_samples_per_s"] for w in workers),
        ]
        if f"stream_w{workers[0]}_samples_per_s" in f:
            blank = [""] * (len(PERCENTILES) + 5)
            yield [f"{name} stream", *blank, *(f[f"stream_w{w}_samples_per_s"] for w in workers)]


def headers(workers: tuple[int, ...]) -> list[str]:
    return [
        "path",
        *(f"raw p{p:g} µs" for p in PERCENTILES),
        "decoded p50 µs",
        "decoded p99 µs",
        "batch ms",
        "seq /s",
        "seq MB/s",
        *(f"loader w={w} /s" for w in workers),
    ]


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


def plot(results: list[dict[str, Any]], workers: tuple[int, ...], out: Path) -> None:
    """Latency CDFs (log x) per path and the throughput bars, into ``out`` (a PNG)."""
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
    labels = ["sequential", *(f"loader w={w}" for w in workers)]
    width = 0.8 / max(1, len(results))
    for k, r in enumerate(results):
        f = r["figures"]
        keys = ["sequential_samples_per_s", *(f"loader_w{w}_samples_per_s" for w in workers)]
        values = [f[key]["median"] for key in keys]
        x = np.arange(len(labels)) + k * width
        bars.bar(x, values, width, color=f"C{k}", label=f"{Path(r['path']).name} ({r['kind']})")
    bars.set_xticks(np.arange(len(labels)) + width * (len(results) - 1) / 2, labels)
    bars.set(ylabel="samples/s", yscale="log", title="throughput (medians)")
    bars.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def format_table(head: list[str], rows: list[list[Any]]) -> str:
    """Right-aligned columns, thousands separators, small figures with 2 decimals."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.2f}" if abs(v) < 10 else f"{v:,.0f}"
        return str(v)

    table = [head, *([cell(v) for v in row] for row in rows)]
    widths = [max(len(r[c]) for r in table) for c in range(len(head))]
    lines = [
        "  ".join(
            v.ljust(w) if c == 0 else v.rjust(w)
            for c, (v, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in table
    ]
    return "\n".join(lines)
