"""The roofline: how close nwhisper's encoder and decoder step run to this machine's limits.

    python3 bench/roofline.py [--models tiny.en,base] [--repeat 5] [--position 64]

The encoder is compute-bound (GEMMs of 1500 rows), so it is held against the BLAS sgemm peak; a
decoder step of one token is memory-bound (every weight is read once for one row), so it is held
against the bytes it must read divided by the memory bandwidth. The issue's targets: encoder at
≥ 70 % of the sgemm peak, decoder step within 2× of its bandwidth bound.

Every timing is the best of --repeat calls after a warm-up call (bench/kernels.py's timed: fewer,
at least 2, for calls that take long), on the bench's thread count (bench/transcribe.py THREADS,
set before NumPy loads its BLAS). Limits:
  sgemm peak   the best GFLOP/s of np.matmul on float32 over a few large square products and the
               encoder's own shapes for each model (its projections, MLP, one head's scores)
  bandwidth    GB/s of a read of a 512 MiB float32 array, far beyond the last-level cache, on
               THREADS threads (np.max over pieces of it); a copy (np.copyto, read + write
               counted) beside it
  hardware     the CPU's own float32 FMA rate (bench/peak.py: clock × lanes × units, timed on
               loops of nothing but FMAs), and its int8 (VNNI) and bfloat16 rates; an encoder's
               "% fma" is its FLOPs over the float32 one on THREADS threads
On a busy machine the short products win the most quiet moments: read the limits with the load
average printed beside them.

Encoder FLOPs of one 30 s window, a multiply-add counted as 2 (T = n_audio_ctx = 1500 positions,
d = n_audio_state, M = n_mels, L = n_audio_layer; GELU, softmax, LayerNorm and adds not counted):
    conv1                      2 · 2T · d · 3M          3000 frames, kernel 3
    conv2                      2 · T · d · 3d           stride 2: T positions
    per layer  q, k, v, out    4 · 2·T·d²
               scores Q·Kᵀ     2·T²·d                   all heads: h · 2·T·T·(d/h)
               values P·V      2·T²·d
               fc1, fc2        2 · 2·T·d·4d
    total = 12·T·M·d + 6·T·d² + L · (24·T·d² + 4·T²·d)    tiny ≈ 36.9 GFLOP, base ≈ 87.4
Timed: Whisper.encode on a (3000, n_mels) float32 log-mel, float32 and int8. int8 runs the
linear layers (q, k, v, out, fc1, fc2: 24·T·d² of the FLOPs) on the int8 GEMM (kernels/gemm_int8.py)
where the CPU has AVX-512 VNNI, so its "% of the sgemm peak" (the same FLOP count over its time)
can pass 100 %: it says how much of a float32 machine's limit the int8 path beats, not a limit.

Decoder bytes per token: what one single-token Whisper.decode (vocabulary projection included)
reads, counted from the arrays the loaded model holds, in the precision its few-row products
read them (float32: the checkpoint's float16, 2 bytes a weight, widened at the point of use — 4 for
a float32 checkpoint; compute_type "int8": 1 byte a weight + a 4-byte scale a row):
    weights     per layer: self-attention q, k and v (one stacked product), out + cross-attention
                q, out + fc1 + fc2
                = 14·d² weights, with their biases and LayerNorms
    out proj    the tied output projection, n_vocab × d
    cross K/V   the window's cross-attention keys and values, 2 · 1500 · d per layer (float32;
                int8: int8 with a float32 scale per key and head), read whole every step
    KV cache    the self-attention keys and values so far, 2 · position · d float32 per layer
bound ms = bytes / read bandwidth; ratio = measured / bound. Timed: a prompt of position − 16
tokens in one call, then 32 one-token steps (positions around --position), their median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from machine import ROOT, THREAD_VARS, THREADS

os.environ.update({k: str(THREADS) for k in THREAD_VARS})    # before NumPy loads its BLAS
# What nwhisper/__init__ sets before NumPy loads, which here comes first: without it OpenBLAS's
# workers spin after each product and take a core from the Numba kernels that follow.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import numpy as np  # noqa: E402

import peak as hardware  # noqa: E402

MIB = 1 << 20
SQUARES = (1024, 2048)
STREAM_BYTES = 512 * MIB
STEPS = 32          # single-token decoder steps timed, centred on --position
TOKEN = 440         # any id below n_vocab: a step costs the same whatever the token


# ---------------------------------------------------------------------------------------------
# The machine's limits
def sgemm_peak(products, repeat, timed):
    """[(label, GFLOP/s)] for each (label, m, k, n) product a(m, k) @ b(k, n), best of `repeat`."""
    rng = np.random.default_rng(0)
    rates = []
    for label, m, k, n in products:
        a = rng.standard_normal((m, k), np.float32)
        b = rng.standard_normal((k, n), np.float32)
        out = np.empty((m, n), np.float32)
        rates.append((label, 2 * m * k * n / timed(lambda: np.matmul(a, b, out=out), repeat) / 1e9))
    return rates


def machine_sgemm(products, repeat, timed):
    """sgemm_peak with OpenBLAS on its own THREADS threads. Loading a model on the CPU backend
    leaves NumPy's OpenBLAS at one thread (nwhisper calls it from Numba's threads,
    kernels/blas.py); the machine's peak is still OpenBLAS's own, so it gets them back here."""
    from nwhisper.kernels import blas   # the nwhisper main() imported (--src)
    if not blas.available():
        return sgemm_peak(products, repeat, timed)
    _, set_threads, get_threads, _ = blas._openblas()
    before = get_threads()
    set_threads(THREADS)
    try:
        return sgemm_peak(products, repeat, timed)
    finally:
        set_threads(before)


def bandwidth(repeat, timed):
    """(read GB/s, copy GB/s) over STREAM_BYTES arrays. The read is np.max over pieces of the array
    on THREADS threads (NumPy releases the GIL; its max is vectorised, so the loads are the limit);
    a copy moves its bytes twice."""
    a = np.ones(STREAM_BYTES // 4, np.float32)
    b = np.empty_like(a)
    pieces = np.array_split(a, 16 * THREADS)
    with ThreadPoolExecutor(THREADS) as pool:
        read = STREAM_BYTES / timed(lambda: list(pool.map(np.max, pieces)), repeat) / 1e9
    copy = 2 * STREAM_BYTES / timed(lambda: np.copyto(b, a), repeat) / 1e9
    return read, copy


# ---------------------------------------------------------------------------------------------
# What the model needs
def encoder_flops(d):
    """FLOPs of one 30 s window through the encoder of dims `d` (the formula above)."""
    T, w, M, L = d.n_audio_ctx, d.n_audio_state, d.n_mels, d.n_audio_layer
    return 12 * T * M * w + 6 * T * w * w + L * (24 * T * w * w + 4 * T * T * w)


def encoder_products(name, d):
    """The encoder's sgemm shapes (label, m, k, n): projection, fc1, fc2, one head's scores."""
    T, w, hd = d.n_audio_ctx, d.n_audio_state, d.n_audio_state // d.n_audio_head
    return [(f"{name} proj {T}x{w}x{w}", T, w, w), (f"{name} fc1 {T}x{w}x{4 * w}", T, w, 4 * w),
            (f"{name} fc2 {T}x{4 * w}x{w}", T, 4 * w, w), (f"{name} QK {T}x{hd}x{T}", T, hd, T)]


def _read_bytes(w):
    """Bytes a few-row product reads of `w`: the int8 rows and scales of an Int8Weight (its other
    forms are for many-row GEMMs) or of Int8Heads (int8 cross K/V), else the array itself
    (float16 bits or float32)."""
    from nwhisper.kernels.matmul import Int8Weight
    Int8Heads = sys.modules["nwhisper.kernels.attention"].Int8Heads
    return w.q.nbytes + w.scale.nbytes if isinstance(w, (Int8Weight, Int8Heads)) else w.nbytes


def decoder_bytes(model, state, position):
    """{part: bytes} that one single-token step at `position` reads (the docstring's list)."""
    weights = model.dec_ln.w.nbytes + model.dec_ln.b.nbytes
    for blk in model.dec_blocks:
        for ln in (blk.attn_ln, blk.cross_ln, blk.mlp_ln):
            weights += ln.w.nbytes + ln.b.nbytes
        for lin in (blk.attn.qkv, blk.attn.out, blk.cross.q, blk.cross.out,
                    blk.fc1, blk.fc2):
            weights += _read_bytes(lin.w) + (lin.b.nbytes if lin.b is not None else 0)
    cross = sum(_read_bytes(k) + _read_bytes(v) for k, v in zip(state.cross_k, state.cross_v))
    cache = sum(k[:position].nbytes + v[:position].nbytes for k, v in zip(state.self_k, state.self_v))
    return {"weights": weights, "out proj": _read_bytes(model.out_proj), "cross K/V": cross,
            "KV cache": cache}


def step_ms(model, enc, position):
    """(median ms of STEPS single-token decoder steps whose positions centre on `position`, the
    decoder state they ran in)."""
    state = model.new_state(enc)
    model.decode(state, np.full(position - STEPS // 2, TOKEN, np.int32))
    one = np.array([TOKEN], np.int32)
    times = []
    for _ in range(STEPS):
        t = time.perf_counter()
        model.decode(state, one)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, state


# ---------------------------------------------------------------------------------------------
def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--repeat", type=int, default=5, help="best of this many calls per timing")
    p.add_argument("--position", type=int, default=64,
                   help="decoder position the steps centre on (the KV cache's length)")
    p.add_argument("--src", default=ROOT, help=argparse.SUPPRESS)   # bench/transcribe.py --rev
    args = p.parse_args()
    sys.path.insert(0, args.src)
    import nwhisper
    from kernels import timed      # bench/kernels.py: best of n after a warm-up (nwhisper from src)

    la = os.getloadavg()[0]
    loaded = {name: nwhisper.load(name, device="cpu") for name in args.models.split(",")}
    products = [(f"square {n}", n, n, n) for n in SQUARES]
    for name, m in loaded.items():
        products += encoder_products(name, m.model.dims)
    rates = machine_sgemm(products, args.repeat, timed)
    peak = max(r for _, r in rates)
    read, copy = bandwidth(args.repeat, timed)
    hw = hardware.measure()
    print(f"roofline, {THREADS} threads, load average {la:.2f} at start")
    print(hardware.describe(hw))
    print(f"sgemm peak {peak:.0f} GFLOP/s, the best of these (np.matmul float32, GFLOP/s, best of "
          f"{args.repeat}): " + ", ".join(f"{label} {r:.0f}" for label, r in rates))
    print(f"memory bandwidth: read {read:.1f} GB/s ({THREADS} threads, {STREAM_BYTES // MIB} MiB), "
          f"copy {copy:.1f} GB/s")

    enc_rows, dec_rows = [], []
    for name, m in loaded.items():
        d = m.model.dims
        # a log-mel's values do not change the encoder's cost: random ones of its shape will do
        mel = np.random.default_rng(0).standard_normal((2 * d.n_audio_ctx, d.n_mels), np.float32)
        gflop = encoder_flops(d) / 1e9
        for ct in ("float32", "int8"):
            model = m.model if ct == "float32" else nwhisper.load(name, device="cpu", compute_type=ct).model
            enc = model.encode(mel)
            s = timed(lambda: model.encode(mel), args.repeat)
            enc_rows.append(f"{name:8} {ct:8} {gflop:7.1f} {s:8.3f} {gflop / s:8.1f} {gflop / s / peak:7.0%}"
                            f" {gflop / s / hw['float32'][2]:7.0%}")
            ms, state = step_ms(model, enc, args.position)
            parts = decoder_bytes(model, state, args.position)
            total = sum(parts.values())
            bound = total / (read * 1e9) * 1e3
            dec_rows.append(f"{name:8} {ct:8}" + "".join(f"{b / 1e6:13.1f}" for b in parts.values())
                            + f"{total / 1e6:10.1f} {bound:9.2f} {ms:8.2f} {ms / bound:6.2f}")
    print(f"encoder, one 30 s window (best of {args.repeat}; target >= 70 % of the sgemm peak)")
    print(f"{'model':8} {'compute':8} {'GFLOP':>7} {'s':>8} {'GFLOP/s':>8} {'% sgemm':>7} {'% fma':>7}")
    print("\n".join(enc_rows))
    print(f"decoder, one token at position ~{args.position} (median of {STEPS} steps; bound = "
          "bytes / read bandwidth; target: ratio <= 2)")
    print(f"{'model':8} {'compute':8}" + "".join(f"{k + ' MB':>13}" for k in parts)
          + f"{'MB/token':>10} {'bound ms':>9} {'step ms':>8} {'ratio':>6}")
    print("\n".join(dec_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
