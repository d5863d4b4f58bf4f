"""The CPU encoder's int8 and bfloat16 attention, a block of queries at a time, so that nothing
leaves L2.

`compute_type="int8"` on a CPU with AVX-512 VNNI and BF16, and `"bfloat16"` on one with BF16: a
block of BLOCK queries of one head is one parallel item, and all of its work stays in that core's
cache:

    scores   s = q·kᵀ / √hd for the block's rows over every key: int8 products (queries and keys
             quantised per row, as SageAttention does) on gemm_int8's VNNI micro-tile; or, for
             bfloat16, q and kᵀ / √hd rounded to bfloat16 on gemm_bf16's micro-tile (√hd = 8:
             the keys' scaling is exact)
    exp      p = exp(s − rowmax), rounded to bfloat16; total = Σ of the rounded p (so that the
             weights the values see sum to what they are divided by), in a fixed order
    values   out = (p · v) / total with v in bfloat16, summed in float32 by `vdpbf16ps`, which
             multiplies 2 pairs of bfloat16 into each 32-bit lane — 32 multiply-adds an
             instruction against 16 for a float32 FMA

The exponential and both products are LLVM IR in Numba intrinsics (Numba has no vector types),
each summing in an order fixed by its code, so the result is the same in every build.

Done head by head over the whole sequence (attention.attention_blas), each head's 1500 × 1536
score block (9 MB) went out to memory and back twice, and the values' product ran at float32's
rate. The probabilities are not kept (the encoder never returns them).

Layouts (H heads of hd = 64 columns, nk keys padded to `wide`, a multiple of 64):
    queries  xq (nq·H + pad, hd) u8: row m·H + h is query m of head h (q's rows, reshaped);
             bfloat16: xb (nq·H + pad, hd/2) u32, the same rows as gemm_bf16.to_pairs makes them
    keys     panels (H, wide/64, hd/4, 4, 16, 4) i8: gemm_int8.PackedInt8's per head;
             bfloat16: kb (H, wide/64, hd/2, 4, 16, 2) u16: gemm_bf16.PackedBf16's per head
    values   vb (H, wide/2, hd, 2) u16: for each pair of keys and each column, the two values'
             bfloat16 side by side (a 32-bit lane of vdpbf16ps)

A CPU fast path of attention(): tested against the portable body (attention_portable) within the
rounding int8 and bfloat16 add, and against the same products done exactly in NumPy.
"""

import functools
import math

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from nwhisper.kernels import gemm_bf16, gemm_int8, trampoline
from nwhisper.kernels import llvm_ir as L
from nwhisper.kernels.matmul import quantize_int8
from nwhisper.kernels.vecmath import bf16, from_key, order_key

HD = 64         # the head width every Whisper model has (d_model / n_head)
BLOCK = 48      # queries per parallel item (a multiple of gemm_bf16.ROWS and gemm_int8.ROWS): its scores
                # (48 × 1536 f32) and probabilities (bf16) take ~440 KB of a core's L2
FIXED = 2.0 ** 40   # the fixed point a row's total is summed in (_exp_row)

@functools.cache
def available(scores="int8"):
    """True where the blocked attention runs with `scores` "int8" or "bf16": the values need
    AVX-512 BF16 (vdpbf16ps, gemm_bf16.available()); int8 scores also gemm_int8's VNNI tile (the
    queries are quantised with its offset of 128)."""
    return gemm_bf16.available() and (scores == "bf16" or gemm_int8.isa() == "avx512vnni")


