"""linear_elem's CPU fast path: the same sums, a tile of rows × outputs at a time.

A decoder step multiplies a few rows (a batch of windows, a beam, a prompt) by the decoder's
int8 or float16 weights. linear_elem takes one output at a time and sums each row's dot product
in four 8-lane accumulators (LLVM's vectorised loop: column c goes to lane c mod 32), widening
the weight row again for every row and loading two operands per multiply-add: for one row it
streams the weights at memory speed, for eight it is compute-bound at a third of the FMA units'
rate.

Here a micro-tile of up to 4 rows × O outputs (3 for int8 weights, 1 for float16: outs) keeps
its sums in registers: each weight vector is widened once for all its rows and each row vector
loaded once for O outputs. linear_elem's four accumulators are kept apart (all four in one loop
where R·O·4 vectors fit in registers, else in passes over the tile's weight rows, which stay in
L1), each summed in linear_elem's order, and added as LLVM's reduction adds them:

    total = (a0 + a1) + (a2 + a3),  then lanes (0+4, 1+5, 2+6, 3+7),  (0+2, 1+3),  0+1
    out = fma(total, scale, bias)  (+ out where accumulating)

so every (row, output) rounds exactly as in linear_elem where LLVM vectorises it that way (an
AVX2 CPU: same_as_body, tested bit for bit), and on any CPU the same whatever rows come with it
— a window decodes the same alone or batched. The IR carries no fast-math flags (explicit
llvm.fma), so its order holds in every build, compiled or cached. Each tile prefetches a later
tile's weight rows, a line of each an iteration: several rows streamed at once outrun the
hardware prefetcher otherwise. For input widths that are a multiple of 32 (every Whisper
width) on CPUs with AVX2, FMA and F16C; linear_elem elsewhere. bench/tiles.py times the two per
shape (bench/RESULTS.md has the figures).
"""

import functools

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from nwhisper.kernels import llvm_ir as L
from nwhisper.kernels.trampoline import NoAlias, nonneg, shared

LANES = 8               # float32 lanes of an AVX2 vector
PARTS = 4               # linear_elem's accumulators: column c sums into part (c // 8) % 4
STEP = LANES * PARTS   # columns per iteration of linear_elem's vector loop
ROWS = 4                # rows per micro-tile at most
GROUP = 6               # outputs that every tile shape divides
GROUPS = 8              # groups of outputs per parallel item
ACCUMULATORS = 12       # vectors a tile sums into, of the 16 registers


def outs(int8):
    """Outputs per tile of a group, for any number of rows: int8 rows are read 3 at a time; float16
    rows, twice the bytes, one at a time (3 at a time, 3-5 rows took 1.5x linear_elem's time
    from memory; one at a time they still gain the widening shared by the rows)."""
    return 3 if int8 else 1


_outs = njit(inline="always")(outs)
# Every tile shape (rows, outputs) the kernel is built with: a group's, and 1 × 1 for the outputs
# past the last group (a vocabulary of 51865). Each shape adds to the compile.
SHAPES = {int8: sorted({(r, outs(int8)) for r in range(1, ROWS + 1)} | {(1, 1)}) for int8 in (True, False)}


@functools.cache
def available():
    """True where the tiles run: AVX2 with FMA and F16C, Numba compiling for this CPU."""
    return L.host_has("avx2", "fma", "f16c")


def same_as_body():
    """Whether the tiles' sums are linear_elem's bit for bit here: where LLVM vectorises
    linear_elem's loop in 8 lanes × 4 accumulators, as it does on an AVX2 CPU without AVX-512
    (tested; a CPU with AVX-512 may take 16 lanes, and the two then differ by float32 rounding)."""
    return available() and not L.host_has("avx512f")


def fits(n_in):
    """Whether a product of input width n_in runs here (the vector loop covers it whole)."""
    return n_in % STEP == 0 and n_in > 0


