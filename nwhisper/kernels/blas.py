"""The CPU's float32 products on NumPy's own OpenBLAS, run by Numba's threads: one thread pool.

A CPU backend has two kinds of parallel work: its kernels, Numba parallel loops on an OpenMP
pool, and its float32 GEMMs (the encoder's, a window's cross K/V), which NumPy would run on
OpenBLAS's own pool. Two pools on few cores fight: a pool whose workers spin after a job takes a
core from the other's next job (OpenBLAS's sgemm at half its speed right after a spinning Numba
launch), and a pool whose workers sleep instead costs a wake-up for every parallel launch —
more than a decoder step's small products take.

So here the GEMMs run in Numba's pool too: OpenBLAS is told to use one thread, and a parallel
loop gives each Numba thread a block of the output's columns, which it computes by calling
OpenBLAS's `cblas_sgemm` on its block (as fast as OpenBLAS's own threads). Numba's workers may then spin between launches (libgomp's default), and a
decoder step's launches can all run on both cores.

The BLAS is NumPy's: the `scipy-openblas` library inside NumPy's wheel, found next to NumPy and
called through a symbol registered with LLVM (so the compiled loops cache like any other: the
address is looked up in each process, not baked into the code). Where NumPy has another BLAS
(Accelerate, MKL from conda) `available()` is False and gemm calls NumPy's matmul instead, with
Numba's workers asleep between launches as before.
"""

import ctypes
import functools
import glob
import os

import llvmlite.binding as llvm
import numpy as np
from numba import config, njit, types

from nwhisper.kernels import trampoline

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_SYMBOL = "nwhisper_cblas_sgemm"


@functools.cache
def _openblas():
    """(cblas_sgemm, set_num_threads, get_num_threads, integer type) of NumPy's bundled
    OpenBLAS, or None."""
    libs = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libs, "libscipy_openblas*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        # scipy-openblas64 (ILP64, NumPy >= 2's wheels) suffixes its symbols with 64_
        for suffix, int_type in (("64_", ctypes.c_int64), ("", ctypes.c_int32)):
            sgemm = getattr(lib, f"scipy_cblas_sgemm{suffix}", None)
            set_threads = getattr(lib, f"scipy_openblas_set_num_threads{suffix}", None)
            get_threads = getattr(lib, f"scipy_openblas_get_num_threads{suffix}", None)
            if None not in (sgemm, set_threads, get_threads):
                set_threads.argtypes = [ctypes.c_int]
                return sgemm, set_threads, get_threads, int_type
    return None


@functools.cache
def register_symbol():
    """Whether NumPy's OpenBLAS was found (ILP64, as the loops below are compiled for) and its
    cblas_sgemm registered with LLVM as _SYMBOL: what loading or compiling them needs (the
    kernel cache's helper calls this alone)."""
    found = _openblas()
    if found is None or found[3] is not ctypes.c_int64:
        return False
    llvm.add_symbol(_SYMBOL, ctypes.cast(found[0], ctypes.c_void_p).value)
    return True


@functools.cache
def available():
    """Whether the GEMMs run here: NumPy's OpenBLAS was found, registered with LLVM and set to
    one thread (once per process; NumPy's own products then run on one thread too)."""
    if os.environ.get("NWHISPER_NUMPY_BLAS") == "1":   # tests: the backend's NumPy path
        return False
    if not register_symbol():
        return False
    _openblas()[1](1)       # set_num_threads
    return True


@functools.cache
def _compiled():
    """_blocks, compiled (or loaded from the cache) on the first product that needs it: a
    transcription whose products all run on other GEMMs (gemm_f32, gemm_int8) never pays for it.

    One compilation, for arrays of any layout ('A'): typed by each call instead, every layout
    of a, b and c (C-contiguous, or column views) was a compilation of its own -- 18 on a first
    transcription, ~1.5 s each. What is only read is typed read-only, which writable arrays
    convert to (a memory-mapped checkpoint's weights and biases are read-only)."""
    _blocks.compile((_i64,) * 4 + _ARGS)
    _blocks.disable_compile()
    return _blocks


_i32, _i64, _f32, _ptr = types.int32, types.int64, types.float32, types.voidptr
_RO1, _RO2 = (types.Array(_f32, n, "A", readonly=True) for n in (1, 2))
# _blocks' arguments after (lo, hi, spread, chunks): parts, a, b, c, trans_b, alpha, beta, bias
_ARGS = (_i64, _RO2, _RO2, types.Array(_f32, 2, "A"), types.boolean, _f32, _f32, _RO1)
# cblas_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
_sgemm = types.ExternalFunction(_SYMBOL, types.void(
    _i32, _i32, _i32, _i64, _i64, _i64, _f32, _ptr, _i64, _ptr, _i64, _f32, _ptr, _i64))


