"""imgpack's converter: image folders to ``pt``/``hdf5``/``lmdb``/``wds`` datasets."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time each name is imported on first use
    from convert.job import BadInputError
    from convert.options import ConvertOptions, ConvertResult
    from convert.pipeline import convert_folder

# Imported lazily, like readers' names, so that `imgpack --help` (whose package this is)
# starts without torch; tests/test_cli_startup.py checks this table against the block above.
_EXPORTS = {
    "BadInputError": "convert.job",
    "ConvertOptions": "convert.options",
    "ConvertResult": "convert.options",
    "convert_folder": "convert.pipeline",
}

__all__ = ["BadInputError", "ConvertOptions", "ConvertResult", "convert_folder"]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
