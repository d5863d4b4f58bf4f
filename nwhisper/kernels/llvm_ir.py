"""What the CPU's vector intrinsics (gemm_int8, attention_blocked) build their LLVM IR from.

Numba has no vector types, so the few loops that need them are written as LLVM IR in Numba
intrinsics; these are the pieces they share: whether the CPU has the instructions, a
broadcast, a vector load's address, and a counted loop carrying values (accumulators) from one
iteration to the next.
"""

import llvmlite.binding as llvm
from llvmlite import ir
from numba.core import config

I32, I64 = ir.IntType(32), ir.IntType(64)


def host_has(*features):
    """Whether the CPU Numba compiles for has every one of `features` (LLVM's names: "avx2",
    "avx512bf16", ...). Where Numba compiles for another CPU (NUMBA_CPU_NAME), only what
    NUMBA_CPU_FEATURES turns on for it ("+avx2,+fma,..."): none for a portable cache's generic
    CPU, whose code an intrinsic built for this one would not run on; an AVX2 machine's paths
    on an AVX-512 one (NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=+avx2,+fma) to compare them."""
    if config.CPU_NAME not in (None, "host"):
        named = {f.strip()[1:]: f.strip()[0] == "+" for f in (config.CPU_FEATURES or "").split(",")
                 if f.strip()[:1] in "+-" and f.strip()}
        return all(named.get(f, False) for f in features)
    have = llvm.get_host_cpu_features()
    return all(have.get(f, False) for f in features)


def splat(builder, value, t):
    """`value` in every lane of vector type t."""
    one = builder.insert_element(ir.Constant(t, ir.Undefined), value, ir.Constant(I32, 0))
    lanes = ir.Constant(ir.VectorType(I32, t.count), None)
    return builder.shuffle_vector(one, ir.Constant(t, ir.Undefined), lanes)


def vector_at(builder, base, at, t):
    """A pointer to a vector of type t at element offset `at` of pointer `base`."""
    return builder.bitcast(builder.gep(base, [at]), t.as_pointer())


def counted_loop(builder, n, step, inits, name):
    """Begin `for i in range(0, n, step)` (i64 n) carrying values that start as `inits`: returns
    (i, the carried values, close). The body is built after it (it may hold loops of its own);
    close(new) ends it with the values the next iteration carries and returns them as they
    leave the loop (the inits when n <= 0), the builder positioned after it."""
    entry = builder.block
    loop = builder.append_basic_block(name + ".loop")
    done = builder.append_basic_block(name + ".done")
    builder.cbranch(builder.icmp_signed(">", n, ir.Constant(I64, 0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(I64)
    i.add_incoming(ir.Constant(I64, 0), entry)
    carried = [builder.phi(v.type) for v in inits]
    for phi, v in zip(carried, inits):
        phi.add_incoming(v, entry)

    def close(new):
        latch = builder.block                         # the body's last block
        i_next = builder.add(i, ir.Constant(I64, step))
        i.add_incoming(i_next, latch)
        for phi, v in zip(carried, new):
            phi.add_incoming(v, latch)
        builder.cbranch(builder.icmp_signed("<", i_next, n), loop, done)
        builder.position_at_end(done)
        out = [builder.phi(v.type) for v in inits]    # phis first: LLVM's rule
        for phi, v0, v in zip(out, inits, new):
            phi.add_incoming(v0, entry)
            phi.add_incoming(v, latch)
        return out

    return i, carried, close


def declare(builder, name, ret, params):
    """The function `name` (an LLVM intrinsic) in the builder's module, declared once."""
    return builder.module.globals.get(name) or ir.Function(builder.module, ir.FunctionType(ret, params), name)


def broadcast_tile(builder, dot, zero, a, lda, b, n, b_step, rows, vecs, name):
    """The loop of a GEMM micro-tile of `rows` × `vecs` vectors, as vpdpbusd, vdpbf16ps and
    gemm_int8's AVX2 step take it: for k < n, each row's 4 bytes at a + r·lda + 4k broadcast,
    times each of the `vecs` vectors of 4-byte lanes at b + k·b_step (as many lanes as `zero`
    has, one after the other), summed by `dot(acc, a4, b)` (a function that builds the IR) into
    accumulators starting at `zero`. a, b: i8 pointers; lda: i64 bytes. Returns the sums,
    row-major."""
    lanes = zero.type.count
    i32v = ir.VectorType(I32, lanes)
    k, acc, close = counted_loop(builder, n, 1, [zero] * (rows * vecs), name)
    at_k = builder.mul(k, ir.Constant(I64, b_step))
    bv = [builder.load(vector_at(builder, b, builder.add(at_k, ir.Constant(I64, 4 * lanes * j)), i32v),
                       align=1)
          for j in range(vecs)]
    new = []
    for r in range(rows):
        at = builder.add(builder.mul(ir.Constant(I64, r), lda), builder.mul(k, ir.Constant(I64, 4)))
        four = builder.load(builder.bitcast(builder.gep(a, [at]), I32.as_pointer()), align=1)
        a4 = splat(builder, four, i32v)
        new += [dot(acc[r * vecs + j], a4, bv[j]) for j in range(vecs)]
    return close(new)


def store_rows(builder, first, end, rows, name, store_row):
    """store_row(r) (which builds row r's stores) for each tile row r < `rows` with first ≤ r <
    end (i64 values): the rows of a micro-tile that are a product's own (a tile past a product's
    last row computes rows that are not stored)."""
    done = builder.append_basic_block(name + ".stored")
    for r in range(rows):
        row, skip = builder.append_basic_block(f"{name}.row{r}"), builder.append_basic_block(f"{name}.skip{r}")
        r_ = ir.Constant(I64, r)
        builder.cbranch(builder.and_(builder.icmp_signed("<=", first, r_), builder.icmp_signed("<", r_, end)),
                        row, skip)
        builder.position_at_end(row)
        store_row(r)
        builder.branch(skip)
        builder.position_at_end(skip)
    builder.branch(done)
    builder.position_at_end(done)
