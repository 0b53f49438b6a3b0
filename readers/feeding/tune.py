"""Which DataLoader settings keep the GPU busy, measured on the user's own data.

:func:`tune_loader` sweeps ``num_workers`` (0 up to 2x the usable CPUs), in-process
``decode_threads``, ``prefetch_factor`` (1, 2, 4) and, with CUDA, ``pin_memory``, through
:func:`readers.make_loader` (with the ``crop=`` training will use), cheapest setting first.
For each it measures samples/s, the time to the first batch (what
``persistent_workers=False`` pays every epoch) and, given the model's compute time per
batch (``step_ms``), the mean time the training loop waits for each batch while a step
runs after it. The verdict is that measured wait, not the rate: without workers loading
does not overlap compute, so a loader 3.8x as fast as the model still leaves it waiting a
quarter of every step. A setting keeps up when the wait is at most
:data:`readers.feeding.wait.WAIT_SHARE` (5 %) of the step (:func:`readers.feeding.wait.keeps_up`,
the stall meter's rule too); the sweep stops at the cheapest that does.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch

from readers.batch import collate_any
from readers.cpus import usable_cpus
from readers.dataset import ImageDataset
from readers.epochs.loader import make_loader
from readers.feeding.wait import WAIT_SHARE, keeps_up
from readers.images.crop import Crop
from readers.manifest import load_manifest

__all__ = [
    "Setting",
    "Trial",
    "candidate_settings",
    "loader_rate",
    "measure",
    "recommend",
    "sweep",
    "tune_loader",
]

SAME = 0.05  # rates within this fraction count as equal (prefer the cheaper setting)


@dataclass(frozen=True)
class Setting:
    """One DataLoader configuration, as ``make_loader`` keyword arguments."""

    num_workers: int
    decode_threads: int
    prefetch_factor: int | None
    pin_memory: bool

    @property
    def cost(self) -> int:
        """Processes and threads it keeps busy: what the cheapest setting minimises."""
        return self.num_workers + 1 if self.num_workers else self.decode_threads

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_workers": self.num_workers}
        if self.num_workers:
            out.update(prefetch_factor=self.prefetch_factor, persistent_workers=True)
        else:
            out["decode_threads"] = self.decode_threads
        if self.pin_memory:
            out["pin_memory"] = True
        return out

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.kwargs().items())


@dataclass
class Trial:
    """What one setting measured."""

    setting: Setting
    samples_per_s: float
    first_batch_ms: float
    wait_ms: float | None = None  # mean per batch, with step_ms of compute after each
    ratio: float | None = None  # loader batches/s (no compute) over compute batches/s

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "setting": self.setting.kwargs()}


def candidate_settings(cpus: int | None = None, cuda: bool | None = None) -> list[Setting]:
    """Every setting the sweep tries, cheapest first (then fewer prefetched batches)."""
    cpus = cpus or usable_cpus()
    cuda = torch.cuda.is_available() if cuda is None else cuda
    settings = [Setting(0, t, None, pin) for t in range(1, cpus + 1) for pin in (False, cuda)]
    settings += [
        Setting(w, 1, p, pin)
        for w in range(1, 2 * cpus + 1)
        for p in (1, 2, 4)
        for pin in (False, cuda)
    ]
    unique = list(dict.fromkeys(settings))
    return sorted(unique, key=lambda s: (s.cost, s.num_workers, s.prefetch_factor or 0))


def _batches(loader: Any) -> Iterator[Any]:
    """Batches forever, epoch after epoch (a sample-sized dataset is a few batches)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the dataset gives no batch: is batch_size larger than it?")


def _timed(batches: Iterator[Any], seconds: float, step_s: float) -> tuple[int, float, float]:
    """Samples, elapsed seconds and mean seconds waited per batch over at least ``seconds``
    and 5 batches, sleeping ``step_s`` after each (the model's compute, GIL released).

    One batch and step go untimed first: every worker has started, and the queue a run
    before emptied has refilled as it does between training steps (timed, its first wait
    was a whole batch's load, a fifth of the mean over 5 batches)."""
    next(batches)
    time.sleep(step_s)
    samples, waited, count = 0, 0.0, 0
    start = time.perf_counter()
    while count < 5 or time.perf_counter() - start < seconds:
        asked = time.perf_counter()
        _images, labels, *_fields = next(batches)
        waited += time.perf_counter() - asked
        samples, count = samples + len(labels), count + 1
        if step_s:
            time.sleep(step_s)
    return samples, time.perf_counter() - start, waited / count


