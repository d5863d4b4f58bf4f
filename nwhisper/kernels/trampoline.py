"""How a CPU launcher shares a body's work out: `call_at`, a call through a compiled function's
address; `nonneg`, a promise to LLVM that an index is not negative; and `NoAlias`, the pipeline
that compiles a range function with its arrays declared not to overlap.

Each body has one serial function over a range of work items (`name_range(lo, hi, ...)`,
_compile.py writes them) that runs every launch's arithmetic, and a parallel launcher that only
splits [0, count) into one block a thread and calls `name_range` on each block by its address:

    @njit(parallel=True)
    def name(at, count, chunks, ...):
        for c in prange(chunks):
            call_at(at, c * count // chunks, (c + 1) * count // chunks, (...))

Called by address, the range function is not linked into the parallel loop. Linked, Numba would
optimise the whole body again inside the loop's gufunc and once more in the launcher (numba 0.68:
a parallel attend_row took 2.3 s to compile against 1.1 for its range function, and a process
that compiled it rounded some sums differently from one that loaded it from the cache). Here the
parallel launcher compiles in ~0.3 s, and a launch gives the same floats whether it runs on one
thread or many, compiled here or cached.

A range function's loops vectorise as a prange loop's would: its index starts at a `nonneg` lo
(an index that might be negative is checked for wrapping at every access), and its arrays are
noalias, as Numba declares a prange loop's (an in-place GELU, out = x, otherwise fails LLVM's
runtime overlap check and runs scalar: 6.3 ms against 0.8 over an encoder's 2.3 M floats). So,
as for a parallel launch before, a body may write in place only to the element it reads.

`at` is the address of the range function's C wrapper (the entry Numba itself calls first-class
functions through), found once per argument types (backend/cpu.py); its C type is built from
the same data model, so the call passes each argument as that wrapper receives it.
"""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.extending import intrinsic


class NoAlias(CompilerBase):
    """Numba's nopython pipeline with the arrays' data declared noalias (Numba's own flag, which
    it sets for a prange loop's gufunc)."""

    def define_pipelines(self):
        self.state.flags.noalias = True
        return [DefaultPassBuilder.define_nopython_pipeline(self.state)]


@intrinsic
def call_at(typingctx, at, lo, hi, args):
    """fn(lo, hi, *args) for the compiled function whose C wrapper is at address `at` (intp),
    compiled for exactly (int64, int64, *the types of args)."""
    if not isinstance(args, types.BaseTuple):
        return None
    sig = types.void(at, lo, hi, args)

    def codegen(context, builder, signature, llargs):
        at_v, lo_v, hi_v, tup = llargs
        arg_types = [signature.args[1], signature.args[2], *signature.args[3]]
        values = [lo_v, hi_v, *cgutils.unpack_tuple(builder, tup, len(signature.args[3]))]
        fnty = ir.FunctionType(context.get_value_type(types.none),
                               [context.get_value_type(t) for t in arg_types])
        builder.call(builder.inttoptr(at_v, fnty.as_pointer()), values)
        return context.get_dummy_value()

    return sig, codegen


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
