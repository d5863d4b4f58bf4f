"""Row reductions: softmax (in place, optionally causal and scaled) and argmax.

`exp_rows` is the softmax's exponential for large blocks on the CPU: Numba compiles math.exp
to one libm call per element, which never vectorises (it was 40 % of the encoder), so there
2^t is computed as 2^floor(t) · 2^frac(t) — the integer part written straight into a float's
exponent bits, the fraction by a polynomial — all plain arithmetic a compiler can vectorise.
"""

import math

import numpy as np

from nwhisper.kernels._compile import kernel


@kernel
def softmax_row(r, x, n, scale, nq, causal, q_offset):
    """x[r, :m] = softmax(scale * x[r, :m]) and x[r, m:] = 0, in place; x: (rows, n) f32.

    m = n, or when causal m = min(n, r % nq + q_offset + 1): row r is query r % nq of a
    (heads * nq, n) score block, and query q sees keys j <= q + q_offset. Columns past m are
    never read, so masked scores need not be computed. scale > 0 (it commutes with the max).
    """
    m = n
    if causal:
        m = min(n, r % nq + q_offset + 1)
    top = np.float32(-math.inf)
    for c in range(m):
        top = max(top, x[r, c])
    total = np.float32(0.0)
    for c in range(m):
        e = math.exp((x[r, c] - top) * scale)
        x[r, c] = e
        total += e
    inv = np.float32(1.0) / total
    for c in range(m):
        x[r, c] *= inv
    for c in range(m, n):
        x[r, c] = np.float32(0.0)


@kernel
def exp_row(r, x, tops, bits, bits_f32, total):
    """x[r, :] = exp(x[r, :] - max(x[r, :])) and total[r] = their sum, in place; -inf gives 0.

    x (rows, n) f32; tops (rows,) f32, the row maxima when the caller has them, or (0,) to find
    them here; bits (rows, n) int32 scratch and bits_f32 the same memory viewed as f32 (the
    exponent 2^floor(t) is built as integer bits, read back as a float); total (rows,) f32.
    Exponents below 2^-126 (beyond float32's normal range) flush to 0. Relative error ≤ 3e-6,
    from rounding the fraction of t when |t| is large — where exp(t) is below 2^-20 of the max.
    """
    n = x.shape[1]
    if tops.shape[0] > 0:
        top = tops[r]
    else:
        top = np.float32(-math.inf)
        for c in range(n):
            v = x[r, c]
            top = v if v > top else top
    for c in range(n):
        t = (x[r, c] - top) * np.float32(1.4426950408889634)  # log2(e)
        t = t if t >= np.float32(-126.0) else np.float32(-127.0)  # -127: exponent bits 0 -> 0.0
        whole = np.int32(math.floor(t))
        f = t - np.float32(whole)
        # 2^f on [0, 1): least squares at 4000 Chebyshev nodes, degree 6, relative error 2.6e-9
        # in float64 (float32's rounding, ~6e-8, dominates). Literals, not module constants: a
        # cached launcher would keep a constant's old value.
        p = np.float32(2.1877504770e-04)
        p = p * f + np.float32(1.2387821479e-03)
        p = p * f + np.float32(9.6845804523e-03)
        p = p * f + np.float32(5.5480426326e-02)
        p = p * f + np.float32(2.4023050204e-01)
        p = p * f + np.float32(6.9314692869e-01)
        p = p * f + np.float32(1.0000000026e+00)
        x[r, c] = p
        bits[r, c] = (whole + np.int32(127)) << np.int32(23)
    acc = np.float32(0.0)
    for c in range(n):
        e = x[r, c] * bits_f32[r, c]
        x[r, c] = e
        acc += e
    total[r] = acc


@kernel
def argmax_row(r, x, out, n):
    """out[r] = the first index of the largest x[r, :]; x: (rows, n) f32, out: (rows,) int32."""
    best = 0
    top = x[r, 0]
    for c in range(1, n):
        if x[r, c] > top:
            top = x[r, c]
            best = c
    out[r] = best


def softmax_rows(be, x):
    """x = softmax(x) along rows, in place; x: (rows, n) f32."""
    be.softmax_rows(x)


def exp_rows(be, x, total):
    """x = exp(x - rowmax(x)) in place and total = its row sums, (rows, n) and (rows, 1) f32: the
    unnormalised softmax (exp_row)."""
    bits = be.scratch("exp_rows.bits", x.shape, np.int32)
    # On the CPU the maxima come from NumPy: LLVM does not vectorise a max reduction without
    # giving up NaN semantics (it was two thirds of this op's time); its exp loop does vectorise.
    if be.name == "cpu":
        tops = be.scratch("exp_rows.tops", (x.shape[0],))
        be.host(np.max, x, 1, tops)
    else:
        tops = be.scratch("exp_rows.tops", (0,))
    be.launch(exp_row, x.shape[0], x, tops, bits, bits.view(np.float32), total.reshape(-1),
              work=2 * x.size)


def argmax(be, logits, out):
    """out[r] = argmax(logits[r]) on the device, ties to the lowest index; (n, V) f32 -> (n,) int32."""
    be.launch(argmax_row, logits.shape[0], logits, out, logits.shape[1], work=logits.size)
