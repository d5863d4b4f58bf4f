"""How a CPU launch shares its work out over Numba's threads: every body's range function runs
its blocks, called by address from one parallel loop that all launches share.

Each body has one serial function over a range of work items (`name_range(lo, hi, ...)`:
_compile.py writes them; hand-written kernels have their own) that runs all of a launch's
arithmetic. A launch of [0, count) in `chunks` blocks is

    launch(spread_address(), address(name_range, args), count, chunks, args)

`launch` stores the arguments in a frame on its stack and hands `spread`, the one parallel
loop, the frame and an entry that takes (lo, hi, frame) and calls name_range on the frame's
arguments through the range function's address. `spread`'s loop only calls that entry per
block; `launch` calls `spread` through its address too, so no launch links a parallel loop.

Why: a parallel loop costs Numba ~0.3-0.5 s to compile (its gufunc, scheduling and the loop
linked in again), and a prange loop that held the body optimised the whole body twice more
(numba 0.68: a parallel attend_row compiled in 2.3 s against 1.1 for its range function, and a
process that compiled it rounded some sums otherwise than one that loaded it from the cache).
Here `spread` compiles once (0.5 s, then from the cache), each argument types' `launch` in
~0.07 s, and a launch gives the same floats on one thread or many, compiled here or cached.

A range function's loops vectorise as a prange loop's would: its index starts at a `nonneg` lo
(an index that might be negative is checked for wrapping at every access), and its arrays are
noalias, as Numba declares a prange loop's (an in-place GELU, out = x, otherwise fails LLVM's
runtime overlap check and runs scalar: 6.3 ms against 0.8 over an encoder's 2.3 M floats). So
a body may write in place only to the element it reads.

An address is that of a compiled function's C wrapper (the entry Numba itself calls first-class
functions through); the entry's call is typed from the same data model, so it passes each
argument as that wrapper receives it.
"""

import hashlib

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.extending import intrinsic

_I64 = ir.IntType(64)
# An entry: void(lo, hi, frame): the range function over [lo, hi) on the frame's arguments
_ENTRY = ir.FunctionType(ir.VoidType(), [_I64, _I64, ir.IntType(8).as_pointer()])


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
def _framed(typingctx, at, args):
    """(entry, frame): a frame on the caller's stack holding address `at` and the tuple `args`,
    and the address of an entry (defined once per tuple type in the caller's module) that calls
    the function at `at` as f(lo, hi, *args) with the frame's values."""
    if not isinstance(args, types.BaseTuple):
        return None
    sig = types.UniTuple(types.int64, 2)(at, args)

    def codegen(context, builder, signature, llargs):
        at_v, tup = llargs
        tuple_type = signature.args[1]
        frame_type = ir.LiteralStructType([_I64, tup.type])
        frame = cgutils.alloca_once(builder, frame_type)
        builder.store(at_v, cgutils.gep_inbounds(builder, frame, 0, 0))
        builder.store(tup, cgutils.gep_inbounds(builder, frame, 0, 1))
        name = "nwhisper.entry." + hashlib.sha1(str(tuple_type).encode()).hexdigest()[:16]
        entry = cgutils.get_or_insert_function(builder.module, _ENTRY, name)
        if entry.is_declaration:
            entry.linkage = "internal"
            b = ir.IRBuilder(entry.append_basic_block())
            lo, hi, raw = entry.args
            held = b.bitcast(raw, frame_type.as_pointer())
            target = b.load(cgutils.gep_inbounds(b, held, 0, 0))
            values = cgutils.unpack_tuple(b, b.load(cgutils.gep_inbounds(b, held, 0, 1)),
                                          len(tuple_type))
            callee = ir.FunctionType(context.get_value_type(types.none),
                                     [_I64, _I64] + [context.get_value_type(t) for t in tuple_type])
            b.call(b.inttoptr(target, callee.as_pointer()), [lo, hi, *values])
            b.ret_void()
        return context.make_tuple(builder, signature.return_type,
                                  (builder.ptrtoint(entry, _I64), builder.ptrtoint(frame, _I64)))

    return sig, codegen


@intrinsic
def _call(typingctx, at, a, b, c, d):
    """f(a, b, c, d) for the function at address `at` taking four int64s (an entry's three
    arguments fit too: a pointer passes as an int64 does)."""
    sig = types.void(at, a, b, c, d)

    def codegen(context, builder, signature, llargs):
        fn = ir.FunctionType(ir.VoidType(), [_I64] * 4)
        builder.call(builder.inttoptr(llargs[0], fn.as_pointer()), list(llargs[1:]))
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


@njit(cache=True)
def launch(spread_at, at, count, chunks, args):
    """The range function at address `at` over [0, count) in `chunks` blocks on Numba's threads
    (spread, at `spread_at`), given the arguments after its (lo, hi)."""
    entry, frame = _framed(at, args)
    _call(spread_at, entry, count, chunks, frame)


_SPREAD = (types.int64,) * 4
_ADDRESSES = {}     # address()'s answers, by (function, the arguments' typing keys)


def address_of(fn, sig):
    """The address of dispatcher `fn`'s C wrapper for argument types `sig`, compiled (or loaded
    from the cache) first if need be."""
    if sig not in fn.overloads:
        fn.compile(sig)
    cres = fn.overloads[sig]
    return cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)


def spread_address():
    at = _ADDRESSES.get(spread)
    if at is None:
        at = _ADDRESSES[spread] = address_of(spread, _SPREAD)
    return at


def typing_key(fn, a):
    """What Numba types argument `a` by, cheaply: an array's type, dtype, dimensions, layout
    and flags (numba's typeof reads no more of it), a scalar's Python type, a tuple's items';
    anything else as Numba types it."""
    if isinstance(a, np.ndarray):
        f = a.flags
        return type(a), a.dtype, a.ndim, f.c_contiguous, f.f_contiguous, f.writeable, f.aligned
    if isinstance(a, (bool, np.generic)) or (isinstance(a, (int, float)) and abs(a) < 2 ** 62):
        return type(a)
    if isinstance(a, tuple):
        return tuple(typing_key(fn, x) for x in a)
    return fn.typeof_pyval(a)


def address(ranged, args):
    """The address of range function `ranged`'s code for (lo, hi, *args)."""
    key = (ranged, tuple(typing_key(ranged, a) for a in args))
    at = _ADDRESSES.get(key)
    if at is None:
        sig = (types.int64, types.int64) + tuple(ranged.typeof_pyval(a) for a in args)
        at = _ADDRESSES[key] = address_of(ranged, sig)
    return at


def share(ranged, count, *args):
    """ranged(lo, hi, *args) over [0, count), one block a thread of Numba's."""
    launch(spread_address(), address(ranged, args), count, numba.get_num_threads(), args)


def share_as(ranged, sig, count, args):
    """As share, with `ranged` compiled once for argument types `sig` (after lo, hi) however the
    arrays come (their layouts and flags: 'A' and read-only types take any), and `launch` once
    for them."""
    found = _ADDRESSES.get((ranged, sig))
    if found is None:
        launched = _SPREAD + (types.Tuple(sig),)
        address_of(launch, launched)
        found = _ADDRESSES[(ranged, sig)] = (address_of(ranged, (types.int64, types.int64) + sig),
                                             launch.overloads[launched].entry_point)
    at, run = found
    run(spread_address(), at, count, numba.get_num_threads(), args)
