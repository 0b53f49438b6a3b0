"""``python -m tests.held_cli SHARDS RELEASE ARGS...``: the ``imgpack`` command, held still
once its journal records SHARDS completed shards, until the file RELEASE exists.

A test that signals or kills a conversion "mid-run" must not race it: 120 small images
convert in well under a second on a quiet machine, so a run could finish between the test
seeing a shard complete and its signal arriving. Held here, the conversion is exactly where
the test wants it. A signal still arrives as in a free run: the hold is an interruptible
sleep in the main thread, where the writer journals each shard.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from convert.cli import main
from convert.journal import Journal

HOLD_LIMIT_S = 120  # a test that never releases fails at its own timeout, not here


def hold_at(shards: int, release: Path) -> None:
    """Make every :class:`Journal` block once it holds ``shards`` entries."""
    append = Journal.append

    def append_then_hold(self: Journal, entry) -> None:
        append(self, entry)
        entries = len(self.path.read_text(encoding="utf-8").splitlines()) - 1
        deadline = time.monotonic() + HOLD_LIMIT_S
        while entries == shards and not release.exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    Journal.append = append_then_hold


if __name__ == "__main__":
    hold_at(int(sys.argv[1]), Path(sys.argv[2]))
    sys.argv = ["imgpack", *sys.argv[3:]]
    sys.exit(main())
