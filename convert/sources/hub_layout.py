"""How the Hugging Face Hub lays out a dataset's Parquet files, so that a conversion takes one
split and never merges them.

The Hub names each file ``SPLIT-NNNNN-of-NNNNN.parquet`` (older uploads add ``-<hash>``),
at the top of the repository or under ``data/``; a dataset with several configs keeps
each in a folder of its own (``CONFIG/SPLIT-NNNNN-of-NNNNN.parquet``, or under
``CONFIG/data/``). :func:`split_files` keeps the files of the split asked for (``--split``),
refusing several splits without one and a folder of configs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

__all__ = ["holds_configs", "split_files", "split_of"]

_SPLIT_FILE = re.compile(r"(?P<split>.+?)-\d{5}-of-\d{5}(?:-[0-9a-f]+)?\.parquet")
_DATA = "data"  # the Hub's folder of data files, inside a repository or a config


def split_of(name: str) -> str | None:
    """The split a file named by the Hub's rule belongs to, or None."""
    match = _SPLIT_FILE.fullmatch(os.path.basename(name))
    return match.group("split") if match else None


def holds_configs(folder: Path) -> bool:
    """True if ``folder`` has a sub-folder of split-named Parquet files (a config); cheap on
    an image folder: its first class folder holding other files answers."""
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        names = os.listdir(sub)
        if any(split_of(n) for n in names) or (
            _DATA in names
            and (sub / _DATA).is_dir()
            and any(map(split_of, os.listdir(sub / _DATA)))
        ):
            return True
        if any((sub / n).is_file() for n in names):
            return False
    return False


def split_files(
    where: str, files: Sequence[str], split: str | None, folder: Path | None
) -> list[str]:
    """The ``files`` of ``split`` (None: all, if they hold one split or none); ``folder`` is
    the local folder listed for them, where configs are looked for. ValueError, one line:
    configs, several splits without ``split``, or no file of ``split``."""
    configs = _configs(files, folder) if folder is not None else []
    if configs:
        raise ValueError(
            f"{where}: a Hugging Face dataset with the configs {', '.join(configs)} (a folder "
            f"each): convert one, e.g. {os.path.join(where, configs[0])}"
        )
    by_split: dict[str, list[str]] = {}
    for f in files:
        by_split.setdefault(split_of(f) or "", []).append(f)
    splits = sorted(s for s in by_split if s)
    if split is None:
        if len(splits) > 1:
            example = "train" if "train" in splits else splits[0]
            raise ValueError(
                f"{where}: holds the splits {', '.join(splits)}: choose one with --split NAME "
                f"(or name its files, e.g. {_split_glob(where, files, example)})"
            )
        return list(files)
    if not split or split not in by_split:
        named = (
            f"splits: {', '.join(splits)}"
            if splits
            else "no file is named SPLIT-NNNNN-of-NNNNN.parquet"
        )
        raise ValueError(f"{where}: no split {split!r} ({named})")
    return by_split[split]


def _split_glob(where: str, files: Sequence[str], split: str) -> str:
    """A pattern naming the files of ``split``, for a message."""
    first = next(f for f in files if split_of(f) == split)
    under = f"{_DATA}/" if os.path.basename(os.path.dirname(first)) == _DATA else ""
    return f"{where.rstrip('/')}/{under}{split}-*.parquet"


def _configs(files: Sequence[str], folder: Path) -> list[str]:
    """The config folders among ``files``' places below ``folder``, sorted."""
    found = set()
    for f in files:
        parts = Path(f).relative_to(folder).parts
        inside = parts[1:-1]
        if len(parts) > 1 and parts[0] != _DATA and inside in ((), (_DATA,)) and split_of(f):
            found.add(parts[0])
    return sorted(found)