def _emit_tile(builder, args, int8, R, O):
    """The IR of one tile of R rows × O outputs (see _tile)."""
    from llvmlite import ir
    x_a, ldx, w_a, ldw, n_in, out_a, ldo, scale_a, bias_a, acc_flag = args[:10]
    f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
    x_p, out_p, scale_p, bias_p = (builder.inttoptr(a, f32.as_pointer())
                                   for a in (x_a, out_a, scale_a, bias_a))
    w_p = builder.inttoptr(w_a, (ir.IntType(8) if int8 else ir.IntType(16)).as_pointer())
    vf = ir.VectorType(f32, LANES)
    c = lambda v: ir.Constant(i64, v)  # noqa: E731
    fma = L.declare(builder, "llvm.fma.v8f32", vf, [vf, vf, vf])
    fma1 = L.declare(builder, "llvm.fma.f32", f32, [f32, f32, f32])
    i8p = ir.IntType(8).as_pointer()
    prefetch = L.declare(builder, "llvm.prefetch.p0", ir.VoidType(), [i8p, i32, i32, i32])

    def widened(at):
        if int8:
            t = ir.VectorType(ir.IntType(8), LANES)
            return builder.sitofp(builder.load(L.vector_at(builder, w_p, at, t), align=1), vf)
        bits = builder.load(L.vector_at(builder, w_p, at, ir.VectorType(ir.IntType(16), LANES)), align=1)
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), LANES)), vf)

    # Parts summed in one loop: all four where their accumulators fit, else fewer per pass
    # (the weight rows are read again from L1).
    together = next(t for t in (4, 2, 1) if R * O * t <= ACCUMULATORS)
    parts = []      # per part: R·O vectors, row-major
    for g0 in range(0, PARTS, together):
        k, acc, close = L.counted_loop(builder, n_in, STEP, [ir.Constant(vf, None)] * (R * O * together),
                                       f"t{R}x{O}.p{g0}")
        if g0 == 0:     # a later tile's weights from memory, a line of each row an iteration:
            ahead = 2 if R >= 3 else 1  # two tiles on where a tile's sums take longer (measured)
            for o in range(O):
                at = builder.gep(w_p, [builder.add(builder.mul(c(o + ahead * O), ldw), k)])
                builder.call(prefetch, [builder.bitcast(at, i8p), ir.Constant(i32, 0),
                                        ir.Constant(i32, 3), ir.Constant(i32, 1)])
        new = []
        for g in range(together):
            col = builder.add(k, c(LANES * (g0 + g)))
            xs = [builder.load(L.vector_at(builder, x_p, builder.add(builder.mul(c(r), ldx), col), vf),
                               align=4) for r in range(R)]
            ws = [widened(builder.add(builder.mul(c(o), ldw), col)) for o in range(O)]
            new += [builder.call(fma, [xs[r], ws[o], acc[(g * R + r) * O + o]])
                    for r in range(R) for o in range(O)]
        done = close(new)
        parts += [done[g * R * O:(g + 1) * R * O] for g in range(together)]

    def lanes(v, picks):
        return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                      ir.Constant(ir.VectorType(i32, len(picks)), picks))

    adding = builder.icmp_signed("!=", acc_flag, c(0))
    for r in range(R):
        for o in range(O):
            a = [parts[g][r * O + o] for g in range(PARTS)]
            t = builder.fadd(builder.fadd(a[0], a[1]), builder.fadd(a[2], a[3]))
            t = builder.fadd(lanes(t, [0, 1, 2, 3]), lanes(t, [4, 5, 6, 7]))
            t = builder.fadd(lanes(t, [0, 1]), lanes(t, [2, 3]))
            total = builder.fadd(builder.extract_element(t, c(0)), builder.extract_element(t, c(1)))
            y = builder.call(fma1, [total, builder.load(builder.gep(scale_p, [c(o)])),
                                    builder.load(builder.gep(bias_p, [c(o)]))])
            at = builder.gep(out_p, [builder.add(builder.mul(c(r), ldo), c(o))])
            builder.store(builder.select(adding, builder.fadd(builder.load(at), y), y), at)


