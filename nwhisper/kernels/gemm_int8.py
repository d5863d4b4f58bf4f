"""The CPU's int8 GEMM for many rows: the role BLAS plays for float32, on AVX-512 VNNI or AVX2.

`compute_type="int8"` keeps every linear layer's weights as int8 rows with per-row scales
(matmul.Int8Weight). A decoder step's few rows read them with float activations (linear_tiles, linear_elem);
the encoder's 1500 rows, the window's cross K/V and a prompt's rows come here: the activations
are quantised per row too, and the products of the two int8 matrices are summed exactly in int32,
4 pairs of bytes into each 32-bit lane — by `vpdpbusd` (AVX-512 VNNI: 64 multiply-adds per
instruction, against 16 for a float32 FMA), or on AVX2 by `vpmaddubsw` and `vpmaddwd` (32 in
two multiplies, against 8 for an FMA).

    x (M, K) f32 ──quantize_rows──► xq (Mp, Kp) u8 = round(x / sx) + o,  sx = max|x_row| / 127
    w (N, K) int8 ──pack──────────► (N/64, Kp/4, 4, 16, 4): for each 64 output columns and each
                                    4 inputs, 256 contiguous bytes = four 16-lane vectors
    out[m, n] = sx[m] · sw[n] · (Σ xq·w − o · Σ_k w[n, k]) + bias[n]        o = offset()

Why VNNI's offset of 128: vpdpbusd multiplies an *unsigned* byte by a signed one, so the
activations are shifted into 0…255 and the shift's contribution, 128 · (column sum of w), is
taken off again (computed once per weight). No lane can overflow: 255 · 127 · K < 2³¹ for any K
below 66 000. AVX2's vpmaddubsw sums its pairs in int16, which shifted activations would
saturate; it reads them signed (offset 0) and multiplies |x| by w with x's sign (_avx2_dot).
Either way the int32 sums are the exact integer product, so both give the same floats.

Numba has no vector types, so the micro-kernel (4 rows × 64 columns, the whole K loop, its
epilogue fused) is written as LLVM IR in a Numba intrinsic, built for the instruction set
isa() finds; everything around it is ordinary Numba. This is a CPU fast path, tested against
NumPy's exact integer product of the same quantised matrices and against linear_elem (the
portable body) within the rounding the activations add. Without either (or with Numba compiling
for another CPU) int8's many-row products fall back to float32 BLAS, on the int8 rows
dequantised (matmul.dense).
"""

import functools
import math

import numpy as np
from numba import njit, types
from numba.extending import intrinsic, overload

from nwhisper.kernels import llvm_ir as L, trampoline
from nwhisper.kernels.vecmath import from_key, order_key

ROWS = 4        # rows of x per micro-tile
VECS = 4        # 16-lane vectors of output columns per micro-tile: 64 columns
COLS = 16 * VECS
CHUNK = 64      # rows per parallel item
SUB_VECS = 2    # vectors per AVX2 sub-tile: ROWS × 2 accumulators of 8 lanes


def supported():
    """The instruction sets this CPU can build the micro-tile from, fastest first:
    "avx512vnni" (vpdpbusd), "avx2" (vpmaddubsw and vpmaddwd); none where Numba compiles for
    another CPU (e.g. NUMBA_CPU_NAME=generic for portable caches)."""
    vnni = L.host_has("avx512f", "avx512bw", "avx512vnni")
    return ("avx512vnni",) * vnni + ("avx2",) * L.host_has("avx2")


@functools.cache
def isa():
    """The instruction set the micro-tile is built from here (the first of supported()), or None."""
    return next(iter(supported()), None)


def available():
    """True where the int8 GEMM runs (isa())."""
    return isa() is not None


def offset():
    """What quantize_rows adds to the activations for this machine's micro-tile: 128 for
    vpdpbusd (unsigned bytes), 0 for AVX2's (signed bytes)."""
    return 128 if isa() == "avx512vnni" else 0


