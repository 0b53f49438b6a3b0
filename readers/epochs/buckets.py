"""Aspect-ratio buckets: which bucket each sample goes to, and an epoch made of batches.

:class:`AspectBuckets` is a list of output shapes ``(height, width)``. Each sample goes to
the bucket whose aspect ratio ``width / height`` is nearest its stored one on a log scale,
decided from the stored sizes (``ds.sizes``), no image decoded (:meth:`AspectBuckets.assign`).
The comparison is exact, in integers: with the buckets in ascending aspect, a sample of
aspect ``r`` lies past the boundary between neighbours ``a < b`` when ``r**2 > a * b``
(their geometric mean). **Ties** (``r**2 == a * b``) go to the bucket nearer to square
(smaller ``|log aspect|``), and between a shape and its transpose to the landscape one:
to ``b`` exactly when ``a * b <= 1``. Two buckets of one aspect are refused (which of them
is nearest would be arbitrary).

:class:`BucketPlan` is an epoch of batches, a pure function of the assignment, the batch
size, ``drop_last``, the seed and the epoch: each bucket's samples in a seeded order
without replacement (a :class:`readers.epochs.order.FeistelOrder` per bucket and epoch),
chunked by ``batch_size`` (the bucket's last short batch kept, or dropped with
``drop_last``); the batches laid out bucket after bucket, and their order across buckets a
:class:`FeistelOrder` over the batch count, new each epoch. Each position of an epoch is
one batch, so :mod:`readers.epochs.state` deals batches to ranks and resumes them exactly
as it deals samples; a saved state adds :meth:`BucketPlan.state_dict` (O(buckets)).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from readers.epochs.order import FeistelOrder

__all__ = [
    "AspectBuckets",
    "BucketPlan",
    "bucket_counts",
    "bucket_dtype",
    "group_by_bucket",
    "index_dtype",
]

_SAFE = 1 << 62  # int64 products stay exact below this; past it, Python integers
_CHUNK = 1 << 20  # rows or samples worked on at a time: temporaries stay small at any N


def bucket_dtype(buckets: int) -> type[np.signedinteger]:
    """The smallest signed integer type that holds the index of each of ``buckets``."""
    return next(t for t in (np.int8, np.int16, np.int32) if buckets <= np.iinfo(t).max + 1)


def index_dtype(samples: int) -> type[np.signedinteger]:
    """int32 for indices of fewer than 2**31 samples, else int64: a plan's rows take half
    the memory of int64's below two billion samples."""
    return np.int32 if samples <= np.iinfo(np.int32).max + 1 else np.int64


def bucket_counts(
    bucket_of: np.ndarray, buckets: int, rows: np.ndarray | None = None
) -> np.ndarray:
    """int64 ``[buckets]``: the rows in each bucket (``bucket_of[r]`` row ``r``'s; every
    row of it, or ``rows``), counted a chunk at a time (``np.bincount`` of the whole would
    widen it to int64 at once)."""
    counts = np.zeros(buckets, np.int64)
    total = len(bucket_of) if rows is None else len(rows)
    for lo in range(0, total, _CHUNK):
        chunk = bucket_of[lo : lo + _CHUNK] if rows is None else bucket_of[rows[lo : lo + _CHUNK]]
        counts += np.bincount(chunk, minlength=buckets)
    return counts


