"""The CPU's int8 GEMM for many rows: the role BLAS plays for float32, on AVX-512 VNNI.

`compute_type="int8"` keeps every linear layer's weights as int8 rows with per-row scales
(matmul.Int8Weight). A decoder step's few rows read them with the portable GEMV (linear_elem);
the encoder's 1500 rows, the window's cross K/V and a prompt's rows come here: the activations
are quantised per row too, and the products of the two int8 matrices are summed in int32 by
`vpdpbusd`, which multiplies 4 pairs of bytes and adds them to a 32-bit lane — 64 multiply-adds
per instruction, against 16 for a float32 FMA.

    x (M, K) f32 ──quantize_rows──► xq (Mp, Kp) u8 = round(x / sx) + 128,  sx = max|x_row| / 127
    w (N, K) int8 ──pack──────────► (N/64, Kp/4, 4, 16, 4): for each 64 output columns and each
                                    4 inputs, 256 contiguous bytes = four 16-lane vectors
    out[m, n] = sx[m] · sw[n] · (Σ xq·w − 128 · Σ_k w[n, k]) + bias[n]

Why the +128: vpdpbusd multiplies an *unsigned* byte by a signed one, so the activations are
shifted into 0…255 and the shift's contribution, 128 · (column sum of w), is taken off again
(computed once per weight). No lane can overflow: 255 · 127 · K < 2³¹ for any K below 66 000.

Numba has no vector types, so the micro-kernel (4 rows × 64 columns in 16 vector registers, the
whole K loop, its epilogue fused) is written as LLVM IR in a Numba intrinsic; everything
around it is ordinary Numba. This is a CPU fast path, tested against NumPy's exact integer product
of the same quantised matrices and against linear_elem (the portable body) within the rounding
the activations add. Without AVX-512 VNNI (or with Numba compiling for another CPU) int8's
many-row products fall back to float32 BLAS, on the int8 rows dequantised (CpuBackend._full).
"""

import functools
import math

import llvmlite.binding as llvm
import numpy as np
from numba import njit, prange, types
from numba.core import config
from numba.extending import intrinsic

from nwhisper.kernels import llvm_ir as L
from nwhisper.kernels.vecmath import from_key, order_key

ROWS = 4        # rows of x per micro-tile
VECS = 4        # 16-lane vectors of output columns per micro-tile: 64 columns
COLS = 16 * VECS
CHUNK = 64      # rows per parallel item


@functools.cache
def available():
    """True when Numba compiles for this machine's CPU and it has AVX-512 VNNI."""
    if config.CPU_NAME not in (None, "host"):   # e.g. NUMBA_CPU_NAME=generic for portable caches
        return False
    features = llvm.get_host_cpu_features()
    return all(features.get(f, False) for f in ("avx512f", "avx512bw", "avx512vnni"))


@intrinsic
def _tile(typingctx, x_addr, ldx, w_addr, k4, out_addr, ldo, rows, sx_addr, shift_addr, sw_addr,
          bias_addr):
    """One micro-tile, epilogue fused: for r < rows (≤ ROWS) and c < COLS,
    out[r, c] = f32(Σ_k4 dot4(x[r, 4k:4k+4], panel) − shift[c]) · sx[r] · sw[c] + bias[c].

    x_addr: u8 row 0 of the tile (row stride ldx bytes); w_addr: the weight panel; out_addr:
    f32 out[0, 0] of the tile (row stride ldo floats); sx_addr: the rows' scales; shift_addr
    (i32), sw_addr and bias_addr (f32): the tile's first column of each."""
    sig = types.void(types.uintp, types.intp, types.uintp, types.intp, types.uintp, types.intp,
                     types.intp, types.uintp, types.uintp, types.uintp, types.uintp)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        x_addr, ldx, w_addr, k4, out_addr, ldo, rows, sx_addr, shift_addr, sw_addr, bias_addr = args
        i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
        v16, f16x = ir.VectorType(i32, 16), ir.VectorType(f32, 16)
        dot = L.declare(builder, "llvm.x86.avx512.vpdpbusd.512", v16, [v16, v16, v16])
        c = lambda v: ir.Constant(i64, v)  # noqa: E731
        ptr = lambda addr, t: builder.inttoptr(addr, t.as_pointer())  # noqa: E731

        sums = L.broadcast_tile(builder, dot, ir.Constant(v16, None), ptr(x_addr, i8), ldx,
                                ptr(w_addr, i8), k4, 4 * COLS, ROWS, VECS, "tile")

        shift_p, sw_p, bias_p = ptr(shift_addr, i32), ptr(sw_addr, f32), ptr(bias_addr, f32)
        shift = [builder.load(L.vector_at(builder, shift_p, c(16 * j), v16), align=4) for j in range(VECS)]
        sw = [builder.load(L.vector_at(builder, sw_p, c(16 * j), f16x), align=4) for j in range(VECS)]
        bias = [builder.load(L.vector_at(builder, bias_p, c(16 * j), f16x), align=4) for j in range(VECS)]
        out_p, sx_p = ptr(out_addr, f32), ptr(sx_addr, f32)
        end = builder.append_basic_block("tile.end")
        for r in range(ROWS):   # rows past `rows` (the last tile of an odd count) are not stored
            store = builder.append_basic_block(f"tile.row{r}")
            builder.cbranch(builder.icmp_signed("<", c(r), rows), store, end)
            builder.position_at_end(store)
            sx = L.splat(builder, builder.load(builder.gep(sx_p, [c(r)])), f16x)
            for j in range(VECS):
                v = builder.sitofp(builder.sub(sums[r * VECS + j], shift[j]), f16x)
                v = builder.fadd(builder.fmul(v, builder.fmul(sx, sw[j])), bias[j])
                at = builder.add(builder.mul(c(r), ldo), c(16 * j))
                builder.store(v, L.vector_at(builder, out_p, at, f16x), align=4)
        builder.branch(end)
        builder.position_at_end(end)
        return context.get_dummy_value()

    return sig, codegen


