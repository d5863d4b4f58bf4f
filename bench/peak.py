"""The CPU's own arithmetic peak, measured: clock × lanes × units, not a library's best product.

    python3 bench/peak.py            # also imported by bench/roofline.py

A BLAS sgemm's best rate is what one library reaches, not what the hardware can do (CTranslate2
runs Whisper's encoder faster than OpenBLAS's own best product on these machines). Here each
limit is timed on loops that do nothing but the instruction in question, in LLVM IR (Numba has
no vector types), on THREADS threads at once:

  clock      a chain of dependent 64-bit multiply-adds (4 cycles each on every x86 core):
             steps a second on one core × 4 = its cycles a second, at the clock it runs at
             (/proc/cpuinfo's MHz on a VM is the host's nominal figure)
  float32    12 independent 16-lane fused multiply-adds (llvm.fma.v16f32: vfmadd…ps zmm) per
             iteration: 2 FLOPs a lane; without AVX-512, 8-lane ones (ymm)
  int8       vpdpbusd zmm (AVX-512 VNNI): 64 u8×i8 products summed into 16 lanes, 2 ops each;
             without VNNI, gemm_int8's AVX2 step (vpsignb, vpmaddubsw, vpmaddwd, vpaddd: 32
             products into 8 lanes), the ceiling its micro-tile works under
  bfloat16   vdpbf16ps zmm (AVX-512 BF16): 32 bf16 pairs into 16 f32 lanes, 2 FLOPs each
Twelve accumulators cover the 4-cycle latency of two units. Per core and cycle: one core's
rate / clock — e.g. 64 float32 FLOPs a cycle is 2 FMA units × 16 lanes × 2. The same loops on
THREADS threads at once say what this VM's shared cores give at that moment.
Where `lscpu` lists amx_bf16 / amx_int8 that is printed too (tiles at several times the rate;
nwhisper has no AMX path, so its peak is not timed here).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from machine import ROOT, THREADS, cpu_flags

sys.path.insert(0, ROOT)
from nwhisper.kernels import gemm_int8  # noqa: E402
from nwhisper.kernels import llvm_ir as L  # noqa: E402

ACC = 12            # independent accumulators a loop carries
CHAIN_CYCLES = 4    # the clock loop's multiply and add
F32X16 = ir.VectorType(ir.FloatType(), 16)
F32X8 = ir.VectorType(ir.FloatType(), 8)
I32X16 = ir.VectorType(L.I32, 16)
I32X8 = ir.VectorType(L.I32, 8)
BF16X32 = ir.VectorType(ir.IntType(16), 32)


def _calls(fname, acc_t, params):
    """dot(builder, acc, *operands): one call of LLVM function `fname`."""
    return lambda builder, acc, *ops: builder.call(L.declare(builder, fname, acc_t, list(params)),
                                                   [acc, *ops])


# name: (the /proc/cpuinfo flags it needs, accumulator type, operand types, the step
# dot(builder, acc, *operands), operations per lane per step)
UNITS = {
    "float32": (("avx512f",), F32X16, (F32X16, F32X16),
                _calls("llvm.fma.v16f32", F32X16, (F32X16, F32X16, F32X16)), 2),
    "float32 (AVX2)": (("fma",), F32X8, (F32X8, F32X8),
                       _calls("llvm.fma.v8f32", F32X8, (F32X8, F32X8, F32X8)), 2),
    "int8": (("avx512_vnni",), I32X16, (I32X16, I32X16),
             _calls("llvm.x86.avx512.vpdpbusd.512", I32X16, (I32X16, I32X16, I32X16)), 8),
    # gemm_int8's AVX2 step as it is: |x| times w with x's sign, pairs into int16, then int32
    "int8 (AVX2)": (("avx2",), I32X8, (I32X8, I32X8), gemm_int8._avx2_dot, 8),
    "bfloat16": (("avx512_bf16",), F32X16, (BF16X32, BF16X32),
                 _calls("llvm.x86.avx512bf16.dpbf16ps.512", F32X16, (F32X16, BF16X32, BF16X32)), 4),
}


def _loop_intrinsic(unit):
    _, acc_t, params, dot, _ = UNITS[unit]

    @intrinsic
    def spin(typingctx, n, seed):
        sig = types.float64(types.int64, types.float32)

        def codegen(context, builder, signature, args):
            n, seed = args
            x = L.splat(builder, seed, F32X16)
            # the operands: the seed's bits, so that nothing is known at compile time
            half = builder.shuffle_vector(x, x, ir.Constant(I32X8, list(range(8))))
            bits = lambda t: builder.bitcast(half if t in (F32X8, I32X8) else x, t)  # noqa: E731
            ops = [bits(t) for t in params]
            zero = bits(acc_t)
            _, acc, close = L.counted_loop(builder, n, 1, [zero] * ACC, unit)
            if unit == "int8 (AVX2)":   # several instructions: their operands must vary, or
                # LLVM hoists the multiplies out of the loop; each step multiplies by its
                # accumulator's bytes (12 chains cover their latency)
                out = close([dot(builder, a, ops[0], a) for a in acc])
            else:
                out = close([dot(builder, a, *ops) for a in acc])
            total = out[0]
            integer = isinstance(acc_t.element, ir.IntType)
            for a in out[1:]:
                total = builder.add(total, a) if integer else builder.fadd(total, a)
            lane = builder.extract_element(total, ir.Constant(L.I32, 0))
            if integer:
                return builder.sitofp(lane, ir.DoubleType())
            return builder.fpext(lane, ir.DoubleType())
        return sig, codegen
    return spin


def _parallel(spin):
    @njit(parallel=True, cache=False)
    def run(n, threads, seed):
        out = np.zeros(threads)
        for t in prange(threads):
            out[t] = spin(n, seed)
        return out
    return run


@njit(cache=False)
def _clock(n, y, c):
    """n steps of x = x·y + c: a multiply (3 cycles on every x86 core since 2008) and an add (1)
    that each wait for the last; y and c are not known when it compiles, and the multiply-add is
    no reduction LLVM could vectorise."""
    x = c
    for _ in range(n):
        x = x * y + c
    return x


def _best_seconds(f, *args, repeat=5):
    f(*args)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        f(*args)
        best = min(best, time.perf_counter() - t)
    return best


def measure(threads=THREADS):
    """{"clock_ghz", "amx": [...], kind: (GOP/s on one core, its ops a cycle, GOP/s on `threads`
    threads, the unit timed)} for each kind (float32, int8, bfloat16) the CPU has, its AVX-512
    unit where it has one, else its AVX2 one. The one-core figure is the hardware's; the threads'
    figure is what this VM gives at the moment (its cores are shared: it moves between runs)."""
    flags = cpu_flags()
    n = 2_000_000
    clock = n * CHAIN_CYCLES / _best_seconds(_clock, n, 3, 1) / 1e9
    out = {"clock_ghz": clock, "amx": sorted(f for f in flags if f.startswith("amx"))}
    # a seed the compiler cannot see, so that no step of the loop is folded
    seed = np.float32(1.0 + 1e-7 * (time.time() % 1))
    for unit, (need, acc_t, _, _, per_lane) in UNITS.items():
        kind = unit.split()[0]          # "float32 (AVX2)" stands in for "float32"
        if not flags.issuperset(need) or kind in out:
            continue
        per_call = acc_t.count * per_lane * ACC
        run = _parallel(_loop_intrinsic(unit))
        one, many = (n * per_call * t / _best_seconds(run, n, t, seed) / 1e9 for t in (1, threads))
        out[kind] = (one, one / clock, many, unit)
    return out


def describe(m, threads=THREADS):
    """One line per limit, for the roofline's header."""
    lines = [f"hardware peak (clock {m['clock_ghz']:.2f} GHz from dependent multiply-adds)"]
    for kind in dict.fromkeys(unit.split()[0] for unit in UNITS):
        if kind in m:
            one, per_cycle, many, unit = m[kind]
            lines.append(f"  {unit:14} one core {one:6.0f} GOP/s = {per_cycle:5.1f} ops a cycle;"
                         f" {threads} threads {many:6.0f} GOP/s")
    lines.append("  AMX: " + (", ".join(m["amx"]) if m["amx"] else "none (lscpu lists no amx_*)"))
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe(measure()))
