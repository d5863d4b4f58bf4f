"""Row reductions: softmax (in place, optionally causal and scaled) and argmax."""

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


def argmax(be, logits, out):
    """out[r] = argmax(logits[r]) on the device, ties to the lowest index; (n, V) f32 -> (n,) int32."""
    be.launch(argmax_row, logits.shape[0], logits, out, logits.shape[1], work=logits.size)
