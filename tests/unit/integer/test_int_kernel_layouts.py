"""The C kernel's quantized matmul (``fx_integer.int_kernel.qmatmul``) against the numpy
oracle's ``qmatmul``, byte for byte, over every weight layout and code path of int_kernel.c:
codes 0..15 packed two to a byte or int8, scales int32 or int64 (a scale past 2**31), groups
16 (two blocks per vector, an odd last block), 32, 128 and 256, token counts across the 4-row
tile, one to three 16-bit input pieces, inputs at the accumulation bound; and the oracle's own
FixedPointOverflow where it refuses an input."""

from __future__ import annotations

import numpy as np
import pytest

from fx_integer import int_kernel
from fx_integer.artifact import QWeight
from fx_integer.oracle import FixedPointOverflow, qmatmul, qmatrix

if not int_kernel.available():  # pragma: no cover - g++ is a system dependency of the project
    pytest.skip("the integer kernel does not build here (no g++)", allow_module_level=True)

# (group, K, code range, offset, scale bits): the formats' shapes
LAYOUTS = [
    (32, 576, (0, 15), True, 17),      # Q4_1 / Q4_K: nibbles, int32 scales
    (32, 576, (0, 15), True, 33),      # nibbles, int64 scales (past 2**31)
    (32, 576, (-128, 127), False, 16),  # Q8_0: int8 codes
    (32, 320, (-128, 127), True, 29),  # int8 codes, int64 offsets
    (16, 272, (-32, 31), False, 18),   # Q6_K-like: G = 16, 17 blocks (an odd last block)
    (16, 256, (0, 15), True, 18),      # G = 16 nibbles
    (16, 240, (-32, 31), True, 31),    # G = 16, int64 scales, odd block count
    (128, 512, (-8, 7), False, 19),    # G = 128
    (256, 512, (0, 15), True, 20),     # G = 256 nibbles
    (256, 768, (-128, 127), True, 29),  # G = 256 int8, int64 offsets
    (128, 512, (-8, 7), False, 4),     # tiny scales: inputs past 2**32 (three pieces) pass
    (256, 512, (-128, 127), True, 3),
    (16, 272, (-32, 31), True, 3),
]


def _weight(rng: np.random.Generator, g: int, k: int, lo: int, hi: int, offset: bool,
            sbits: int, o: int = 37) -> QWeight:
    codes = rng.integers(lo, hi + 1, size=(o, k), dtype=np.int8)
    nb = k // g
    scale = rng.integers(-(1 << sbits), (1 << sbits) + 1, size=(o, nb), dtype=np.int64)
    scale[0, 0] = (1 << sbits) - 1
    off = (rng.integers(-(1 << (sbits + 3)), 1 << (sbits + 3), size=(o, nb), dtype=np.int64)
           if offset else None)
    if off is not None:
        off[0, 0] = 1 - (1 << (sbits + 3))
    return QWeight(codes, scale, off, g, max(abs(lo), hi), "test")


def _same(w: QWeight, x: np.ndarray, threads: int = 1) -> bool:
    """Both paths agree (bytes, or the oracle's error word for word); True where they answered."""
    try:
        want: np.ndarray | str = qmatmul(x, qmatrix(w), "m")
    except FixedPointOverflow as exc:
        want = str(exc)
    try:
        got: np.ndarray | str = int_kernel.qmatmul(int_kernel.NativeMatrix(w), x, "m",
                                                   threads=threads)
    except FixedPointOverflow as exc:
        got = str(exc)
    if isinstance(want, str):
        assert got == want
        return False
    assert isinstance(got, np.ndarray) and got.tobytes() == want.tobytes()
    return True


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda v: f"G{v[0]}K{v[1]}c{v[2][1]}s{v[4]}")
def test_layouts_identical(layout: tuple[int, int, tuple[int, int], bool, int]) -> None:
    g, k, (lo, hi), offset, sbits = layout
    rng = np.random.default_rng(g * 1000 + k + sbits)
    w = _weight(rng, g, k, lo, hi, offset, sbits)
    nm = int_kernel.NativeMatrix(w)
    assert bool(nm.flags & int_kernel.QF_NIBBLES) == (lo >= 0 and hi <= 15 and k % 32 == 0)
    assert bool(nm.flags & int_kernel.QF_S32) == (sbits + (3 if offset else 0) < 31)
    answered: set[int] = set()
    for xbits in (4, 15, 16, 24, 31, 33, 38):  # one, two and three 16-bit pieces
        for t in (1, 3, 4, 5, 9):
            x = rng.integers(-(1 << xbits), (1 << xbits) + 1, size=(t, k), dtype=np.int64)
            x[0, :3] = [(1 << xbits), -(1 << xbits), 0]
            if _same(w, x, threads=1 + t % 2):
                answered.add(xbits)
    assert {4, 15} <= answered  # one and two pieces inside the proven range
    if sbits <= 4:
        assert {33, 38} <= answered  # three pieces


@pytest.mark.parametrize("layout", [LAYOUTS[0], LAYOUTS[4], LAYOUTS[8]],
                         ids=lambda v: f"G{v[0]}")
def test_inputs_at_the_accumulation_bound(layout: tuple[int, int, tuple[int, int], bool, int]
                                          ) -> None:
    """Inputs scaled to just inside and just past the oracle's accumulation check: the kernel's
    int64 lanes hold sums up to its 2**62 bound (same bytes), then the same error."""
    g, k, (lo, hi), offset, sbits = layout
    rng = np.random.default_rng(7 + g)
    w = _weight(rng, g, k, lo, hi, offset, sbits)
    wq = qmatrix(w).wq
    base = rng.integers(-(1 << 20), (1 << 20) + 1, size=(3, k), dtype=np.int64)

    def bound(x: np.ndarray) -> int:
        a = np.abs(x).reshape(x.shape[0], -1, g).sum(axis=2)
        return int((((a >> 20) + 1) @ wq).max())

    lo_f, hi_f = 1, 1 << 24  # the largest factor whose bound passes, by bisection
    while hi_f - lo_f > 1:
        mid = (lo_f + hi_f) // 2
        if bound(base * mid) <= (1 << 32) and int(np.abs(base * mid).max()) <= (1 << 41):
            lo_f = mid
        else:
            hi_f = mid
    assert _same(w, base * lo_f) or True  # the oracle's piece range may still refuse it
    assert not _same(w, base * hi_f)
    # the largest accepted input of this matrix, as sums go: every code at qmax, inputs alike
    w2 = QWeight(np.full_like(w.codes, hi), w.scale, w.offset, g, w.qmax, "test")
    x = np.full((2, k), 1, dtype=np.int64)
    f = 1
    while bound(x * f * 2) <= (1 << 32) and f < (1 << 40):
        f *= 2
    x = x * f
    x[1] = -x[1]
    assert _same(w2, x)
