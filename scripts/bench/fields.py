"""Sample fields (issue 30), measured side by side in one run: what captions cost.

The data is img2dataset's: the benchmark folder's JPEGs written as WebDataset tars with a
caption (``txt``, 8-40 words, some non-ASCII) and a ``json`` (url, width, height, score) per
sample, by ``webdataset.TarWriter``; and the same JPEGs as Parquet files in the Hugging
Face Hub layout (``data/train-NNNNN-of-NNNNN.parquet``, written by ``datasets``: an
``image``, a ``ClassLabel`` label, the same ``caption`` and a ``score`` column).
Contenders, each a child process (:mod:`scripts.bench.convert_rate`,
:mod:`scripts.bench.read_rate`), in interleaved rounds whose order reverses each round;
medians quoted:

* conversion of those tars, and of those Parquet files, to ``pt`` jpeg at 224
  (``--resize 256 --center-crop 224``), with their fields against ``--no-fields`` (the
  four in the same interleaved rounds);
* ``make_loader`` reads (plain path, no workers) of the dataset with fields, without
  ``fields=`` and with ``fields=("txt",)``, against the dataset converted ``--no-fields``;
* ``ds.metadata()`` over ``--metadata-samples`` samples (tiny JPEGs with a caption and a
  json each, converted once and kept in ``--work``): seconds and peak memory
  (:mod:`scripts.bench.metadata_rate`), three runs.

    .venv/bin/python -m scripts.bench.fields --folder bench-data/folder --rounds 5 [--json F]
        [--sections convert,read,metadata] [--passes 12]

Targets: reads without ``fields=`` >= 0.97x, with ``fields=("txt",)`` >= 0.9x, conversion
with fields >= 0.95x (tars and Parquet alike); ``metadata()`` of 1 M samples under 2 s and 300 MB.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import statistics
from pathlib import Path

import webdataset
from PIL import Image

from convert import ConvertOptions, convert_folder
from scripts.bench.ab import run_child
from scripts.bench.common import image_files, machine_info, print_machine, write_json
from scripts.bench.settings import CROP, FOLDER, RESIZE, ROOT, WORK

VOCABULARY = (
    "a photo of the old harbour at dusk with boats and gulls over grey water near Zürich "
    "café naïve façade 東京 München Ελλάδα street market red blue green tiny large"
)
WORDS = VOCABULARY.split()
TAR_SAMPLES = 500


def caption(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))


def write_tars(samples: list[tuple[bytes, int, tuple[int, int]]], out: Path, seed: int = 0) -> Path:
    """``samples`` (JPEG bytes, label, (width, height)) as captioned tars in ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rng = random.Random(seed)
    for start in range(0, len(samples), TAR_SAMPLES):
        with webdataset.TarWriter(str(out / f"{start // TAR_SAMPLES:05d}.tar")) as tar:
            for i, (jpeg, label, (width, height)) in enumerate(
                samples[start : start + TAR_SAMPLES], start
            ):
                meta = {"url": f"https://example.com/{i}.jpg", "width": width, "height": height}
                tar.write(
                    {
                        "__key__": f"{i:08d}",
                        "jpg": jpeg,
                        "cls": label,
                        "txt": caption(rng),
                        "json": {**meta, "score": round(rng.random(), 4)},
                    }
                )
    return out


def write_parquet(
    samples: list[tuple[bytes, int, tuple[int, int]]], out: Path, seed: int = 0
) -> Path:
    """``samples`` as Parquet files in the Hub layout in ``out`` (``TAR_SAMPLES`` rows a
    file): the captions and scores :func:`write_tars` writes for the same seed."""
    import datasets

    shutil.rmtree(out, ignore_errors=True)
    (out / "data").mkdir(parents=True)
    rng = random.Random(seed)
    rows = [(caption(rng), round(rng.random(), 4)) for _ in samples]  # write_tars' draws
    classes = [str(k) for k in range(max((label for _, label, _ in samples), default=0) + 1)]
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=classes),
            "caption": datasets.Value("string"),
            "score": datasets.Value("float64"),
        }
    )
    files = -(-len(samples) // TAR_SAMPLES)
    for number, start in enumerate(range(0, len(samples), TAR_SAMPLES)):
        chunk = range(start, min(start + TAR_SAMPLES, len(samples)))
        columns = {
            "image": [{"bytes": samples[i][0], "path": f"{i:08d}.jpg"} for i in chunk],
            "label": [samples[i][1] for i in chunk],
            "caption": [rows[i][0] for i in chunk],
            "score": [rows[i][1] for i in chunk],
        }
        path = out / "data" / f"train-{number:05d}-of-{files:05d}.parquet"
        datasets.Dataset.from_dict(columns, features=features).to_parquet(str(path))
    return out


def folder_samples(folder: Path) -> list[tuple[bytes, int, tuple[int, int]]]:
    files = image_files(folder)
    classes = sorted({f.parent.name for f in files})
    out = []
    for f in files:
        with Image.open(f) as image:
            size = image.size
        out.append((f.read_bytes(), classes.index(f.parent.name), size))
    return out


def tiny_samples(count: int) -> list[tuple[bytes, int, tuple[int, int]]]:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 12), (120, 60, 30)).save(buffer, "JPEG", quality=90)
    return [(buffer.getvalue(), i % 10, (16, 12)) for i in range(count)]


def convert(src: Path, dst: Path, **options: object) -> Path:
    convert_folder(
        src, dst, ConvertOptions(format="pt", **options), workers=2, overwrite=True, progress=False
    )
    return dst


