"""Run a script as ``__main__`` and record what still runs in its process at exit.

``python -m tests.at_exit SCRIPT ARGS...`` (under ``torchrun`` too) runs SCRIPT and, as the
interpreter starts to exit (the last ``atexit`` handler, after ``threading`` joined its
threads and ``multiprocessing`` its children, just before finalization), writes to
``$IMGPACK_AT_EXIT/rank-$RANK.json`` the names of the other threads of the process (Python
and native) and the DataLoader (or other) child processes still alive.

Anything running then can be killed by finalization in the middle of its work: a native
thread that asks for the GIL at that point (gloo's, dropping the last gradient all-reduce,
whose thread-local state holds a Python object) exits inside a C++ destructor, and the
process aborts with ``terminate called without an active exception``.
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import runpy
import sys
import threading
from pathlib import Path
from typing import Any


def still_running() -> dict[str, Any]:
    """Threads other than this one (``/proc`` names, Linux) and live child processes."""
    me = threading.get_native_id()
    native = [
        Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        for tid in os.listdir("/proc/self/task")
        if int(tid) != me
    ]
    return {
        "native_threads": sorted(native),
        "python_threads": sorted(
            t.name for t in threading.enumerate() if t is not threading.current_thread()
        ),
        "children": sorted(p.pid for p in multiprocessing.active_children()),
    }


def _record() -> None:
    out = Path(os.environ["IMGPACK_AT_EXIT"]) / f"rank-{os.environ.get('RANK', '0')}.json"
    out.write_text(json.dumps(still_running()))


def main() -> None:
    script, *args = sys.argv[1:]
    atexit.register(_record)  # registered first, so it runs last
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
