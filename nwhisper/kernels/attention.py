"""Multi-head scaled dot-product attention, causal or not, for the encoder and the decoder step.

Three portable launches, each parallel over many small items (GPU-friendly: neighbouring threads
read neighbouring memory or share a row):

    scores  s[h, q, j] = q[q, h] . k[j, h]                 one item per (head, query, key)
    softmax p[h, q, :] = softmax(s[h, q, :] / sqrt(hd))    one item per (head, query) row
                                                           (be.softmax_rows: reduce.softmax_row)
    values  out[q, h*hd + c] = sum_j p[h, q, j] v[j, h*hd + c]   one item per output element

Causal: query q sees keys j <= q + q_offset (q_offset = tokens already in the KV cache); masked
scores are never computed nor read. The probabilities stay in a scratch buffer and are returned
(word timestamps read the cross-attention weights of some heads).

A decoder step's attentions are attend_row: each (head, query) item does all three, in one
launch — its cross-attention over head-major keys (f32 on the CPU, or Int8Heads with the scales
of int8 ones, on either backend), and on the CPU its self-attention over the rows of a KV cache
of at most 448 keys. Many queries (the
encoder, a long prompt) run the two products on BLAS one head at a time while its scores are in
cache, reduce.exp_rows (an exponential that vectorises) between them, then 1/sum scales the
output, or the probabilities when they are returned (without, one head's buffer serves all);
compute_type "int8" on a CPU with VNNI and BF16 runs attention_blocked instead (a block of
queries at a time in L2: int8 scores, bfloat16 probabilities and values); float32 on a CPU with
AVX-512 attention_fused (a block of queries at a time in L2, all three steps in float32).
Each is tested against the portable path.
"""

import math

import numpy as np

from nwhisper.kernels import attention_blocked, attention_fused, blas, gemm_int8
from nwhisper.kernels._compile import kernel
from nwhisper.kernels.matmul import quantize_int8
from nwhisper.kernels.reduce import exp_rows
from nwhisper.kernels.vecmath import fast_exp, from_key, order_key

@kernel
def attn_scores_elem(i, q, k, s, nq, nk, hd, causal, q_offset):
    """s[h, qi, j] = q[qi, h*hd:(h+1)*hd] . k[j, h*hd:(h+1)*hd], i = (h * nq + qi) * nk + j.

    q (nq, H*hd), k (nk, H*hd), s (H, nq, nk) f32; masked entries (causal, j > qi + q_offset)
    are left unwritten.
    """
    j = i % nk
    hq = i // nk
    qi = hq % nq
    h = hq // nq
    if causal and j > qi + q_offset:
        return
    base = h * hd
    acc = np.float32(0.0)
    for c in range(hd):
        acc += q[qi, base + c] * k[j, base + c]
    s[h, qi, j] = acc


@kernel
def attn_values_elem(i, p, v, out, nq, nk, width, hd, causal, q_offset):
    """out[qi, col] = sum_j p[h, qi, j] * v[j, col], with qi, col = divmod(i, width), h = col // hd.

    p (H, nq, nk) softmaxed f32, v (nk, width), out (nq, width) f32, width = H * hd.
    """
    qi = i // width
    col = i - qi * width
    h = col // hd
    m = nk
    if causal:
        m = min(nk, qi + q_offset + 1)
    acc = np.float32(0.0)
    for j in range(m):
        acc += p[h, qi, j] * v[j, col]
    out[qi, col] = acc


class Int8Heads:
    """Keys or values that a window's decoding attends to, as int8 (H, nk, hd) with one f32
    scale per key and head (H, nk) (compute_type "int8": every decoder step reads the
    cross-attention's K/V whole, 6 MB a layer in f32 on base; int8 is a quarter)."""

    def __init__(self, q, scale):
        self.q, self.scale = q, scale
        self.shape, self.ndim = q.shape, 3     # read like a head-major array


@kernel
def heads_int8_row(j, x, q, scale, n_head, hd):
    """Key j's rows of Int8Heads from x (n, H*hd) f32, for every head h: q[h, j, :] =
    round(x[j, h*hd:(h+1)*hd] · (1 / scale[h, j])), halves up; scale = max|row| · (1/127) (1 for
    a zero row). One item a key: each reads one contiguous row of x."""
    for h in range(n_head):
        row = x[j, h * hd:(h + 1) * hd]       # row views: see attend_row
        dst = q[h, j]
        top = order_key(np.float32(0.0))   # |v|'s maximum as integer keys: it vectorises
        for c in range(hd):
            k = order_key(abs(row[c]))
            top = k if k > top else top
        # Products with reciprocals, written out: the CPU's fastmath would make them of the
        # divisions anyway, and so both targets round alike.
        m = from_key(top)
        s = m * np.float32(1.0 / 127.0) if m > np.float32(0.0) else np.float32(1.0)
        scale[h, j] = s
        inv = np.float32(1.0) / s
        for c in range(hd):
            v = row[c] * inv
            v = np.float32(-127.0) if v < np.float32(-127.0) else v
            v = np.float32(127.0) if v > np.float32(127.0) else v
            dst[c] = np.int8(math.floor(v + np.float32(0.5)))  # to nearest, halves up


