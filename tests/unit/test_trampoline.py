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


INLINED = """
import copy, re, sys, types
import numba, numpy as np
from numba.core import inline_closurecall
if sys.argv[1] == "numba's":        # a `copy` of its own: trampoline leaves the inliner alone
    inline_closurecall.copy = types.SimpleNamespace(copy=copy.copy, deepcopy=copy.deepcopy)
from nwhisper.kernels import trampoline

@numba.njit(inline="always")
def body(i, x, out):
    acc = np.float32(0.0)
    for j in range(x.shape[1]):
        if x[i, j] > 0:
            acc += x[i, j] * x[i, j]
        else:
            acc -= x[i, j]
    out[i] = acc

@numba.njit(pipeline_class=trampoline.NoAlias)
def twice(x, out, out2):
    for i in range(x.shape[0]):
        body(i, x, out)
        body(i, x, out2)     # the same body inlined again: its own copy

x = np.random.default_rng(3).standard_normal((5, 37)).astype(np.float32)
out, out2 = np.zeros(5, np.float32), np.zeros(5, np.float32)
twice(x, out, out2)
want = np.where(x > 0, x * x, -x).sum(axis=1)
assert np.allclose(out, want, rtol=1e-5) and np.array_equal(out, out2), (out, out2, want)
shared = type(inline_closurecall.copy).__name__ == "_BlockCopies"
print(shared, re.sub(r"_ZN\\S+", "SYM", twice.inspect_asm(twice.signatures[0])))
"""


def test_the_inliner_copies_a_bodys_blocks_with_one_memo_and_the_same_code():
    """Numba's inliner copied a body's IR a block at a time, the whole scope with each block
    (1.2 s of Silero's 4.5 s compile); trampoline gives the blocks of one inlining one memo. A
    body inlined twice into one function still gets a copy per inlining (both give the body's
    result), and the machine code is the same as with Numba's own copying (Silero's, the
    decoder's and the int8 quantiser's were compared the same way)."""
    import subprocess
    import sys

    import paths

    runs = {}
    for how in ("shared", "numba's"):
        runs[how] = subprocess.run([sys.executable, "-c", INLINED, how], env=paths.env(), check=True,
                                   capture_output=True, text=True, timeout=300).stdout
    assert runs["shared"].startswith("True ") and runs["numba's"].startswith("False ")
    assert runs["shared"][5:] == runs["numba's"][6:]
