"""The CPU encoder's float32 attention, fused: a block of queries of one head at a time, its
scores never leaving the core's L2.

attention_blas does a head at a time over the whole sequence: its 1500 × 1500 score block (9 MB)
goes out to memory between the two products and the exponentials. Here, with AVX-512, a block
of BLOCK queries of one head is one parallel item, and everything it does stays in that core's
cache (its transposed scores: BLOCK × 1500 floats, 288 KB):

    scores   sᵀ[j, r] = (k_j · q_r) / √hd: KEYS keys × BLOCK queries in 24 registers, each key's
             element broadcast, the block's queries transposed to vectors of 16 (√hd = 8: the
             scaling is exact)
    exp      per query (a lane): p = fast_exp(s − max over keys), total = Σ p over the keys in
             order; vecmath.fast_exp's polynomial, 16 queries to a vector
    values   out[r, :] = (Σ_j p[r, j] · v_j) / total[r]: ROWS queries × hd in 24 registers

The queries, keys and values are read where they are (rows of any stride: the encoder's q, k and
v products, or views of one stacked product): nothing is packed. The three steps are LLVM IR in
one Numba intrinsic per item (Numba has no vector types), so the loop over items around it is a
single call and compiles in a fraction of a second; every sum runs in an order fixed by the
code, so the result is the same in every build and however the items are shared out.

A CPU fast path of attention() (variant "fused": float32, unmasked, no probabilities kept, heads
of 64): tested against the portable body (attention_portable) and against NumPy in float64.
"""

import functools

import numpy as np
from llvmlite import ir
from numba import config, get_thread_id, njit, types
from numba.extending import intrinsic

from nwhisper.kernels import llvm_ir as L, trampoline

HD = 64         # the head width every Whisper model has
BLOCK = 48      # queries per parallel item: three 16-lane vectors
KEYS = 8        # keys per scores tile: 8 × 3 accumulators
ROWS = 6        # queries per values tile: 6 × 4 accumulators (hd = 4 vectors)
CHUNK = 64      # keys summed apart before their sum joins the total (totals and values): one
                # running sum over 1500 keys would lose ~4 × BLAS's accuracy
# vecmath.fast_exp's 2^f on [0, 1), highest degree first
POLY = (2.1877504770e-04, 1.2387821479e-03, 9.6845804523e-03, 5.5480426326e-02,
        2.4023050204e-01, 6.9314692869e-01, 1.0000000026e+00)


@functools.cache
def available():
    """True where the fused attention runs: AVX-512 on the CPU Numba compiles for (its tiles
    keep 24 vector accumulators: AVX2's 16 registers would spill)."""
    return L.host_has("avx512f")