def _vnni_dot(builder, acc, a4, b):
    """acc + vpdpbusd: each 32-bit lane gains the 4 products of a4's u8 bytes and b's s8."""
    from llvmlite import ir
    v16 = ir.VectorType(ir.IntType(32), 16)
    dot = L.declare(builder, "llvm.x86.avx512.vpdpbusd.512", v16, [v16, v16, v16])
    return builder.call(dot, [acc, a4, b])


def _avx2_dot(builder, acc, a4, b):
    """acc + the same 4 products a lane, on AVX2, of a4's *signed* bytes (offset() is 0) and
    b's: vpmaddubsw multiplies an unsigned byte by a signed one and adds pairs into int16, where
    255 · 127 · 2 would saturate, so it multiplies |x| by b with x's sign (vpsignb), at most
    127 · 127 · 2; vpmaddwd by ones adds the pairs into the 32-bit lane. The sums carry no
    128 · Σw to take off."""
    from llvmlite import ir
    i8, i16, i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
    b32, h16, v8 = ir.VectorType(i8, 32), ir.VectorType(i16, 16), ir.VectorType(i32, 8)
    x = builder.bitcast(a4, b32)
    ax = builder.call(L.declare(builder, "llvm.abs.v32i8", b32, [b32, ir.IntType(1)]),
                      [x, ir.Constant(ir.IntType(1), 0)])
    signed = builder.call(L.declare(builder, "llvm.x86.avx2.psign.b", b32, [b32, b32]),
                          [builder.bitcast(b, b32), x])
    pairs = builder.call(L.declare(builder, "llvm.x86.avx2.pmadd.ub.sw", h16, [b32, b32]),
                         [ax, signed])
    lanes = builder.call(L.declare(builder, "llvm.x86.avx2.pmadd.wd", v8, [h16, h16]),
                         [pairs, ir.Constant(h16, [1] * 16)])
    return builder.add(acc, lanes)


# Per instruction set: lanes per vector, the dot, and the vectors of a sub-tile: a tile's
# ROWS × COLS sums are summed in sub-tiles of ROWS rows, one K loop after the other, each small
# enough for the 16 vector registers (AVX2's 32 accumulators of 8 lanes would spill).
_SHAPES = {"avx512vnni": (16, _vnni_dot, VECS), "avx2": (8, _avx2_dot, SUB_VECS)}


