"""The epoch order's Feistel network (:class:`readers.epochs.order.FeistelOrder`) against a
reference written from its docstring, one Python int at a time: with the compiled
``readers/epochs/feistel.c`` and without it (``IMGPACK_KERNEL=0``: the Makefile runs this
file again that way, and under the sanitizers), for widths from 1 to 63 bits; and the
compiled module refusing every bad argument, never crashing or looping."""

from __future__ import annotations

import importlib.util
import random

import numpy as np
import pytest

from readers.compiled import compiled_module, compiled_off
from readers.epochs.order import COMPILED_NETWORK, FeistelOrder

feistel = None
if importlib.util.find_spec("readers.epochs.feistel") is not None:
    from readers.epochs import feistel

needs_module = pytest.mark.skipif(feistel is None, reason="readers.epochs.feistel is not built")
WORD = (1 << 64) - 1


def reference_mix(half: int, key: int, mask: int) -> int:
    z = half ^ key
    z = z * 0x9E3779B97F4A7C15 & WORD
    z ^= z >> 30
    z = z * 0xBF58476D1CE4E5B9 & WORD
    z ^= z >> 27
    z = z * 0x94D049BB133111EB & WORD
    z ^= z >> 31
    return z & mask


def reference_order(n: int, seed: int, epoch: int, position: int) -> int:
    """``f(position)``: six rounds over the halves of ``b`` bits, cycle-walked into [0, n)."""
    bits = max(1, (n - 1).bit_length())
    right = bits - bits // 2
    left_mask, right_mask = (1 << bits // 2) - 1, (1 << right) - 1
    sequence = np.random.SeedSequence([seed, epoch, 0xFE15])
    keys = [int(k) for k in sequence.generate_state(6, np.uint64)]
    x = position
    while True:
        left, low = x >> right, x & right_mask
        for i, key in enumerate(keys):
            if i % 2:
                low ^= reference_mix(left, key, right_mask)
            else:
                left ^= reference_mix(low, key, left_mask)
        x = left << right | low
        if x < n:
            return x


def halves(n: int) -> tuple[int, int, int]:
    """The compiled module's shift, left mask and right mask for ``n`` samples."""
    bits = max(1, (n - 1).bit_length())
    right = bits - bits // 2
    return right, (1 << bits // 2) - 1, (1 << right) - 1


SIZES = [2, 3, 4, 5, 64, 65, 1000, 1 << 20, (1 << 20) + 1, 10**9 + 7, (1 << 40) + 3, 1 << 62]


@pytest.mark.parametrize("n", SIZES)
def test_the_order_is_the_reference_networks(n: int) -> None:
    rng = np.random.default_rng(n % 1000)
    positions = np.unique(np.concatenate([[0, n - 1], rng.integers(0, n, 200)]))
    for seed, epoch in [(0, 0), (7, 3), (2**40 + 1, 12)]:
        got = FeistelOrder(n, seed, epoch).indices(positions)
        assert got.dtype == np.int64
        assert got.tolist() == [reference_order(n, seed, epoch, int(p)) for p in positions]


def test_this_run_takes_the_path_it_says() -> None:
    # the kernel-off rerun checks numpy's path, the plain run the compiled one where built
    taken = compiled_module(COMPILED_NETWORK, "epoch orders use numpy")
    assert (taken is None) == (compiled_off() or feistel is None)


@pytest.mark.parametrize("bad", [[-1], [10], [0, 3, 10**6]])
def test_a_position_outside_the_epoch_is_refused_on_either_path(bad: list[int]) -> None:
    with pytest.raises(IndexError, match=r"outside the epoch's \[0, 10\)"):
        FeistelOrder(10, 1, 0).indices(np.array(bad))


@needs_module
def test_the_module_is_the_reference_at_any_alignment_and_length() -> None:
    n, seed, epoch = 1_000_003, 5, 1
    keys = np.random.SeedSequence([seed, epoch, 0xFE15]).generate_state(6, np.uint64)
    expected = [reference_order(n, seed, epoch, p) for p in range(300)]
    words = np.arange(300, dtype=np.int64).tobytes()
    for offset in range(8):  # positions and keys at every byte offset
        positions = memoryview(bytearray(offset) + words)[offset:]
        key_bytes = memoryview(bytearray(offset) + keys.tobytes())[offset:]
        out = bytearray(len(words))
        feistel.indices(positions, out, key_bytes, n, *halves(n))
        assert np.frombuffer(out, np.int64).tolist() == expected
    empty = np.empty(0, np.int64)
    feistel.indices(empty, empty, keys, n, *halves(n))  # no positions: nothing to do


@needs_module
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n": 0}, "must hold 0 samples"),
        ({"n": 2000}, "must hold 2000 samples"),  # the halves hold 1024
        ({"n": 400}, "at most twice as many"),  # 1024 values for 400 samples
        ({"shift": 0, "right": 0}, "a right half of 1-32 bits"),
        ({"shift": 33, "right": (1 << 33) - 1}, "a right half of 1-32 bits"),
        ({"right": 30}, "a right half of 1-32 bits"),  # not 2**shift - 1
        ({"left": 6}, "a left half no wider"),  # not 2**k - 1
        ({"left": 63}, "a left half no wider"),  # wider than the right half
        ({"positions": [5, 1000]}, r"position 1000 outside \[0, 1000\)"),
        ({"positions": [-1], "out": 1}, r"position -1 outside"),
        ({"out": 3}, "out as long as positions"),
        ({"keys": b"\0" * 7}, "whole 8-byte words"),
    ],
)
def test_the_module_refuses_bad_arguments(change: dict, message: str) -> None:
    args = {"n": 1000, "shift": 5, "left": 31, "right": 31, "positions": [0, 999], "out": 2}
    args |= change
    positions = np.array(args["positions"], np.int64)
    out = np.zeros(args["out"], np.int64)
    keys = change.get("keys", np.ones(6, np.uint64))
    with pytest.raises(ValueError, match=message):
        feistel.indices(positions, out, keys, args["n"], args["shift"], args["left"], args["right"])
    assert not out.any()  # refused before any work


