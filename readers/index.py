"""What a map-style dataset takes as an index: one integer, whatever holds it."""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch

__all__ = ["as_index"]


def as_index(index: Any, where: object) -> int:
    """``index`` as an ``int``: an int, a NumPy integer, or a 0-d integer tensor or array
    (what ``Subset`` over a tensor of indices passes); never a bool.

    Raises:
        TypeError: naming ``where`` (the dataset) and what was passed instead.
    """
    dtype = getattr(index, "dtype", None)
    boolean = isinstance(index, bool) or dtype in (torch.bool, np.bool_)
    try:
        if boolean or getattr(index, "ndim", 0) != 0:
            raise TypeError
        return operator.index(index)
    except TypeError:
        kind = type(index).__name__ + (f" of {dtype}" if dtype is not None else "")
        raise TypeError(
            f"{where}: indices must be integers, not {kind} "
            "(for a subset, use torch.utils.data.Subset(ds, indices))"
        ) from None
