"""CUDA-only fast paths, where one thread per work item leaves the GPU waiting on memory.

    gemm_tiled    out = x @ w.T (+ bias) for many rows (the encoder): 16x16 output tiles, x and w
                  staged through shared memory
    gemv          the same for a few rows (the decoder step): 32 threads share one output, read a
                  weight row coalesced, and add their partial sums in shared memory
    softmax_rows  one block per row: max and sum reduced in shared memory (the portable body walks
                  a whole 1500-key row in one thread, three times)

The GEMMs widen f16 weights where they read them. References: the portable bodies
matmul.linear_elem and reduce.softmax_row; tests/cudasim_check.py compares them under the
simulator. Imported only by the CUDA backend (`cuda` is a module global, as the simulator needs).
No warp shuffles: the simulator has no warps.
"""

import math

import numpy as np
from numba import cuda, float32

TILE = 16        # gemm_tiled: a block computes a TILE x TILE block of out
TILE_ROW = TILE + 1  # shared rows padded by one: no bank conflicts reading ws[tx, k]
GEMV_LANES = 32  # gemv: threads per output
GEMV_OUTS = 8    # gemv: outputs per block
GEMV_MAX_ROWS = 4  # the backend uses gemv up to this many rows of x
SOFTMAX_THREADS = 128  # softmax_rows: threads per row (a power of two)


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


@cuda.jit(cache=True)
def softmax_rows(x, n, scale, nq, causal, q_offset):
    """Block r: x[r, :m] = softmax(scale * x[r, :m]), x[r, m:] = 0; m as in reduce.softmax_row.

    Two passes over the row instead of three: each thread keeps a running (max, sum of exp) over
    its columns, rescaling the sum when the max grows; the block then merges those pairs.
    """
    red_max = cuda.shared.array(SOFTMAX_THREADS, float32)
    red_sum = cuda.shared.array(SOFTMAX_THREADS, float32)
    r = cuda.blockIdx.x
    t = cuda.threadIdx.x
    m = n
    if causal:
        m = min(n, r % nq + q_offset + 1)
    top = np.float32(-math.inf)
    total = np.float32(0.0)
    for c in range(t, m, SOFTMAX_THREADS):
        v = x[r, c]
        if v > top:
            total = total * math.exp((top - v) * scale) + np.float32(1.0)
            top = v
        else:
            total += math.exp((v - top) * scale)
    red_max[t] = top
    red_sum[t] = total
    cuda.syncthreads()
    step = SOFTMAX_THREADS // 2
    while step > 0:
        if t < step:
            other = red_max[t + step]
            if other > red_max[t]:
                red_sum[t] = red_sum[t] * math.exp((red_max[t] - other) * scale) + red_sum[t + step]
                red_max[t] = other
            elif other > np.float32(-math.inf):  # an empty thread's (-inf, 0) adds nothing
                red_sum[t] += red_sum[t + step] * math.exp((other - red_max[t]) * scale)
        cuda.syncthreads()
        step //= 2
    top = red_max[0]
    inv = np.float32(1.0) / red_sum[0]
    for c in range(t, m, SOFTMAX_THREADS):
        x[r, c] = math.exp((x[r, c] - top) * scale) * inv
    for c in range(m + t, n, SOFTMAX_THREADS):
        x[r, c] = np.float32(0.0)


def softmax(x, scale, nq, causal, q_offset):
    """x = masked softmax of scale * x along rows, in place; x (rows, n) f32 on the device."""
    softmax_rows[x.shape[0], SOFTMAX_THREADS](x, x.shape[1], scale, nq, causal, q_offset)


def gemm(x, w, bias, out):
    """out = x @ w.T + bias on the device; bias a (0,) array for none."""
    n, n_in = x.shape
    n_out = w.shape[0]
    if n <= GEMV_MAX_ROWS:
        grid = ((n_out + GEMV_OUTS - 1) // GEMV_OUTS, n)
        gemv[grid, (GEMV_LANES, GEMV_OUTS)](x, w, bias, out, n_in, n_out)
    else:
        grid = ((n_out + TILE - 1) // TILE, (n + TILE - 1) // TILE)
        gemm_tiled[grid, (TILE, TILE)](x, w, bias, out, n, n_in, n_out)
