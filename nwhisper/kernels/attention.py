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

The CPU runs the two products on BLAS per head instead, and its softmax in between two ways,
both tested against the portable path:

    a few queries (a decoder step)   reduce.exp_rows over every head's rows in one launch
    many queries (the encoder)       one head at a time while its scores are in cache:
                                     reduce.exp_rows (an exponential that vectorises), then
                                     1/sum scales the output, or the probabilities when they
                                     are returned (without, one head's buffer serves all)
"""

import math

import numpy as np

from nwhisper.kernels import gemm_int8
from nwhisper.kernels._compile import kernel
from nwhisper.kernels.matmul import quantize_int8
from nwhisper.kernels.reduce import exp_rows

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


# Up to this many queries the CPU's softmax is one launch over every head (a decoder step);
# above, one per head while its scores are in cache.
FEW_QUERIES = 8


def attention(be, q, k, v, out, n_head, causal=False, q_offset=0, weights=True, int8=False):
    """out = softmax(q k^T / sqrt(hd) [causal mask]) v per head.

    q (nq, H*hd), k and v (nk, H*hd), out (nq, H*hd) f32, all row-contiguous (a KV cache is passed
    as kcache[:L]); on the CPU k and v may also be head-major (H, nk, hd), as be.heads makes the
    cross-attention's. weights=True returns the probabilities p (H, nq, nk) f32: a view of the
    backend's scratch, valid until the next attention call on that backend; weights=False
    returns None and lets the CPU skip storing them (the encoder's would be 54 MB per layer).
    int8=True (compute_type "int8"; the encoder): where the CPU's int8 GEMM runs, the scores of
    many queries are an int8 product (queries and keys quantised per row, as SageAttention does;
    the probabilities' product with the values stays f32).
    """
    nq, nk = q.shape[0], k.shape[k.ndim - 2]  # (nk, width) or head-major (H, nk, hd)
    keep = weights or be.name != "cpu" or nq <= FEW_QUERIES
    p = be.scratch("attention.p", (n_head, nq, nk)) if keep else None
    if be.name != "cpu":
        attention_portable(be, q, k, v, out, p, causal, q_offset)
    else:
        attention_blas(be, q, k, v, out, n_head, p, causal, q_offset,
                       int8 and p is None and not causal and gemm_int8.available())
    return p if weights else None


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

    A few queries: the scores of every head go to p (H, nq, nk) in one batched product, one
    exp_rows launch, then the values in one batched product. Many: head by head, exp_rows between the
    products; with p the normalised probabilities are kept there, with p None one (nq, nk) buffer
    serves every head. int8 (p None, not causal): each head's scores on the int8 GEMM, into a
    buffer as wide as its 64-column panels, whose padding columns score -inf (bias)."""
    nq, nk = q.shape[0], k.shape[k.ndim - 2]  # (nk, width) or head-major (H, nk, hd)
    hd = q.shape[1] // n_head
    head_major = k.ndim == 3
    scale = np.float32(1.0 / math.sqrt(hd))
    masked = np.arange(nk) > np.arange(nq)[:, None] + q_offset if causal and nq > 1 else None
    if nq <= FEW_QUERIES:
        # Every head in one batched product each way, over (H, ·, ·) views of the rows: one NumPy
        # call instead of one per head (a step's attention is mostly call overhead: 2-4x faster).
        kh = k if head_major else k.reshape(nk, n_head, hd).transpose(1, 0, 2)
        vh = v if head_major else v.reshape(nk, n_head, hd).transpose(1, 0, 2)
        qh = (q * scale).reshape(nq, n_head, hd).transpose(1, 0, 2)
        np.matmul(qh, kh.transpose(0, 2, 1), out=p)
        if masked is not None:
            p[:, masked] = -np.inf
        total = np.empty((n_head * nq, 1), np.float32)
        exp_rows(be, p.reshape(n_head * nq, nk), total)
        p /= total.reshape(n_head, nq, 1)
        out.reshape(nq, n_head, hd)[:] = np.matmul(p, vh).transpose(1, 0, 2)
        return
    if int8:
        wide = -(-nk // gemm_int8.COLS) * gemm_int8.COLS
        keys = np.zeros((wide, hd), np.float32)
        pad = np.zeros((wide,), np.float32)
        pad[nk:] = -np.inf
    buf = np.empty((nq, wide if int8 else nk), np.float32) if p is None else None
    total = np.empty((nq, 1), np.float32)
    for h in range(n_head):
        cols = slice(h * hd, (h + 1) * hd)
        s = buf if p is None else p[h]
        if int8:
            keys[:nk] = k[h] if head_major else k[:, cols]
            gemm_int8.gemm(q[:, cols] * scale, gemm_int8.PackedInt8(*quantize_int8(be, keys)),
                           pad, s, be.scratch)
        else:
            np.matmul(q[:, cols] * scale, (k[h] if head_major else k[:, cols]).T, out=s)
        if masked is not None:
            s[masked] = -np.inf
        exp_rows(be, s, total)
        vh = v[h] if head_major else v[:, cols]
        if p is None:
            np.matmul(s[:, :nk], vh, out=out[:, cols])
            out[:, cols] /= total
        else:
            s /= total
            np.matmul(s, vh, out=out[:, cols])