@needs_module
def test_the_module_refuses_wrong_types() -> None:
    positions, keys = np.arange(4, dtype=np.int64), np.ones(6, np.uint64)
    with pytest.raises(TypeError):
        feistel.indices(positions, positions.tobytes(), keys, 4, 1, 1, 1)  # read-only out
    with pytest.raises(TypeError):
        feistel.indices([0, 1], np.zeros(2, np.int64), keys, 4, 1, 1, 1)
    with pytest.raises(TypeError):
        feistel.indices(positions, np.zeros(4, np.int64), keys, 4, 1, 1)
    with pytest.raises(TypeError):
        feistel.indices(positions, np.zeros(4, np.int64), keys, 4.0, 1, 1, 1)


@needs_module
def test_random_arguments_never_crash_or_hang_the_module() -> None:
    # random sizes, halves right or off by a little, positions in range or not, keys of any
    # length: each call returns in-range indices or raises, and the process lives on
    rng = random.Random(30)
    returned = refused = 0
    for _ in range(3000):
        n = rng.choice([1, 2, 3, rng.randint(1, 10**6), rng.randint(1, 1 << 62)])
        shift, left, right = halves(n)
        if rng.random() < 0.3:
            shift, left, right = (v + rng.randint(-1, 1) for v in (shift, left, right))
        positions = np.array(
            [rng.randint(-2, n + 1) if rng.random() < 0.05 else rng.randrange(n) for _ in range(9)],
            np.int64,
        )
        keys = rng.randbytes(8 * rng.randint(0, 9) + (rng.random() < 0.05))
        out = np.full(9, -7, np.int64)
        try:
            feistel.indices(positions, out, keys, n, shift, left, right)
        except (ValueError, OverflowError):
            refused += 1
            continue
        returned += 1
        assert ((out >= 0) & (out < n)).all()
    assert returned > 1000 and refused > 300, (returned, refused)
