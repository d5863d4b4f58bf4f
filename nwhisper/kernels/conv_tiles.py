"""The CPU's convolutions for the speaker network: im2col a tile of rows, then BLAS on the tile.

CAM++'s portable bodies unroll a whole convolution's input into columns (speaker_ops's
im2col2d_row, im2col1d_row) and make it one GEMM. Its front end's 3×3 convolutions have 32
output channels and 288 columns per output position: for a chunk of windows the columns are
~90 MB, written once and read once, and the GEMM's 32 outputs per row do too little with each
byte to hide that. Here each Numba thread instead unrolls a tile of rows — a few hundred, small
enough to stay in its core's cache — calls OpenBLAS's sgemm on it (kernels/blas.py: one thread
pool), and finishes the tile's outputs where they are still in cache: the bias (a folded batch
norm), a residual block's shortcut, the ReLU.

One function serves every convolution of the network, seen as 2-D over (time, frequency):
a k_t × k_f kernel with a stride over each axis, a dilation and padding over time, padding over
frequency; a 1-D convolution is k_f = 1 over one frequency bin. The columns are in the bodies'
order, (k_t, k_f, channel), so the same weights serve both; tested against the bodies
(tests/unit/test_kernels.py, test_speaker_conv_tiles_match_the_bodies).

With AVX-512, the convolutions whose outputs come in 32s (all of CAM++'s) skip the columns:
a micro-tile (LLVM IR in a Numba intrinsic, as gemm_bf16's) keeps 10 output positions × 32
channels in registers and reads the (zero-padded) input in place, tap by tap: the positions
of a tile are consecutive along one axis, so each tap's inputs are at a fixed stride (ten
divides the front end's lines of 40, 20 and 10 frequencies), and the epilogue (bias, shortcut,
ReLU) is applied before the sums leave the registers. Wider outputs run 32 at a time over the
same inputs. OpenBLAS's kernels do little with a product only 32 columns wide; this one runs the
front end's 3 × 3 convolutions 1.4-1.9 times as fast. Where the CPU also has AVX-512 BF16 and
the caller asks (a speaker network beside an int8 or bfloat16 model), the padded input holds the
channels as bfloat16 pairs and `vdpbf16ps` multiplies a pair in each lane: half the bytes and twice the
multiply-adds an instruction, ~2 × float32's speed (float32 sums, as gemm_bf16's).
"""

import functools

import numpy as np
from llvmlite import ir
from numba import config, njit, types
from numba.extending import intrinsic, overload

from nwhisper.kernels import blas, gemm_bf16, trampoline
from nwhisper.kernels import llvm_ir as L
from nwhisper.kernels.blas import _NO_TRANS, _ROW_MAJOR, _TRANS, _sgemm
from nwhisper.kernels.vecmath import bf16 as bf16_of
from nwhisper.kernels.vecmath import bf16_array

TILE_BYTES = 1 << 18    # a tile's columns: 256 KB, inside any x86 core's L2 beside the weights
ROWS = 10               # output positions per micro-tile: 10 × 2 accumulators, 2 weight vectors
COLS = 32               # its output channels: two 16-lane vectors
# the distances between a tile's positions, in elements of the padded input, that CAM++'s
# convolutions take: 1-channel frequencies (its first); 32 channels as bfloat16 pairs or floats,
# frequency stride 1 or 2; 128 channels as pairs or floats along time (the CAM layers')
STEPS = (1, 16, 32, 64, 128)


def available():
    """Whether the tiles run here: NumPy's OpenBLAS is callable from Numba's threads."""
    return blas.available()


@functools.cache
def direct_available():
    """Whether the micro-tile runs here: AVX-512 on the CPU Numba compiles for (with AVX2's 16
    registers its 24 accumulators would spill)."""
    return L.host_has("avx512f")


def bf16_available():
    """Whether the micro-tile can multiply bfloat16 pairs here (AVX-512 BF16: gemm_bf16's)."""
    return direct_available() and gemm_bf16.available()