@intrinsic
def _tile(typingctx, x_addr, ldx, w_addr, k4, out_addr, ldo, rows, sx_addr, shift_addr, sw_addr,
          bias_addr):
    """One micro-tile, epilogue fused: for r < rows (≤ ROWS) and c < COLS,
    out[r, c] = f32(Σ_k4 dot4(x[r, 4k:4k+4], panel) − shift[c]) · sx[r] · sw[c] + bias[c]
    (on AVX2 the sums come without the shift: _avx2_dot).

    x_addr: u8 row 0 of the tile (row stride ldx bytes); w_addr: the weight panel; out_addr:
    f32 out[0, 0] of the tile (row stride ldo floats); sx_addr: the rows' scales; shift_addr
    (i32), sw_addr and bias_addr (f32): the tile's first column of each."""
    sig = types.void(types.uintp, types.intp, types.uintp, types.intp, types.uintp, types.intp,
                     types.intp, types.uintp, types.uintp, types.uintp, types.uintp)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        x_addr, ldx, w_addr, k4, out_addr, ldo, rows, sx_addr, shift_addr, sw_addr, bias_addr = args
        i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
        kind = isa()
        lanes, dot, sub_vecs = _SHAPES[kind]
        vi, vf = ir.VectorType(i32, lanes), ir.VectorType(f32, lanes)
        vecs = COLS // lanes
        c = lambda v: ir.Constant(i64, v)  # noqa: E731
        ptr = lambda addr, t: builder.inttoptr(addr, t.as_pointer())  # noqa: E731

        sums = [None] * (ROWS * vecs)     # row-major
        for j0 in range(0, vecs, sub_vecs):
            w_at = builder.gep(ptr(w_addr, i8), [c(4 * lanes * j0)])  # vector j0 of the panel
            part = L.broadcast_tile(builder, functools.partial(dot, builder), ir.Constant(vi, None),
                                    ptr(x_addr, i8), ldx, w_at, k4, 4 * COLS, ROWS, sub_vecs,
                                    f"tile{j0}")
            for r in range(ROWS):
                sums[r * vecs + j0:r * vecs + j0 + sub_vecs] = part[r * sub_vecs:(r + 1) * sub_vecs]

        shift_p, sw_p, bias_p = ptr(shift_addr, i32), ptr(sw_addr, f32), ptr(bias_addr, f32)
        vectors = lambda p, t: [builder.load(L.vector_at(builder, p, c(lanes * j), t), align=4)  # noqa: E731
                                for j in range(vecs)]
        shift = vectors(shift_p, vi) if kind == "avx512vnni" else None   # AVX2's sums have none
        sw, bias = vectors(sw_p, vf), vectors(bias_p, vf)
        out_p, sx_p = ptr(out_addr, f32), ptr(sx_addr, f32)

        def store_row(r):
            sx = L.splat(builder, builder.load(builder.gep(sx_p, [c(r)])), vf)
            for j in range(vecs):
                total = sums[r * vecs + j]
                total = total if shift is None else builder.sub(total, shift[j])
                v = builder.sitofp(total, vf)
                v = builder.fadd(builder.fmul(v, builder.fmul(sx, sw[j])), bias[j])
                at = builder.add(builder.mul(c(r), ldo), c(lanes * j))
                builder.store(v, L.vector_at(builder, out_p, at, vf), align=4)
        # rows past `rows` (the last tile of an odd count) are not stored
        L.store_rows(builder, c(0), rows, ROWS, "tile", store_row)
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
        trampoline.share(_pack_range, self.panels.shape[0], np.ascontiguousarray(q), self.panels, self.shift)
        self.scale = np.ascontiguousarray(scale, np.float32)
        self.no_bias = np.zeros((n,), np.float32)  # so one epilogue serves layers without a bias
        self.n, self.k, self.k_padded = n, k, kp

    def rows(self):
        """The int8 weight (N, K) again, row-major."""
        n, kp = self.n, self.k_padded
        return np.ascontiguousarray(self.panels.transpose(0, 2, 3, 1, 4).reshape(n, kp)[:, :self.k])


@njit(cache=True)
def _pack_range(lo, hi, spread, chunks, q, panels, shift):
    """panels[p, kk, v, l, b] = q[p·COLS + 16·v + l, 4·kk + b] (0 past K); shift[n] = 128 · Σ_k q[n, k],
    for panels p in [lo, hi) (shared out by the loop at `spread`: trampoline.py). One pass over
    q, a panel of COLS rows per item (NumPy's transposing copy of the same layout is a strided
    copy several times slower, on every matrix of a load)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    n, k = q.shape
    for p in range(lo, hi):
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


def quantize_rows(x, xq, sx, add, affine=None):
    """xq[m, :K] = round(x[m] / sx[m]) + add as u8 (add: offset()), sx[m] = max|x[m]| / 127
    (1 for a zero row); affine = (scale, shift), K of each: of max(x[m, :K] · scale + shift, 0)
    instead (a batch norm and its ReLU before the product, applied as the row is read), x's
    first K columns.
    xq's padding (rows up to a multiple of ROWS, columns up to Kp) is zeroed: tiles read it,
    and zero weights in the padded columns cancel it. A row per item, on Numba's threads."""
    scale, shift = (None, None) if affine is None else affine
    trampoline.share(_quantize_range, xq.shape[0], x, xq, sx, add, scale, shift)


def _read(x, m, c, scale, shift):
    """x[m, c], or with a scale max(x[m, c] · scale[c] + shift[c], 0)."""


@overload(_read)
def _read_of(x, m, c, scale, shift):
    if isinstance(scale, types.NoneType):   # compiled apart: no test in the plain loops
        return lambda x, m, c, scale, shift: x[m, c]

    def affine(x, m, c, scale, shift):
        v = x[m, c] * scale[c] + shift[c]
        return v if v > np.float32(0.0) else np.float32(0.0)
    return affine


