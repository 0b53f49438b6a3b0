"""One conversion's images/s, in this process: a child of the A/B helper (``scripts.bench.ab``).

``--folder`` (any source: an image folder, a folder of tars...) converted with ``--encoding
jpeg --resize R`` (and ``--center-crop C``; ``--no-fields``: none of the source's fields) to
``--format`` in a temporary folder (deleted after), by ``convert_folder`` with ``--workers``;
the result line is
``{"rate": images/s, "unit": "images/s"}``.

    .venv/bin/python -m scripts.bench.ab --rev d097a57 convert_rate --folder bench-data/folder
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from convert import ConvertOptions, convert_folder
from scripts.bench.child import emit
from scripts.bench.settings import RESIZE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True, help="ImageNet-layout source")
    parser.add_argument("--format", default="pt")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--resize", type=int, default=RESIZE)
    parser.add_argument("--center-crop", type=int)
    parser.add_argument("--no-fields", action="store_true", help="keep none of the fields")
    args = parser.parse_args()
    options = ConvertOptions(
        format=args.format,
        encoding="jpeg",
        resize=args.resize,
        center_crop=args.center_crop,
        **({"fields": ()} if args.no_fields else {}),
    )
    with tempfile.TemporaryDirectory(prefix="imgpack-convert-rate-") as scratch:
        start = time.perf_counter()
        result = convert_folder(
            args.folder, Path(scratch) / "out", options, workers=args.workers, progress=False
        )
        emit(rate=result.written / (time.perf_counter() - start), unit="images/s")


if __name__ == "__main__":
    main()