@intrinsic
def _tile(typingctx, x_addr, lda, offs_addr, taps, w_addr, c, out_addr, ldo, rows, bias_addr, res_addr,
          relu, unit):
    """out[r, o] = Σ_tap Σ_ch x[r·lda + offs[tap] + ch] · w[tap, ch, o] + bias[o] (+ res[r, o])
    (ReLU) for r < rows (≤ ROWS), o < COLS; out, bias and res (0: none; out's row stride) f32
    addresses, offs i64. `unit`, an element of x, picks the
    arithmetic by its type: float32, x and w f32 and an FMA per channel (strides in floats);
    uint32, x's channels in bfloat16 pairs (lda, offs and c counted in pairs), w (tap, pair, o, 2)
    bfloat16, `vdpbf16ps` multiplying a pair in each lane (float32 sums)."""
    sig = types.void(types.uintp, types.intp, types.uintp, types.intp, types.uintp, types.intp,
                     types.uintp, types.intp, types.intp, types.uintp, types.uintp, types.boolean, unit)
    pairs = unit == types.uint32

    def codegen(context, builder, signature, args):
        x_addr, lda, offs_addr, taps, w_addr, c, out_addr, ldo, rows, bias_addr, res_addr, relu, _ = args
        f32, i64 = ir.FloatType(), ir.IntType(64)
        vec = ir.VectorType(f32, 16)
        elem = ir.IntType(32) if pairs else f32
        wvec = ir.VectorType(elem, 16)
        if pairs:   # LLVM's own signature takes <32 x bfloat>; the <16 x i32> form is upgraded
            dot = L.declare(builder, "llvm.x86.avx512bf16.dpbf16ps.512", vec, [vec, wvec, wvec])
            madd = lambda a, b, acc: builder.call(dot, [acc, a, b])  # noqa: E731
        else:
            fma = L.declare(builder, "llvm.fma.v16f32", vec, [vec, vec, vec])
            madd = lambda a, b, acc: builder.call(fma, [a, b, acc])  # noqa: E731
        k = lambda v: ir.Constant(i64, v)  # noqa: E731
        at = lambda addr, t=f32: builder.inttoptr(addr, t.as_pointer())  # noqa: E731
        x, w, out, bias = at(x_addr, elem), at(w_addr, elem), at(out_addr), at(bias_addr)
        offs = builder.inttoptr(offs_addr, i64.as_pointer())

        def taps_loop(step):
            """The sums over every tap and channel, rows `step` (an i64) elements apart."""
            tap, sums, close_tap = L.counted_loop(builder, taps, 1, [ir.Constant(vec, None)] * (2 * ROWS),
                                                  "conv.tap")
            off = builder.load(builder.gep(offs, [tap]))
            w_tap = builder.mul(builder.mul(tap, c), k(COLS))
            ch, acc, close_ch = L.counted_loop(builder, c, 1, sums, "conv.ch")
            w_row = builder.add(w_tap, builder.mul(ch, k(COLS)))
            wv = [builder.load(L.vector_at(builder, w, builder.add(w_row, k(16 * j)), wvec), align=4)
                  for j in range(2)]
            at = builder.add(off, ch)
            new = []
            for r in range(ROWS):
                a = builder.load(builder.gep(x, [builder.add(builder.mul(k(r), step), at)]))
                a = L.splat(builder, a, wvec)
                new += [madd(a, wv[j], acc[2 * r + j]) for j in range(2)]
            return close_tap(close_ch(new))

        # Each of the steps CAM++'s convolutions take gets a loop of its own: with the rows at
        # constant distances one register addresses all twelve (a runtime step kept twelve
        # addresses, more than the registers, and spilled them at every channel).
        joined = builder.append_basic_block("conv.joined")
        generic = builder.append_basic_block("conv.step")
        switch = builder.switch(lda, generic)
        ends = []
        for step in (None,) + STEPS:
            if step is None:
                builder.position_at_end(generic)
            else:
                case = builder.append_basic_block(f"conv.step{step}")
                switch.add_case(k(step), case)
                builder.position_at_end(case)
            ends.append((taps_loop(lda if step is None else k(step)), builder.block))
            builder.branch(joined)
        builder.position_at_end(joined)
        sums = []
        for i in range(2 * ROWS):
            phi = builder.phi(vec)
            for values, block in ends:
                phi.add_incoming(values[i], block)
            sums.append(phi)
        b = [builder.load(L.vector_at(builder, bias, k(16 * j), vec), align=4) for j in range(2)]
        zero = ir.Constant(vec, None)
        maxnum = L.declare(builder, "llvm.maxnum.v16f32", vec, [vec, vec])
        end = builder.append_basic_block("conv.end")

        def store_rows(res):
            for r in range(ROWS):   # positions past `rows` (a line's last tile) are not stored
                store = builder.append_basic_block(f"conv.row{r}")
                builder.cbranch(builder.icmp_signed("<", k(r), rows), store, end)
                builder.position_at_end(store)
                for j in range(2):
                    o = builder.add(builder.mul(k(r), ldo), k(16 * j))
                    v = builder.fadd(sums[2 * r + j], b[j])
                    if res is not None:
                        v = builder.fadd(v, builder.load(L.vector_at(builder, res, o, vec), align=4))
                    v = builder.select(relu, builder.call(maxnum, [v, zero]), v)
                    builder.store(v, L.vector_at(builder, out, o, vec), align=4)
            builder.branch(end)

        # the epilogue while the sums are in registers: the shortcut of a residual block, the ReLU
        with_res, without = (builder.append_basic_block(f"conv.{n}") for n in ("res", "nores"))
        builder.cbranch(builder.icmp_unsigned("!=", res_addr, ir.Constant(res_addr.type, 0)), with_res, without)
        builder.position_at_end(with_res)
        store_rows(at(res_addr))
        builder.position_at_end(without)
        store_rows(None)
        builder.position_at_end(end)
        return context.get_dummy_value()

    return sig, codegen


