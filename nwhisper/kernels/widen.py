"""`widen(w)`: one weight element as float32, whatever the weight is stored as.

Whisper checkpoints are float16. A decoder step is memory-bound, so its products read the weights
in the checkpoint's two bytes and widen each at the point of use — exactly, float16 ⊂ float32,
so a float32 transcription gives the same numbers as with pre-widened weights, for half the
bytes.

Numba's CUDA target has float16 arrays; its CPU target has none. So on the CPU a float16 matrix
travels as its raw bits in a uint16 array, and `widen` of a uint16 reinterprets the bits as a
half and extends it (LLVM's `fpext half → float`, one vcvtph2ps per 16 lanes). Every other
element type (float32, float16 on CUDA, int8) is plain conversion. A kernel body calls
`widen(w[o, c])`; its CUDA launcher compiles it with `widen` bound to float32 conversion
(CUDA_FORMS), which is also what runs under the CUDA simulator.
"""

import numpy as np
from numba import njit, types
from numba.extending import intrinsic, overload

from nwhisper.kernels import trampoline


def widen(w):
    """w as float32 (uint16 on the CPU: float16 bits)."""
    return np.float32(w)


@intrinsic
def _half_bits(typingctx, bits):
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@overload(widen)
def _widen(w):
    if w == types.uint16:
        return lambda w: _half_bits(w)
    return lambda w: np.float32(w)


# The CUDA launchers' form (_compile.for_cuda): CUDA has float16 arrays, so there `widen` is only
# a conversion, and Numba's CUDA target compiles an overloaded helper for the current device only
# (the PTX check runs without one).
CUDA_FORMS = {"widen": np.float32}


# A thread's share of to_float32 at a time: large enough that a step's overhead is nothing.
_BLOCK = 1 << 16


@njit(cache=True)
def _widen_range(lo, hi, spread, chunks, bits, out):
    """out[i] = the float16 whose bits are bits[i], as float32, over blocks [lo, hi): in this
    thread, or shared out by the parallel loop at `spread` (trampoline.py)."""
    if spread:
        trampoline.shared(spread, chunks, lo, hi)
        return
    n = bits.size
    for i in range(lo * _BLOCK, min(n, hi * _BLOCK)):
        out[i] = _half_bits(bits[i])


def to_float32(a, out=None):
    """A C-contiguous float32 copy of float16 array `a` (contiguous, aligned or not: a
    memory-mapped checkpoint's tensor is read where it lies), widened exactly on Numba's threads
    (a large float32 encoder's 600 M weights are this, and NumPy's cast runs on one), into `out`
    (C-contiguous, a.size) where given, else a new array."""
    out = np.empty(a.shape, np.float32) if out is None else out
    if not _widen_range.signatures:
        # one compilation for every argument's flags (read-only and unaligned accept the rest)
        _widen_range.compile((types.int64,) * 4 + (types.Array(types.uint16, 1, "C", readonly=True, aligned=False),
                                                   types.Array(types.float32, 1, "C")))
        _widen_range.disable_compile()
    trampoline.share(_widen_range, -(-a.size // _BLOCK),
                     np.ascontiguousarray(a).reshape(-1).view(np.uint16), out.reshape(-1))
    return out
