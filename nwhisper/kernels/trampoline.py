"""How a CPU launch shares its work out over Numba's threads: a range function hands blocks of
its own range to the one parallel loop that every launch shares.

Each body has one serial function over a range of work items (_compile.py writes them; the
hand-written kernels have their own), which runs all of a launch's arithmetic:

    @njit(pipeline_class=NoAlias, cache=True)
    def name_range(lo, hi, spread_at, chunks, ...):
        if spread_at:                       # a parallel launch
            shared(spread_at, chunks, lo, hi)
            return
        for i in [lo, hi): body(i, ...)

Called with spread_at = 0 it runs [lo, hi) in this thread. Called with spread_address() it
stores its own arguments in a frame on its stack, and `spread`, the one parallel loop, calls an
entry (defined beside the function, in its module) on each of `chunks` blocks of [lo, hi) that
calls the function again on its block with spread_at = 0. `spread` itself is called by its
address, so no range function links a parallel loop.

Why: a parallel loop costs Numba ~0.3-0.5 s to compile (its gufunc, scheduling and the loop
linked in again), and a prange loop that held the body optimised the whole body twice more
(numba 0.68: a parallel attend_row compiled in 2.3 s against 1.1 for its range function, and a
process that compiled it rounded some sums otherwise than one that loaded it from the cache).
Here `spread` compiles once (~0.4 s, then from the cache) and a body's launch is its range
function alone: the same floats on one thread or many, compiled here or cached.

A range function's loops vectorise as a prange loop's would: its index starts at a `nonneg` lo
(an index that might be negative is checked for wrapping at every access), and its arrays are
noalias, as Numba declares a prange loop's (an in-place GELU, out = x, otherwise fails LLVM's
runtime overlap check and runs scalar: 6.3 ms against 0.8 over an encoder's 2.3 M floats). So
a body may write in place only to the element it reads.
"""

import copy
import functools

import numba
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils, inline_closurecall
from numba.core import ir as numba_ir
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.extending import intrinsic

_I64 = ir.IntType(64)
# An entry: void(lo, hi, frame): the range function over [lo, hi) on the frame's arguments
_ENTRY = ir.FunctionType(ir.VoidType(), [_I64, _I64, ir.IntType(8).as_pointer()])


class _BlockCopies:
    """`copy` as Numba's inliner sees it: the blocks of a body it copies share one memo.

    Every body is inlined into its range function in Numba's IR (_compile.py), and the inliner
    (InlineWorker.inline_ir) copies the body's IR twice, a block at a time; each block's
    deepcopy took the function's whole scope (every variable) with it, so a body of B blocks
    and V variables cost B × V copies: 1.2 s of Silero's one body's 4.5 s compile. Here the
    blocks that share a scope within one inlining share one memo (the scope copied once, as a
    deepcopy of the whole function would); a new inlining starts afresh, as each must own its
    copy."""

    def __init__(self):
        self.fresh()

    def fresh(self):
        self._scope, self._memo = None, None

    def deepcopy(self, x, memo=None):
        if memo is None and isinstance(x, numba_ir.Block):
            if x.scope is not self._scope:
                self._scope, self._memo = x.scope, {}
            memo = self._memo
        return copy.deepcopy(x, memo)

    def __getattr__(self, name):
        return getattr(copy, name)


def _share_block_copies():
    """Install _BlockCopies in Numba's inliner, each inlining from a fresh memo; where this
    Numba's inliner is not as expected, leave it be."""
    worker = getattr(inline_closurecall, "InlineWorker", None)
    inline_ir = getattr(worker, "inline_ir", None)
    if inline_closurecall.__dict__.get("copy") is not copy or inline_ir is None:
        return
    copies = _BlockCopies()

    @functools.wraps(inline_ir)
    def inline_afresh(*args, **kwargs):
        copies.fresh()
        try:
            return inline_ir(*args, **kwargs)
        finally:
            copies.fresh()

    worker.inline_ir = inline_afresh
    inline_closurecall.copy = copies


_share_block_copies()


class NoAlias(CompilerBase):
    """Numba's nopython pipeline with the arrays' data declared noalias (Numba's own flag, which
    it sets for a prange loop's gufunc)."""

    def define_pipelines(self):
        self.state.flags.noalias = True
        return [DefaultPassBuilder.define_nopython_pipeline(self.state)]


