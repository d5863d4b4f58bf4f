"""CUDA-only GEMM fast paths: out[r, o] = x[r, :] . w[o, :] (+ bias[o]).

    gemm_tiled  many rows (the encoder): 16x16 output tiles, x and w staged through shared memory
    gemv        a few rows (the decoder step): 32 threads share one output, reading a weight row
                coalesced, and add their partial sums in shared memory

Both widen f16 weights where they read them. Their reference is the portable body
matmul.linear_elem; tests/cudasim_check.py compares them under the simulator. Imported only by
the CUDA backend (`cuda` is a module global, as the simulator needs). No warp shuffles: the
simulator has no warps.
"""

import numpy as np
from numba import cuda, float32

TILE = 16        # gemm_tiled: a block computes a TILE x TILE block of out
TILE_ROW = TILE + 1  # shared rows padded by one: no bank conflicts reading ws[tx, k]
GEMV_LANES = 32  # gemv: threads per output
GEMV_OUTS = 8    # gemv: outputs per block
GEMV_MAX_ROWS = 4  # the backend uses gemv up to this many rows of x


@cuda.jit(cache=True)
def gemm_tiled(x, w, bias, out, n, n_in, n_out):
    """Block (bx, by) of TILE x TILE threads computes out[by*TILE + ty, bx*TILE + tx]."""
    xs = cuda.shared.array((TILE, TILE_ROW), float32)  # a shape must be constants, not TILE + 1
    ws = cuda.shared.array((TILE, TILE_ROW), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    r = cuda.blockIdx.y * TILE + ty
    o = cuda.blockIdx.x * TILE + tx
    w_row = cuda.blockIdx.x * TILE + ty  # the weight row this thread stages
    acc = np.float32(0.0)
    for c0 in range(0, n_in, TILE):
        c = c0 + tx
        xs[ty, tx] = x[r, c] if r < n and c < n_in else np.float32(0.0)
        ws[ty, tx] = np.float32(w[w_row, c]) if w_row < n_out and c < n_in else np.float32(0.0)
        cuda.syncthreads()
        for k in range(TILE):
            acc += xs[ty, k] * ws[tx, k]
        cuda.syncthreads()
    if r < n and o < n_out:
        if bias.shape[0] > 0:
            acc += np.float32(bias[o])
        out[r, o] = acc


@cuda.jit(cache=True)
def gemv(x, w, bias, out, n_in, n_out):
    """Block (bx, r) of GEMV_LANES x GEMV_OUTS threads computes out[r, bx*GEMV_OUTS + ty]."""
    part = cuda.shared.array((GEMV_OUTS, GEMV_LANES), float32)
    lane = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    o = cuda.blockIdx.x * GEMV_OUTS + ty
    r = cuda.blockIdx.y
    acc = np.float32(0.0)
    if o < n_out:
        for c in range(lane, n_in, GEMV_LANES):
            acc += x[r, c] * np.float32(w[o, c])
    part[ty, lane] = acc
    cuda.syncthreads()
    step = GEMV_LANES // 2
    while step > 0:
        if lane < step:
            part[ty, lane] += part[ty, lane + step]
        cuda.syncthreads()
        step //= 2
    if lane == 0 and o < n_out:
        acc = part[ty, 0]
        if bias.shape[0] > 0:
            acc += np.float32(bias[o])
        out[r, o] = acc


def launch(x, w, bias, out):
    """out = x @ w.T + bias on the device; bias a (0,) array for none."""
    n, n_in = x.shape
    n_out = w.shape[0]
    if n <= GEMV_MAX_ROWS:
        grid = ((n_out + GEMV_OUTS - 1) // GEMV_OUTS, n)
        gemv[grid, (GEMV_LANES, GEMV_OUTS)](x, w, bias, out, n_in, n_out)
    else:
        grid = ((n_out + TILE - 1) // TILE, (n + TILE - 1) // TILE)
        gemm_tiled[grid, (TILE, TILE)](x, w, bias, out, n, n_in, n_out)
