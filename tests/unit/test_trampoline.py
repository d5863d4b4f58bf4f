"""kernels/trampoline.py: a launch shared out over Numba's threads reaches its range function
with every argument as the function's own call would pass it, and covers [0, count) once.

Truth: the same range function called directly on [0, count) in this thread (Numba's own
calling convention), and the plain index arithmetic of the blocks.
"""

import numba
import numpy as np
import pytest

from nwhisper.kernels import trampoline


@pytest.fixture
def rng():
    return np.random.default_rng(7)


@numba.njit(pipeline_class=trampoline.NoAlias)
def _mixed(lo, hi, out, table, flag, scale, shift, bits, wide, seen):
    """Every kind of argument a body takes: arrays of 1-3 dimensions, read-only and strided,
    a bool, a float32, an int64, float16 bits, a float64; `seen` counts each item's visits."""
    for i in range(lo, hi):
        seen[i] += 1
        for j in range(out.shape[1]):
            v = table[i % table.shape[0], j % table.shape[1], 0] * scale + shift
            if flag:
                v = -v
            out[i, j] = v + np.float32(bits[j % bits.shape[0]]) + wide


@pytest.mark.parametrize("count", [0, 1, 2, 7, 64])
@pytest.mark.parametrize("chunks", [1, 2, 5])
def test_a_shared_launch_equals_the_direct_call(count, chunks, rng):
    table = rng.standard_normal((3, 5, 2)).astype(np.float32)
    table.setflags(write=False)
    bits = np.arange(0, 40, 3, dtype=np.uint16)[::2]     # strided
    args = (table, True, np.float32(0.5), 3, bits, 1.25)
    want, seen_want = np.zeros((count, 6), np.float32), np.zeros(count, np.int64)
    _mixed(0, count, want, *args, seen_want)
    got, seen = np.zeros((count, 6), np.float32), np.zeros(count, np.int64)
    call = (got,) + args + (seen,)
    trampoline.launch(trampoline.spread_address(), trampoline.address(_mixed, call), count, chunks, call)
    assert np.array_equal(got, want) and (seen == 1).all()
    got[:], seen[:] = 0, 0
    trampoline.share(_mixed, count, *call)          # on Numba's own threads
    assert np.array_equal(got, want) and (seen == 1).all()


def test_an_array_compiled_as_any_layout_takes_every_layout(rng):
    """share_as: one compilation of the range function and of its launch for 'A' read-only
    arrays, reached with C-contiguous, strided and writable arrays alike."""
    a = numba.types.Array(numba.types.float32, 2, "A", readonly=True)
    sig = (a, numba.types.Array(numba.types.float32, 2, "A"), numba.types.boolean, numba.types.float32,
           numba.types.int64, numba.types.Array(numba.types.uint16, 1, "A", readonly=True),
           numba.types.float64, numba.types.Array(numba.types.int64, 1, "A"))

    @numba.njit
    def rows(lo, hi, x, out, flag, scale, shift, bits, wide, seen):
        for i in range(lo, hi):
            seen[i] += 1
            for j in range(out.shape[1]):
                out[i, j] = (-x[i, j] if flag else x[i, j]) * scale + shift + bits[0] + wide

    x = rng.standard_normal((9, 8)).astype(np.float32)
    for source, target in ((x, np.zeros((9, 8), np.float32)), (x[:, ::2], np.zeros((9, 16), np.float32)[:, ::4])):
        seen = np.zeros(9, np.int64)
        trampoline.share_as(rows, sig, 9, (source, target, False, np.float32(2), 1, np.array([4], np.uint16), 0.5, seen))
        assert np.array_equal(target, source * np.float32(2) + np.float32(5.5)) and (seen == 1).all()
    assert len(rows.signatures) == 1
