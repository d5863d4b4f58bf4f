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
"""

import numpy as np
from numba import config, njit, prange

from nwhisper.kernels import blas
from nwhisper.kernels.blas import _NO_TRANS, _ROW_MAJOR, _TRANS, _sgemm

TILE_BYTES = 1 << 18    # a tile's columns: 256 KB, inside any x86 core's L2 beside the weights


def available():
    """Whether the tiles run here: NumPy's OpenBLAS is callable from Numba's threads."""
    return blas.available()


def tile_rows(n_cols, rows):
    """Rows per tile for columns of n_cols floats: TILE_BYTES of them, at least 16."""
    return max(16, min(rows, TILE_BYTES // (4 * n_cols)))


@njit(parallel=True, cache=True)
def _conv_parts(x, w, bias, out, t_out, f_out, kt, kf, stride_t, stride_f, dilation_t, pad_t,
                pad_f, residual, relu, tile, cols):
    n, t_in, f_in, c = x.shape
    rows, n_out = out.shape
    k_cols = w.shape[1]
    parts = cols.shape[0]
    tiles = (rows + tile - 1) // tile
    for p in prange(parts):
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


_NO_BIAS = np.empty((0,), np.float32)
_NONE = np.empty((0, 0), np.float32)


def conv(be, x, w, bias, out, kt, kf, stride_t=1, stride_f=1, dilation_t=1, pad_t=0, pad_f=0,
         residual=None, relu=False):
    """out = conv(x) + bias (+ residual) (ReLU), on the host's BLAS in tiles (available()).

    x (W, T, F, C) f32 C-contiguous; w (C_out, kt·kf·C) f32, columns (kt, kf, C); bias (C_out,)
    or None;
    out (W·T_out·F_out, C_out) f32 with T_out = (T + 2·pad_t − dilation_t·(kt − 1) − 1) //
    stride_t + 1 and F_out likewise (no dilation); residual None or out's shape."""
    n, t_in, f_in, c = x.shape
    t_out = (t_in + 2 * pad_t - dilation_t * (kt - 1) - 1) // stride_t + 1
    f_out = (f_in + 2 * pad_f - (kf - 1) - 1) // stride_f + 1
    rows, k_cols = n * t_out * f_out, kt * kf * c
    if out.shape != (rows, w.shape[0]) or w.shape[1] != k_cols:
        raise ValueError(f"conv: x {x.shape}, w {w.shape} and out {out.shape} do not agree")
    tile = tile_rows(k_cols, rows)
    parts = max(1, min(config.NUMBA_NUM_THREADS, (rows + tile - 1) // tile))
    cols = be.workspace((parts, tile, k_cols))
    _conv_parts(x, w, _NO_BIAS if bias is None else bias, out, t_out, f_out, kt, kf, stride_t, stride_f, dilation_t, pad_t,
                pad_f, _NONE if residual is None else residual, relu, tile, cols)
