"""The CPU's float32 GEMM for many rows on AVX-512: the float32 encoder's products and a window's
cross K/V, where BLAS ran them.

Both this and OpenBLAS run a core at its FMA peak; two threads are where they part. blas.py gives
each of Numba's threads a block of the output's columns and OpenBLAS's sgemm on it (one thread
pool): 156-188 GFLOP/s on Whisper's shapes on a 2-core Zen 4, whose FMAs peak at ~224. Here the
work is many small items (64 columns × 96 rows each), every item the same micro-tile over a
weight panel that stays in L2 while the rows stream past: 206-224 GFLOP/s on the same shapes.

    w (N, K) f32, or f16 bits ──pack──► (N/64, K, 64) f32: each 64 output columns' weights,
                                        k-major, so a step of k reads 4 contiguous vectors
    out[m, n] = Σ_k x[m, k] · w[n, k] + bias[n]  (+ what out held: linear_add's residual)

Each sum is one float32 FMA chain over k in order: the same floats on any number of threads and
rows. The pack is made for each product from the checkpoint's own matrix (f16 bits are widened as
they are packed): the one pass over the weights that widening them for BLAS cost, so a float32
encoder holds no second copy of its matrices (large-v3's is 2.5 GB in float32).

The micro-kernel (ROWS rows × 64 columns, the whole K loop, bias and residual in its stores) is
LLVM IR in a Numba intrinsic (llvm_ir.broadcast_tile, as gemm_bf16's and gemm_int8's). A CPU fast
path of matmul.linear: tested against linear_elem, the portable body, and against the exact
product. Where it does not run (no AVX-512, Numba compiling for another CPU, fewer than
MIN_ROWS rows, a width not a multiple of 64) BLAS does.
"""

import functools

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from nwhisper.kernels import llvm_ir as L, trampoline
from nwhisper.kernels.widen import widen

ROWS = 6        # rows of x per micro-tile: 6 × 4 accumulators, 4 weight vectors, 1 broadcast
VECS = 4        # 16-lane vectors of output columns per micro-tile: 64 columns
COLS = 16 * VECS
CHUNK = 16 * ROWS   # rows per parallel item: a panel stays in L2 while they stream past
# Fewer rows than this stay on BLAS: the pack's pass over the weights would outweigh the product.
MIN_ROWS = 64


@functools.cache
def available():
    """True where the micro-tile can be built: AVX-512 on the CPU Numba compiles for."""
    return L.host_has("avx512f")


def takes(m, w):
    """Whether this GEMM runs x (m rows) @ w.T: AVX-512, enough rows, a width of whole panels."""
    return m >= MIN_ROWS and w.shape[0] % COLS == 0 and available()


@intrinsic
def _tile(typingctx, x_addr, ldx, w_addr, k, out_addr, ldo, first, bias_addr, accumulate):
    """One micro-tile: out[r, c] = Σ_k x[r, k] · panel[k, c] + bias[c] (+ out[r, c] where
    `accumulate`) for first ≤ r < ROWS, c < COLS. x_addr: the tile's row 0 (row stride ldx
    bytes, every row readable); w_addr: the panel (k steps of 256 bytes); out_addr: f32 out[0, 0]
    of the tile (row stride ldo floats); bias_addr: f32 bias of the tile's first column."""
    sig = types.void(types.uintp, types.intp, types.uintp, types.intp, types.uintp, types.intp,
                     types.intp, types.uintp, types.boolean)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        x_addr, ldx, w_addr, k, out_addr, ldo, first, bias_addr, accumulate = args
        i8, i64, f32 = ir.IntType(8), ir.IntType(64), ir.FloatType()
        f16x = ir.VectorType(f32, 16)
        fma = L.declare(builder, "llvm.fma.v16f32", f16x, [f16x, f16x, f16x])
        c = lambda v: ir.Constant(i64, v)  # noqa: E731
        ptr = lambda addr, t: builder.inttoptr(addr, t.as_pointer())  # noqa: E731

        def dot(acc, x4, w):    # broadcast_tile hands over 4-byte lanes: here they are floats
            return builder.call(fma, [builder.bitcast(x4, f16x), builder.bitcast(w, f16x), acc])

        sums = L.broadcast_tile(builder, dot, ir.Constant(f16x, None), ptr(x_addr, i8), ldx,
                                ptr(w_addr, i8), k, 4 * COLS, ROWS, VECS, "f32")
        bias_p, out_p = ptr(bias_addr, f32), ptr(out_addr, f32)
        bias = [builder.load(L.vector_at(builder, bias_p, c(16 * j), f16x), align=4) for j in range(VECS)]
        keep = builder.icmp_unsigned("!=", accumulate, ir.Constant(accumulate.type, 0))

        def store_row(r):
            for j in range(VECS):
                at = L.vector_at(builder, out_p, builder.add(builder.mul(c(r), ldo), c(16 * j)), f16x)
                v = builder.fadd(sums[r * VECS + j], bias[j])
                with builder.if_then(keep):
                    builder.store(builder.fadd(v, builder.load(at, align=4)), at, align=4)
                with builder.if_then(builder.not_(keep)):
                    builder.store(v, at, align=4)
        L.store_rows(builder, first, c(ROWS), ROWS, "f32", store_row)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True)
def _pack_range(lo, hi, spread, chunks, w, panels):
    """panels[p, k, j] = w[p·COLS + j, k] as float32 for panels p in [lo, hi) (shared out by the
    loop at `spread`: trampoline.py); w f32, or f16 as its uint16 bits (widen.py)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    for p in range(lo, hi):
        rows = w[p * COLS:(p + 1) * COLS]
        for k in range(w.shape[1]):     # k outer: the writes run contiguously, the reads from
            for j in range(COLS):       # COLS rows that each stay in L1 for 16 steps of k
                panels[p, k, j] = widen(rows[j, k])


@njit(cache=True)
def _gemm_range(lo, hi, spread, chunks, x, panels, bias, out, accumulate):
    """Items [lo, hi) (shared out by the loop at `spread`), every (panel, CHUNK rows) pair an
    item. A last tile that would pass x's last row starts ROWS before it instead and stores
    only its rows that are new (x has at least ROWS rows)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    m_rows, k = x.shape
    ldx, ldo = x.strides[0], out.strides[0] // 4
    for item in range(lo, hi):
        p, first, end = trampoline.panel_rows(item, m_rows, CHUNK)
        n0 = p * COLS
        for m0 in range(first, end, ROWS):
            start = min(m0, m_rows - ROWS)
            _tile(x[start:].ctypes.data, ldx, panels[p].ctypes.data, k, out[start:, n0:].ctypes.data,
                  ldo, m0 - start, bias[n0:].ctypes.data, accumulate)


def gemm(x, w, bias, out, accumulate, scratch):
    """out = x @ w.T + bias (out += that where `accumulate`); x (M, K) f32 with unit column stride,
    M ≥ ROWS; w (N, K) f32 or f16 bits (uint16), N a multiple of COLS; out (M, N) f32 with unit
    column stride; bias (N,) f32 or None; scratch(name, shape, dtype): the backend's reusable
    buffers."""
    n, k = w.shape
    panels = scratch("gemm_f32.panels", (n // COLS, k, COLS), np.float32)
    trampoline.share(_pack_range, n // COLS, w, panels)
    if bias is None:
        bias = scratch("gemm_f32.no_bias", (n,), np.float32)
        bias[:] = 0
    trampoline.share(_gemm_range, (n // COLS) * -(-x.shape[0] // CHUNK), x, panels, bias, out,
                     bool(accumulate))