def group_by_bucket(rows: np.ndarray, bucket_of: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``rows`` grouped bucket after bucket (``bucket_of[r]`` row ``r``'s, ``counts`` per
    bucket as :func:`bucket_counts` gives them), in their given order within a bucket: what a
    stable argsort by bucket gives, a chunk at a time, so that the only array as long as
    ``rows`` made is the result (a global argsort's int64 order and its sort's scratch took
    four times as much)."""
    out = np.empty_like(rows)
    cursor = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for lo in range(0, len(rows), _CHUNK):
        chunk = rows[lo : lo + _CHUNK]
        bucket = bucket_of[chunk]
        grouped = chunk[np.argsort(bucket, kind="stable")]
        taken = 0
        for k, n in enumerate(np.bincount(bucket, minlength=len(counts)).tolist()):
            out[cursor[k] : cursor[k] + n] = grouped[taken : taken + n]
            cursor[k] += n
            taken += n
    return out


def _shapes(sizes: Sequence[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    try:
        shapes = tuple((int(h), int(w)) for h, w in sizes)
    except (TypeError, ValueError):
        raise ValueError(f"bucket sizes: (height, width) pairs, not {sizes!r}") from None
    bad = [
        s for s, given in zip(shapes, sizes, strict=True) if min(s) < 1 or list(s) != list(given)
    ]
    if not shapes or bad:
        raise ValueError(
            f"bucket sizes: positive integer (height, width) pairs, not {bad or sizes}"
        )
    return shapes


@dataclass(frozen=True, init=False)
class AspectBuckets:
    """Output shapes ``(height, width)``, one per bucket; each batch holds one bucket's
    samples, resized to cover its shape (aspect kept) and cropped to it in the decode:
    centred, or at a seeded random offset with ``jitter``; ``flip`` mirrors at random.

    Args:
        sizes: the buckets' ``(height, width)``; no two of one aspect ratio.
        jitter: crop at a random offset (a pure function of seed, epoch, sample index)
            instead of the centre.
        flip: a horizontal flip with probability 1/2, drawn the same way.
    """

    sizes: tuple[tuple[int, int], ...]
    jitter: bool
    flip: bool

    def __init__(
        self, sizes: Sequence[Sequence[int]], jitter: bool = False, flip: bool = False
    ) -> None:
        shapes = _shapes(sizes)
        aspects = [w / h for h, w in shapes]
        for i, (h, w) in enumerate(shapes):
            same = [shapes[j] for j in range(i) if shapes[j][1] * h == w * shapes[j][0]]
            if same:
                raise ValueError(
                    f"buckets {same[0]} and {(h, w)} have one aspect ratio "
                    f"({aspects[i]:.4g}): keep one of them"
                )
        object.__setattr__(self, "sizes", shapes)
        object.__setattr__(self, "jitter", bool(jitter))
        object.__setattr__(self, "flip", bool(flip))

    @classmethod
    def around(
        cls,
        area: int = 512 * 512,
        step: int = 64,
        max_ratio: float = 2.0,
        jitter: bool = False,
        flip: bool = False,
    ) -> AspectBuckets:
        """The usual grid (kohya-ss/sd-scripts' ``make_bucket_resolutions``): for each side
        ``s`` a multiple of ``step``, the other side the largest multiple of ``step`` with
        ``s * other <= area``, both ways round, kept when the aspect is within
        ``1 / max_ratio .. max_ratio``; of shapes of one aspect the largest; ascending aspect."""
        if area < step * step or step < 1 or max_ratio < 1:
            raise ValueError(
                f"around(area={area}, step={step}, max_ratio={max_ratio}): need step >= 1, "
                "area >= step**2, max_ratio >= 1"
            )
        best: dict[tuple[int, int], tuple[int, int]] = {}
        for side in range(step, area // step + 1, step):
            other = area // side // step * step
            if other < step or max(side, other) > max_ratio * min(side, other):
                continue
            for h, w in ((side, other), (other, side)):
                g = np.gcd(h, w)
                key = (h // g, w // g)
                if key not in best or h * w > best[key][0] * best[key][1]:
                    best[key] = (h, w)
        shapes = sorted(best.values(), key=lambda s: s[1] / s[0])
        return cls(shapes, jitter, flip)

    @cached_property
    def _ascending(self) -> np.ndarray:
        """Bucket indices by ascending aspect ``width / height``."""
        return np.argsort([w / h for h, w in self.sizes], kind="stable")

    def assign(self, sizes: np.ndarray) -> np.ndarray:
        """``[n]``: the bucket (an index of :attr:`sizes`) of each stored ``(height, width)``
        in ``sizes`` (``[n, 2]``), by the rule in the module docstring; in the smallest
        integer type that holds a bucket's index (:func:`bucket_dtype`), computed a chunk
        of rows at a time, so that a billion samples' assignment takes a byte each."""
        sizes = np.asarray(sizes).reshape(-1, 2)
        out = np.empty(len(sizes), bucket_dtype(len(self.sizes)))
        for lo in range(0, len(sizes), _CHUNK):
            out[lo : lo + _CHUNK] = self._assign(sizes[lo : lo + _CHUNK])
        return out

    def _assign(self, sizes: np.ndarray) -> np.ndarray:
        sizes = np.asarray(sizes, dtype=np.int64)
        h, w = sizes[:, 0], sizes[:, 1]
        if len(h) and min(h.min(), w.min()) < 1:
            raise ValueError("bucket assignment: a stored size below 1 pixel")
        order = self._ascending
        shapes = np.asarray(self.sizes, dtype=np.int64)[order]
        largest = int(max(h.max(initial=1), w.max(initial=1)))
        biggest = int(shapes.max())
        exact_int64 = largest * largest * biggest * biggest < _SAFE
        hh, ww = (h * h, w * w) if exact_int64 else (h.astype(object) ** 2, w.astype(object) ** 2)
        rank = np.zeros(len(h), dtype=np.int64)
        for (ha, wa), (hb, wb) in zip(shapes[:-1].tolist(), shapes[1:].tolist(), strict=True):
            # r = w/h past the geometric mean of a = wa/ha and b = wb/hb: w² ha hb vs h² wa wb
            left, right = ww * (ha * hb), hh * (wa * wb)
            past = left > right
            if wa * wb <= ha * hb:  # a * b <= 1: a tie goes to b (nearer square, or landscape)
                past |= left == right
            rank += past.astype(np.int64)
        return order[rank]

    def __repr__(self) -> str:
        return f"AspectBuckets(sizes={list(self.sizes)}, jitter={self.jitter}, flip={self.flip})"


def assignment_digest(assignment: np.ndarray) -> str:
    """A short fingerprint of every sample's bucket, in index order."""
    return hashlib.sha1(np.ascontiguousarray(assignment, "<i8").tobytes()).hexdigest()[:16]


@dataclass(frozen=True)
class BucketPlan:
    """An epoch of batches over samples assigned to buckets (see the module docstring).

    ``assignment[i]`` is sample ``i``'s bucket (of ``len(buckets.sizes)``); the samples are
    those the epoch reads (a subset's positions when over one, ``subset`` its
    :func:`readers.epochs.state.subset_digest`). Batch ``g`` of the layout
    is batch ``g - first[k]`` of bucket ``k``; position ``p`` of epoch ``e`` reads batch
    :meth:`batch_at`."""

    buckets: AspectBuckets
    assignment: np.ndarray
    batch_size: int
    drop_last: bool
    seed: int
    shuffle: bool = True
    subset: str | None = None  # the subset_digest of the samples read, None for all

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size}: at least 1")

    @cached_property
    def members(self) -> tuple[np.ndarray, ...]:
        """Each bucket's samples, ascending (:func:`index_dtype`)."""
        rows = np.arange(len(self.assignment), dtype=index_dtype(len(self.assignment)))
        grouped = group_by_bucket(rows, self.assignment, self.counts)
        return tuple(np.split(grouped, np.cumsum(self.counts)[:-1]))

    @cached_property
    def counts(self) -> np.ndarray:
        """Samples in each bucket."""
        return bucket_counts(self.assignment, len(self.buckets.sizes))

    @cached_property
    def batch_counts(self) -> np.ndarray:
        """Batches each bucket gives an epoch."""
        b = self.batch_size
        return self.counts // b if self.drop_last else -(-self.counts // b)

    @cached_property
    def first(self) -> np.ndarray:
        """The layout's first batch of each bucket, and the total at the end."""
        return np.concatenate([[0], np.cumsum(self.batch_counts)])

    @property
    def num_batches(self) -> int:
        return int(self.first[-1])

    @cached_property
    def digest(self) -> str:
        return assignment_digest(self.assignment)

    def _seeds(self, salt: int) -> int:
        return int(np.random.SeedSequence([self.seed, salt]).generate_state(1, np.uint64)[0])

    def batch_order(self, epoch: int) -> FeistelOrder | None:
        """Position -> layout batch for ``epoch`` (None: the layout's order)."""
        if not self.shuffle:
            return None
        return FeistelOrder(self.num_batches, self._seeds(0xBA7C), epoch)

    def batch_at(self, epoch: int, batch: int) -> tuple[int, np.ndarray]:
        """Layout batch ``batch`` of epoch ``epoch``: its bucket and its samples (int64)."""
        k = int(np.searchsorted(self.first, batch, side="right")) - 1
        if not 0 <= batch < self.num_batches:
            raise IndexError(f"batch {batch} outside the epoch's {self.num_batches}")
        n = int(self.counts[k])
        lo = (batch - int(self.first[k])) * self.batch_size
        slots = np.arange(lo, min(lo + self.batch_size, n), dtype=np.int64)
        if self.shuffle:
            slots = FeistelOrder(n, self._seeds(0xB0C4 + k), epoch).indices(slots)
        return k, self.members[k][slots].astype(np.int64)

    def state_dict(self) -> dict[str, Any]:
        """What a saved state must match: the buckets' sizes, the batching and the
        assignment (``jitter`` and ``flip`` change crops only, and may change on resume)."""
        return {
            "sizes": [list(s) for s in self.buckets.sizes],
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "samples": len(self.assignment),
            "assignment": self.digest,
            "subset": self.subset,
        }

    def check(self, state: Any) -> None:
        """Refuse ``state`` (a saved :meth:`state_dict`) unless it matches this plan.

        Raises:
            ValueError: naming what differs.
        """
        if not isinstance(state, dict):
            raise ValueError("loader state records no buckets: it is not a bucketed loader's")
        mine = self.state_dict()
        for key, value in mine.items():
            if state.get(key) != value:
                raise ValueError(
                    f"loader state is for buckets with {key}={state.get(key)!r}, this loader "
                    f"has {key}={value!r}"
                )
