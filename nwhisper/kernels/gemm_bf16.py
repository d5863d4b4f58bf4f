"""The CPU's bfloat16 GEMM: `compute_type="bfloat16"`'s products of many rows, on AVX-512 BF16.

A bfloat16 is the top half of a float32 (8 exponent bits, 7 of mantissa), so the product of two
is exact in float32; `vdpbf16ps` multiplies 2 pairs of them into each float32 lane and adds both
to it — 32 multiply-adds per instruction, twice a float32 FMA's 16. The encoder's products of
1500 rows and a window's cross K/V come here with their operands rounded to bfloat16 (to
nearest, ties to even) and their sums kept in float32 (as CTranslate2's and PyTorch's bfloat16
products keep theirs); the decoder's steps, memory-bound, stay float32's (linear_tiles):

    x (M, K) f32 ──to_pairs──► xb (Mp, Kp/2) u32 = bf16(x[m, 2t]) | bf16(x[m, 2t+1]) << 16
    w (N, K)     ──pack──────► (N/64, Kp/2, 4, 16, 2) u16: for each 64 output columns and each
                               2 inputs, 256 contiguous bytes = four 16-lane vectors
    out[m, n] = Σ_t dot2(xb[m, t], w[n, 2t:2t+2]) + bias[n]                      (f32 sums)

The micro-kernel (ROWS rows × 64 columns, the whole K loop, a scale per row and a bias per column
applied as it stores) is LLVM IR in a Numba intrinsic (llvm_ir.broadcast_tile, as gemm_int8's);
attention_blocked multiplies its probabilities by the values with it too. Everything around it
is ordinary Numba. A CPU fast path of matmul.linear: tested against linear_elem, the portable body,
on the same bfloat16-rounded operands, and against their exact product in NumPy. Where it does
not run (no AVX-512 BF16, Numba compiling for another CPU, a device backend) the model is
float32 (model.Whisper says so with a warning, as CTranslate2 does).
"""

import functools

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from nwhisper.kernels import llvm_ir as L, trampoline
from nwhisper.kernels.vecmath import bf16
from nwhisper.kernels.widen import widen

ROWS = 6        # rows of x per micro-tile: 6 × 4 accumulators, 4 weight vectors, 1 broadcast
VECS = 4        # 16-lane vectors of output columns per micro-tile: 64 columns
COLS = 16 * VECS
CHUNK = 16 * ROWS   # rows per parallel item: a panel stays in L2 while they stream past
ONES = np.ones(ROWS, np.float32)    # the row scales of a product that has none (× 1 is exact)


@functools.cache
def available():
    """True where the micro-tile can be built: AVX-512 BF16 on the CPU Numba compiles for."""
    return L.host_has("avx512f", "avx512bw", "avx512bf16")


@intrinsic
def _tile(typingctx, x_addr, ldx, w_addr, k2, out_addr, ldo, rows, scale_addr, bias_addr):
    """One micro-tile: out[r, c] = Σ_t dot2(x[r, t], panel[t, c]) · scale[r] + bias[c] for
    r < rows (≤ ROWS), c < COLS. x_addr: the tile's row 0 of bfloat16 pairs (row stride ldx
    bytes); w_addr: the panel (k2 pairs, 256 bytes each); out_addr: f32 out[0, 0] of the tile
    (row stride ldo floats); scale_addr: f32 scales of the tile's rows (ONES: none); bias_addr:
    f32 bias of the tile's first column."""
    sig = types.void(types.uintp, types.intp, types.uintp, types.intp, types.uintp, types.intp,
                     types.intp, types.uintp, types.uintp)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        x_addr, ldx, w_addr, k2, out_addr, ldo, rows, scale_addr, bias_addr = args
        i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
        v16, f16x = ir.VectorType(i32, 16), ir.VectorType(f32, 16)
        # LLVM's own signature takes <32 x bfloat>; the <16 x i32> form is upgraded on parsing.
        dot = L.declare(builder, "llvm.x86.avx512bf16.dpbf16ps.512", f16x, [f16x, v16, v16])
        c = lambda v: ir.Constant(i64, v)  # noqa: E731
        ptr = lambda addr, t: builder.inttoptr(addr, t.as_pointer())  # noqa: E731

        sums = L.broadcast_tile(builder, lambda *a: builder.call(dot, a), ir.Constant(f16x, None),
                                ptr(x_addr, i8), ldx, ptr(w_addr, i8), k2, 4 * COLS, ROWS, VECS, "bf16")
        bias_p, scale_p, out_p = ptr(bias_addr, f32), ptr(scale_addr, f32), ptr(out_addr, f32)
        bias = [builder.load(L.vector_at(builder, bias_p, c(16 * j), f16x), align=4) for j in range(VECS)]

        def store_row(r):
            scale = L.splat(builder, builder.load(builder.gep(scale_p, [c(r)])), f16x)
            for j in range(VECS):
                at = builder.add(builder.mul(c(r), ldo), c(16 * j))
                builder.store(builder.fadd(builder.fmul(sums[r * VECS + j], scale), bias[j]),
                              L.vector_at(builder, out_p, at, f16x), align=4)
        L.store_rows(builder, c(0), rows, ROWS, "bf16", store_row)    # rows past `rows`: not stored
        return context.get_dummy_value()

    return sig, codegen