@intrinsic
def _tile(typingctx, x_addr, ldx, w_addr, ldw, n_in, out_addr, ldo, scale_addr, bias_addr,
          accumulate, probe, rows, outs):
    """out[r, o] (+ out[r, o] where accumulate ≠ 0) = fma(Σ_c x[r, c] · w[o, c], scale[o],
    bias[o]) for r < rows, o < outs, (rows, outs) one of SHAPES; w's elements int8 or float16
    bits (uint16), the type of `probe` (any element of w). Addresses (x, out, scale, bias f32)
    as integers, strides in elements. One function for every shape (a switch), so that Numba
    compiles one specialisation per weight type."""
    if probe not in (types.int8, types.uint16):
        return None
    int8 = probe == types.int8
    u, i = types.uintp, types.intp
    sig = types.void(u, i, u, i, i, u, i, u, u, i, probe, i, i)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        i64 = ir.IntType(64)
        end = builder.append_basic_block("tile.end")
        key = builder.add(builder.mul(args[11], ir.Constant(i64, 16)), args[12])
        switch = builder.switch(key, end)
        for R, O in SHAPES[int8]:
            block = builder.append_basic_block(f"tile.{R}x{O}")
            switch.add_case(ir.Constant(i64, 16 * R + O), block)
            builder.position_at_end(block)
            _emit_tile(builder, args, int8, R, O)
            builder.branch(end)
        builder.position_at_end(end)
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def _at(a, i, j):
    """The address of a[i, j] as an integer."""
    return a.ctypes.data + i * a.strides[0] + j * a.itemsize


@njit(inline="always")
def _outputs(x, w, scale, bias, out, acc, o0, o_end, group):
    """Every row of x against outputs o0 … o_end − 1, in tiles of up to ROWS rows × the outputs
    that outs() gives; unless `group` (the few outputs past the last group), one row × one
    output at a time."""
    n, n_in = x.shape
    ldx, ldw, ldo = x.strides[0] // 4, w.strides[0] // w.itemsize, out.strides[0] // 4
    int8 = w.itemsize == 1
    r = 0
    while r < n:
        rows = min(n - r, ROWS) if group else 1
        step = _outs(int8) if group else 1
        for o in range(o0, o_end, step):
            _tile(_at(x, r, 0), ldx, _at(w, o, 0), ldw, n_in, _at(out, r, o), ldo,
                  _at(scale, 0, o), _at(bias, 0, o), acc, w[0, 0], rows, step)
        r += rows


@njit
def _item(item, x, w, scale, bias, out, acc):
    """Parallel item `item`: GROUPS groups of GROUP outputs, each past every row (its weight
    rows stay in L1 from the first tile on); the last item takes the outputs past the groups
    one at a time."""
    groups = w.shape[0] // GROUP
    if item * GROUPS < groups:
        for g in range(item * GROUPS, min((item + 1) * GROUPS, groups)):
            _outputs(x, w, scale, bias, out, acc, g * GROUP, (g + 1) * GROUP, True)
    else:
        _outputs(x, w, scale, bias, out, acc, groups * GROUP, w.shape[0], False)


def items(n_out):
    """How many items a product of n_out outputs is shared out in."""
    return -(-(n_out // GROUP) // GROUPS) + (n_out % GROUP > 0)


@njit(pipeline_class=NoAlias, cache=True)
def linear_range(lo, hi, spread, chunks, x, w, scale, bias, out, acc):
    """Items [lo, hi) of out (+)= x @ w.T · scale + bias as linear_elem computes it (acc: 1 to
    add to out, else 0); x (n, n_in) f32 with n_in a multiple of STEP, w (n_out, n_in) int8 or
    uint16 (float16 bits), scale and bias (n_out,) f32 (ones and zeros where the layer has none),
    out (n, n_out) f32; rows of x and out with unit column stride. All of a product is
    [0, items(n_out)), in this thread or shared out on the threads (be.share, trampoline.py)."""
    if spread:
        shared(spread, chunks, lo, hi)
        return
    lo = nonneg(lo)
    for j in range(hi - lo):
        _item(lo + j, x, w, scale, bias, out, acc)
