"""CUDA-only fast paths, where one thread per work item leaves the GPU waiting on memory.

    gemm_tiled    out = x @ w.T (+ bias) for many rows (the encoder): 16x16 output tiles, x and w
                  staged through shared memory
    gemv          the same for a few rows (the decoder step): 32 to 256 threads share one output,
                  read a weight row coalesced, and add their partial sums in shared memory
    softmax_rows  one block per row: max and sum reduced in shared memory (the portable body walks
                  a whole 1500-key row in one thread, three times)
    layernorm_rows  one block per row, the same way (a decoder step normalises single rows: one
                  thread walking 384 columns three times is latency, not work)
    attend_part, attend_join   a few queries' attention (the decoder step): a block per (head,
                  query, chunk of keys) scores its keys, exps them against its own largest and
                  sums their values; one per (head, query) merges the chunks (split-K, as flash
                  decoding does) -- two launches instead of three, and the GPU's every
                  multiprocessor busy where one block per head kept a handful
    scores_tiled, values_tiled   many queries' (the encoder, a prompt): gemm_tiled's tiles with
                  the head as the grid's third dimension, softmax_rows between them

The GEMMs widen f16 weights where they read them. References: the portable bodies
matmul.linear_elem, reduce.softmax_row, norm.layernorm_row and attention.attention_portable's;
tests/helpers/cudasim_check.py compares them under the simulator, and on a GPU with --gpu. Imported only
by the CUDA backend (`cuda` is a module global, as the simulator needs). No warp shuffles: the
simulator has no warps. No device functions either: the block reductions are written out in each
kernel, because compiling a kernel that calls one needs a driver, and the test suite checks this
module's PTX on machines without one.
"""

import math

import numpy as np
from numba import cuda, float32

TILE = 16        # gemm_tiled: a block computes a TILE x TILE block of out
TILE_ROW = TILE + 1  # shared rows padded by one: no bank conflicts reading ws[tx, k]
GEMV_THREADS = 256  # gemv: threads per block, shared by GEMV_THREADS // lanes outputs
# gemv gives each output the fewest lanes (32 up to GEMV_THREADS) that still make this many
# blocks: a decoder layer's 384 outputs at 32 lanes were 48 blocks, a few warps per
# multiprocessor each walking its row serially (latency-bound); the vocabulary's 51864 are
# plenty at 32.
GEMV_MIN_BLOCKS = 512
GEMV_MAX_ROWS = 4  # the backend uses gemv up to this many rows of x
SOFTMAX_THREADS = 128  # softmax_rows: threads per row (a power of two)
ROW_THREADS = 128  # layernorm_rows: threads per row (a power of two)
# attend_part / attend_join: a few queries' attention split over blocks of ATTEND_KEYS keys each
# (a decoder step has only H (head, query) pairs: one block each left the H200 latency-bound, ~70
# µs per launch over the cross-attention's 1500 keys, on 6 of its 132 multiprocessors)
ATTEND_KEYS = 32       # a power of two
ATTEND_SPLIT = 16      # threads per key's score, a power of two
# threads per block: ATTEND_KEYS * ATTEND_SPLIT, >= ATTEND_HD and >= ATTEND_MAX_CHUNKS. Enough
# that a score and a chunk's value sums are a few loads per thread (a thread waits out each load
# of a loop in turn).
ATTEND_THREADS = 512
ATTEND_HD = 128        # the widest head they take (Whisper's are 64)
ATTEND_MAX_CHUNKS = 64   # ... and the most keys: ATTEND_MAX_CHUNKS * ATTEND_KEYS (1500 are 47)
ATTEND_MAX_ROWS = 4   # the backend uses them up to this many queries


@cuda.jit(cache=True)
def gemm_tiled(x, w, bias, out, n, n_in, n_out, accumulate):
    """Block (bx, by) of TILE x TILE threads computes out[by*TILE + ty, bx*TILE + tx] (adds it to
    what is there when `accumulate`)."""
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
        out[r, o] = out[r, o] + acc if accumulate else acc


