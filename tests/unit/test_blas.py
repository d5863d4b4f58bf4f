"""kernels/blas.py: the CPU's float32 GEMMs on NumPy's OpenBLAS, called from Numba's threads.

Truth: NumPy's product in float64 of the same arrays. Also checked: that OpenBLAS was set to one
thread (the one-pool design), that bad shapes and layouts are refused before any BLAS call, and
that the NumPy fallback (NWHISPER_NUMPY_BLAS=1, what runs where NumPy's BLAS is not found) gives
the same encoder states in a process of its own; the product tests run on whichever of the two
this process has.
"""

import os
import subprocess
import sys

import numpy as np
import paths
import pytest

from nwhisper.kernels import blas

def rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def close(got, want, k):
    """float32 products of k terms: |Δ| within a few ulps of the terms' magnitude."""
    bound = 4e-7 * k * max(1.0, float(np.max(np.abs(want))))
    assert np.max(np.abs(got - want)) <= bound, f"max |Δ| {np.max(np.abs(got - want)):.3g} > {bound:.3g}"


@pytest.mark.parametrize("m, k, n", [(1500, 384, 1536), (1500, 64, 1500)])
def test_gemm_does_not_depend_on_the_threads_running(m, k, n):
    """The same bits whatever numba.set_num_threads says (a batch worker runs with its share of
    the cores): OpenBLAS rounds a block of columns otherwise than the same columns inside a
    wider block, so the columns are split as for every thread the machine has. (Seen: a
    2-worker batch's avg_logprob 1e-6 off the same file transcribed alone.)"""
    import numba

    rng = np.random.default_rng(7)
    a, b = rand(rng, m, k), rand(rng, n, k)
    before = numba.get_num_threads()
    outs = []
    try:
        for threads in (1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(threads)
            c = np.empty((m, n), np.float32)
            blas.gemm(a, b, c)
            outs.append(c)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(*outs)


@pytest.mark.parametrize("m, k, n", [(1, 7, 5), (3, 64, 33), (150, 96, 200), (1500, 64, 129)])
@pytest.mark.parametrize("trans_b", [True, False])
def test_gemm_against_numpy(m, k, n, trans_b):
    """Serial (few multiply-adds) and shared-out (over PARALLEL_MACS) products, b stored either
    way, with alpha, accumulate and bias."""
    rng = np.random.default_rng(m * 1000 + n)
    a, c0, bias = rand(rng, m, k), rand(rng, m, n), rand(rng, n)
    b = rand(rng, n, k) if trans_b else rand(rng, k, n)
    product = a.astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
    c = np.full((m, n), np.nan, np.float32)   # what c held must not leak through
    blas.gemm(a, b, c, trans_b)
    close(c, product, k)
    c = c0.copy()
    blas.gemm(a, b, c, trans_b, alpha=0.25, accumulate=True, bias=bias)
    close(c, 0.25 * product + c0 + bias, k)
    c = np.full((m, n), np.nan, np.float32)
    blas.gemm(a, b, c, trans_b, bias=bias)
    close(c, product + bias, k)


def test_gemm_on_column_views():
    """The encoder's attention multiplies one head's columns of q, k and v into one head's
    columns of out: row strides wider than the rows."""
    rng = np.random.default_rng(1)
    qkv, out = rand(rng, 300, 3 * 128), np.zeros((300, 128), np.float32)
    q, k, v = qkv[:, 32:64], qkv[:, 160:192], qkv[:, 288:320]
    s = np.empty((300, 300), np.float32)
    blas.gemm(q, k, s, alpha=0.5)
    close(s, 0.5 * q.astype(np.float64) @ k.T.astype(np.float64), 32)
    blas.gemm(s, v, out[:, 32:64], trans_b=False)
    close(out[:, 32:64], s.astype(np.float64) @ v.astype(np.float64), 300)
    assert not out[:, :32].any() and not out[:, 64:].any()


def test_gemm_reads_read_only_arrays():
    """A memory-mapped checkpoint's weights and biases are read-only (the ggml and HF
    containers): a, b and bias are only read."""
    rng = np.random.default_rng(3)
    a, b, bias = rand(rng, 40, 16), rand(rng, 24, 16), rand(rng, 24)
    for x in (a, b, bias):
        x.flags.writeable = False
    c = np.empty((40, 24), np.float32)
    blas.gemm(a, b, c, bias=bias)
    close(c, a.astype(np.float64) @ b.T.astype(np.float64) + bias, 16)


def test_gemm_edges_and_refusals():
    rng = np.random.default_rng(2)
    c = rand(rng, 4, 3)
    bias = rand(rng, 3)
    blas.gemm(np.empty((4, 0), np.float32), np.empty((3, 0), np.float32), c, bias=bias)
    np.testing.assert_array_equal(c, np.broadcast_to(bias, (4, 3)))
    blas.gemm(np.empty((0, 5), np.float32), rand(rng, 3, 5), np.empty((0, 3), np.float32))
    with pytest.raises(ValueError, match="into"):
        blas.gemm(rand(rng, 4, 5), rand(rng, 3, 6), np.empty((4, 3), np.float32))
    with pytest.raises(ValueError, match="unit stride"):
        blas.gemm(rand(rng, 4, 10)[:, ::2], rand(rng, 3, 5), np.empty((4, 3), np.float32))
    with pytest.raises(ValueError, match="float32"):
        blas.gemm(rand(rng, 4, 5).astype(np.float64), rand(rng, 3, 5), np.empty((4, 3), np.float32))


def test_openblas_runs_one_thread():
    """NumPy's wheel (what .ci/run installs) bundles OpenBLAS, which available() finds and
    leaves at one thread: its own pool would fight Numba's."""
    assert blas.available(), "NumPy's bundled scipy-openblas64 not found"
    get_threads = blas._openblas()[2]
    assert get_threads() == 1


def test_numpy_fallback_gives_the_same_encoder():
    """A random Whisper's encoder with the GEMMs on kernels/blas.py and, in another process,
    on NumPy's matmul (NWHISPER_NUMPY_BLAS=1): the same states within float32 rounding."""
    code = """
import sys, numpy as np
from helpers_models import tiny_dims, tiny_random_checkpoint
from nwhisper import backend
from nwhisper.model import Whisper
ck = tiny_random_checkpoint(tiny_dims(width=64, heads=4, layers=2, n_audio_ctx=100))
m = Whisper(ck, backend.get("cpu"))
mel = np.random.default_rng(0).standard_normal((200, ck.dims.n_mels)).astype(np.float32)
np.save(sys.argv[1], m.encode(mel))
"""
    outs = []
    for fallback in ("0", "1"):
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"nw-enc-{os.getpid()}-{fallback}.npy")
        env = paths.env(NWHISPER_NUMPY_BLAS=fallback)
        proc = subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True,
                              text=True, timeout=300, cwd=paths.ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(np.load(path))
        os.unlink(path)
    assert np.max(np.abs(outs[0] - outs[1])) <= 1e-4 * max(1.0, float(np.max(np.abs(outs[1]))))
