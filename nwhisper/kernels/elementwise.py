"""Elementwise kernels: add, copy/convert, row gathers and row adds, the KV cache's append.

One work item per element. 2-D operands are addressed through a flat index so that neighbouring
GPU threads touch neighbouring memory; the CPU loop vectorises less but these kernels are
memory-bound either way.
"""

import numpy as np

from nwhisper.kernels._compile import kernel
from nwhisper.kernels.widen import widen


@kernel
def add_elem(i, a, b, out):
    """out[i] = a[i] + b[i]; flat f32 (out may be a)."""
    out[i] = a[i] + b[i]


@kernel
def fill_elem(i, x, value):
    """x[i] = value; flat (the CUDA backend's zeros)."""
    x[i] = value


@kernel
def copy_elem(i, src, dst):
    """dst[i] = src[i], converted to dst's type (f16 -> f32 is exact); flat."""
    dst[i] = src[i]


@kernel
def add_rows_elem(i, x, table, start, d):
    """x[r, c] += table[start + r, c], r, c = divmod(i, d); x: (n, d) f32, table: (rows, d) f32/f16."""
    r = i // d
    c = i - r * d
    x[r, c] += np.float32(table[start + r, c])


@kernel
def embed_elem(i, table, ids, out, d):
    """out[r, c] = table[ids[r], c], r, c = divmod(i, d); table (V, d) f32/f16 (CPU: f16 as uint16
    bits, widen.py), ids (n,) int32."""
    r = i // d
    c = i - r * d
    out[r, c] = widen(table[ids[r], c])


@kernel
def embed_at_elem(i, table, pos_table, tokens, out, d):
    """out[r, c] = table[tokens[1 + r], c] + pos_table[tokens[0] + r, c], r, c = divmod(i, d): a
    decoder call's token and positional embeddings. tokens (1 + n,) int32 is [position of the
    first token, its ids…]: read on the device, so a step's launches do not change from one
    position to the next (the CUDA backend replays them as a graph). table as embed_elem's."""
    r = i // d
    c = i - r * d
    out[r, c] = widen(table[tokens[1 + r], c]) + np.float32(pos_table[tokens[0] + r, c])


@kernel
def kv_append_elem(i, qkv, cache_k, cache_v, tokens, d):
    """cache_k[p + r, c] = qkv[r, d + c], cache_v[p + r, c] = qkv[r, 2d + c], r, c = divmod(i, d),
    p = tokens[0] (embed_at_elem's position): the keys and values of a call's stacked
    [q | k | v] product (n, 3d) appended to a layer's cache (capacity, d)."""
    r = i // d
    c = i - r * d
    row = tokens[0] + r
    cache_k[row, c] = qkv[r, d + c]
    cache_v[row, c] = qkv[r, 2 * d + c]


def add(be, a, b, out):
    """out = a + b elementwise; same-shape contiguous f32 (out may be a)."""
    be.launch(add_elem, a.size, be.flat(a), be.flat(b), be.flat(out))


def kv_write(be, cache, pos, rows):
    """cache[pos:pos + n] = rows; cache (capacity, d), rows (n, d)."""
    n = rows.shape[0]
    if pos + n > cache.shape[0]:
        raise IndexError(f"kv_write: rows {pos}..{pos + n} do not fit a cache of {cache.shape[0]}")
    be.launch(copy_elem, rows.size, rows.reshape(-1), cache[pos:pos + n].reshape(-1))


def add_rows(be, x, table, start):
    """x[i] += table[start + i] for each row i of x (positional embeddings); table f32 or f16."""
    n, d = x.shape
    if start + n > table.shape[0]:
        raise IndexError(f"add_rows: rows {start}..{start + n} of a table of {table.shape[0]}")
    if be.on_host:      # the same sums in NumPy: a launcher less for a first transcription to compile
        x += table[start:start + n]
        return
    be.launch(add_rows_elem, x.size, x, table, start, d)


def embed_at(be, table, pos_table, tokens, out):
    """out[i] = table[tokens[1 + i]] + pos_table[tokens[0] + i] (embed_at_elem); tokens (1 + n,)
    int32 on the device, out (n, d). The caller checks that the positions fit pos_table."""
    be.launch(embed_at_elem, out.size, table, pos_table, tokens, out, out.shape[1])


def kv_append(be, qkv, cache_k, cache_v, tokens):
    """The keys and values of qkv (n, 3d) = [queries | keys | values] into the caches at position
    tokens[0] (kv_append_elem); the caller checks that they fit. qkv is taken whole, not as a
    view of its last 2d columns: such a view is strided for several rows and not for one, and
    the kernel would compile for both."""
    n, d = qkv.shape[0], qkv.shape[1] // 3
    be.launch(kv_append_elem, n * d, qkv, cache_k, cache_v, tokens, d)


def embed(be, table, ids, out):
    """out[i] = table[ids[i]]; table (V, d) f32 or f16, ids (n,) int32 on the device, out (n, d)."""
    be.launch(embed_elem, out.size, table, ids, out, out.shape[1])
