"""Position ranges: the arithmetic the epoch plan (:mod:`readers.epochs.state`) is written in.

A list of ``[start, stop)`` ranges names positions of an epoch's order, in order; these
functions cut, subtract and enumerate them without touching the data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["Ranges", "merge_adjacent", "positions", "subtract", "take", "total", "wrapped"]

Ranges = tuple[tuple[int, int], ...]


def total(ranges: Sequence[tuple[int, int]]) -> int:
    """How many positions ``ranges`` hold."""
    return sum(stop - start for start, stop in ranges)


def take(ranges: Sequence[tuple[int, int]], start: int, count: int) -> Ranges:
    """Positions ``[start, start + count)`` of the concatenated ``ranges``, as ranges."""
    out: list[tuple[int, int]] = []
    skip, left = start, count
    for lo, hi in ranges:
        if left <= 0:
            break
        if skip >= hi - lo:
            skip -= hi - lo
            continue
        n = min(hi - lo - skip, left)
        out.append((lo + skip, lo + skip + n))
        skip, left = 0, left - n
    if left > 0:
        raise ValueError(f"{count} positions from {start} run past the {total(ranges)} there are")
    return merge_adjacent(out)


def wrapped(ranges: Sequence[tuple[int, int]], num_samples: int) -> Ranges:
    """``ranges`` with padding positions (``>= num_samples``) mapped back into the epoch:
    position ``p`` reads what position ``p % num_samples`` reads."""
    out = []
    for lo, hi in ranges:
        while lo < hi:
            base = lo - lo % num_samples
            stop = min(hi, base + num_samples)
            out.append((lo - base, stop - base))
            lo = stop
    return tuple(out)


def subtract(ranges: Sequence[tuple[int, int]], minus: Sequence[tuple[int, int]]) -> Ranges:
    """``ranges`` without any position in ``minus``, keeping the order of ``ranges``."""
    cuts = sorted(minus)
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        pieces = [(lo, hi)]
        for c_lo, c_hi in cuts:
            if c_hi <= lo or c_lo >= hi:
                continue
            pieces = [
                part
                for p_lo, p_hi in pieces
                for part in ((p_lo, min(p_hi, c_lo)), (max(p_lo, c_hi), p_hi))
                if part[0] < part[1]
            ]
        out.extend(pieces)
    return merge_adjacent(out)


def positions(ranges: Sequence[tuple[int, int]]) -> np.ndarray:
    """Every position of ``ranges``, in order, as an int64 array."""
    if not ranges:
        return np.empty(0, np.int64)
    return np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in ranges])


def merge_adjacent(ranges: list[tuple[int, int]]) -> Ranges:
    """``ranges`` with each range that starts where the one before stops joined to it."""
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)