def _columns(x, scale):
    """How many of x's columns are read: all, or as many as the scale has."""


@overload(_columns)
def _columns_of(x, scale):
    if isinstance(scale, types.NoneType):
        return lambda x, scale: x.shape[1]
    return lambda x, scale: scale.shape[0]


# 'nnan': LLVM vectorises a max reduction only when told there are no NaNs; nothing that
# would change a rounding ('arcp', 'reassoc') is allowed, so tests can redo it in NumPy.
@njit(cache=True, fastmath={"nnan", "nsz"})
def _quantize_range(lo, hi, spread, chunks, x, xq, sx, add, scale, shift):
    """quantize_rows over xq's rows [lo, hi) (shared out by the loop at `spread`)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    m_rows = x.shape[0]
    k = _columns(x, scale)
    for m in range(lo, hi):
        xq[m, k:] = 0
        if m >= m_rows:
            xq[m, :] = 0
            continue
        top = order_key(np.float32(0.0))   # max|x| as integer keys: it vectorises
        for c in range(k):
            key = order_key(abs(_read(x, m, c, scale, shift)))
            top = key if key > top else top
        top = from_key(top)
        s = top / np.float32(127.0) if top > np.float32(0.0) else np.float32(1.0)
        sx[m] = s
        inv = np.float32(1.0) / s
        for c in range(k):
            v = min(max(_read(x, m, c, scale, shift) * inv, np.float32(-127.0)), np.float32(127.0))
            # round half up, then + add (v + 128.5 would round 87.49999 up in float32); a
            # negative value's u8 is its two's complement byte, as the AVX2 tile reads it
            xq[m, c] = np.uint8(np.int32(math.floor(v + np.float32(0.5))) + add)


@njit(cache=True)
def _gemm_range(lo, hi, spread, chunks, xq, sx, panels, shift, sw, bias, out):
    """Items [lo, hi) (shared out by the loop at `spread`), every (panel, CHUNK rows) pair an
    item: the panel's weights stay in L2 while its row chunk's tiles stream past."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    m_rows = out.shape[0]
    k4 = xq.shape[1] // 4
    ldo = out.strides[0] // 4
    for item in range(lo, hi):
        p, first, end = trampoline.panel_rows(item, m_rows, CHUNK)
        n0 = p * COLS
        for m0 in range(first, end, ROWS):
            _tile(xq[m0:].ctypes.data, xq.shape[1], panels[p].ctypes.data, k4,
                  out[m0:, n0:].ctypes.data, ldo, min(ROWS, m_rows - m0), sx[m0:].ctypes.data,
                  shift[n0:].ctypes.data, sw[n0:].ctypes.data, bias[n0:].ctypes.data)


def gemm(x, w: PackedInt8, bias, out, scratch, affine=None):
    """out = x @ w.T (+ bias) with x quantised per row; x (M, K) f32, out (M, N) f32 with unit
    column stride, bias (N,) f32 or None; scratch(name, shape, dtype): the backend's reusable
    buffers (a fresh 0.8-3 MB array per call cost as much as the quantisation, in page faults);
    affine: (scale, shift), of max(x · scale + shift, 0) instead, x's first K columns
    (quantize_rows)."""
    m = x.shape[0]
    if (x.shape[1] if affine is None else len(affine[0])) != w.k:
        raise ValueError(f"gemm_int8: x {x.shape} does not give the weight's {w.k} inputs")
    xq = scratch("gemm_int8.xq", (-(-m // ROWS) * ROWS, w.k_padded), np.uint8)
    sx = scratch("gemm_int8.sx", (m,), np.float32)
    quantize_rows(np.require(x, np.float32, ("C", "A")), xq, sx, offset(), affine)
    trampoline.share(_gemm_range, w.panels.shape[0] * -(-m // CHUNK), xq, sx, w.panels, w.shift,
                     w.scale, w.no_bias if bias is None else bias, out)