def heads_int8(be, x, n_head, groups=1):
    """Int8Heads of keys or values x (n, groups·H·hd) on the backend: one launch for `groups`
    consecutive blocks of H heads (the decoder's every layer's keys and values, side by side in
    one product), a list of them when groups > 1."""
    n, width = x.shape
    heads = n_head * groups
    q = be.empty((heads, n, width // heads), np.int8)
    scale = be.empty((heads, n), np.float32)
    be.launch(heads_int8_row, n, x, q, scale, heads, width // heads, work=2 * x.size)
    if groups == 1:
        return Int8Heads(q, scale)
    return [Int8Heads(q[g * n_head:(g + 1) * n_head], scale[g * n_head:(g + 1) * n_head])
            for g in range(groups)]


@kernel
def attend_row(r, q, k, ks, v, vs, p, out, nq, nk, hd, scale, weights, by_row, causal, q_offset, at):
    """One query's whole attention in one head, r = h*nq + qi, over the keys it sees (m: all nk,
    or causal j <= qi + q_offset + at[0]): p[h, qi, j] = exp(s_j - max s), s_j = scale · ks[h, j] ·
    q[qi, h*hd:(h+1)*hd] . key_j, then out[qi, h*hd:(h+1)*hd] = Σ_j p[h, qi, j] · vs[h, j] ·
    value_j / Σ_j p[h, qi, j]; with `weights` p normalised too (and p[h, qi, m:] = 0).

    The keys and values: head-major, key_j = k[h, j] (k, v (H, nk, hd): a decoder step's
    cross-attention), or `by_row` a row-major cache, key_j = k[j, h] (k, v (nk, H, hd): the rows
    of an (nk, H*hd) KV cache; its self-attention, the whole cache with its position read from
    `at`, so that the launch is the same at every step). int8 with a scale per key ks, vs (H, nk)
    f32 (Int8Heads), or f32 with ks, vs empty. q (nq, ≥ H*hd: its first H*hd columns), out
    (nq, H*hd), p (H, nq, nk) f32, at (1,) int32. Scores, exponential and values in one item:
    the query's probabilities stay in cache between them (three launches would also be two more
    parallel regions)."""
    h = r // nq
    qi = r - h * nq
    m = nk
    if causal:
        m = min(nk, qi + q_offset + at[0] + 1)
    # Row views first: indexes computed from r might be negative as far as the compiler knows,
    # and NumPy's wraparound on them turned the inner loops into gathers (8x slower).
    qh = q[qi, h * hd:(h + 1) * hd]
    ph = p[h, qi]
    keys_scaled = ks.shape[0] > 0
    values_scaled = vs.shape[0] > 0
    top = order_key(np.float32(-math.inf))
    for j in range(m):
        key = k[j, h] if by_row else k[h, j]
        acc = np.float32(0.0)
        for c in range(hd):
            acc += qh[c] * np.float32(key[c])
        score = acc * ks[h, j] * scale if keys_scaled else acc * scale
        ph[j] = score
        at_key = order_key(score)
        top = at_key if at_key > top else top
    most = from_key(top)
    total = np.float32(0.0)
    for j in range(m):     # vectorises (vecmath.fast_exp; math.exp is a libm call per key)
        e = np.float32(fast_exp(ph[j] - most))
        ph[j] = e
        total += e
    o = out[qi, h * hd:(h + 1) * hd]
    for c in range(hd):
        o[c] = np.float32(0.0)
    for j in range(m):
        w = ph[j] * vs[h, j] if values_scaled else ph[j]
        value = v[j, h] if by_row else v[h, j]
        for c in range(hd):
            o[c] += w * np.float32(value[c])
    inv = np.float32(1.0) / total
    for c in range(hd):
        o[c] *= inv
    if weights:
        for j in range(m):
            ph[j] *= inv
        for j in range(m, nk):
            ph[j] = np.float32(0.0)


def attend_rows(be, q, k, v, out, p, weights, by_row, causal, q_offset, at):
    """Few queries in one launch of attend_row, an item per (head, query): over head-major keys
    and values (the cross-attention: Int8Heads, or (CPU) f32 (H, nk, hd) arrays), or `by_row`
    over row-major ones (nk, H*hd) (the CPU's self-attention over its KV cache, causal from the
    position q_offset + at[0]); p (H, nq, nk) holds the exp'd scores, normalised when `weights`."""
    n_head, nq, nk = p.shape
    hd = out.shape[1] // n_head
    if isinstance(k, Int8Heads):       # keys and values alike
        k, ks, v, vs = k.q, k.scale, v.q, v.scale
    else:                              # f32 (the CPU's) have no scales: an empty array
        ks = vs = be.scratch("attention.unscaled", (0, 0))
        if by_row:
            k, v = k.reshape(nk, n_head, hd), v.reshape(nk, n_head, hd)
    be.launch(attend_row, n_head * nq, q, k, ks, v, vs, p, out, nq, nk, hd,
              np.float32(1.0 / math.sqrt(hd)), weights, by_row, causal, q_offset, at,
              work=n_head * nq * nk * hd // 32)   # two vectorised passes over the keys


# Up to this many queries the CPU's attention is one launch over every head and query
# (attend_row: a decoder step); above, BLAS's products one head at a time.
FEW_QUERIES = 8
# ... and up to this many row-major keys (a decoder's self-attention cache: at most n_text_ctx)
# the whole attention is attend_row.
SHORT_KEYS = 448


def attention(be, q, k, v, out, n_head, causal=False, q_offset=0, weights=True, int8=False,
              n_keys=None, at=None, bf16=False):
    """out = softmax(q k^T / sqrt(hd) [causal mask]) v per head.

    q (nq, H*hd), k and v (nk, H*hd), out (nq, H*hd) f32, all row-contiguous (a KV cache is passed
    as kcache[:L]). q may be wider than out: its first H*hd columns are the queries (the decoder
    passes its stacked [q | k | v] product whole: a view of several of its rows would be strided
    and of one row not, and the CPU's attend_row would compile for both, ~1.5 s of a first
    command). On the CPU k and v may also be head-major (H, nk, hd), as be.heads makes the
    cross-attention's; or Int8Heads (heads_int8; not causal) on either backend.
    weights=True returns the probabilities p (H, nq, nk) f32: a view of the backend's scratch,
    valid until the next attention call on that backend; weights=False returns None and lets the
    CPU skip storing them (the encoder's would be 54 MB per layer).
    int8=True (compute_type "int8"; the encoder): where the CPU's int8 GEMM runs, the scores of
    many queries are an int8 product (queries and keys quantised per row, as SageAttention does;
    the probabilities' product with the values stays f32).
    bf16=True (compute_type "bfloat16"; the encoder): where the CPU has AVX-512 BF16, scores and
    values on bfloat16 operands (attention_blocked); elsewhere f32.
    n_keys: only k's and v's first n_keys rows are keys (a whole row-major KV cache passed with
    its filled length: slicing a CUDA device array is costly Python, and a step would
    slice every layer's cache twice).
    at: a device int32 array holding q_offset in at[0] (the decoder's `tokens`). A backend that
    reads the position there (the CPU's attend_row; CUDA's attend_part, be.reads_position) attends
    over all of k's rows, masked, so that its launch is the same at every position (a replayed
    step); p then has a column for each of k's rows, zero past the query's own position.
    Elsewhere it is unused.
    """
    width, nq = out.shape[1], q.shape[0]
    keep = weights or not be.on_host or nq <= FEW_QUERIES or isinstance(k, Int8Heads)
    nk = k.shape[k.ndim - 2] if n_keys is None or at is not None else n_keys  # (nk, width) or (H, nk, hd)
    how = variant(be, nq, nk, k, causal, keep, int8, width // n_head, bf16)
    if at is not None:
        if how == "rows" or how == "device" and be.reads_position(nq, width // n_head, k):
            n_keys, q_offset = None, 0   # all of k's rows, masked past the position read from at
        else:
            be.note_host_position()
            at = None
    if n_keys is not None and be.on_host:
        k, v, n_keys = k[:n_keys], v[:n_keys], None   # NumPy's views are cheap; BLAS wants them
    nk = k.shape[k.ndim - 2] if n_keys is None else n_keys
    p = be.scratch("attention.p", (n_head, nq, nk)) if keep else None
    if q.shape[1] != width and how != "rows":
        q = be.columns(q, 0, width)     # the queries alone (attend_row reads them in place)
    if at is None and how in ("heads", "rows", "device"):
        at = be.constant("attention.no_position", lambda: be.zeros((1,), np.int32))
    if how in ("heads", "rows"):
        attend_rows(be, q, k, v, out, p, weights, how == "rows", causal, q_offset, at)
    elif how == "device":
        if not be.attention_fast(q, k, v, out, p, causal, q_offset, at):
            attention_portable(be, q, k, v, out, p, causal, q_offset)
    elif how == "blocked":
        attention_blocked.attention(be, q, k, v, out, n_head, "bf16" if bf16 else "int8")
    elif how == "fused":
        attention_fused.attention(be, q, k, v, out, n_head)
    else:
        attention_blas(be, q, k, v, out, n_head, p, causal, q_offset, how == "blas_int8")
    return p if weights else None


def variant(be, nq, nk, k, causal, keep=True, int8=False, hd=0, bf16=False):
    """Which implementation attention() runs: the first of these that applies (keep: the
    probabilities are kept; int8, bf16: compute_type "int8", "bfloat16"; hd: the head width).

      heads      keys as Int8Heads, or head-major on the host for a few queries and no mask (the
                 decoder's cross-attention): attend_rows, both products in one pass a head
      device     a device backend: its fast path where it has one (be.attention_fast), else the
                 three portable bodies (attention_portable, the reference)
      rows       the host, a few queries over short row-major keys (the decoder's self-attention):
                 attend_rows by row, the same body over the cache's rows
      blocked    the host, int8 or bf16, unmasked, no probabilities kept, heads of 64 and a CPU
                 with BF16 (and VNNI for int8): attention_blocked.attention
      blas_int8  the host, int8, unmasked, no probabilities kept, where the int8 GEMM runs:
                 attention_blas with each head's scores on it
      fused      the host, float32, unmasked, no probabilities kept, row-major keys, heads of 64
                 and a CPU with AVX-512 (the encoder): attention_fused.attention
      blas       the host otherwise: per head, two BLAS products around exp_rows
    """
    if isinstance(k, Int8Heads) or (be.on_host and k.ndim == 3 and nq <= FEW_QUERIES and not causal):
        return "heads"
    if not be.on_host:
        return "device"
    if nq <= FEW_QUERIES and k.ndim == 2 and nk <= SHORT_KEYS:
        return "rows"
    if (int8 or bf16) and not keep and not causal:
        if hd == attention_blocked.HD and attention_blocked.available("bf16" if bf16 else "int8"):
            return "blocked"
        if bf16:
            return "blas"
        if gemm_int8.available():
            return "blas_int8"
    if (not keep and not causal and k.ndim == 2 and hd == attention_fused.HD
            and nk >= attention_fused.KEYS and attention_fused.available()):
        return "fused"
    return "blas"


def attention_portable(be, q, k, v, out, p, causal, q_offset):
    """The three portable launches; p (H, nq, nk) is the scratch for the probabilities."""
    n_head, nq, nk = p.shape
    width = q.shape[1]
    hd = width // n_head
    be.launch(attn_scores_elem, n_head * nq * nk, q, k, p, nq, nk, hd, causal, q_offset)
    be.softmax_rows(p.reshape(n_head * nq, nk), 1.0 / math.sqrt(hd), nq, causal, q_offset)
    be.launch(attn_values_elem, nq * width, p, v, out, nq, nk, width, hd, causal, q_offset)


def attention_blas(be, q, k, v, out, n_head, p, causal, q_offset, int8=False):
    """CPU: per head s = q·kᵀ and out = softmax(s)·v on BLAS (NumPy arrays only); k and v
    (nk, H*hd), or head-major (H, nk, hd).

    Head by head, exp_rows between the products (each product shared out over the threads); with
    p the normalised probabilities are kept there, with p None one (nq, nk) buffer serves every
    head. int8 (p None, not causal): each head's scores on the int8 GEMM, into a
    buffer as wide as its 64-column panels, whose padding columns score -inf (bias)."""
    nq, nk = q.shape[0], k.shape[k.ndim - 2]  # (nk, width) or head-major (H, nk, hd)
    hd = q.shape[1] // n_head
    head_major = k.ndim == 3
    scale = np.float32(1.0 / math.sqrt(hd))
    masked = np.arange(nk) > np.arange(nq)[:, None] + q_offset if causal and nq > 1 else None
    if int8:
        wide = -(-nk // gemm_int8.COLS) * gemm_int8.COLS
        keys = np.zeros((wide, hd), np.float32)
        pad = np.zeros((wide,), np.float32)
        pad[nk:] = -np.inf
    buf = be.workspace((nq, wide if int8 else nk)) if p is None else None
    total = np.empty((nq, 1), np.float32)
    for h in range(n_head):
        cols = slice(h * hd, (h + 1) * hd)
        s = buf if p is None else p[h]
        if int8:
            keys[:nk] = k[h] if head_major else k[:, cols]
            gemm_int8.gemm(q[:, cols] * scale, gemm_int8.PackedInt8(*quantize_int8(be, keys)),
                           pad, s, be.scratch)
        else:
            blas.gemm(q[:, cols], k[h] if head_major else k[:, cols], s, alpha=scale)
        if masked is not None:
            s[masked] = -np.inf
        exp_rows(be, s, total)
        vh = v[h] if head_major else v[:, cols]
        if p is None:
            blas.gemm(s[:, :nk], vh, out[:, cols], trans_b=False)
            out[:, cols] /= total
        else:
            s /= total
            blas.gemm(s, vh, out[:, cols], trans_b=False)

