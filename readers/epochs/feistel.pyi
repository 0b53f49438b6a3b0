"""The compiled Feistel network (``readers/epochs/feistel.c``; see :mod:`readers.epochs.order`)."""

from typing_extensions import Buffer

def indices(
    positions: Buffer,
    out: Buffer,
    keys: Buffer,
    num_samples: int,
    shift: int,
    left_mask: int,
    right_mask: int,
    /,
) -> None:
    """``out[k]`` = the network's ``f(positions[k])``, cycle-walked into ``[0, num_samples)``:
    int64 buffers of one length, ``keys`` uint64 (one a round), the GIL released. A
    position outside ``[0, num_samples)`` or halves that do not hold it: ``ValueError``."""