class PackedBf16:
    """A weight (N, K), N a multiple of COLS (every Whisper width is), rounded to bfloat16 and
    laid out for _tile: panels (N/COLS, Kp/2, VECS, 16, 2), K padded by zeros to Kp, even.
    Two bytes a weight, as the checkpoint's float16."""

    def __init__(self, w):
        n, k = w.shape
        if n % COLS:
            raise ValueError(f"PackedBf16: {n} output rows is not a multiple of {COLS}")
        kp = k + k % 2
        self.panels = np.empty((n // COLS, kp // 2, VECS, 16, 2), np.uint16)
        trampoline.share(_pack_range, self.panels.shape[0], w, self.panels)
        self.no_bias = np.zeros((n,), np.float32)  # so one epilogue serves layers without a bias
        self.shape, self.dtype = (n, k), np.dtype(np.float32)
        self.n, self.k, self.k_padded = n, k, kp

    def rows(self):
        """The weight (N, K) as float32 again: the bfloat16 values it multiplies by."""
        n, kp = self.n, self.k_padded
        bits = self.panels.transpose(0, 2, 3, 1, 4).reshape(n, kp)[:, :self.k].astype(np.uint32)
        return (bits << 16).view(np.float32)


@njit(cache=True)
def _pack_range(lo, hi, spread, chunks, w, panels):
    """panels[p, t, v, l, e] = bf16(w[p·COLS + 16·v + l, 2·t + e]) (0 past K) for panels p in
    [lo, hi) (shared out by the loop at `spread`: trampoline.py); w f32, or f16 as its uint16
    bits (widen.py)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    n, k = w.shape
    for p in range(lo, hi):
        for t in range(panels.shape[1]):
            for j in range(COLS):
                for e in range(2):
                    col = 2 * t + e
                    panels[p, t, j // 16, j % 16, e] = bf16(widen(w[p * COLS + j, col])) if col < k else 0


def to_pairs(x, xb):
    """xb[m, t] = bf16(x[m, 2t]) | bf16(x[m, 2t+1]) << 16, zero past x's K columns and M rows
    (tiles read the padding; zero weights and unstored rows make it harmless). A row per item,
    on Numba's threads."""
    trampoline.share(_pairs_range, xb.shape[0], x, xb)


@njit(cache=True)
def _pairs_range(lo, hi, spread, chunks, x, xb):
    """to_pairs over xb's rows [lo, hi) (shared out by the loop at `spread`)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    m_rows, k = x.shape
    for m in range(lo, hi):
        for t in range(xb.shape[1]):
            low = bf16(x[m, 2 * t]) if m < m_rows and 2 * t < k else np.uint16(0)
            high = bf16(x[m, 2 * t + 1]) if m < m_rows and 2 * t + 1 < k else np.uint16(0)
            xb[m, t] = np.uint32(low) | (np.uint32(high) << np.uint32(16))


@njit(cache=True)
def _gemm_range(lo, hi, spread, chunks, xb, panels, ones, bias, out):
    """Items [lo, hi) (shared out by the loop at `spread`), every (panel, CHUNK rows) pair an
    item; ones: ONES."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    m_rows = out.shape[0]
    k2 = xb.shape[1]
    ldo = out.strides[0] // 4
    for item in range(lo, hi):
        p, first, end = trampoline.panel_rows(item, m_rows, CHUNK)
        n0 = p * COLS
        for m0 in range(first, end, ROWS):
            _tile(xb[m0:].ctypes.data, 4 * k2, panels[p].ctypes.data, k2, out[m0:, n0:].ctypes.data,
                  ldo, min(ROWS, m_rows - m0), ones.ctypes.data, bias[n0:].ctypes.data)


def gemm(x, w: PackedBf16, bias, out, scratch):
    """out = x @ w.T (+ bias) on bfloat16 operands; x (M, K) f32, out (M, N) f32 with unit column
    stride, bias (N,) f32 or None; scratch(name, shape, dtype): the backend's reusable buffers."""
    m = x.shape[0]
    xb = scratch("gemm_bf16.xb", (-(-m // ROWS) * ROWS, w.k_padded // 2), np.uint32)
    to_pairs(np.require(x, np.float32, ("C", "A")), xb)
    trampoline.share(_gemm_range, w.panels.shape[0] * -(-m // CHUNK), xb, w.panels, ONES,
                     w.no_bias if bias is None else bias, out)