@intrinsic
def _exp_row(typingctx, s_addr, n, top, p_addr):
    """p[j] = bfloat16(e^(s[j] − top)) for j < n (a multiple of 16), and the sum of those
    bfloat16 values, exactly: each times 2^40 as an int64 (a p below 2^-40 adds 0), so the total
    is the same whatever the order or vector width. e^x = 2^t, t = x·log2(e) ≥ −127 (below: 0): 2^floor(t) in the exponent bits times
    2^frac(t) by a degree-3 polynomial (least squares on [0, 1), relative error 9e-5, well
    inside bfloat16's 2^-9); rounded to nearest even by vcvtneps2bf16. Written as vectors:
    Numba's scalar loop of the same did a third of the speed."""
    sig = types.float32(types.uintp, types.intp, types.float32, types.uintp)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        s_addr, n, top, p_addr = args
        i16, i32, i64, f32 = ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
        vf, vi, vh = ir.VectorType(f32, 16), ir.VectorType(i32, 16), ir.VectorType(i16, 16)
        v8q = ir.VectorType(i64, 8)
        fma = L.declare(builder, "llvm.fma.v16f32", vf, [vf, vf, vf])
        floor = L.declare(builder, "llvm.floor.v16f32", vf, [vf])
        vmax = L.declare(builder, "llvm.maxnum.v16f32", vf, [vf, vf])
        to_bf16 = L.declare(builder, "llvm.x86.avx512bf16.cvtneps2bf16.512", vh, [vf])  # upgraded as above
        fv = lambda v: ir.Constant(vf, [v] * 16)  # noqa: E731
        iv = lambda v: ir.Constant(vi, [v] * 16)  # noqa: E731
        tops = L.splat(builder, top, vf)
        s_p, p_p = builder.inttoptr(s_addr, f32.as_pointer()), builder.inttoptr(p_addr, i16.as_pointer())

        j, (acc,), close = L.counted_loop(builder, n, 16, [ir.Constant(v8q, None)], "exp")
        x = builder.load(L.vector_at(builder, s_p, j, vf), align=4)
        t = builder.call(vmax, [builder.fmul(builder.fsub(x, tops), fv(1.4426950408889634)), fv(-127.0)])
        whole = builder.call(floor, [t])
        f = builder.fsub(t, whole)
        poly = builder.call(fma, [fv(0.07705804610896771), f, fv(0.2276455791717931)])
        poly = builder.call(fma, [poly, f, fv(0.695122892740359)])
        poly = builder.call(fma, [poly, f, fv(1.0)])
        exponent = builder.shl(builder.add(builder.fptosi(whole, vi), iv(127)), iv(23))  # -127: 0.0
        b = builder.call(to_bf16, [builder.fmul(poly, builder.bitcast(exponent, vf))])
        builder.store(b, L.vector_at(builder, p_p, j, vh), align=2)
        fixed = builder.fmul(builder.bitcast(builder.shl(builder.zext(b, vi), iv(16)), vf), fv(FIXED))
        halves = [builder.fptosi(builder.shuffle_vector(fixed, fixed, ir.Constant(ir.VectorType(i32, 8), list(range(h, h + 8)))), v8q)
                  for h in (0, 8)]
        lanes, = close([builder.add(acc, builder.add(halves[0], halves[1]))])

        total = ir.Constant(i64, 0)
        for lane in range(8):
            total = builder.add(total, builder.extract_element(lanes, ir.Constant(i32, lane)))
        return builder.fdiv(builder.sitofp(total, f32), ir.Constant(f32, FIXED))

    return sig, codegen


