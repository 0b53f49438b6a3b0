"""The labels of a foreign source, as its samples carry them: a class number or a class name
per sample (WebDataset's ``cls`` member or a value inside its ``json`` member, a Parquet
label column), turned into imgpack's class list and labels once every sample is seen.

A label that is an integer (``3``, the text ``"3"``) is that class number: the stored label
is the integer itself and the class names are ``"0"`` .. ``"K-1"`` in numeric order unless
``--classes FILE`` names them. Any other text is a class name, sorted as folders are.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from readers.spec import UNLABELED

__all__ = ["LabelField", "Labels"]

_CLASS_NUMBER = re.compile(r"-?[0-9]+")


class Labels:
    """Collects each sample's raw label (``add``), then numbers them (``resolve``): by the
    class list given (numbers index it, names are looked up), else numbers stand for
    themselves (classes ``"0"``, ``"1"``...) and names are sorted, as folders are."""

    def __init__(self, where: str, key: str, classes: Sequence[str] | None) -> None:
        self.where, self.key = where, key
        self.classes = list(classes) if classes is not None else None
        self._paths: list[str] = []
        self._values: list[int | str | None] = []

    def add(self, path: str, value: bytes | int | str | None) -> None:
        """Record one sample's label (None, or a negative number: it has none)."""
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8").strip()
            except UnicodeDecodeError:
                raise ValueError(
                    f"{self.where}: {path}: its {self.key} is not UTF-8 text"
                ) from None
        if isinstance(value, str) and _CLASS_NUMBER.fullmatch(value):
            value = int(value)
        if isinstance(value, int) and value < 0:
            value = None  # the Hub's -1 for a sample without a label (a test split)
        self._paths.append(path)
        self._values.append(value)

    def resolve(self) -> tuple[list[str], list[int | None], list[dict[str, str]]]:
        """The class list, each sample's label (None: left out, without one while others
        have one) and the problems listing those left out."""
        given = [v for v in self._values if v is not None]
        if not given:
            return list(self.classes or []), [UNLABELED] * len(self._values), []
        if {type(v) for v in given} == {int, str}:
            raise ValueError(
                f"{self.where}: the {self.key} labels mix class numbers and class names"
            )
        classes = self.classes
        if classes is None:
            if isinstance(given[0], int):
                classes = [str(n) for n in range(max(given) + 1)]  # type: ignore[type-var]
            else:
                classes = sorted(set(given))  # type: ignore[arg-type]
        index = {name: i for i, name in enumerate(classes)}
        labels: list[int | None] = []
        problems = []
        for path, value in zip(self._paths, self._values, strict=True):
            if value is None:
                labels.append(None)
                problems.append({"path": path, "error": f"{path}: no {self.key} label: left out"})
            elif isinstance(value, int):
                if not 0 <= value < len(classes):
                    raise ValueError(
                        f"{self.where}: {path}: label {value} is not one of the "
                        f"{len(classes)} classes (0-{len(classes) - 1}): give --classes FILE"
                    )
                labels.append(value)
            elif value in index:
                labels.append(index[value])
            else:
                raise ValueError(f"{self.where}: {path}: class {value!r} is not in the class list")
        return classes, labels, problems


@dataclass(frozen=True)
class LabelField:
    """Where a WebDataset sample keeps its label, as ``--label-key`` names it: a member's
    extension (``cls``, ``txt``: its text is a class number or name), or a value inside a
    JSON member (``json.label``: the ``label`` key of the ``json`` member; nested keys and
    list positions by more dots, ``json.annotation.class_id``)."""

    member: str  # the extension of the member holding the label, lower case
    keys: tuple[str, ...] = ()  # the path inside a JSON member; () for its whole value
    is_json: bool = False

    @classmethod
    def parse(cls, label_key: str) -> LabelField:
        """The field ``label_key`` names: the dotted parts up to one named ``json`` are the
        member's extension, the rest the keys inside it."""
        parts = label_key.split(".")
        for i, part in enumerate(parts):
            if part.lower() == "json":
                return cls(".".join(parts[: i + 1]).lower(), tuple(parts[i + 1 :]), True)
        return cls(label_key.lower())

    def __str__(self) -> str:
        return ".".join((self.member, *self.keys))

    def value(self, raw: bytes | None, sample: str) -> bytes | int | str | None:
        """The label in ``raw``, the member's bytes (None: the sample has no such member):
        the text of a plain member, a JSON member's number or string (None: the key is not
        there, or null). ValueError naming ``sample`` for a JSON value that is no label."""
        if raw is None or not self.is_json:
            return raw
        try:
            value: Any = json.loads(raw)
        except ValueError as e:  # UnicodeDecodeError is one too
            raise ValueError(f"{sample}: its {self.member} member is not JSON ({e})") from None
        for key in self.keys:
            if isinstance(value, dict):
                value = value.get(key)
            elif isinstance(value, list) and key.isdecimal() and int(key) < len(value):
                value = value[int(key)]
            else:
                return None
        if value is None or (isinstance(value, (int, str)) and not isinstance(value, bool)):
            return value
        raise ValueError(f"{sample}: {self} is {_json_kind(value)}: {_hint(self, value)}")


def _json_kind(value: object) -> str:
    if isinstance(value, dict):
        return f"a JSON object (keys: {', '.join(list(value)[:5])})"
    if isinstance(value, list):
        return f"a list of {len(value)} values"
    return f"{json.dumps(value)}, not a class number or name"


def _hint(field: LabelField, value: object) -> str:
    """What to give instead of ``field`` for a JSON ``value`` that is not one label."""
    if isinstance(value, dict):
        key = next(iter(value), "KEY")
        return f"name the key holding the label, e.g. --label-key {field}.{key}"
    if isinstance(value, list):
        return "one label per sample is converted; --label-key names a single-label key"
    return "labels are integers or class names"
