"""Linear layers and the decoder's output projection: out = x @ w.T (+ bias).

One body, `linear_elem`, computes up to four outputs of one row: the CUDA backend's portable GEMM,
the CPU's GEMV for a decoder step's few rows (where BLAS's threading costs more than the
arithmetic), and the reference that the CPU's BLAS path is tested against. Four outputs per item
give the loop four independent sums, so it streams the weights instead of waiting on one sum.

Weights are f32, f16 (CUDA), or int8 with one f32 scale per output row (`Int8Weight`, the
`compute_type="int8"` path): a decoder step is memory-bound, and int8 rows are a quarter of the
bytes of f32 ones.
"""

import numpy as np

from nwhisper.kernels._compile import kernel

OUTS_PER_ITEM = 4


@kernel
def linear_elem(i, x, w, scale, bias, out, n, n_in):
    """out[r, o] = sum_c x[r, c] * w[o, c] (* scale[o]) (+ bias[o]) for o in the item's block.

    x (n, n_in) f32, w (n_out, n_in) f32/f16/int8, scale and bias (n_out,) f32 or (0,) for none,
    out (n, n_out) f32. Item i is block b = i // n of OUTS_PER_ITEM outputs (the last block may be
    shorter) for row r = i % n: items next to each other share a block of weight rows.
    """
    b = i // n
    r = i - b * n
    o = b * 4
    n_out = w.shape[0]
    if o + 4 <= n_out:
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        for c in range(n_in):
            xc = x[r, c]
            a0 += xc * np.float32(w[o, c])
            a1 += xc * np.float32(w[o + 1, c])
            a2 += xc * np.float32(w[o + 2, c])
            a3 += xc * np.float32(w[o + 3, c])
        out[r, o] = a0
        out[r, o + 1] = a1
        out[r, o + 2] = a2
        out[r, o + 3] = a3
    else:
        for t in range(o, n_out):
            acc = np.float32(0.0)
            for c in range(n_in):
                acc += x[r, c] * np.float32(w[t, c])
            out[r, t] = acc
    for t in range(o, min(o + 4, n_out)):
        acc = out[r, t]
        if scale.shape[0] > 0:
            acc *= scale[t]
        if bias.shape[0] > 0:
            acc += np.float32(bias[t])
        out[r, t] = acc


def linear_items(n, n_out):
    """The launch size of linear_elem for n rows and n_out outputs."""
    return n * ((n_out + OUTS_PER_ITEM - 1) // OUTS_PER_ITEM)


class Int8Weight:
    """A weight matrix as int8 rows with one f32 scale each (w ≈ q · scale[:, None]), beside the
    full-precision matrix that BLAS uses for many rows at once (a prompt, word alignment).

    Symmetric per-row scales: scale = max|w_row| / 127, so each row's largest weight is exact and
    the rounding error of any weight is at most scale / 2."""

    def __init__(self, q, scale, full):
        self.q, self.scale, self.full = q, scale, full
        self.shape, self.dtype = q.shape, q.dtype


def quantize_int8(w):
    """(q int8, scale f32) of a host matrix w (o, i), per output row; all-zero rows get scale 1."""
    w = np.asarray(w, np.float32)
    top = np.abs(w).max(axis=1)
    scale = np.where(top > 0, top / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def linear(be, x, w, bias, out):
    """out = x @ w.T + bias; x (n, i), out (n, o) f32; w from be.weight or be.weight_int8;
    bias (o,) or None."""
    be.gemm(x, w, out, bias)


def logits(be, x, table, out):
    """out = x @ table.T: the decoder's tied output projection; table (V, d) from be.weight or
    be.weight_int8."""
    be.gemm(x, table, out)