@njit(cache=True)
def _attend_range(lo, hi, spread, chunks, xq, sx, panels, shift, sw, xb, kb, pad, vb, out, n_head,
                  nq, nk, bf16_scores, ones, zeros):
    """Items [lo, hi) (shared out by the loop at `spread`: trampoline.py), every (head, BLOCK
    queries) pair an item: scores (int8, or bfloat16 where bf16_scores: xb and kb instead of
    xq … sw), exp, values, in L2. ones: gemm_bf16.ONES; zeros: HD of them (the values' product
    has no bias)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    wide = pad.shape[0]
    n_panels = wide // gemm_int8.COLS
    k4, k2 = HD // 4, wide // 2
    ldo = out.strides[0] // 4
    blocks = -(-nq // BLOCK)
    s = np.empty((BLOCK, wide), np.float32)     # an item's scratch, each item writes what it reads
    p = np.empty((BLOCK, wide), np.uint16)
    sxb = np.empty(BLOCK, np.float32)
    inv = np.empty(BLOCK, np.float32)
    for item in range(lo, hi):
        h = item // blocks
        m0 = (item % blocks) * BLOCK
        rows = min(BLOCK, nq - m0)
        for r in range(BLOCK):
            sxb[r] = sx[(m0 + r) * n_head + h] if r < rows else np.float32(1.0)
        for pn in range(n_panels):
            n0 = pn * gemm_int8.COLS
            if bf16_scores:
                x0 = xb[m0 * n_head + h:].ctypes.data       # rows of HD // 2 pairs, 4 bytes each
                for r in range(0, rows, gemm_bf16.ROWS):
                    gemm_bf16._tile(x0 + r * n_head * HD * 2, n_head * HD * 2, kb[h, pn].ctypes.data,
                                    HD // 2, s[r:, n0:].ctypes.data, wide,
                                    min(gemm_bf16.ROWS, rows - r), ones.ctypes.data,
                                    pad[n0:].ctypes.data)
                continue
            x0 = xq[m0 * n_head + h:].ctypes.data
            for r in range(0, rows, gemm_int8.ROWS):
                gemm_int8._tile(x0 + r * n_head * HD, n_head * HD, panels[h, pn].ctypes.data, k4,
                                s[r:, n0:].ctypes.data, wide, min(gemm_int8.ROWS, rows - r),
                                sxb[r:].ctypes.data, shift[h, n0:].ctypes.data,
                                sw[h, n0:].ctypes.data, pad[n0:].ctypes.data)
        for r in range(rows):
            top = order_key(-math.inf)
            for j in range(nk):
                key = order_key(s[r, j])
                top = key if key > top else top
            inv[r] = np.float32(1.0) / _exp_row(s[r].ctypes.data, wide, from_key(top), p[r].ctypes.data)
        for r in range(rows, BLOCK):    # a last block's unused rows: read by a tile, never stored
            p[r, :] = 0
        for r in range(0, rows, gemm_bf16.ROWS):    # out = (p · v) / total: v's panel is 64 wide
            gemm_bf16._tile(p[r:].ctypes.data, wide * 2, vb[h].ctypes.data, k2,
                            out[m0 + r:, h * HD:].ctypes.data, ldo, min(gemm_bf16.ROWS, rows - r),
                            inv[r:].ctypes.data, zeros.ctypes.data)


@njit(cache=True)
def _pack_keys_range(lo, hi, spread, chunks, kq, k_scale, n_head, scale, panels, shift, sw):
    """kq (nk·H, hd) i8 rows (row j·H + h: key j of head h) and their scales into each head's
    PackedInt8 layout, the +128 shift's correction and the scales times `scale` (1/√hd); items
    [lo, hi) of (head, panel) (shared out by the loop at `spread`)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    nk = kq.shape[0] // n_head
    for hp in range(lo, hi):
        h, pn = hp // panels.shape[1], hp % panels.shape[1]
        for col in range(gemm_int8.COLS):
            j = pn * gemm_int8.COLS + col
            vec, lane = col // 16, col % 16
            total = 0
            for k in range(HD):
                b = kq[j * n_head + h, k] if j < nk else np.int8(0)
                panels[h, pn, k // 4, vec, lane, k % 4] = b
                total += b
            shift[h, j] = 128 * total
            sw[h, j] = k_scale[j * n_head + h] * scale if j < nk else np.float32(0.0)


@njit(cache=True)
def _pack_keys_bf16_range(lo, hi, spread, chunks, k, n_head, kb):
    """k (nk, H·hd) f32 / √hd (hd = 64: × 1/8, exact) into each head's PackedBf16 layout
    kb (H, wide/64, hd/2, 4, 16, 2), keys past nk zero; items [lo, hi) of (head, panel)
    (shared out by the loop at `spread`)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    nk = k.shape[0]
    for hp in range(lo, hi):
        h, pn = hp // kb.shape[1], hp % kb.shape[1]
        for col in range(gemm_bf16.COLS):
            j = pn * gemm_bf16.COLS + col
            for c in range(HD):
                kb[h, pn, c // 2, col // 16, col % 16, c % 2] = (
                    bf16(k[j, h * HD + c] * np.float32(0.125)) if j < nk else np.uint16(0))


@njit(cache=True)
def _pack_values_range(lo, hi, spread, chunks, v, n_head, vb):
    """v (nk, H·hd) f32 into vb (H, wide/2, hd, 2) bf16, keys past nk zero; items [lo, hi) of
    (head, pair of keys) (shared out by the loop at `spread`)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    nk = v.shape[0]
    for ht in range(lo, hi):
        h, t = ht // vb.shape[1], ht % vb.shape[1]
        for e in range(2):
            j = 2 * t + e
            for c in range(HD):
                vb[h, t, c, e] = bf16(v[j, h * HD + c]) if j < nk else np.uint16(0)


def attention(be, q, k, v, out, n_head, scores="int8"):
    """out = softmax(q kᵀ / √hd) v per head, not causal; q (nq, H·hd), k and v (nk, H·hd), out
    (nq, H·hd) f32, row-contiguous with hd = 64; scores "int8" or "bf16"; on the CPU, where
    available(scores)."""
    nq, width = q.shape
    nk = k.shape[0]
    if width != n_head * HD:
        raise ValueError(f"attention_blocked: heads of {width // n_head} columns, not {HD}")
    wide = -(-nk // gemm_int8.COLS) * gemm_int8.COLS
    q = np.require(q, np.float32, "C").reshape(nq * n_head, HD)
    rows = (nq + BLOCK) * n_head     # a block's last tile reads rows past nq: zeros
    unused = be.constant("blocked.unused", lambda: {
        "xq": np.zeros((1, 1), np.uint8), "sx": np.zeros(1, np.float32),
        "panels": np.zeros((1,) * 6, np.int8), "shift": np.zeros((1, 1), np.int32),
        "sw": np.zeros((1, 1), np.float32), "xb": np.zeros((1, 1), np.uint32),
        "kb": np.zeros((1,) * 6, np.uint16)})
    if scores == "bf16":
        xq, sx, panels, shift, sw = (unused[name] for name in ("xq", "sx", "panels", "shift", "sw"))
        xb = be.scratch("blocked.xb", (rows, HD // 2), np.uint32)
        gemm_bf16.to_pairs(q, xb)
        kb = be.scratch("blocked.kb", (n_head, wide // gemm_bf16.COLS, HD // 2, 4, 16, 2), np.uint16)
        trampoline.share(_pack_keys_bf16_range, kb.shape[0] * kb.shape[1], np.require(k, np.float32, "C"),
                         n_head, kb)
    else:
        xb, kb = unused["xb"], unused["kb"]
        xq = be.scratch("blocked.xq", (rows, HD), np.uint8)
        sx = be.scratch("blocked.sx", (nq * n_head,), np.float32)
        gemm_int8.quantize_rows(q, xq, sx, gemm_int8.offset())
        kq, k_scale = quantize_int8(be, np.require(k, np.float32, "C").reshape(nk * n_head, HD))
        panels = be.scratch("blocked.panels", (n_head, wide // gemm_int8.COLS, HD // 4, 4, 16, 4), np.int8)
        shift = be.scratch("blocked.shift", (n_head, wide), np.int32)
        sw = be.scratch("blocked.sw", (n_head, wide), np.float32)
        trampoline.share(_pack_keys_range, panels.shape[0] * panels.shape[1], kq, k_scale, n_head,
                         np.float32(1.0 / math.sqrt(HD)), panels, shift, sw)
    pad = be.scratch("blocked.pad", (wide,), np.float32)
    pad[:nk], pad[nk:] = 0.0, -np.inf       # padding keys score -inf: exp 0
    vb = be.scratch("blocked.vb", (n_head, wide // 2, HD, 2), np.uint16)
    trampoline.share(_pack_values_range, vb.shape[0] * vb.shape[1], np.require(v, np.float32, "C"),
                     n_head, vb)
    trampoline.share(_attend_range, n_head * -(-nq // BLOCK), xq, sx, panels, shift, sw, xb, kb,
                     pad, vb, out, n_head, nq, nk, scores == "bf16", gemm_bf16.ONES,
                     be.constant("blocked.zeros", lambda: np.zeros(HD, np.float32)))