def loader_rate(loader: Any, seconds: float = 0.5) -> tuple[float, float, Iterator[Any]]:
    """Samples/s of ``loader`` once running, the ms to its first batch, and its batches
    (to go on timing)."""
    start = time.perf_counter()
    batches = _batches(loader)
    next(batches)
    first_ms = 1000 * (time.perf_counter() - start)
    samples, elapsed, _ = _timed(batches, seconds, 0.0)
    return samples / elapsed, first_ms, batches


def measure(
    source: str | os.PathLike[str] | ImageDataset,
    setting: Setting,
    batch_size: int,
    step_ms: float | None = None,
    seconds: float = 0.5,
    transform: Any = None,
    crop: Crop | None = None,
) -> Trial:
    """Samples/s, time to the first batch and (with ``step_ms``) the mean wait per batch."""
    with warnings.catch_warnings():  # more workers than CPUs is what is being measured
        warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
        loader = make_loader(
            source,
            batch_size,
            seed=0,
            distributed=False,
            collate_fn=collate_any,
            transform=transform,
            crop=crop,
            **setting.kwargs(),
        )
        rate, first_ms, batches = loader_rate(loader, seconds)
        trial = Trial(setting, rate, first_ms)
        if step_ms:
            _, _, wait_s = _timed(batches, seconds, step_ms / 1000)
            trial.wait_ms = 1000 * wait_s
            trial.ratio = (trial.samples_per_s / batch_size) / (1000 / step_ms)
    return trial


def warm_page_cache(source: str | os.PathLike[str] | ImageDataset) -> bool:
    """Read the dataset's files once when they fit in half the available memory, so that
    the first setting measured does not pay for the disk and the later ones not; False
    when they do not fit (then every setting reads from the disk, as training will)."""
    manifest = source.manifest if isinstance(source, ImageDataset) else load_manifest(source)
    paths = [manifest.shard_path(i) for i in range(len(manifest.shards))]
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if sum(p.stat().st_size for p in paths) > available // 2:
        return False
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass
    return True


def sweep(
    source: str | os.PathLike[str] | ImageDataset,
    batch_size: int = 64,
    step_ms: float | None = None,
    seconds: float = 0.5,
    settings: list[Setting] | None = None,
    report: Callable[[Trial], None] | None = None,
    transform: Any = None,
    crop: Crop | None = None,
) -> list[Trial]:
    """Measure ``settings`` (default: :func:`candidate_settings`) in order, page cache
    warmed first; with ``step_ms``, stop at the first that keeps up
    (:func:`readers.feeding.wait.keeps_up`)."""
    warm_page_cache(source)
    trials = []
    for setting in settings or candidate_settings():
        trials.append(measure(source, setting, batch_size, step_ms, seconds, transform, crop))
        if report is not None:
            report(trials[-1])
        if step_ms and keeps_up(trials[-1].wait_ms, step_ms):
            break
    return trials


def recommend(trials: list[Trial], step_ms: float | None = None) -> Trial:
    """With ``step_ms``: the first (cheapest) trial that keeps up
    (:func:`readers.feeding.wait.keeps_up`), else the cheapest whose wait is within
    ``WAIT_SHARE`` of a step of the least wait. Without: the cheapest whose rate is within
    ``SAME`` of the fastest."""
    waited = [(t.wait_ms, t) for t in trials if t.wait_ms is not None]
    if step_ms and waited:
        enough = [t for wait, t in waited if keeps_up(wait, step_ms)]
        if enough:
            return enough[0]
        least = min(wait for wait, _ in waited)
        return next(t for wait, t in waited if wait <= least + WAIT_SHARE * step_ms)
    fastest = max(t.samples_per_s for t in trials)
    return next(t for t in trials if t.samples_per_s >= (1 - SAME) * fastest)


def tune_loader(
    dataset_or_path: str | os.PathLike[str] | ImageDataset,
    batch_size: int = 64,
    step_ms: float | None = None,
    seconds: float = 0.5,
    transform: Any = None,
    crop: Crop | None = None,
) -> dict[str, Any]:
    """The recommended ``make_loader`` keyword arguments for this data on this machine
    (``transform``/``crop``: those training will use, e.g. a crop that makes batches
    stack)."""
    trials = sweep(dataset_or_path, batch_size, step_ms, seconds, transform=transform, crop=crop)
    return recommend(trials, step_ms).setting.kwargs()
