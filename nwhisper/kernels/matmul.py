"""Linear layers and the decoder's output projection: out = x @ w.T (+ bias).

One body, `linear_elem`, computes one output column: the portable product, and the reference
that the fast paths are tested against. One output per item keeps each item's reads one
contiguous weight row, which is what lets the hardware prefetcher stream a 20 MB vocabulary
projection from memory (blocks of several rows per item are slower from DRAM). `variant()` names
the fast paths and the rule between them (BLAS, the CPU's int8 GEMM, linear_tiles, a device's own
GEMM); `linear` and `linear_add` run what it chooses.

Weights come from a backend's weight preparation: f32; f16 (on the CPU as uint16 bits, widen.py,
or as HalfRows); or int8 with one f32 scale per output row (`Int8Weight`, the
`compute_type="int8"` path): a decoder step is memory-bound, and f16 rows are half the bytes of
f32 ones, int8 rows a quarter; or bfloat16 packed for the CPU's bfloat16 GEMM
(gemm_bf16.PackedBf16, the `compute_type="bfloat16"` encoder's).
"""

import math

import numpy as np

from nwhisper.kernels import blas, gemm_bf16, gemm_f32, gemm_int8, linear_tiles
from nwhisper.kernels._compile import kernel
from nwhisper.kernels.elementwise import add
from nwhisper.kernels.speaker_ops import scale_shift_relu_row
from nwhisper.kernels.vecmath import from_key, order_key
from nwhisper.kernels.widen import to_float32, widen

# Up to this many rows an int8 weight's products read its int8 rows (a GEMV streaming them once for
# all rows); above, a GEMM: the CPU's int8 GEMM, or a full-precision matrix.
GEMV_ROWS = 8

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
    products of many rows may use: the same rows packed for the CPU's int8 GEMM (`packed`,
    gemm_int8.PackedInt8), or the full-precision matrix (`full`, kept by a device backend).
    `quantized_rows`: whether the activations multiplied by it may be quantised too (not a
    decoder's: see Backend.weight_int8).

    Symmetric per-row scales (quantize_row): scale = max|w_row| / 127, so each row's largest
    weight is exact and the rounding error of any weight is at most scale / 2."""

    def __init__(self, q, scale, full, packed=None, quantized_rows=True):
        self._q, self.scale, self.full, self.packed = q, scale, full, packed
        self.quantized_rows = quantized_rows
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


class HalfRows:
    """A float16 matrix that products of many rows multiply on the host's BLAS (a float32
    encoder's): its bits, where the checkpoint holds them, widened into a scratch matrix for
    each product (the same float32 values). Half the memory of a float32 copy, which a large
    model's encoder feels (large-v3's: 1.3 GB), for a pass over the weights per product: ~1 % of
    the work of an encoder's 1500 rows."""

    def __init__(self, bits):
        self.bits, self.shape, self.dtype = bits, bits.shape, np.dtype(np.float16)


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
        v = x / s
        v = np.float32(-127.0) if v < np.float32(-127.0) else v
        v = np.float32(127.0) if v > np.float32(127.0) else v
        q[o, c] = np.int8(math.floor(v + np.float32(0.5)))  # to nearest, halves up


def column_scales(w):
    """c (i,) f32 = 1 / max_o |w[o, i]| of a weight matrix (1 for a column of zeros): for int8
    rows read with float activations.

    A row's int8 step is its largest |weight| / 127, and a few input columns of Whisper's decoder
    matrices hold weights far larger than the rest (its hidden states' outlier features), so
    per-row scales quantise every other column coarsely. W·diag(c) gives every column the same
    range; the LayerNorm that feeds the product divides its gain and bias by c (model._LayerNorm's
    `columns`), so the product is the same: LN(x)·Wᵀ = (LN(x)/c)·(W·diag(c))ᵀ, at no cost per
    step. Measured on tiny.en's output projection over the 63 s clip's 230 steps: logit error
    against the f16 product median 0.092 -> 0.017, 99th percentile 0.44 -> 0.066, largest 1.10
    -> 0.16 (scales from activation statistics, SmoothQuant's, did no better here)."""
    half = w.dtype == np.float16
    top = np.zeros(w.shape[1], np.uint16 if half else np.float32)
    for i in range(0, w.shape[0], 4096):    # a block of rows at a time: no copy of the matrix
        block = w[i:i + 4096]
        # |w| of a half is its bits without the sign, and those order as the values do
        top = np.maximum(top, (block.view(np.uint16) & np.uint16(0x7FFF) if half
                               else np.abs(block)).max(axis=0))
    top = top.view(np.float16).astype(np.float32) if half else top
    return np.where(top > 0, 1.0 / np.where(top > 0, top, 1.0), 1.0).astype(np.float32)