@njit(cache=True)
def _blocks(lo, hi, spread, chunks, parts, a, b, c, trans_b, alpha, beta, bias):
    """Blocks [lo, hi) of `parts`, block t being columns [t·n/parts, (t+1)·n/parts) of
    c = alpha · a @ op(b) + beta · c (+ bias), op(b) = b.T (b (n, k)) or b (b (k, n)); a (m, k),
    c (m, n): rows of unit stride, any row stride. In this thread, or shared out by the
    parallel loop at `spread` (trampoline.py)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    m, k = a.shape
    n = c.shape[1]
    for t in range(lo, hi):
        n0 = t * n // parts
        n1 = (t + 1) * n // parts
        if n1 == n0:
            continue
        gain = beta
        if bias.size:              # c's block starts as the bias (then the product adds to it)
            for r in range(m):
                row = c[r]
                if beta == 0:      # not 0 · c: c may hold anything, NaN included
                    # a loop, not row[n0:n1] = bias[n0:n1]: a slice assignment compiles NumPy's
                    # broadcasting and its error messages (~3 s of a first-ever command)
                    for j in range(n0, n1):
                        row[j] = bias[j]
                else:
                    for j in range(n0, n1):
                        row[j] += bias[j]
            gain = np.float32(1.0)
        if trans_b:
            b_block = b[n0:].ctypes.data
        else:
            b_block = b[0, n0:].ctypes.data
        _sgemm(_ROW_MAJOR, _NO_TRANS, _TRANS if trans_b else _NO_TRANS, m, n1 - n0, k, alpha,
               a.ctypes.data, a.strides[0] // 4, b_block, b.strides[0] // 4, gain,
               c[0, n0:].ctypes.data, c.strides[0] // 4)


# Below this many multiply-adds a product runs in the calling thread: sharing it out would cost
# more than it saves.
PARALLEL_MACS = 1 << 17

_NO_BIAS = np.empty((0,), np.float32)


def gemm(a, b, c, trans_b=True, alpha=1.0, accumulate=False, bias=None):
    """c = alpha · a @ b.T (trans_b; b (n, k)) or alpha · a @ b (b (k, n)), plus c itself when
    `accumulate`, plus bias (n,) when given; float32 2-D arrays whose rows have unit stride
    (views of columns are fine). Run on Numba's threads, each a block of c's columns; where
    available() is False, by NumPy's matmul on its own BLAS."""
    for x in (a, b, c):
        if x.dtype != np.float32 or x.ndim != 2 or x.size and (x.strides[1] != 4 or x.strides[0] % 4):
            raise ValueError("gemm: float32 2-D arrays whose rows have unit stride")
    m, k = a.shape
    n = c.shape[1]
    if c.shape[0] != m or (b.shape[1] if trans_b else b.shape[0]) != k or \
            (b.shape[0] if trans_b else b.shape[1]) != n:
        raise ValueError(f"gemm: {a.shape} by {b.shape}{'ᵀ' if trans_b else ''} into {c.shape}")
    if m == 0 or n == 0:
        return
    if not available():
        product = np.matmul(a * np.float32(alpha) if alpha != 1.0 else a, b.T if trans_b else b)
        if bias is not None:
            product += bias
        if accumulate:
            c += product
        else:
            c[...] = product
        return
    beta = np.float32(1.0 if accumulate else 0.0)
    bias = _NO_BIAS if bias is None else bias
    if k == 0:
        c[...] = (c if accumulate else 0) + bias
        return
    # As many blocks as the machine has threads, however many run now: OpenBLAS rounds a block
    # of columns otherwise than the same columns inside a wider block, so a split that followed
    # numba.set_num_threads (a batch worker's share of the cores) would change the numbers.
    parts = min(config.NUMBA_NUM_THREADS, n) if m * n * k >= PARALLEL_MACS else 1
    blocks = _compiled()
    if parts > 1:
        trampoline.share(blocks, parts, parts, a, b, c, trans_b, np.float32(alpha), beta, bias)
    else:
        blocks(0, 1, 0, 1, 1, a, b, c, trans_b, np.float32(alpha), beta, bias)
