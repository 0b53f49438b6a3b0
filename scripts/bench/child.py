"""What a child process of the A/B helper (:mod:`scripts.bench.ab`) prints: its result as one
JSON line, with the checkout its ``readers`` came from, so that the helper can tell that each
side ran its own tree's code. Imports only ``readers``, so that a child measuring its own
memory (:mod:`scripts.bench.memory_probe`) carries nothing else."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import readers

CODE = "code"  # the key of the checkout in a result line


def emit(**values: Any) -> None:
    """Print a child's result line: ``values`` and the checkout its ``readers`` came from."""
    code = Path(readers.__file__).resolve().parents[1]
    print(json.dumps({**values, CODE: str(code)}), flush=True)
