"""Linear layers and the decoder's output projection: out = x @ w.T (+ bias).

The portable body computes one output element; it is the CUDA backend's GEMM and the reference
that the CPU's BLAS path is tested against.
"""

import numpy as np

from nwhisper.kernels._compile import kernel


@kernel
def linear_elem(i, x, w, bias, out, n, n_in):
    """out[r, o] = sum_c x[r, c] * w[o, c] (+ bias[o] when bias is not empty).

    x (n, n_in) f32, w (n_out, n_in) f32/f16, bias (n_out,) or (0,), out (n, n_out) f32.
    Items run o-major (o = i // n) so that threads next to each other share a weight row.
    """
    o = i // n
    r = i - o * n
    acc = np.float32(0.0)
    for c in range(n_in):
        acc += x[r, c] * np.float32(w[o, c])
    if bias.shape[0] > 0:
        acc += np.float32(bias[o])
    out[r, o] = acc


def linear(be, x, w, bias, out):
    """out = x @ w.T + bias; x (n, i), out (n, o) f32; w (o, i) from be.weight; bias (o,) or None."""
    be.gemm(x, w, out, bias)


def logits(be, x, table, out):
    """out = x @ table.T: the decoder's tied output projection; table (V, d) from be.weight."""
    be.gemm(x, table, out)