def quantize_int8(be, w, columns=None):
    """(q int8, scale f32) of a weight matrix w (o, i) on the backend, per output row; of
    w · diag(columns) when columns (i,) f32 is given (the product made in the kernel, so an
    equalised float32 copy of w is never made)."""
    q = be.empty(w.shape, np.int8)
    scale = be.empty((w.shape[0],), np.float32)
    columns = be.scratch("quantize.none", (0,)) if columns is None else be.upload(columns)
    be.launch(quantize_row, w.shape[0], w, columns, q, scale, work=4 * w.size)
    return q, scale


def variant(be, n, w):
    """(which product out = x @ w.T runs for x of n rows, the matrix it reads): the first of
    these that applies.

      rows    an Int8Weight's int8 rows, or f16 bits (a uint16 matrix: weight(gemv=True)), read
              as they are: up to GEMV_ROWS rows, or any number where the activations stay float
              (a decoder's: a row's sums must not depend on how many rows come with it), or
              where neither of the GEMMs below takes the weight. On the host linear_tiles where
              it runs (the same sums as linear_elem), else linear_elem
      int8    many rows on the host's int8 GEMM (a weight packed for it: gemm_int8.available)
      bf16    any rows on the host's bfloat16 GEMM (a PackedBf16: only made where it runs)
      f32     many rows of a float32 matrix or a HalfRows on the host's float32 GEMM where it
              runs (gemm_f32.takes)
      blas    the host's float32 BLAS: a float32 matrix, a HalfRows widened, or an Int8Weight's
              rows dequantised where the CPU has no int8 GEMM (dense)
      device  a device backend: its own GEMM where it has one (be.gemm_fast), else linear_elem;
              an Int8Weight's full-precision matrix for many rows
    """
    if isinstance(w, gemm_bf16.PackedBf16):
        return "bf16", w
    if isinstance(w, Int8Weight):
        if n > GEMV_ROWS and w.full is not None:
            w = w.full
        elif n > GEMV_ROWS and w.packed is not None:
            return "int8", w
        elif n > GEMV_ROWS and w.quantized_rows and be.on_host and not gemm_int8.available():
            return "blas", w
        else:
            return "rows", w
    if not be.on_host:
        return "device", w
    if w.dtype == np.uint16:
        return "rows", w
    return ("f32" if gemm_f32.takes(n, w) else "blas"), w


def linear(be, x, w, bias, out, ln=None):
    """out = x @ w.T + bias; x (n, i), out (n, o) f32; w from be.weight, be.weight_rows or
    be.weight_int8; bias (o,) or None. ln = (ln_w, ln_b, eps): of LayerNorm(x) instead,
    normalised where the backend can (a GPU's GEMV reads x and normalises it in the same launch)."""
    _product(be, x, w, bias, out, ln, False)


def linear_bn_relu(be, x, scale, shift, w, bias, out):
    """out = max(x[:, :K] · scale + shift, 0) @ w.T + bias, K = len(scale): a batch norm and
    its ReLU before the product (CAM++'s dense layers read the first K columns of their block's
    concatenation). The int8 GEMM applies them as it quantises each row; elsewhere they are a
    pass of their own (scale_shift_relu_row)."""
    how, packed = variant(be, x.shape[0], w)
    if how == "int8":
        gemm_int8.gemm(x, packed.packed, bias, out, be.scratch, affine=(scale, shift))
        return
    h = be.scratch("matmul.bn_relu", (x.shape[0], scale.shape[0]))
    be.launch(scale_shift_relu_row, x.shape[0], x, scale, shift, h, work=h.size)
    linear(be, h, w, bias, out)