@cuda.jit(cache=True)
def gemv(x, w, bias, out, n_in, n_out, accumulate, lanes, ln_w, ln_b, eps):
    """Block (bx, r) of GEMV_THREADS threads, `lanes` of them per output (a power of two): they
    compute out[r, bx*outs + t // lanes], outs = GEMV_THREADS // lanes, each lane summing every
    lanes-th column, then their partial sums in shared memory (adds the result to what is in
    out when `accumulate`). With ln_w not empty, of LayerNorm(x[r]) (ln_w, ln_b, eps): the block
    first reduces the row's mean and variance as layernorm_rows does, and normalises each
    column where it reads it (the normalised row is never stored: one launch instead of two)."""
    part = cuda.shared.array(GEMV_THREADS, float32)
    t = cuda.threadIdx.x
    ty = t // lanes
    lane = t - ty * lanes
    o = cuda.blockIdx.x * (GEMV_THREADS // lanes) + ty
    r = cuda.blockIdx.y
    norm = ln_w.shape[0] > 0
    mean = np.float32(0.0)
    inv = np.float32(1.0)
    if norm:
        var = np.float32(0.0)
        for stage in range(2):  # the sum (mean is 0: d is x), then the squared deviations
            acc = np.float32(0.0)
            for c in range(t, n_in, GEMV_THREADS):
                d = x[r, c] - mean
                acc += d if stage == 0 else d * d
            part[t] = acc
            cuda.syncthreads()
            step = GEMV_THREADS // 2
            while step > 0:
                if t < step:
                    part[t] += part[t + step]
                cuda.syncthreads()
                step //= 2
            if stage == 0:
                mean = part[0] / np.float32(n_in)
            else:
                var = part[0] / np.float32(n_in)
            cuda.syncthreads()  # every thread has read part[0] before it is reused
        inv = np.float32(1.0) / math.sqrt(var + eps)
    acc = np.float32(0.0)
    if o < n_out and norm:
        for c in range(lane, n_in, lanes):
            acc += ((x[r, c] - mean) * inv * ln_w[c] + ln_b[c]) * np.float32(w[o, c])
    elif o < n_out:
        # four columns a turn, their loads first: a warp then waits for memory once a turn
        # instead of once a column (Numba leaves this loop rolled). The sum's order is the
        # rolled loop's.
        c = lane
        while c + 3 * lanes < n_in:
            w0 = np.float32(w[o, c])
            w1 = np.float32(w[o, c + lanes])
            w2 = np.float32(w[o, c + 2 * lanes])
            w3 = np.float32(w[o, c + 3 * lanes])
            acc += x[r, c] * w0
            acc += x[r, c + lanes] * w1
            acc += x[r, c + 2 * lanes] * w2
            acc += x[r, c + 3 * lanes] * w3
            c += 4 * lanes
        while c < n_in:
            acc += x[r, c] * np.float32(w[o, c])
            c += lanes
    part[t] = acc
    cuda.syncthreads()
    step = lanes // 2
    while step > 0:
        if lane < step:
            part[t] += part[t + step]
        cuda.syncthreads()
        step //= 2
    if lane == 0 and o < n_out:
        acc = part[t]
        if bias.shape[0] > 0:
            acc += np.float32(bias[o])
        out[r, o] = out[r, o] + acc if accumulate else acc


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


@cuda.jit(cache=True)
def layernorm_rows(x, w, b, out, n, eps):
    """Block r: out[r] = (x[r] - mean) / sqrt(var + eps) * w + b, as norm.layernorm_row's passes
    (out may be x: each thread writes only the columns it alone reads)."""
    red = cuda.shared.array(ROW_THREADS, float32)
    r = cuda.blockIdx.x
    t = cuda.threadIdx.x
    mean = np.float32(0.0)
    var = np.float32(0.0)
    for stage in range(2):  # the sum (mean is 0: d is x), then the squared deviations
        acc = np.float32(0.0)
        for c in range(t, n, ROW_THREADS):
            d = x[r, c] - mean
            acc += d if stage == 0 else d * d
        red[t] = acc
        cuda.syncthreads()
        step = ROW_THREADS // 2
        while step > 0:
            if t < step:
                red[t] += red[t + step]
            cuda.syncthreads()
            step //= 2
        if stage == 0:
            mean = red[0] / np.float32(n)
        else:
            var = red[0] / np.float32(n)
        cuda.syncthreads()  # every thread has read red[0] before it is reused
    inv = np.float32(1.0) / math.sqrt(var + eps)
    for c in range(t, n, ROW_THREADS):
        out[r, c] = (x[r, c] - mean) * inv * w[c] + b[c]


@cuda.jit(cache=True)
def attend_part(q, k, v, p, part, nq, nk, hd, scale, causal, q_offset, at):
    """Block (c, r), r = h * nq + qi: query qi's attention in head h over keys c*ATTEND_KEYS …
    (c+1)*ATTEND_KEYS - 1 that it sees (masked as softmax_rows, offset q_offset + at[0]): the raw
    scores into p[h, qi, j]; into part[r, c] this chunk's largest score, the sum of exp(scale *
    (score - largest)), and those weights' sum of the value rows (hd). attend_join merges the
    chunks. ATTEND_SPLIT threads share a key's score (each a few of its columns: no thread walks
    a whole row), and every sum and maximum of the block is a tree in shared memory."""
    red = cuda.shared.array(ATTEND_THREADS, float32)
    w = cuda.shared.array(ATTEND_KEYS, float32)
    c = cuda.blockIdx.x
    r = cuda.blockIdx.y
    t = cuda.threadIdx.x
    h = r // nq
    qi = r - h * nq
    base = h * hd
    m = nk
    if causal:
        m = min(nk, qi + q_offset + at[0] + 1)
    j0 = c * ATTEND_KEYS
    n = min(ATTEND_KEYS, m - j0)   # keys of this chunk that the query sees (<= 0: none)
    jj = t // ATTEND_SPLIT
    sub = t - jj * ATTEND_SPLIT
    acc = np.float32(0.0)
    if jj < n:
        for cc in range(sub, hd, ATTEND_SPLIT):
            acc += q[qi, base + cc] * k[j0 + jj, base + cc]
    red[t] = acc
    cuda.syncthreads()
    step = ATTEND_SPLIT // 2
    while step > 0:
        if sub < step:
            red[t] += red[t + step]
        cuda.syncthreads()
        step //= 2
    score = np.float32(-math.inf)
    if t < ATTEND_KEYS and t < n:
        score = red[t * ATTEND_SPLIT]
        p[h, qi, j0 + t] = score
    cuda.syncthreads()     # every key's sum read before red is reused
    if t < ATTEND_KEYS:
        red[t] = score
    cuda.syncthreads()
    step = ATTEND_KEYS // 2
    while step > 0:        # the chunk's largest score
        if t < step:
            red[t] = max(red[t], red[t + step])
        cuda.syncthreads()
        step //= 2
    top = red[0]
    cuda.syncthreads()
    if t < ATTEND_KEYS:
        e = math.exp((score - top) * scale) if t < n else np.float32(0.0)
        w[t] = e
        red[t] = e
    cuda.syncthreads()
    step = ATTEND_KEYS // 2
    while step > 0:        # their sum
        if t < step:
            red[t] += red[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        part[r, c, 0] = top
        part[r, c, 1] = red[0]
    cuda.syncthreads()
    # values: thread t sums column t % hd over every G-th key of the chunk, G = threads // hd
    groups = ATTEND_THREADS // hd
    g = t // hd
    col = t - g * hd
    acc = np.float32(0.0)
    if g < groups:
        for i in range(g, n, groups):
            acc += w[i] * v[j0 + i, base + col]
    red[t] = acc
    cuda.syncthreads()
    if t < hd:
        acc = np.float32(0.0)
        for gi in range(groups):
            acc += red[gi * hd + t]
        part[r, c, 2 + t] = acc


@cuda.jit(cache=True)
def attend_join(p, part, out, nq, nk, hd, scale, causal, q_offset, at):
    """Block (c, r), r = h * nq + qi: attend_part's chunks merged, each weighted by exp(scale *
    (its largest - the largest)). Every block normalises its chunk's p[h, qi] into probabilities
    (0 where masked); block 0 also writes out[qi, h*hd + c] = the chunks' weighted value sums /
    their weighted exp sums. The chunks' (largest, sum) pairs are read at once, one per thread,
    and reduced as trees in shared memory (a loop of global loads in one thread waits out each)."""
    tops = cuda.shared.array(ATTEND_MAX_CHUNKS, float32)
    weights = cuda.shared.array(ATTEND_MAX_CHUNKS, float32)
    red = cuda.shared.array(ATTEND_THREADS, float32)
    c = cuda.blockIdx.x
    r = cuda.blockIdx.y
    t = cuda.threadIdx.x
    h = r // nq
    qi = r - h * nq
    m = nk
    if causal:
        m = min(nk, qi + q_offset + at[0] + 1)
    used = (m + ATTEND_KEYS - 1) // ATTEND_KEYS   # chunks past the mask hold nothing
    if t < ATTEND_MAX_CHUNKS:
        top_t = part[r, t, 0] if t < used else np.float32(-math.inf)
        tops[t] = top_t
        red[t] = top_t
    cuda.syncthreads()
    step = ATTEND_MAX_CHUNKS // 2
    while step > 0:
        if t < step:
            red[t] = max(red[t], red[t + step])
        cuda.syncthreads()
        step //= 2
    top = red[0]
    cuda.syncthreads()
    if t < ATTEND_MAX_CHUNKS:
        wt = math.exp((tops[t] - top) * scale) if t < used else np.float32(0.0)
        weights[t] = wt
        red[t] = part[r, t, 1] * wt if t < used else np.float32(0.0)
    cuda.syncthreads()
    step = ATTEND_MAX_CHUNKS // 2
    while step > 0:
        if t < step:
            red[t] += red[t + step]
        cuda.syncthreads()
        step //= 2
    inv = np.float32(1.0) / red[0]
    cuda.syncthreads()
    j = c * ATTEND_KEYS + t
    if t < ATTEND_KEYS and j < nk:
        p[h, qi, j] = math.exp((p[h, qi, j] - top) * scale) * inv if j < m else np.float32(0.0)
    if c == 0:   # the same for the whole block: its syncthreads are reached by every thread
        groups = ATTEND_THREADS // hd   # thread t sums column t % hd over every G-th chunk
        g = t // hd
        col = t - g * hd
        acc = np.float32(0.0)
        if g < groups:
            for i in range(g, used, groups):
                acc += part[r, i, 2 + col] * weights[i]
        red[t] = acc
        cuda.syncthreads()
        if t < hd:
            acc = np.float32(0.0)
            for gi in range(groups):
                acc += red[gi * hd + t]
            out[qi, h * hd + t] = acc * inv


@cuda.jit(cache=True)
def scores_tiled(q, k, s, nq, nk, hd):
    """Block (bx, by, h): s[h, by*TILE + ty, bx*TILE + tx] = q[row, h*hd:] . k[key, h*hd:] --
    gemm_tiled with one head's columns of q and k."""
    qs = cuda.shared.array((TILE, TILE_ROW), float32)
    ks = cuda.shared.array((TILE, TILE_ROW), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    base = cuda.blockIdx.z * hd
    r = cuda.blockIdx.y * TILE + ty
    o = cuda.blockIdx.x * TILE + tx
    k_row = cuda.blockIdx.x * TILE + ty  # the key this thread stages
    acc = np.float32(0.0)
    for c0 in range(0, hd, TILE):
        c = c0 + tx
        qs[ty, tx] = q[r, base + c] if r < nq and c < hd else np.float32(0.0)
        ks[ty, tx] = k[k_row, base + c] if k_row < nk and c < hd else np.float32(0.0)
        cuda.syncthreads()
        for kk in range(TILE):
            acc += qs[ty, kk] * ks[tx, kk]
        cuda.syncthreads()
    if r < nq and o < nk:
        s[cuda.blockIdx.z, r, o] = acc


@cuda.jit(cache=True)
def values_tiled(p, v, out, nq, nk, hd):
    """Block (bx, by, h): out[row, h*hd + col] = sum_j p[h, row, j] v[j, h*hd + col], row =
    by*TILE + ty, col = bx*TILE + tx (masked probabilities are 0, so every key is summed)."""
    ps = cuda.shared.array((TILE, TILE_ROW), float32)
    vs = cuda.shared.array((TILE, TILE_ROW), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    h = cuda.blockIdx.z
    base = h * hd
    r = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    acc = np.float32(0.0)
    for j0 in range(0, nk, TILE):
        ps[ty, tx] = p[h, r, j0 + tx] if r < nq and j0 + tx < nk else np.float32(0.0)
        vs[ty, tx] = v[j0 + ty, base + col] if j0 + ty < nk and col < hd else np.float32(0.0)
        cuda.syncthreads()
        for kk in range(TILE):
            acc += ps[ty, kk] * vs[kk, tx]
        cuda.syncthreads()
    if r < nq and col < hd:
        out[r, base + col] = acc


def layernorm(launch, x, w, b, out, eps):
    """out = LayerNorm(x) row by row on the device; `launch` is the backend's launcher."""
    if x.shape[0] == 0:
        return
    launch(layernorm_rows, x.shape[0], ROW_THREADS, x, w, b, out, x.shape[1], eps)


def fuses_layernorm(n):
    """Whether gemm() takes `ln` for n rows of x: the GEMV does."""
    return n <= GEMV_MAX_ROWS


def reads_position(nq, nk, hd):
    """Whether attention() runs attend_part/attend_join for nq queries over nk keys of heads hd
    wide: the kernels that read the causal offset from a device array."""
    return nq <= ATTEND_MAX_ROWS and nk <= ATTEND_MAX_CHUNKS * ATTEND_KEYS and hd <= ATTEND_HD


def attention(launch, q, k, v, out, p, causal, q_offset, at, scratch):
    """As kernels.attention.attention_portable (p the (H, nq, nk) probabilities' scratch), the
    causal offset q_offset + at[0] (at a (1,) int32 device array) where reads_position, else
    q_offset (the tiled kernels); False for a few queries whose heads are wider than
    attend_part's tile, and nothing was done.
    scratch(name, shape): the backend's scratch buffers (attend_part's partial results)."""
    n_head, nq, nk = p.shape
    hd = q.shape[1] // n_head
    scale = np.float32(1.0 / math.sqrt(hd))
    if nq == 0:
        return True
    if reads_position(nq, nk, hd):
        chunks = (nk + ATTEND_KEYS - 1) // ATTEND_KEYS
        part = scratch("attention.part", (n_head * nq, chunks, 2 + hd))
        launch(attend_part, (chunks, n_head * nq), ATTEND_THREADS, q, k, v, p, part, nq, nk, hd,
               scale, causal, q_offset, at)
        launch(attend_join, (chunks, n_head * nq), ATTEND_THREADS, p, part, out, nq, nk, hd,
               scale, causal, q_offset, at)
        return True
    if nq <= ATTEND_MAX_ROWS and hd > ATTEND_HD:
        return False
    tiles = (nq + TILE - 1) // TILE
    launch(scores_tiled, ((nk + TILE - 1) // TILE, tiles, n_head), (TILE, TILE), q, k, p, nq, nk, hd)
    softmax(launch, p.reshape(n_head * nq, nk), scale, nq, causal, q_offset)
    launch(values_tiled, ((hd + TILE - 1) // TILE, tiles, n_head), (TILE, TILE), p, v, out, nq, nk, hd)
    return True


def softmax(launch, x, scale, nq, causal, q_offset):
    """x = masked softmax of scale * x along rows, in place; x (rows, n) f32 on the device.
    `launch(kernel, grid, block, *args)` is the backend's launcher."""
    launch(softmax_rows, x.shape[0], SOFTMAX_THREADS, x, x.shape[1], scale, nq, causal, q_offset)


def gemm(launch, x, w, bias, out, ln, accumulate=False):
    """out = x @ w.T + bias on the device (out += ... when `accumulate`); bias a (0,) array for
    none. ln: (ln_w, ln_b, eps), to multiply LayerNorm(x) instead, which only the GEMV does
    (fuses_layernorm); ln_w a (0,) array for none."""
    n, n_in = x.shape
    n_out = w.shape[0]
    if n <= GEMV_MAX_ROWS:
        lanes = 32
        while lanes < GEMV_THREADS and n_out * lanes // GEMV_THREADS < GEMV_MIN_BLOCKS:
            lanes *= 2
        outs = GEMV_THREADS // lanes
        ln_w, ln_b, eps = ln
        launch(gemv, ((n_out + outs - 1) // outs, n), GEMV_THREADS, x, w, bias, out, n_in, n_out,
               accumulate, lanes, ln_w, ln_b, eps)
    else:
        if ln[0].shape[0]:
            raise ValueError("gemm: LayerNorm is fused into the GEMV only (fuses_layernorm)")
        grid = ((n_out + TILE - 1) // TILE, (n + TILE - 1) // TILE)
        launch(gemm_tiled, grid, (TILE, TILE), x, w, bias, out, n, n_in, n_out, accumulate)