def tile_rows(n_cols, rows):
    """Rows per tile for columns of n_cols floats: TILE_BYTES of them, at least 16."""
    return max(16, min(rows, TILE_BYTES // (4 * n_cols)))


@njit(pipeline_class=trampoline.NoAlias, cache=True)
def _conv_parts_range(lo, hi, spread, chunks, x, w, bias, out, t_out, f_out, kt, kf, stride_t,
                      stride_f, dilation_t, pad_t, pad_f, residual, relu, tile, cols):
    """Parts [lo, hi) of the tiles, part p unrolling its tiles into cols[p]: in this thread, or
    shared out by the parallel loop at `spread` (trampoline.py)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    n, t_in, f_in, c = x.shape
    rows, n_out = out.shape
    k_cols = w.shape[1]
    parts = cols.shape[0]
    tiles = (rows + tile - 1) // tile
    lo = trampoline.nonneg(lo)
    for p in range(lo, hi):
        buf = cols[p]
        for ti in range(p * tiles // parts, (p + 1) * tiles // parts):
            r0 = ti * tile
            m = min(rows, r0 + tile) - r0
            for i in range(m):
                r = r0 + i
                fo = r % f_out
                wt = r // f_out
                to = wt % t_out
                wi = wt // t_out
                j = 0
                for a in range(kt):
                    t = to * stride_t + a * dilation_t - pad_t
                    for b in range(kf):
                        f = fo * stride_f + b - pad_f
                        if t >= 0 and t < t_in and f >= 0 and f < f_in:
                            for ch in range(c):
                                buf[i, j + ch] = x[wi, t, f, ch]
                        else:
                            for ch in range(c):
                                buf[i, j + ch] = np.float32(0.0)
                        j += c
            _sgemm(_ROW_MAJOR, _NO_TRANS, _TRANS, m, n_out, k_cols, np.float32(1.0),
                   buf.ctypes.data, buf.strides[0] // 4, w.ctypes.data, k_cols,
                   np.float32(0.0), out[r0].ctypes.data, n_out)
            for i in range(r0, r0 + m):
                for o in range(n_out):
                    v = out[i, o]
                    if bias.shape[0]:
                        v += bias[o]
                    if residual.shape[0]:
                        v += residual[i, o]
                    out[i, o] = max(v, np.float32(0.0)) if relu else v


def _channels(xp):
    """How many of x's channels one element of the padded input xp holds (_pad)."""


@overload(_channels)
def _channels_of(xp):
    n = 2 if xp.dtype == types.uint32 else 1
    return lambda xp: n


def _element(xp, x, wi, t, f, u):
    """xp's element u of x's position (wi, t, f): channel u, or channels 2u and 2u + 1 as a
    pair of bfloat16 (gemm_bf16.to_pairs's order)."""


@overload(_element)
def _element_of(xp, x, wi, t, f, u):
    if xp.dtype == types.uint32:
        return lambda xp, x, wi, t, f, u: (np.uint32(bf16_of(x[wi, t, f, 2 * u]))
                                           | (np.uint32(bf16_of(x[wi, t, f, 2 * u + 1])) << np.uint32(16)))
    return lambda xp, x, wi, t, f, u: x[wi, t, f, u]


@njit(pipeline_class=trampoline.NoAlias, cache=True)
def _pad_range(lo, hi, spread, chunks, x, xp, pad_t, pad_f):
    """Lines [lo, hi) (window, padded time) of xp (W, T + 2·pad_t, F + 2·pad_f, units), flat: x
    amid zeros, its C channels as C floats (xp f32) or C/2 bfloat16 pairs (xp u32)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    n, t_in, f_in, c = x.shape
    units = c // _channels(xp)
    tp, fp = t_in + 2 * pad_t, f_in + 2 * pad_f
    lo = trampoline.nonneg(lo)
    for wt in range(lo, hi):
        wi, t = wt // tp, wt % tp - pad_t
        at = wt * fp * units
        for f in range(-pad_f, f_in + pad_f):
            inside = 0 <= t < t_in and 0 <= f < f_in
            for u in range(units):
                xp[at + u] = _element(xp, x, wi, t, f, u) if inside else 0
            at += units


@njit(pipeline_class=trampoline.NoAlias, cache=True)
def _direct_range(lo, hi, spread, chunks, xp, tp, fp, c, taps, offs, bias, out, t_out, f_out,
                  stride_t, stride_f, residual, relu):
    """The micro-tiles along lines [lo, hi) of outputs: a (window, time) line along frequency,
    or, for a 1-D convolution (one frequency), a window's line along time. xp: the padded input
    (W, tp, fp, c), flat: f32, or u32 bfloat16 pairs with c counting pairs (_tile)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    ldo = out.strides[0] // 4
    along_f = f_out > 1
    length = f_out if along_f else t_out
    lo = trampoline.nonneg(lo)
    for line in range(lo, hi):
        # floats from one position to the next, computed in the loop: taken from outside it,
        # the value halved the tiles' speed
        if along_f:
            step = stride_f * c
            base = ((line // t_out) * tp + (line % t_out) * stride_t) * fp * c
        else:
            step = stride_t * fp * c
            base = line * tp * fp * c
        r0 = line * length
        for p0 in range(0, length, ROWS):
            for g in range(taps.shape[0]):      # each COLS outputs, over the same inputs in cache
                o = g * COLS
                _tile(xp[base + p0 * step:].ctypes.data, step, offs.ctypes.data, offs.shape[0],
                      taps[g].ctypes.data, c, out[r0 + p0, o:].ctypes.data, ldo, min(ROWS, length - p0),
                      bias[o:].ctypes.data, residual[r0 + p0, o:].ctypes.data if residual.shape[0] else 0,
                      relu, xp[0])


_NO_BIAS = np.empty((0,), np.float32)
_NONE = np.empty((0, 0), np.float32)


def _taps(w, kt, kf, c, bf16):
    """w (groups·COLS, kt·kf·C) as the micro-tile reads it: per group of COLS outputs (tap, C,
    out) f32, or with bf16 (tap, C/2, out, 2) bfloat16 pairs (uint32)."""
    groups = w.shape[0] // COLS
    taps = w.reshape(groups, COLS, kt * kf, c).transpose(0, 2, 3, 1)
    if bf16:
        taps = bf16_array(taps.reshape(groups, kt * kf, c // 2, 2, COLS).transpose(0, 1, 2, 4, 3)).view(np.uint32)
    return np.ascontiguousarray(taps)


def _conv_direct(be, x, w, bias, out, t_out, f_out, kt, kf, stride_t, stride_f, dilation_t,
                 pad_t, pad_f, residual, relu, bf16, keep):
    n, t_in, f_in, c = x.shape
    if residual is not None and residual.strides != out.strides:
        raise ValueError("conv: the micro-tile reads the shortcut at out's strides")
    unit = c // 2 if bf16 else c    # bfloat16: channels in pairs, x's and w's
    tp, fp = t_in + 2 * pad_t, f_in + 2 * pad_f
    step = stride_f * unit if f_out > 1 else stride_t * fp * unit
    # a last tile reads past its line
    xp = be.workspace((n * tp * fp * unit + ROWS * step + unit,), np.uint32 if bf16 else np.float32)
    trampoline.share(_pad_range, n * tp, x, xp, pad_t, pad_f)
    xp[n * tp * fp * unit:] = 0
    taps = None if keep is None else keep.get(("taps", bf16))
    if taps is None:
        taps = _taps(w, kt, kf, c, bf16)
        if keep is not None:
            keep[("taps", bf16)] = taps
    offs = np.array([(a * dilation_t * fp + b) * unit for a in range(kt) for b in range(kf)], np.int64)
    trampoline.share(_direct_range, out.shape[0] // (f_out if f_out > 1 else t_out), xp, tp, fp, unit, taps,
                     offs, np.zeros(w.shape[0], np.float32) if bias is None else bias, out, t_out, f_out,
                     stride_t, stride_f, _NONE if residual is None else residual, relu)


def conv(be, x, w, bias, out, kt, kf, stride_t=1, stride_f=1, dilation_t=1, pad_t=0, pad_f=0,
         residual=None, relu=False, bf16=False, keep=None):
    """out = conv(x) + bias (+ residual) (ReLU), on the host's BLAS in tiles (available()).
    bf16: where the direct micro-tile runs, C is even and the CPU has AVX-512 BF16
    (bf16_available()), x and w rounded to bfloat16 and multiplied in pairs (float32 sums).

    x (W, T, F, C) f32 C-contiguous; w (C_out, kt·kf·C) f32, columns (kt, kf, C); bias (C_out,)
    or None;
    out (W·T_out·F_out, C_out) f32 with T_out = (T + 2·pad_t − dilation_t·(kt − 1) − 1) //
    stride_t + 1 and F_out likewise (no dilation); residual None or out's shape.
    keep: a dict the caller holds for this w, where the micro-tile keeps w in its own layout
    between calls (else made again every call)."""
    n, t_in, f_in, c = x.shape
    t_out = (t_in + 2 * pad_t - dilation_t * (kt - 1) - 1) // stride_t + 1
    f_out = (f_in + 2 * pad_f - (kf - 1) - 1) // stride_f + 1
    rows, k_cols = n * t_out * f_out, kt * kf * c
    if out.shape != (rows, w.shape[0]) or w.shape[1] != k_cols:
        raise ValueError(f"conv: x {x.shape}, w {w.shape} and out {out.shape} do not agree")
    if w.shape[0] % COLS == 0 and (f_out > 1 or f_in == 1) and direct_available():
        _conv_direct(be, x, w, bias, out, t_out, f_out, kt, kf, stride_t, stride_f, dilation_t,
                     pad_t, pad_f, residual, relu, bf16 and c % 2 == 0 and bf16_available(), keep)
        return
    tile = tile_rows(k_cols, rows)
    parts = max(1, min(config.NUMBA_NUM_THREADS, (rows + tile - 1) // tile))
    cols = be.workspace((parts, tile, k_cols))
    trampoline.share(_conv_parts_range, parts, x, w, _NO_BIAS if bias is None else bias, out, t_out, f_out, kt,
                     kf, stride_t, stride_f, dilation_t, pad_t, pad_f, _NONE if residual is None else residual,
                     relu, tile, cols)
