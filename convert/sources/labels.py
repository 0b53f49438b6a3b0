"""The labels of a foreign source, as its samples carry them: a class number or a class name
per sample (WebDataset's ``cls`` member, a Parquet label column), turned into imgpack's
class list and labels once every sample is seen."""

from __future__ import annotations

from collections.abc import Sequence

from readers.spec import UNLABELED

__all__ = ["Labels"]


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
        if isinstance(value, str) and value.lstrip("-").isdigit():
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
                classes = [str(n) for n in range(max(given) + 1)]
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
