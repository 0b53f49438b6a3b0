"""Benchmark object storage against local disk, side by side, on a loopback S3 server.

convert: the folder converted to ``wds`` (jpeg, resize 256, shuffled, shards of 500) into a
         local folder and into ``s3://`` (each shard staged, then uploaded): images/s.
stream:  ``WdsStream`` through ``make_loader`` (batch 64, centre crop 224 in the decode,
         shuffle window 1,000, ``num_workers=2``, persistent workers) over the same tars
         on local disk and in the bucket (byte ranges, nothing cached): samples/s of an
         epoch after a warm-up epoch.

The S3 server is moto's, a Python process on the same 2 cores: its CPU time is counted as
the benchmark's own, and every S3 request pays it, so the ratios are a conservative bound
for a real object store (which adds network latency instead).

    python -m scripts.bench.remote [--folder bench-data/folder] [--repeats 3] [--json F]
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import readers
from convert import ConvertOptions, convert_folder
from scripts.bench.common import (
    machine_info,
    markdown_table,
    parser,
    print_machine,
    rates_text,
    runs_json,
    source_folder,
    target_row,
    target_table,
    targets_json,
    write_json,
)
from scripts.bench.measure import Measurement, interleaved, median_rate
from scripts.bench.settings import BATCH, CROP, RESIZE
from scripts.s3_server import local_s3_server

BUCKET = "imgpack-bench"
OPTIONS = ConvertOptions("wds", resize=RESIZE, shuffle=True, shard_size=500)
WORKERS = 2
MAX_FOREIGN = 0.5  # default: the S3 server is this benchmark's own child; others still count


def _convert(src: Path, dst: str) -> Callable[[], Measurement]:
    def run() -> Measurement:
        result = convert_folder(src, dst, OPTIONS, overwrite=True, progress=False)
        return Measurement(result.written / result.seconds)

    return run


def _stream(path: str) -> Callable[[], Measurement]:
    loader = readers.make_loader(
        path,
        BATCH,
        stream=True,
        num_workers=WORKERS,
        crop=readers.CenterCrop(CROP),
        persistent_workers=True,
    )
    epochs = iter(range(10**6))

    def one_epoch() -> float:
        loader.set_epoch(next(epochs))
        start, samples = time.perf_counter(), 0
        for images, _ in loader:
            samples += len(images)
        return samples / (time.perf_counter() - start)

    one_epoch()  # workers started, page cache and connections warm

    def run() -> Measurement:
        return Measurement(one_epoch())

    return run


def main() -> None:
    args = parser(__doc__.split("\n\n")[0], MAX_FOREIGN).parse_args()
    info = machine_info()
    print_machine(info)
    src = source_folder(args)
    local = str(args.work / "remote-local-wds")
    with local_s3_server(BUCKET):
        remote = f"s3://{BUCKET}/wds"
        print("convert:")
        convert_runs = interleaved(
            {"local disk": _convert(src, local), "s3 (loopback)": _convert(src, remote)},
            args.repeats,
            args.max_foreign,
        )
        print("stream:")
        stream_runs = interleaved(
            {"local disk": _stream(local), "s3 (loopback)": _stream(remote)},
            args.repeats,
            args.max_foreign,
        )
    rows, targets = [], []
    for what, runs, unit, target in (
        ("convert", convert_runs, "images/s", 1 / 1.3),
        (f"WdsStream, num_workers={WORKERS}", stream_runs, "samples/s", 1 / 1.5),
    ):
        local_rate, s3_rate = median_rate(runs["local disk"]), median_rate(runs["s3 (loopback)"])
        rows.append([what, unit, local_rate, s3_rate, s3_rate / local_rate])
        rows[-1] += [rates_text(runs["local disk"]), rates_text(runs["s3 (loopback)"])]
        targets.append(target_row(f"{what}: s3 / local", s3_rate / local_rate, round(target, 3)))
    headers = ["", "unit", "local (median)", "s3 (median)", "s3 / local", "local runs", "s3 runs"]
    print(markdown_table(headers, rows))
    print(target_table(targets))
    write_json(
        args.json,
        {
            "machine": info,
            "convert": runs_json(convert_runs),
            "stream": runs_json(stream_runs),
            "targets": targets_json(targets),
        },
    )


if __name__ == "__main__":
    main()
