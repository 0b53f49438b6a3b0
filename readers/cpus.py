"""How many CPUs this process may use: one function, so the converter's worker count, the
loader's decode threads, the feeding sweep and the measured machine facts agree (taskset and
cgroup affinity count; ``os.cpu_count()`` alone would not see them)."""

from __future__ import annotations

import os

__all__ = ["usable_cpus"]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
