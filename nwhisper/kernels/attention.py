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

On the CPU, the scores and values products run on BLAS per head instead (the same softmax body in
between); tests hold that fast path to the portable one.
"""

import math

import numpy as np

from nwhisper.kernels._compile import kernel

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


def attention(be, q, k, v, out, n_head, causal=False, q_offset=0):
    """out = softmax(q k^T / sqrt(hd) [causal mask]) v per head; returns the probabilities.

    q (nq, H*hd), k and v (nk, H*hd), out (nq, H*hd) f32, all row-contiguous (a KV cache is passed
    as kcache[:L]). Returns p (H, nq, nk) f32: a view of the backend's scratch, valid until the
    next attention call on that backend.
    """
    p = be.scratch("attention.p", (n_head, q.shape[0], k.shape[0]))
    path = attention_blas if be.name == "cpu" else attention_portable
    path(be, q, k, v, out, p, causal, q_offset)
    return p


def attention_portable(be, q, k, v, out, p, causal, q_offset):
    """The three portable launches; p (H, nq, nk) is the scratch for the probabilities."""
    n_head, nq, nk = p.shape
    width = q.shape[1]
    hd = width // n_head
    be.launch(attn_scores_elem, n_head * nq * nk, q, k, p, nq, nk, hd, causal, q_offset)
    _softmax(be, p, hd, causal, q_offset)
    be.launch(attn_values_elem, nq * width, p, v, out, nq, nk, width, hd, causal, q_offset)


def attention_blas(be, q, k, v, out, p, causal, q_offset):
    """CPU fast path: scores and values as BLAS products per head (NumPy arrays only); measured
    faster than the portable launches from the one-token decoder step up (bench/kernels.py)."""
    n_head, nq, nk = p.shape
    hd = q.shape[1] // n_head
    heads = [slice(h * hd, (h + 1) * hd) for h in range(n_head)]
    for h, cols in enumerate(heads):
        np.matmul(q[:, cols], k[:, cols].T, out=p[h])
    _softmax(be, p, hd, causal, q_offset)
    for h, cols in enumerate(heads):
        np.matmul(p[h], v[:, cols], out=out[:, cols])


def _softmax(be, p, hd, causal, q_offset):
    """p = softmax(p / sqrt(hd)) along keys, masked; p (H, nq, nk) raw scores."""
    n_head, nq, nk = p.shape
    be.softmax_rows(p.reshape(n_head * nq, nk), 1.0 / math.sqrt(hd), nq, causal, q_offset)
