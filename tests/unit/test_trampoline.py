"""kernels/trampoline.py: a range function shared out over Numba's threads runs each of its
blocks with every argument as its own caller passed it, and covers its range once.

Truth: the same range function called in this thread (spread 0) over the same range.
"""

import numba
import numpy as np
import pytest

from nwhisper.kernels import trampoline


@numba.njit(pipeline_class=trampoline.NoAlias)
def _mixed(lo, hi, spread, chunks, out, table, flag, scale, shift, bits, wide, seen):
    """Every kind of argument a body takes: arrays of 1-3 dimensions, read-only and strided,
    a bool, a float32, an int64, float16 bits, a float64; `seen` counts each item's visits."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    for i in range(lo, hi):
        seen[i] += 1
        for j in range(out.shape[1]):
            v = table[i % table.shape[0], j % table.shape[1], 0] * scale + shift
            if flag:
                v = -v
            out[i, j] = v + np.float32(bits[j % bits.shape[0]]) + wide


@pytest.mark.parametrize("lo,hi", [(0, 0), (0, 1), (0, 2), (3, 10), (0, 64)])
@pytest.mark.parametrize("chunks", [1, 2, 5])
def test_a_shared_range_equals_the_serial_call(lo, hi, chunks):
    table = np.random.default_rng(7).standard_normal((3, 5, 2)).astype(np.float32)
    table.setflags(write=False)
    bits = np.arange(0, 40, 3, dtype=np.uint16)[::2]     # strided
    args = (table, True, np.float32(0.5), 3, bits, 1.25)
    want, seen_want = np.zeros((hi, 6), np.float32), np.zeros(hi, np.int64)
    _mixed(lo, hi, 0, 1, want, *args, seen_want)
    got, seen = np.zeros((hi, 6), np.float32), np.zeros(hi, np.int64)
    _mixed(lo, hi, trampoline.spread_address(), chunks, got, *args, seen)
    assert np.array_equal(got, want) and np.array_equal(seen, seen_want)
    assert (seen[lo:] == 1).all() and not seen[:lo].any()
    got[:], seen[:] = 0, 0
    if lo == 0:
        trampoline.share(_mixed, hi, got, *args, seen)          # on Numba's own threads
        assert np.array_equal(got, want) and np.array_equal(seen, seen_want)


def test_a_range_function_must_lead_with_int64_bounds():
    """`shared` types only where lo, hi, spread and chunks are int64 (the entry that runs a
    block rewrites the function's first three arguments as such)."""
    @numba.njit
    def narrow(lo, hi, spread, chunks):
        if spread:
            trampoline.shared(spread, chunks, np.int32(lo), hi)

    with pytest.raises(numba.core.errors.TypingError):
        narrow(0, 4, trampoline.spread_address(), 2)