@intrinsic
def _block(typingctx, q_addr, ldq, k_addr, ldk, v_addr, ldv, nk, rows, s_addr, qt_addr,
           out_addr, ldo):
    """One item: out[r, :hd] = softmax_j(q_r · k_j / 8) · v_j for the block's r < rows (≤ BLOCK).
    q, k, v, out: f32 addresses of the head's first column in row 0 of the block / keys, their
    row strides in floats; s: BLOCK · nk floats, qt: hd · BLOCK floats (the thread's scratch);
    nk ≥ KEYS."""
    sig = types.void(types.uintp, types.intp, types.uintp, types.intp, types.uintp, types.intp,
                     types.intp, types.intp, types.uintp, types.uintp, types.uintp, types.intp)

    def codegen(context, builder, signature, args):
        q_addr, ldq, k_addr, ldk, v_addr, ldv, nk, rows, s_addr, qt_addr, out_addr, ldo = args
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        fv, iv = ir.VectorType(f32, 16), ir.VectorType(i32, 16)
        fma = L.declare(builder, "llvm.fma.v16f32", fv, [fv, fv, fv])
        vmax = L.declare(builder, "llvm.maxnum.v16f32", fv, [fv, fv])
        floor = L.declare(builder, "llvm.floor.v16f32", fv, [fv])
        c = lambda v: ir.Constant(i64, v)  # noqa: E731
        fc = lambda v: ir.Constant(fv, [v] * 16)  # noqa: E731
        at = lambda addr: builder.inttoptr(addr, f32.as_pointer())  # noqa: E731
        q, k, v, s, qt, out = (at(a) for a in (q_addr, k_addr, v_addr, s_addr, qt_addr, out_addr))
        load = lambda p, i: builder.load(L.vector_at(builder, p, i, fv), align=4)  # noqa: E731
        store = lambda x, p, i: builder.store(x, L.vector_at(builder, p, i, fv), align=4)  # noqa: E731
        splat = lambda p, i: L.splat(builder, builder.load(builder.gep(p, [i])), fv)  # noqa: E731
        vecs = BLOCK // 16

        # the block's queries transposed: qt[d, r] = q[r, d], zero past `rows`
        r, (), close_r = L.counted_loop(builder, c(BLOCK), 1, [], "fa.qt")
        inside = builder.icmp_signed("<", r, rows)
        d, (), close_d = L.counted_loop(builder, c(HD), 1, [], "fa.qt.d")
        row = builder.select(inside, r, c(0))     # a row that exists, its value then dropped
        x = builder.load(builder.gep(q, [builder.add(builder.mul(row, ldq), d)]))
        x = builder.select(inside, x, ir.Constant(f32, 0.0))
        builder.store(x, builder.gep(qt, [builder.add(builder.mul(d, c(BLOCK)), r)]))
        close_r(close_d([]))

        # scores: sᵀ[j, :] for KEYS keys a tile; the last tile ends at nk (it may overlap the one
        # before: the same values again)
        tiles = builder.sdiv(builder.add(nk, c(KEYS - 1)), c(KEYS))
        t, (), close_t = L.counted_loop(builder, tiles, 1, [], "fa.scores")
        j0 = builder.mul(t, c(KEYS))
        j0 = builder.select(builder.icmp_signed(">", j0, builder.sub(nk, c(KEYS))),
                            builder.sub(nk, c(KEYS)), j0)
        d, acc, close_d = L.counted_loop(builder, c(HD), 1, [ir.Constant(fv, None)] * (KEYS * vecs),
                                         "fa.scores.d")
        qv = [load(qt, builder.add(builder.mul(d, c(BLOCK)), c(16 * u))) for u in range(vecs)]
        new = []
        for jr in range(KEYS):
            a = splat(k, builder.add(builder.mul(builder.add(j0, c(jr)), ldk), d))
            new += [builder.call(fma, [a, qv[u], acc[jr * vecs + u]]) for u in range(vecs)]
        sums = close_d(new)
        for jr in range(KEYS):
            base = builder.mul(builder.add(j0, c(jr)), c(BLOCK))
            for u in range(vecs):
                store(builder.fmul(sums[jr * vecs + u], fc(0.125)), s, builder.add(base, c(16 * u)))
        close_t([])

        # exp: per query (lane), the maximum over the keys, then p = e^(s − max) in place and
        # total = Σ p in the keys' order
        j, tops, close_j = L.counted_loop(builder, nk, 1, [fc(-np.inf)] * vecs, "fa.max")
        tops = close_j([builder.call(vmax, [tops[u], load(s, builder.add(builder.mul(j, c(BLOCK)), c(16 * u)))])
                        for u in range(vecs)])
        chunks = builder.sdiv(builder.add(nk, c(CHUNK - 1)), c(CHUNK))
        ch, totals, close_ch = L.counted_loop(builder, chunks, 1, [fc(0.0)] * vecs, "fa.exp")
        j0 = builder.mul(ch, c(CHUNK))
        length = builder.sub(nk, j0)
        length = builder.select(builder.icmp_signed("<", length, c(CHUNK)), length, c(CHUNK))
        jj, part, close_j = L.counted_loop(builder, length, 1, [fc(0.0)] * vecs, "fa.exp.j")
        j = builder.add(j0, jj)
        new = []
        for u in range(vecs):
            i = builder.add(builder.mul(j, c(BLOCK)), c(16 * u))
            tt = builder.fmul(builder.fsub(load(s, i), tops[u]), fc(1.4426950408889634))   # log2(e)
            low = builder.fcmp_ordered(">=", tt, fc(-126.0))
            tt = builder.select(low, tt, fc(-127.0))          # exponent bits 0: 0.0
            whole = builder.call(floor, [tt])
            f = builder.fsub(tt, whole)
            p = fc(POLY[0])
            for coef in POLY[1:]:
                p = builder.call(fma, [p, f, fc(coef)])
            bits = builder.shl(builder.add(builder.fptosi(whole, iv), ir.Constant(iv, [127] * 16)),
                               ir.Constant(iv, [23] * 16))
            e = builder.fmul(p, builder.bitcast(bits, fv))
            store(e, s, i)
            new.append(builder.fadd(part[u], e))
        part = close_j(new)
        totals = close_ch([builder.fadd(totals[u], part[u]) for u in range(vecs)])
        total = builder.alloca(fv, size=vecs)                 # per query, read back one by one
        for u in range(vecs):
            builder.store(totals[u], builder.gep(total, [c(u)]))
        total = builder.bitcast(total, f32.as_pointer())

        # values: out[r, :] for ROWS queries a tile, stored where r < rows
        r0, (), close_r0 = L.counted_loop(builder, c(BLOCK), ROWS, [], "fa.values")
        zeros = [ir.Constant(fv, None)] * (ROWS * 4)
        ch, sums, close_ch = L.counted_loop(builder, chunks, 1, zeros, "fa.values.chunk")
        j0 = builder.mul(ch, c(CHUNK))
        length = builder.sub(nk, j0)
        length = builder.select(builder.icmp_signed("<", length, c(CHUNK)), length, c(CHUNK))
        jj, acc, close_j = L.counted_loop(builder, length, 1, zeros, "fa.values.j")
        j = builder.add(j0, jj)
        vv = [load(v, builder.add(builder.mul(j, ldv), c(16 * w))) for w in range(4)]
        new = []
        for rr in range(ROWS):
            a = splat(s, builder.add(builder.mul(j, c(BLOCK)), builder.add(r0, c(rr))))
            new += [builder.call(fma, [a, vv[w], acc[rr * 4 + w]]) for w in range(4)]
        part = close_j(new)
        sums = close_ch([builder.fadd(x, y) for x, y in zip(sums, part)])
        end = builder.append_basic_block("fa.values.end")
        for rr in range(ROWS):
            here = builder.add(r0, c(rr))
            put = builder.append_basic_block(f"fa.values.row{rr}")
            builder.cbranch(builder.icmp_signed("<", here, rows), put, end)
            builder.position_at_end(put)
            div = splat(total, here)
            for w in range(4):
                store(builder.fdiv(sums[rr * 4 + w], div), out,
                      builder.add(builder.mul(here, ldo), c(16 * w)))
        builder.branch(end)
        builder.position_at_end(end)
        close_r0([])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True)