def linear_add(be, x, w, bias, out):
    """out += x @ w.T + bias: a projection added to the residual stream it feeds (a block's
    attention output and second MLP layer), in the same pass where the product can."""
    _product(be, x, w, bias, out, None, True)


def logits(be, x, table, out):
    """out = x @ table.T: the decoder's tied output projection; table (V, d) from be.weight or
    be.weight_int8."""
    _product(be, x, table, None, out, None, False)


def _product(be, x, w, bias, out, ln, accumulate):
    how, w = variant(be, x.shape[0], w)
    if how == "device" and be.gemm_fast(x, w, bias, out, ln, accumulate):
        return
    x = normalized(be, x, ln)
    if how in ("rows", "device"):
        _rows(be, x, w, bias, out, accumulate)
    elif how in ("int8", "bf16"):
        target = be.scratch("matmul.sum", out.shape) if accumulate else out
        if how == "int8":
            gemm_int8.gemm(x, w.packed, bias, target, be.scratch)
        else:
            gemm_bf16.gemm(x, w, bias, target, be.scratch)
        if accumulate:
            add(be, out, target, out)
    elif how == "f32" and out.strides[1] == 4:
        gemm_f32.gemm(x if x.strides[1] == 4 else np.ascontiguousarray(x),
                      w.bits if isinstance(w, HalfRows) else w, bias, out, accumulate, be.scratch)
    else:
        be.host(blas.gemm, x, dense(be, w), out, True, 1.0, accumulate, bias)


def _rows(be, x, w, bias, out, accumulate):
    """The "rows" product: linear_tiles on the host where it runs, else linear_elem."""
    q, scale = (w.q, w.scale) if isinstance(w, Int8Weight) else (w, None)
    n, n_in = x.shape
    n_out = q.shape[0]
    work = n * n_out * n_in // 64   # vectorised: ~64 MACs per scalar step
    if (be.on_host and linear_tiles.available() and linear_tiles.fits(n_in)
            and q.dtype in (np.int8, np.uint16) and x.flags.c_contiguous and out.flags.c_contiguous):
        ones = be.constant(("matmul.ones", n_out), lambda: np.ones((n_out,), np.float32))
        zeros = be.constant(("matmul.zeros", n_out), lambda: np.zeros((n_out,), np.float32))
        be.share(linear_tiles.linear_range, linear_tiles.items(n_out),
                 x, q, ones if scale is None else scale, zeros if bias is None else bias, out,
                 int(accumulate), serial=be.serial(work))
        return
    none = be.constant("matmul.none", lambda: be.empty((0,), np.float32))
    be.launch(linear_elem, n_out, x, q, none if scale is None else scale,
              none if bias is None else bias, out, n, n_in, accumulate, work=work)


def normalized(be, x, ln):
    """LayerNorm(x) (ln = (w, b, eps)) in a scratch buffer, for a product that does not fuse the
    normalisation into itself; x itself for ln None."""
    if ln is None:
        return x
    h = be.scratch("matmul.ln", x.shape)
    be.layernorm(x, ln[0], ln[1], h, np.float32(ln[2]))
    return h


def dense(be, w):
    """The float32 matrix that the host's BLAS multiplies by: a HalfRows' bits widened, an
    Int8Weight's rows times their scales, each into a scratch matrix (a pass over the weights,
    ~1 % of an encoder product's work); a float32 matrix as it is."""
    if isinstance(w, HalfRows):
        full = be.scratch("matmul.dense", w.shape)
        be.host(to_float32, w.bits, full)
        return full
    if isinstance(w, Int8Weight):
        full = be.scratch("matmul.dense", w.shape)
        be.host(np.multiply, w.q, w.scale[:, None], full)
        return full
    if w.dtype != np.float32:
        raise TypeError(f"linear: the weight is {w.dtype}; prepare it with be.weight() "
                        "(NumPy has no BLAS for it)")
    return w
