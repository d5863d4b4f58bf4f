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
front end's 3 × 3 convolutions 1.4-1.9 times as fast.

A speaker network beside a bfloat16 or int8 model asks for less precise arithmetic, which the
tile gives where the CPU has it (arithmetic_for): with AVX-512 BF16 the padded input holds the
channels as bfloat16 pairs and `vdpbf16ps` multiplies a pair in each lane (twice float32's
multiply-adds an instruction; float32 sums, as gemm_bf16's); for int8, with AVX-512 VNNI, it
holds them as quads of unsigned bytes, each window scaled by its largest value (every input but
CAM++'s first follows a ReLU), the weights as signed bytes per output, and `vpdpbusd` sums a
quad's products in each lane (four times float32's; exact int32 sums, scaled back in the
epilogue, as gemm_int8's). The padding pass is then a window at a time: its largest value, then
its bytes, while the window is in cache.
"""

import functools

import numpy as np
from llvmlite import ir
from numba import config, njit, types
from numba.extending import intrinsic, overload

from nwhisper.kernels import blas, gemm_bf16, gemm_int8, trampoline
from nwhisper.kernels import llvm_ir as L
from nwhisper.kernels.blas import _NO_TRANS, _ROW_MAJOR, _TRANS, _sgemm
from nwhisper.kernels.vecmath import bf16 as bf16_of
from nwhisper.kernels.vecmath import bf16_array, from_key, order_key

TILE_BYTES = 1 << 18    # a tile's columns: 256 KB, inside any x86 core's L2 beside the weights
ROWS = 10               # output positions per micro-tile: 10 × 2 accumulators, 2 weight vectors
COLS = 32               # its output channels: two 16-lane vectors
# How the tile multiplies: the padded input's element type, and how many channels one holds
ARITHMETIC = {"float32": (np.float32, 1), "bfloat16": (np.uint32, 2), "int8": (np.int32, 4)}


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


def int8_available():
    """Whether the micro-tile can multiply bytes here (AVX-512 VNNI's vpdpbusd: gemm_int8's)."""
    return direct_available() and gemm_int8.isa() == "avx512vnni"


def arithmetic_for(asked, c):
    """The arithmetic a convolution of c input channels gets when `asked` for one: int8 where
    the CPU has VNNI and c is a multiple of 4, else bfloat16 where it has BF16 and c is even
    (for either one asked), else float32."""
    if asked == "int8" and c % 4 == 0 and int8_available():
        return "int8"
    if asked in ("int8", "bfloat16") and c % 2 == 0 and bf16_available():
        return "bfloat16"
    return "float32"


@intrinsic
def _tile(typingctx, x_addr, lda, offs_addr, taps, w_addr, c, out_addr, ldo, rows, bias_addr, sw_addr, sx,
          res_addr, relu, unit):
    """out[r, o] = Σ_tap Σ_ch x[r·lda + offs[tap] + ch] · w[tap, ch, o] + bias[o] (+ res[r, o])
    (ReLU) for r < rows (≤ ROWS), o < COLS; out, bias and res (0: none; out's row stride) f32
    addresses, offs i64. `unit`, an element of x, picks the arithmetic by its type: float32, x
    and w f32 and an FMA per channel (strides in floats); uint32, x's channels in bfloat16 pairs
    (lda, offs and c counted in pairs), w (tap, pair, o, 2) bfloat16, `vdpbf16ps` multiplying a
    pair in each lane (float32 sums); int32, x's channels in quads of unsigned bytes, w (tap,
    quad, o, 4) signed bytes, `vpdpbusd` summing a quad's products in each lane (exact int32
    sums), the sums times sx · sw[o] (sw: an f32 address; the scales x and w were quantised by)."""
    sig = types.void(types.uintp, types.intp, types.uintp, types.intp, types.uintp, types.intp,
                     types.uintp, types.intp, types.intp, types.uintp, types.uintp, types.float32,
                     types.uintp, types.boolean, unit)

    def codegen(context, builder, signature, args):
        (x_addr, lda, offs_addr, taps, w_addr, c, out_addr, ldo, rows, bias_addr, sw_addr, sx,
         res_addr, relu, _) = args
        f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
        vec = ir.VectorType(f32, 16)
        elem = f32 if unit == types.float32 else i32
        wvec = ir.VectorType(elem, 16)
        acc_t = ir.VectorType(i32, 16) if unit == types.int32 else vec
        if unit == types.int32:
            dot = L.declare(builder, "llvm.x86.avx512.vpdpbusd.512", acc_t, [acc_t, wvec, wvec])
            madd = lambda a, b, acc: builder.call(dot, [acc, a, b])  # noqa: E731
        elif unit == types.uint32:   # LLVM's own signature takes <32 x bfloat>; the <16 x i32> form is upgraded
            dot = L.declare(builder, "llvm.x86.avx512bf16.dpbf16ps.512", vec, [vec, wvec, wvec])
            madd = lambda a, b, acc: builder.call(dot, [acc, a, b])  # noqa: E731
        else:
            fma = L.declare(builder, "llvm.fma.v16f32", vec, [vec, vec, vec])
            madd = lambda a, b, acc: builder.call(fma, [a, b, acc])  # noqa: E731
        k = lambda v: ir.Constant(i64, v)  # noqa: E731
        at = lambda addr, t=f32: builder.inttoptr(addr, t.as_pointer())  # noqa: E731
        x, w, out, bias = at(x_addr, elem), at(w_addr, elem), at(out_addr), at(bias_addr)
        offs = builder.inttoptr(offs_addr, i64.as_pointer())

        tap, sums, close_tap = L.counted_loop(builder, taps, 1, [ir.Constant(acc_t, None)] * (2 * ROWS), "conv.tap")
        off = builder.load(builder.gep(offs, [tap]))
        w_tap = builder.mul(builder.mul(tap, c), k(COLS))
        ch, acc, close_ch = L.counted_loop(builder, c, 1, sums, "conv.ch")
        w_row = builder.add(w_tap, builder.mul(ch, k(COLS)))
        wv = [builder.load(L.vector_at(builder, w, builder.add(w_row, k(16 * j)), wvec), align=4)
              for j in range(2)]
        col = builder.add(off, ch)
        # the step through an empty asm at every channel: LLVM would otherwise hoist an address
        # a row out of the loop, more than the registers, and spill them at every channel; this
        # way the rows are addressed off one register, scaled (2 × faster)
        step = builder.asm(ir.FunctionType(i64, [i64]), "", "=r,0", [lda], side_effect=True)
        new = []
        for r in range(ROWS):
            a = builder.load(builder.gep(x, [builder.add(builder.mul(k(r), step), col)]))
            a = L.splat(builder, a, wvec)
            new += [madd(a, wv[j], acc[2 * r + j]) for j in range(2)]
        sums = close_tap(close_ch(new))
        if unit == types.int32:     # the integer sums back to the floats' scale
            sw = [builder.load(L.vector_at(builder, at(sw_addr), k(16 * j), vec), align=4) for j in range(2)]
            scales = [builder.fmul(L.splat(builder, sx, vec), v) for v in sw]
            sums = [builder.fmul(builder.sitofp(v, vec), scales[i % 2]) for i, v in enumerate(sums)]
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
    n = {types.float32: 1, types.uint32: 2, types.int32: 4}[xp.dtype]
    return lambda xp: n


def _element(xp, line, u, inv):
    """xp's element u of a line of x's values (frequency, channel): value u; or values 2u and
    2u + 1 as a pair of bfloat16 (gemm_bf16.to_pairs's order); or values 4u … 4u + 3 as
    unsigned bytes, round(x · inv) each (x ≥ 0), the first in the lowest byte."""


@overload(_element)
def _element_of(xp, line, u, inv):
    if xp.dtype == types.int32:
        def quad(xp, line, u, inv):
            four = np.uint32(0)
            for b in range(4):   # clamped to 0 … 255 first, then rounded half up
                v = min(max(line[4 * u + b] * inv, np.float32(0.0)), np.float32(255.0))
                four |= np.uint32(v + np.float32(0.5)) << np.uint32(8 * b)
            return np.int32(four)
        return quad
    if xp.dtype == types.uint32:
        return lambda xp, line, u, inv: (np.uint32(bf16_of(line[2 * u]))
                                         | (np.uint32(bf16_of(line[2 * u + 1])) << np.uint32(16)))
    return lambda xp, line, u, inv: line[u]


@njit(cache=True)
def _pad_lines(x, xp, lo, hi, pad_t, pad_f, inv):
    """Lines [lo, hi) (window, padded time) of xp (W, T + 2·pad_t, F + 2·pad_f, units), flat: x
    amid zeros, its C channels as C floats (xp f32), C/2 bfloat16 pairs (xp u32) or C/4 byte
    quads (xp i32, each value times inv: the lines are one window's). Without padding over
    frequency a window's lines are one run in both, taken at once (a view a line cost more than
    the copy of a 1-D convolution's short line)."""
    n, t_in, f_in, c = x.shape
    units = c // _channels(xp)
    tp, fp = t_in + 2 * pad_t, f_in + 2 * pad_f
    wt = lo
    while wt < hi:
        wi, t = wt // tp, wt % tp - pad_t
        if t < 0 or t >= t_in:
            xp[wt * fp * units:(wt + 1) * fp * units] = 0
            wt += 1
            continue
        run = 1 if pad_f else min(hi - wt, t_in - t)
        lines = xp[wt * fp * units:(wt + run) * fp * units]
        lines[:pad_f * units] = 0
        lines[(pad_f + f_in) * units:] = 0
        inside = lines[pad_f * units:pad_f * units + run * f_in * units]
        values = x[wi, t:t + run].reshape(run * f_in * c)
        for u in range(run * f_in * units):
            inside[u] = _element(xp, values, u, inv)
        wt += run


@njit(pipeline_class=trampoline.NoAlias, cache=True)
def _pad_range(lo, hi, spread, chunks, x, xp, pad_t, pad_f):
    """_pad_lines over lines [lo, hi) of floats or bfloat16 pairs (shared out at `spread`)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    _pad_lines(x, xp, trampoline.nonneg(lo), hi, pad_t, pad_f, np.float32(1.0))


@njit(pipeline_class=trampoline.NoAlias, cache=True)
def _pad_windows_range(lo, hi, spread, chunks, x, xp, pad_t, pad_f, sx):
    """Windows [lo, hi) of x (≥ 0) as byte quads: sx[wi] = the window's largest value / 255
    (1 for zeros), then _pad_lines over its lines, the bytes round(x / sx[wi]). A window at a
    time, so the second pass reads it from the core's cache."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    n, t_in, f_in, c = x.shape
    tp = t_in + 2 * pad_t
    for wi in range(trampoline.nonneg(lo), hi):
        values = x[wi].reshape(t_in * f_in * c)
        top = order_key(np.float32(0.0))    # the largest as integer keys: it vectorises
        for i in range(values.size):
            key = order_key(values[i])
            top = key if key > top else top
        top_value = from_key(top)
        scale = top_value / np.float32(255.0) if top_value > np.float32(0.0) else np.float32(1.0)
        sx[wi] = scale
        _pad_lines(x, xp, wi * tp, (wi + 1) * tp, pad_t, pad_f, np.float32(1.0) / scale)


@njit(pipeline_class=trampoline.NoAlias, cache=True)
def _direct_range(lo, hi, spread, chunks, xp, tp, fp, c, taps, offs, bias, sx, sw, out, t_out, f_out,
                  stride_t, stride_f, residual, relu):
    """The micro-tiles along lines [lo, hi) of outputs: a (window, time) line along frequency,
    or, for a 1-D convolution (one frequency), a window's line along time. xp: the padded input
    (W, tp, fp, c), flat: f32, u32 bfloat16 pairs or i32 byte quads, c counting its elements
    (_tile); sx, sw: the scales of int8's windows and outputs."""
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
            wi = line // t_out
            step = stride_f * c
            base = (wi * tp + (line % t_out) * stride_t) * fp * c
        else:
            wi = line
            step = stride_t * fp * c
            base = line * tp * fp * c
        r0 = line * length
        for p0 in range(0, length, ROWS):
            for g in range(taps.shape[0]):      # each COLS outputs, over the same inputs in cache
                o = g * COLS
                _tile(xp[base + p0 * step:].ctypes.data, step, offs.ctypes.data, offs.shape[0],
                      taps[g].ctypes.data, c, out[r0 + p0, o:].ctypes.data, ldo, min(ROWS, length - p0),
                      bias[o:].ctypes.data, sw[o:].ctypes.data, sx[wi],
                      residual[r0 + p0, o:].ctypes.data if residual.shape[0] else 0, relu, xp[0])


_NO_BIAS = np.empty((0,), np.float32)
_NONE = np.empty((0, 0), np.float32)


def _taps(w, kt, kf, c, arithmetic):
    """(taps, sw): w (groups·COLS, kt·kf·C) as the micro-tile reads it, per group of COLS
    outputs: float32 (tap, C, out); bfloat16 (tap, C/2, out, 2) pairs (as uint32); int8 (tap,
    C/4, out, 4) signed bytes (as int32), each output's row quantised by its own scale sw[o] =
    max|w[o]| / 127 (else ones)."""
    groups = w.shape[0] // COLS
    sw = np.ones(w.shape[0], np.float32)
    if arithmetic == "int8":
        sw = np.abs(w).max(axis=1) / np.float32(127)
        sw[sw == 0] = 1
        w = np.clip(np.round(w / sw[:, None]), -127, 127).astype(np.int8)
    taps = w.reshape(groups, COLS, kt * kf, c).transpose(0, 2, 3, 1)
    if arithmetic != "float32":
        per = ARITHMETIC[arithmetic][1]
        taps = taps.reshape(groups, kt * kf, c // per, per, COLS).transpose(0, 1, 2, 4, 3)
        taps = bf16_array(taps).view(np.uint32) if arithmetic == "bfloat16" else np.ascontiguousarray(taps).view(np.int32)
    return np.ascontiguousarray(taps), sw.astype(np.float32)


def _conv_direct(be, x, w, bias, out, t_out, f_out, kt, kf, stride_t, stride_f, dilation_t,
                 pad_t, pad_f, residual, relu, arithmetic, keep):
    n, t_in, f_in, c = x.shape
    if residual is not None and residual.strides != out.strides:
        raise ValueError("conv: the micro-tile reads the shortcut at out's strides")
    dtype, per = ARITHMETIC[arithmetic]
    unit = c // per         # the padded input's elements a position: channels, pairs or quads
    tp, fp = t_in + 2 * pad_t, f_in + 2 * pad_f
    step = stride_f * unit if f_out > 1 else stride_t * fp * unit
    sx = np.ones(n, np.float32)
    # a last tile reads past its line
    xp = be.workspace((n * tp * fp * unit + ROWS * step + unit,), dtype)
    if arithmetic == "int8":
        trampoline.share(_pad_windows_range, n, x, xp, pad_t, pad_f, sx)
    else:
        trampoline.share(_pad_range, n * tp, x, xp, pad_t, pad_f)
    xp[n * tp * fp * unit:] = 0
    taps = None if keep is None else keep.get(("taps", arithmetic))
    if taps is None:
        taps = _taps(w, kt, kf, c, arithmetic)
        if keep is not None:
            keep[("taps", arithmetic)] = taps
    offs = np.array([(a * dilation_t * fp + b) * unit for a in range(kt) for b in range(kf)], np.int64)
    trampoline.share(_direct_range, out.shape[0] // (f_out if f_out > 1 else t_out), xp, tp, fp, unit, taps[0],
                     offs, np.zeros(w.shape[0], np.float32) if bias is None else bias, sx, taps[1], out,
                     t_out, f_out, stride_t, stride_f, _NONE if residual is None else residual, relu)


def conv(be, x, w, bias, out, kt, kf, stride_t=1, stride_f=1, dilation_t=1, pad_t=0, pad_f=0,
         residual=None, relu=False, arithmetic="float32", keep=None):
    """out = conv(x) + bias (+ residual) (ReLU), on the host's BLAS in tiles (available()).
    arithmetic, where the direct micro-tile runs (arithmetic_for says which it gets): "float32";
    "bfloat16", x and w rounded to bfloat16 and multiplied in pairs (float32 sums); "int8", for
    x ≥ 0 (an input after a ReLU), each window of x quantised to unsigned bytes by its largest
    value, w to signed bytes per output row, their products summed exactly in int32.

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
                     pad_t, pad_f, residual, relu, arithmetic_for(arithmetic, c), keep)
        return
    tile = tile_rows(k_cols, rows)
    parts = max(1, min(config.NUMBA_NUM_THREADS, (rows + tile - 1) // tile))
    cols = be.workspace((parts, tile, k_cols))
    trampoline.share(_conv_parts_range, parts, x, w, _NO_BIAS if bias is None else bias, out, t_out, f_out, kt,
                     kf, stride_t, stride_f, dilation_t, pad_t, pad_f, _NONE if residual is None else residual,
                     relu, tile, cols)