def _attend_range(lo, hi, spread, chunks, q, k, v, out, n_head, scratch, queries_t):
    """Items [lo, hi), every (head, BLOCK queries) pair an item, shared out by the parallel loop
    at `spread` (trampoline.py); scratch (threads, BLOCK · nk) and queries_t (threads,
    HD · BLOCK): each thread's own."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    nq, nk = q.shape[0], k.shape[0]
    blocks = (nq + BLOCK - 1) // BLOCK
    me = get_thread_id()
    for item in range(lo, hi):
        h, m0 = np.int64(item) // blocks, (np.int64(item) % blocks) * BLOCK
        _block(q[m0, h * HD:].ctypes.data, q.strides[0] // 4, k[0, h * HD:].ctypes.data,
               k.strides[0] // 4, v[0, h * HD:].ctypes.data, v.strides[0] // 4, nk,
               min(BLOCK, nq - m0), scratch[me].ctypes.data, queries_t[me].ctypes.data,
               out[m0, h * HD:].ctypes.data, out.strides[0] // 4)


def attention(be, q, k, v, out, n_head):
    """out = softmax(q kᵀ / √hd) v per head, not causal; q (nq, ≥ H·hd), k and v (nk, H·hd), out
    (nq, H·hd) f32, rows of unit column stride (any row stride), hd = 64, nk ≥ KEYS; on the CPU,
    where available()."""
    nq, nk = q.shape[0], k.shape[0]
    if out.shape[1] != n_head * HD:
        raise ValueError(f"attention_fused: heads of {out.shape[1] // n_head} columns, not {HD}")
    threads = config.NUMBA_NUM_THREADS      # every id get_thread_id() can give, whatever the mask
    scratch = be.scratch("fused.scores", (threads, BLOCK * nk))
    queries_t = be.scratch("fused.queries", (threads, HD * BLOCK))
    blocks = (nq + BLOCK - 1) // BLOCK
    trampoline.share(_attend_range, n_head * blocks, q, k, v, out, n_head, scratch, queries_t)
