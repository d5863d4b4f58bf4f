"""`fast_exp`, `order_key` / `from_key`: an exponential and a maximum that LLVM vectorises;
`bf16`: a float32's nearest bfloat16, as the CPU's bfloat16 kernels pack their operands.

Two reductions over long float32 rows (the encoder's 1500-key softmax, the 51865-word logits of
a decoding step) are slow on the CPU for reasons of form, not arithmetic:

  * Numba compiles `math.exp` to one libm call per element, which never vectorises. `fast_exp`
    computes e^x = 2^t, t = x·log2(e), as 2^floor(t) · 2^frac(t): the integer part written
    straight into a float's exponent bits, the fraction by a polynomial — plain arithmetic.
  * LLVM vectorises a float maximum only if it may ignore NaNs, and the launchers keep IEEE
    semantics (masks are -inf). A float32's bits, read as an int32 with the low 31 bits flipped
    where the sign is set, order exactly as the floats do (-inf lowest); an integer maximum
    vectorises. `order_key(v)` gives that key, `from_key(k)` the float back. A NaN's key lies
    above +inf's (or below -inf's, by its sign bit), where a float compare would skip it.

Each helper is overloaded for the CPU with bit casts (LLVM `bitcast`, free in a vector
register); as Python functions they are the plain forms, and those (CUDA_FORMS) are what the CUDA
launchers bind, where none of this matters: a GPU thread loops over few elements.
"""

import math

import numpy as np
from numba import njit, types
from numba.extending import intrinsic, overload


def fast_exp(x):
    """e^x, for x ≤ 0 or -inf (gives 0); float32 on the CPU, relative error ≤ 3e-6."""
    return math.exp(x)


def order_key(v):
    """A key ordered as float32 v is (the CPU: an int32); v itself in the plain form."""
    return np.float32(v)


def from_key(k):
    """The float32 whose key is k."""
    return np.float32(k)


# The CUDA launchers' forms (_compile.for_cuda): libdevice's expf, float32 compares.
CUDA_FORMS = {"fast_exp": math.exp, "order_key": np.float32, "from_key": np.float32}


@intrinsic
def _float_bits(typingctx, v):
    if v != types.float32:
        return None

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        return builder.bitcast(args[0], ir.IntType(32))

    return types.int32(types.float32), codegen


@intrinsic
def _bits_float(typingctx, b):
    if b != types.int32:
        return None

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


@overload(fast_exp)
def _fast_exp(x):
    def impl(x):
        t = np.float32(x) * np.float32(1.4426950408889634)  # log2(e)
        t = t if t >= np.float32(-126.0) else np.float32(-127.0)  # -127: exponent bits 0 -> 0.0
        whole = np.int32(math.floor(t))
        f = t - np.float32(whole)
        # 2^f on [0, 1): least squares at 4000 Chebyshev nodes, degree 6, relative error 2.6e-9
        # in float64 (float32's rounding, ~6e-8, dominates); the rest of the 3e-6 is the
        # rounding of t's fraction when |t| is large, where e^x is below 2^-20.
        p = np.float32(2.1877504770e-04)
        p = p * f + np.float32(1.2387821479e-03)
        p = p * f + np.float32(9.6845804523e-03)
        p = p * f + np.float32(5.5480426326e-02)
        p = p * f + np.float32(2.4023050204e-01)
        p = p * f + np.float32(6.9314692869e-01)
        p = p * f + np.float32(1.0000000026e+00)
        return p * _bits_float(np.int32((whole + np.int32(127)) << np.int32(23)))
    return impl


@overload(order_key)
def _order_key(v):
    def impl(v):
        b = _float_bits(np.float32(v))
        # Numba widens int32 arithmetic to int64: the casts keep the key 32 bits wide
        return np.int32(b ^ ((b >> np.int32(31)) & np.int32(0x7FFFFFFF)))
    return impl


@overload(from_key)
def _from_key(k):
    def impl(k):
        return _bits_float(np.int32(k ^ ((k >> np.int32(31)) & np.int32(0x7FFFFFFF))))
    return impl


@njit(inline="always")
def bf16(x):
    """The bits of the bfloat16 nearest float32 x (ties to even), as vcvtneps2bf16 rounds (NaNs
    aside: one whose payload lies in the dropped half may come out infinite): the top half of x's bits after adding half the dropped half, less one
    where the kept half is even."""
    b = _float_bits(np.float32(x))
    return np.uint16((b + np.int32(0x7FFF) + ((b >> np.int32(16)) & np.int32(1))) >> np.int32(16) & 0xFFFF)


def bf16_array(a):
    """bf16 of every element of float32 array `a`, in NumPy (uint16, C-contiguous): for weights
    packed on the host."""
    b = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
