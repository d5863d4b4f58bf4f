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
             iteration: 2 FLOPs a lane
  int8       vpdpbusd zmm (AVX-512 VNNI): 64 u8×i8 products summed into 16 lanes, 2 ops each
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

from transcribe import ROOT, THREADS

sys.path.insert(0, ROOT)
from nwhisper.kernels import llvm_ir as L  # noqa: E402

ACC = 12            # independent accumulators a loop carries
CHAIN_CYCLES = 4    # the clock loop's multiply and add
F32X16 = ir.VectorType(ir.FloatType(), 16)
I32X16 = ir.VectorType(L.I32, 16)
BF16X32 = ir.VectorType(ir.IntType(16), 32)

# name: (accumulator type, LLVM function, its argument types, operations per lane per call)
UNITS = {
    "float32": (F32X16, "llvm.fma.v16f32", (F32X16, F32X16, F32X16), 2),
    "int8": (I32X16, "llvm.x86.avx512.vpdpbusd.512", (I32X16, I32X16, I32X16), 8),
    "bfloat16": (F32X16, "llvm.x86.avx512bf16.dpbf16ps.512", (F32X16, BF16X32, BF16X32), 4),
}


def _loop_intrinsic(unit):
    acc_t, fname, params, _ = UNITS[unit]

    @intrinsic
    def spin(typingctx, n, seed):
        sig = types.float64(types.int64, types.float32)

        def codegen(context, builder, signature, args):
            n, seed = args
            x = L.splat(builder, seed, F32X16)
            # the operands: the seed's bits, so that nothing is known at compile time
            ops = [builder.bitcast(x, t) if t != F32X16 else x for t in params[1:]]
            zero = builder.bitcast(x, acc_t) if acc_t != F32X16 else x
            f = L.declare(builder, fname, acc_t, list(params))
            _, acc, close = L.counted_loop(builder, n, 1, [zero] * ACC, unit)
            out = close([builder.call(f, [a] + ops) for a in acc])
            total = out[0]
            for a in out[1:]:
                total = builder.add(total, a) if acc_t == I32X16 else builder.fadd(total, a)
            lane = builder.extract_element(total, ir.Constant(L.I32, 0))
            if acc_t == I32X16:
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


def cpu_flags():
    """The first CPU's feature flags in /proc/cpuinfo."""
    with open("/proc/cpuinfo") as f:
        line = next((ln for ln in f if ln.startswith("flags")), "flags :")
    return set(line.split(":", 1)[1].split())


def measure(threads=THREADS):
    """{"clock_ghz", "amx": [...], unit: (GOP/s on one core, its ops a cycle, GOP/s on `threads`
    threads)} for each unit the CPU has. The one-core figure is the hardware's; the threads'
    figure is what this VM gives at the moment (its cores are shared: it moves between runs)."""
    flags = cpu_flags()
    # a 16-lane FMA is two 8-lane ones without AVX-512: the same FLOPs a call
    need = {"float32": "fma", "int8": "avx512_vnni", "bfloat16": "avx512_bf16"}
    n = 2_000_000
    clock = n * CHAIN_CYCLES / _best_seconds(_clock, n, 3, 1) / 1e9
    out = {"clock_ghz": clock, "amx": sorted(f for f in flags if f.startswith("amx"))}
    # a seed the compiler cannot see, so that no step of the loop is folded
    seed = np.float32(1.0 + 1e-7 * (time.time() % 1))
    for unit, flag in need.items():
        if flag not in flags:
            continue
        per_call = 16 * UNITS[unit][3] * ACC
        run = _parallel(_loop_intrinsic(unit))
        one, many = (n * per_call * t / _best_seconds(run, n, t, seed) / 1e9 for t in (1, threads))
        out[unit] = (one, one / clock, many)
    return out


def describe(m, threads=THREADS):
    """One line per limit, for the roofline's header."""
    lines = [f"hardware peak (clock {m['clock_ghz']:.2f} GHz from dependent multiply-adds)"]
    for unit in UNITS:
        if unit in m:
            one, per_cycle, many = m[unit]
            lines.append(f"  {unit:9} one core {one:6.0f} GOP/s = {per_cycle:5.1f} ops a cycle;"
                         f" {threads} threads {many:6.0f} GOP/s")
    lines.append("  AMX: " + (", ".join(m["amx"]) if m["amx"] else "none (lscpu lists no amx_*)"))
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe(measure()))