def metadata_dataset(work: Path, count: int) -> Path:
    """The ``metadata()`` dataset, converted once (kept while its sample count matches)."""
    dst = work / f"fields-metadata-{count}"
    if (dst / "imgpack.json").is_file():
        return dst
    tars = write_tars(tiny_samples(count), work / "fields-metadata-tars")
    convert(tars, dst, encoding="original")
    shutil.rmtree(tars)
    return dst


def interleaved(
    named: dict[str, tuple[str, list[str]]], rounds: int, key: str = "rate"
) -> dict[str, list[dict[str, float]]]:
    """Each contender's result lines, ``rounds`` of them (``key`` printed as they come)."""
    results: dict[str, list[dict[str, float]]] = {name: [] for name in named}
    for round_ in range(rounds):
        order = list(named) if round_ % 2 == 0 else list(named)[::-1]
        load = os.getloadavg()[0]
        for name in order:
            child, args = named[name]
            results[name].append(run_child(ROOT, child, args))
        latest = {n: round(v[-1][key]) for n, v in results.items()}
        print(f"round {round_ + 1} (load {load:.2f}):", latest)
    return results


SECTIONS = ("convert", "read", "metadata")
# ratio -> (numerator, denominator), contenders' names
RATIOS = {
    "conversion with fields / --no-fields": ("convert, fields", "convert, --no-fields"),
    "parquet conversion with fields / --no-fields": (
        "convert parquet, fields",
        "convert parquet, --no-fields",
    ),
    "read without fields= / no fields stored": ("read, fields stored", "read, no fields stored"),
    "read fields=txt / no fields stored": ("read, fields=txt", "read, no fields stored"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=FOLDER, help="the benchmark folder")
    parser.add_argument("--work", type=Path, default=WORK, help="scratch folder")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--passes", type=int, default=12, help="timed epochs per read child (an epoch: ~0.2 s)"
    )
    parser.add_argument("--metadata-samples", type=int, default=1_000_000)
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument(
        "--sections",
        type=lambda text: text.split(","),
        default=list(SECTIONS),
        help=f"comma-separated, of {','.join(SECTIONS)} (default: all)",
    )
    args = parser.parse_args()
    if unknown := set(args.sections) - set(SECTIONS):
        parser.error(f"--sections: no section {', '.join(sorted(unknown))}")
    info = machine_info()
    print_machine(info)
    work = args.work.resolve()
    samples = folder_samples(args.folder)
    tars = write_tars(samples, work / "fields-tars")
    parquet = write_parquet(samples, work / "fields-parquet")
    geometry = {"encoding": "jpeg", "resize": RESIZE, "center_crop": CROP}
    with_fields = str(convert(tars, work / "fields-pt", **geometry))
    without = str(convert(tars, work / "fields-none-pt", fields=(), **geometry))

    crop = ["--resize", str(RESIZE), "--center-crop", str(CROP)]
    read = ["--reader", "make-loader", "--crop", "none", "--passes", str(args.passes)]
    sections = {
        "convert": {
            "convert, fields": ("convert_rate", ["--folder", str(tars), *crop]),
            "convert, --no-fields": ("convert_rate", ["--folder", str(tars), *crop, "--no-fields"]),
            "convert parquet, fields": ("convert_rate", ["--folder", str(parquet), *crop]),
            "convert parquet, --no-fields": (
                "convert_rate",
                ["--folder", str(parquet), *crop, "--no-fields"],
            ),
        },
        "read": {
            "read, no fields stored": ("read_rate", [without, *read]),
            "read, fields stored": ("read_rate", [with_fields, *read]),
            "read, fields=txt": ("read_rate", [with_fields, *read, "--fields", "txt"]),
        },
    }
    results: dict[str, list[dict[str, float]]] = {}
    for section in args.sections:
        if section in sections:
            results.update(interleaved(sections[section], args.rounds))
    rates = {name: [r["rate"] for r in lines] for name, lines in results.items()}
    median = {name: statistics.median(values) for name, values in rates.items()}
    for name, values in rates.items():
        print(f"{name:30} {median[name]:8,.0f} /s   {' / '.join(f'{v:,.0f}' for v in values)}")
    ratios = {
        name: median[top] / median[bottom]
        for name, (top, bottom) in RATIOS.items()
        if top in median and bottom in median
    }
    # reads also per CPU-second (the machine's other load moves it less than the wall clock)
    cpu = {
        n: statistics.median(r["cpu_rate"] for r in v)
        for n, v in results.items()
        if "cpu_rate" in v[0]
    }
    cpu_ratios = {
        name: cpu[top] / cpu[bottom]
        for name, (top, bottom) in RATIOS.items()
        if top in cpu and bottom in cpu
    }
    for name, ratio in ratios.items():
        per_cpu = f"   per CPU-second {cpu_ratios[name]:.3f}" if name in cpu_ratios else ""
        print(f"{name:46} {ratio:.3f}{per_cpu}")

    metadata = []
    if "metadata" in args.sections:
        dataset = str(metadata_dataset(work, args.metadata_samples))
        metadata = [run_child(ROOT, "metadata_rate", [dataset]) for _ in range(3)]
    for run in metadata:
        rows, seconds, mb = run["rows"], run["seconds"], run["rss_mb"]
        print(f"metadata() of {rows:,} samples: {seconds:.2f} s, {mb:.0f} MiB")
    write_json(
        args.json,
        {
            "machine": info,
            "rates": rates,
            "ratios": ratios,
            "cpu_ratios": cpu_ratios,
            "metadata": metadata,
        },
    )


if __name__ == "__main__":
    main()
