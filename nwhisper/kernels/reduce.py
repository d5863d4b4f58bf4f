"""Row reductions: softmax (in place, optionally causal and scaled) and its exponential.

`exp_rows` is the softmax's exponential for large blocks on the CPU: Numba compiles math.exp
to one libm call per element, which never vectorises (a large share of the encoder), and a float
maximum does not vectorise either; vecmath.py's forms of both do.
"""

import math

import numpy as np

from nwhisper.kernels._compile import kernel
from nwhisper.kernels.vecmath import fast_exp, from_key, order_key


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
def exp_row(r, x, total):
    """x[r, :] = exp(x[r, :] - max(x[r, :])) and total[r] = their sum, in place; -inf gives 0;
    x (rows, n) f32, total (rows,) f32. Both passes vectorise on the CPU (vecmath.py): the
    maximum over integer keys, the exponential by exponent bits (there: relative error ≤ 3e-6,
    and exactly 0 below 2^-126 of the maximum; CUDA's is expf). A row of only -inf has no
    maximum to subtract: no caller passes one (a causal row always sees its first key)."""
    n = x.shape[1]
    top = order_key(-math.inf)
    for c in range(n):
        k = order_key(x[r, c])
        top = k if k > top else top
    m = from_key(top)
    acc = np.float32(0.0)
    for c in range(n):
        e = np.float32(fast_exp(x[r, c] - m))
        x[r, c] = e
        acc += e
    total[r] = acc


def exp_rows(be, x, total):
    """x = exp(x - rowmax(x)) in place and total = its row sums, (rows, n) and (rows, 1) f32: the
    unnormalised softmax (exp_row)."""
    be.launch(exp_row, x.shape[0], x, total.reshape(-1), work=2 * x.size)