@intrinsic
def nonneg(typingctx, v):
    """v, with LLVM told that it is ≥ 0: a range function's index then needs no check for a
    negative (wrapping) index, and its loops vectorise as one that starts at 0 does."""
    if not isinstance(v, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        assume = builder.module.declare_intrinsic(
            "llvm.assume", fnty=ir.FunctionType(ir.VoidType(), [ir.IntType(1)]))
        builder.call(assume, [builder.icmp_signed(">=", args[0], ir.Constant(args[0].type, 0))])
        return args[0]

    return v(v), codegen


@intrinsic
def shared(typingctx, spread_at, chunks, lo, hi):
    """The calling range function on each of `chunks` blocks of [lo, hi), one a thread, by the
    parallel loop at address `spread_at`. The function's leading arguments must be
    (lo, hi, spread_at, chunks): its blocks are calls with their own lo and hi and spread_at 0."""
    if any(t != types.int64 for t in (spread_at, chunks, lo, hi)):
        return None
    sig = types.void(spread_at, chunks, lo, hi)

    def codegen(context, builder, signature, llargs):
        at, chunks_v, lo_v, hi_v = llargs
        fn = builder.function
        # Numba's calling convention: (return slot, exception slot, the arguments as its data
        # model flattens them); the four leading int64s are one value each
        own = list(fn.args[2:])
        frame_type = ir.LiteralStructType([a.type for a in own])
        frame = cgutils.alloca_once(builder, frame_type)
        for i, a in enumerate(own):
            builder.store(a, cgutils.gep_inbounds(builder, frame, 0, i))
        entry = builder.module.globals.get(fn.name + ".block")
        if entry is None:
            entry = ir.Function(builder.module, _ENTRY, fn.name + ".block")
            entry.linkage = "internal"
            b = ir.IRBuilder(entry.append_basic_block())
            block_lo, block_hi, raw = entry.args
            held = b.bitcast(raw, frame_type.as_pointer())
            values = [b.load(cgutils.gep_inbounds(b, held, 0, i)) for i in range(len(own))]
            values[:3] = b.add(values[0], block_lo), b.add(values[0], block_hi), ir.Constant(_I64, 0)
            result = cgutils.alloca_once(b, fn.args[0].type.pointee)
            b.store(cgutils.get_null_value(result.type.pointee), result)
            b.call(fn, [result, cgutils.alloca_once(b, fn.args[1].type.pointee)] + values)
            b.ret_void()
        loop = ir.FunctionType(ir.VoidType(), [_I64] * 4)
        builder.call(builder.inttoptr(at, loop.as_pointer()),
                     [builder.ptrtoint(entry, _I64), builder.sub(hi_v, lo_v), chunks_v,
                      builder.ptrtoint(frame, _I64)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _enter(typingctx, entry, lo, hi, frame):
    """entry(lo, hi, frame) (an _ENTRY at address `entry`)."""
    sig = types.void(entry, lo, hi, frame)

    def codegen(context, builder, signature, llargs):
        e, lo_v, hi_v, f = llargs
        builder.call(builder.inttoptr(e, _ENTRY.as_pointer()),
                     [lo_v, hi_v, builder.inttoptr(f, _ENTRY.args[2])])
        return context.get_dummy_value()

    return sig, codegen


@njit(parallel=True, cache=True)
def spread(entry, count, chunks, frame):
    """entry(lo, hi, frame) on each of `chunks` blocks of [0, count), one a thread: every
    launch's parallel loop."""
    for c in prange(chunks):
        _enter(entry, c * count // chunks, (c + 1) * count // chunks, frame)


_SPREAD = []    # spread's address, once found


def spread_address():
    """The address of `spread`'s C wrapper, compiled (or loaded from the cache) first if need
    be: what a range function is given to share its range out."""
    if not _SPREAD:
        sig = (types.int64,) * 4
        if sig not in spread.overloads:
            spread.compile(sig)
        cres = spread.overloads[sig]
        _SPREAD.append(cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name))
    return _SPREAD[0]


@njit(inline="always")
def panel_rows(item, m_rows, chunk_rows):
    """(panel, first row, end row) of a CPU GEMM's work item: a product's items are (64-column
    panel, chunk of rows) pairs, panel-major, so a thread's consecutive items share a panel
    (it stays in L2) while their rows stream past."""
    row_chunks = -(-m_rows // chunk_rows)
    first = item % row_chunks * chunk_rows
    return item // row_chunks, first, min(first + chunk_rows, m_rows)


def share(ranged, count, *args):
    """ranged over [0, count) on Numba's threads, one block a thread."""
    ranged(0, count, spread_address(), numba.get_num_threads(), *args)