class PackedInt8:
    """An int8 weight (N, K), N a multiple of COLS (every Whisper width is), laid out for _tile:
    panels (N/COLS, Kp/4, VECS, 16, 4) with K padded by zeros to Kp, a multiple of 4; with its
    per-row scales and the +128 shift's correction, 128 · Σ_k w[n, k]."""

    def __init__(self, q, scale):
        n, k = q.shape
        if n % COLS:
            raise ValueError(f"PackedInt8: {n} output rows is not a multiple of {COLS}")
        kp = -(-k // 4) * 4
        self.panels = np.empty((n // COLS, kp // 4, VECS, 16, 4), np.int8)
        self.shift = np.empty((n,), np.int32)
        _pack(np.ascontiguousarray(q), self.panels, self.shift)
        self.scale = np.ascontiguousarray(scale, np.float32)
        self.no_bias = np.zeros((n,), np.float32)  # so one epilogue serves layers without a bias
        self.n, self.k, self.k_padded = n, k, kp

    def rows(self):
        """The int8 weight (N, K) again, row-major."""
        n, kp = self.n, self.k_padded
        return np.ascontiguousarray(self.panels.transpose(0, 2, 3, 1, 4).reshape(n, kp)[:, :self.k])


@njit(parallel=True, cache=True)
def _pack(q, panels, shift):
    """panels[p, kk, v, l, b] = q[p·COLS + 16·v + l, 4·kk + b] (0 past K); shift[n] = 128 · Σ_k q[n, k].
    One pass over q, a panel of COLS rows per parallel item (NumPy's transposing copy of the
    same layout is a strided copy several times slower, on every matrix of a load)."""
    n, k = q.shape
    for p in prange(panels.shape[0]):
        for kk in range(panels.shape[1]):
            for j in range(COLS):
                r = p * COLS + j
                for b in range(4):
                    c = 4 * kk + b
                    panels[p, kk, j // 16, j % 16, b] = q[r, c] if c < k else 0
        for j in range(COLS):
            r = p * COLS + j
            total = 0
            for c in range(k):
                total += q[r, c]
            shift[r] = 128 * total


# 'nnan': LLVM vectorises a max reduction only when told there are no NaNs; nothing that
# would change a rounding ('arcp', 'reassoc') is allowed, so tests can redo it in NumPy.
@njit(parallel=True, cache=True, fastmath={"nnan", "nsz"})
def quantize_rows(x, xq, sx):
    """xq[m, :K] = round(x[m] / sx[m]) + 128 as u8, sx[m] = max|x[m]| / 127 (1 for a zero row);
    xq's padding (rows up to a multiple of ROWS, columns up to Kp) is zeroed: tiles read it,
    and zero weights in the padded columns cancel it."""
    m_rows, k = x.shape
    for m in prange(xq.shape[0]):
        xq[m, k:] = 0
        if m >= m_rows:
            xq[m, :] = 0
            continue
        top = order_key(np.float32(0.0))   # max|x| as integer keys: it vectorises
        for c in range(k):
            key = order_key(abs(x[m, c]))
            top = key if key > top else top
        top = from_key(top)
        s = top / np.float32(127.0) if top > np.float32(0.0) else np.float32(1.0)
        sx[m] = s
        inv = np.float32(1.0) / s
        for c in range(k):
            v = min(max(x[m, c] * inv, np.float32(-127.0)), np.float32(127.0))
            # round half up, then + 128 (v + 128.5 would round 87.49999 up in float32)
            xq[m, c] = np.uint8(np.int32(math.floor(v + np.float32(0.5))) + 128)


@njit(parallel=True, cache=True)
def _gemm(xq, sx, panels, shift, sw, bias, out):
    """Every (panel, CHUNK rows) pair is one parallel item: the panel's weights stay in L2
    while its row chunk's tiles stream past."""
    m_rows = out.shape[0]
    k4 = xq.shape[1] // 4
    ldo = out.strides[0] // 4
    chunks = -(-m_rows // CHUNK)
    for item in prange(panels.shape[0] * chunks):
        p = item // chunks
        chunk = item % chunks
        n0 = p * COLS
        for m0 in range(chunk * CHUNK, min((chunk + 1) * CHUNK, m_rows), ROWS):
            _tile(xq[m0:].ctypes.data, xq.shape[1], panels[p].ctypes.data, k4,
                  out[m0:, n0:].ctypes.data, ldo, min(ROWS, m_rows - m0), sx[m0:].ctypes.data,
                  shift[n0:].ctypes.data, sw[n0:].ctypes.data, bias[n0:].ctypes.data)


def gemm(x, w: PackedInt8, bias, out, scratch):
    """out = x @ w.T (+ bias) with x quantised per row; x (M, K) f32, out (M, N) f32 with unit
    column stride, bias (N,) f32 or None; scratch(name, shape, dtype): the backend's reusable
    buffers (a fresh 0.8-3 MB array per call cost as much as the quantisation, in page faults)."""
    m = x.shape[0]
    xq = scratch("gemm_int8.xq", (-(-m // ROWS) * ROWS, w.k_padded), np.uint8)
    sx = scratch("gemm_int8.sx", (m,), np.float32)
    quantize_rows(np.require(x, np.float32, ("C", "A")), xq, sx)
    _gemm(xq, sx, w.panels, w.shift, w.scale, w.no_bias if bias is None else bias, out)
