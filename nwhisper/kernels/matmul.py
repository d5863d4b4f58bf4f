"""Linear layers and the decoder's output projection: out = x @ w.T (+ bias).

One body, `linear_elem`, computes one output column: the CUDA backend's portable GEMM, and the
reference that the CPU's fast paths are tested against (BLAS; gemm_int8; linear_tiles, the CPU's
product of the decoder's int8 and float16 rows, the same sums register-tiled). One output
per item keeps each item's reads one contiguous weight row, which is what lets the hardware
prefetcher stream a 20 MB vocabulary projection from memory (blocks of several rows per item
are slower from DRAM).

Weights are f32, f16 (on the CPU as uint16 bits, widen.py), or int8 with one f32 scale per output
row (`Int8Weight`, the `compute_type="int8"` path): a decoder step is memory-bound, and f16 rows
are half the bytes of f32 ones, int8 rows a quarter.
"""

import math

import numpy as np

from nwhisper.kernels._compile import kernel
from nwhisper.kernels.vecmath import from_key, order_key
from nwhisper.kernels.widen import widen

@kernel
def linear_elem(o, x, w, scale, bias, out, n, n_in, accumulate):
    """out[r, o] = sum_c x[r, c] * w[o, c] (* scale[o]) (+ bias[o]) for every row r (added to
    what out holds when `accumulate`: a residual stream's update in the same pass): one item
    per output o, so its weight row is read from memory once for all n rows (beam search's).

    x (n, n_in) f32, w (n_out, n_in) f32/f16/int8 (f16 on the CPU as uint16 bits: widen.py),
    scale and bias (n_out,) f32 or (0,) for none, out (n, n_out) f32.
    """
    # Read once, before the loops: a branch after the sum made LLVM vectorise it with one
    # accumulator instead of several, which is much slower.
    s = scale[o] if scale.shape[0] > 0 else np.float32(1.0)
    b = np.float32(bias[o]) if bias.shape[0] > 0 else np.float32(0.0)
    for r in range(n):
        acc = np.float32(0.0)
        for c in range(n_in):
            acc += x[r, c] * widen(w[o, c])
        y = acc * s + b
        out[r, o] = out[r, o] + y if accumulate else y


class Int8Weight:
    """A weight matrix as int8 rows with one f32 scale each (w ≈ q · scale[:, None]), and what
    products of many rows use: the same rows packed for the CPU's int8 GEMM (`packed`,
    gemm_int8.PackedInt8) where it runs, the rows dequantised for BLAS where it does not
    (`blas_rows`: CpuBackend), else the full-precision matrix (`full`) for BLAS or the GPU's GEMM.

    Symmetric per-row scales (quantize_row): scale = max|w_row| / 127, so each row's largest
    weight is exact and the rounding error of any weight is at most scale / 2."""

    def __init__(self, q, scale, full, packed=None, blas_rows=False):
        self._q, self.scale, self.full, self.packed, self.blas_rows = q, scale, full, packed, blas_rows
        self.shape, self.dtype = q.shape, q.dtype

    @property
    def q(self):
        """The int8 rows (n_out, n_in); unpacked again from `packed` where only that is kept."""
        return self._q if self._q is not None else self.packed.rows()

    def keep_packed_only(self):
        """Drop the row-major copy of a packed weight (half its memory): every product of many
        rows reads the packed one, and the rare few-row product unpacks it."""
        if self.packed is not None:
            self._q = None


@kernel
def quantize_row(o, w, columns, q, scale):
    """q[o, :] = round(w'[o, :] / scale[o]) as int8, scale[o] = max|w'[o, :]| / 127 (1 for an
    all-zero row): symmetric per-row int8 of w' = w · diag(columns), or of w itself for columns
    of size 0. w (n_out, n_in) f32/f16, columns (n_in,) or (0,) f32, q int8, scale f32."""
    n = w.shape[1]
    equalised = columns.shape[0] > 0
    row = w[o]
    top = order_key(np.float32(0.0))   # max|w'| as integer keys: it vectorises
    for c in range(n):
        k = order_key(abs(widen(row[c]) * columns[c] if equalised else widen(row[c])))
        top = k if k > top else top
    top = from_key(top)
    s = top / np.float32(127.0) if top > np.float32(0.0) else np.float32(1.0)
    scale[o] = s
    for c in range(n):
        x = widen(row[c]) * columns[c] if equalised else widen(row[c])
        v = min(max(x / s, np.float32(-127.0)), np.float32(127.0))
        q[o, c] = np.int8(math.floor(v + np.float32(0.5)))  # to nearest, halves up


def quantize_int8(be, w, columns=None):
    """(q int8, scale f32) of a weight matrix w (o, i) on the backend, per output row; of
    w · diag(columns) when columns (i,) f32 is given (the product made in the kernel, so an
    equalised float32 copy of w is never made)."""
    q = be.empty(w.shape, np.int8)
    scale = be.empty((w.shape[0],), np.float32)
    columns = be.scratch("quantize.none", (0,)) if columns is None else be.upload(columns)
    be.launch(quantize_row, w.shape[0], w, columns, q, scale, work=4 * w.size)
    return q, scale


def linear(be, x, w, bias, out, ln=None):
    """out = x @ w.T + bias; x (n, i), out (n, o) f32; w from be.weight or be.weight_int8;
    bias (o,) or None. ln = (ln_w, ln_b, eps): of LayerNorm(x) instead, normalised where the
    backend can (a GPU's GEMV reads x and normalises it in the same launch)."""
    be.gemm(x, w, out, bias, ln)


def linear_add(be, x, w, bias, out):
    """out += x @ w.T + bias: a projection added to the residual stream it feeds (a block's
    attention output and second MLP layer); as linear, then add."""
    be.gemm_add(x, w, out, bias)


def logits(be, x, table, out):
    """out = x @ table.T: the decoder's tied output projection; table (V, d) from be.weight or
    be.weight_int8."""
    be.gemm(x, table, out)
