"""Every op on the CUDA backend under Numba's CUDA simulator, compared with the CPU backend.

Run by tests/cuda/test_cudasim.py in a subprocess (the simulator must be switched on before numba is
imported):

    NUMBA_ENABLE_CUDASIM=1 python tests/helpers/cudasim_check.py [--signatures SIGS.json] [--share DIR]

prints one line per case ("CASE name maxdiff=...") and finally "REPORT {json}" (--share: only
the cases this process claims first, by creating a file named for the case in DIR, so that
processes started with the same DIR share the cases between them); shapes are tiny,
as the simulator runs one Python thread per CUDA thread. The simulator does no type inference, so
the argument types of every launch can be saved, and

    python tests/helpers/cudasim_check.py --ptx SIGS.json [PART PARTS]

(without the simulator; needs NVVM, e.g. from `pip install numba-cuda[cu13]`, but no GPU) compiles
each body for exactly those types, and the kernels of _cuda_fast.py, with the CUDA compiler, and
reports any whose PTX uses float64 arithmetic. On a machine with a GPU,

    python tests/helpers/cudasim_check.py --gpu

runs the same cases on the real device instead of the simulator (bench/gpu_session.sh does).
"""

import json
import os
import sys
import time

import numpy as np

from nwhisper import backend  # noqa: E402
from nwhisper.backend import Backend  # noqa: E402
from nwhisper import kernels as K  # noqa: E402
from nwhisper.kernels.matmul import linear_elem  # noqa: E402
from nwhisper.kernels.reduce import softmax_row  # noqa: E402
from speakers_tiny import DIMS as SPEAKERS_TINY, random_state, voices  # noqa: E402

TOL = 5e-6  # relative: f32 on both sides, only the summation order differs (the CPU reassociates)

# The simulator's block manager polls its threads in a loop that keeps the GIL for a whole switch
# interval while they wait at a barrier: 1 ms instead of Python's 5 takes a third to two thirds
# off the cases with many syncthreads
SWITCH_S = 0.001

rng = np.random.default_rng(1234)


def rand(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# Each case takes a backend and host inputs, runs ops on the backend, returns host arrays.

def layernorm_portable(be, x, w, b):
    """The portable body, for the fast path's sake (CudaBackend.layernorm runs _cuda_fast)."""
    out = be.empty(x.shape)
    Backend.layernorm(be, be.upload(x), be.upload(w), be.upload(b), out, np.float32(1e-5))
    return [be.download(out)]


def layernorm(be, x, w, b):
    out = be.empty(x.shape)
    K.layernorm(be, be.upload(x), be.upload(w), be.upload(b), out)
    return [be.download(out)]


def gelu(be, x):
    d = be.upload(x.copy())
    out = be.empty(x.shape)
    K.gelu(be, d, out)
    K.gelu(be, d, d)  # in place
    return [be.download(out), be.download(d)]


def pick(be, logits, rules):
    """Greedy's choice (kernels/pick.py) over a few chunks: the first 30 ids text, the rest
    timestamps; the rules as TimestampRules.ranges gives them."""
    mask = np.zeros_like(logits)
    mask[0, [2, 31, 45]] = -np.inf
    out = be.empty((2,), np.float32)
    K.pick(be, be.upload(logits), be.upload(mask), be.upload(np.asarray(rules, np.int32)), 30, out)
    return [be.download(out)]


def softmax_portable(be, x, scale, nq, causal, q_offset):
    """The portable body, for the fast path's sake (CudaBackend.softmax_rows runs _cuda_fast)."""
    d = be.upload(x.copy())
    be.launch(softmax_row, x.shape[0], d, x.shape[1], np.float32(scale), nq, causal, q_offset)
    out = be.download(d)
    be.softmax_rows(d, scale, nq, causal, q_offset)
    return [out, be.download(d)]


def elementwise(be, a, b, table):
    da, db = be.upload(a.copy()), be.upload(b)
    K.add(be, da, db, da)
    K.add_rows(be, da, be.upload(table), 2)
    z = be.zeros(a.shape)
    K.kv_write(be, z, 1, be.upload(a[:2].copy()))
    return [be.download(da), be.download(z)]


def embed(be, table, ids):
    out = be.empty((ids.shape[0], table.shape[1]))
    K.embed(be, be.upload(table), be.upload(ids), out)
    return [be.download(out)]


def conv1d(be, x, w, b, stride):
    out = be.empty((K.conv.out_len(x.shape[0], stride), w.shape[0]))
    K.conv1d(be, be.upload(x), be.upload(w), be.upload(b), out, stride)
    return [be.download(out)]


def linear(be, x, w, bias):
    out = be.empty((x.shape[0], w.shape[0]))
    K.linear(be, be.upload(x), be.weight(w), None if bias is None else be.upload(bias), out)
    return [be.download(out)]


def linear_ln(be, x, w, bias, ln_w, ln_b):
    """out = LayerNorm(x) @ w.T + bias (the CUDA GEMV normalises x as it reads it; elsewhere a
    layernorm launch, then the product)."""
    out = be.empty((x.shape[0], w.shape[0]))
    K.linear(be, be.upload(x), be.weight(w), be.upload(bias), out,
             (be.upload(ln_w), be.upload(ln_b), 1e-5))
    return [be.download(out)]


def linear_add(be, x, w, bias, residual):
    """out += x @ w.T + bias (CUDA fast paths: the GEMV's or GEMM's epilogue adds)."""
    out = be.upload(residual.copy())
    K.linear_add(be, be.upload(x), be.weight(w), None if bias is None else be.upload(bias), out)
    return [be.download(out)]


def linear_portable(be, x, w, bias):
    """The portable body, for the fast paths' sake (the CPU side of this case runs BLAS)."""
    out = be.empty((x.shape[0], w.shape[0]))
    none = be.upload(np.zeros(0, np.float32))
    be.launch(linear_elem, out.shape[1], be.upload(x), be.weight(w), none,
              none if bias is None else be.upload(bias), out, x.shape[0], x.shape[1], False)
    return [be.download(out)]


def linear_int8(be, x, w, bias):
    """int8 rows with per-row scales (compute_type="int8"): linear_elem on both targets."""
    out = be.empty((x.shape[0], w.shape[0]))
    K.linear(be, be.upload(x), be.weight_int8(w), None if bias is None else be.upload(bias), out)
    return [be.download(out)]


def gemv_lanes(min_blocks, case):
    """`case` with the CUDA GEMV's lanes per output chosen as for a product of many more outputs:
    gemm() widens them (32 up to GEMV_THREADS) until the outputs make GEMV_MIN_BLOCKS blocks, so
    the simulator's few outputs would always take a whole block each (one output a block, the
    slowest way to simulate and not how a GPU runs the vocabulary's). 0 keeps 32 lanes (8 outputs
    a block); 1 widens them until the outputs fill one block."""
    from nwhisper.kernels import _cuda_fast

    def run(be, *args):
        saved, _cuda_fast.GEMV_MIN_BLOCKS = _cuda_fast.GEMV_MIN_BLOCKS, min_blocks
        try:
            return case(be, *args)
        finally:
            _cuda_fast.GEMV_MIN_BLOCKS = saved
    return run


def logits(be, x, table):
    out = be.empty((x.shape[0], table.shape[0]))
    K.logits(be, be.upload(x), be.weight(table), out)
    return [be.download(out)]


def attention(be, q, k, v, n_head, causal, q_offset):
    out = be.empty(q.shape)
    p = K.attention(be, be.upload(q), be.upload(k), be.upload(v), out, n_head, causal, q_offset)
    return [be.download(out), be.download(p)]


def garbage_past(n, x):
    """x with its rows from n on scaled by 50: what a KV cache holds past its length, large enough
    to show in the output if it were attended to."""
    x[n:] *= 50
    return x


def attention_cache(be, q, k, v, n_head, q_offset):
    """A decoder's call: the whole KV cache (rows past its length hold garbage) and n_keys."""
    out = be.empty(q.shape)
    p = K.attention(be, be.upload(q), be.upload(k), be.upload(v), out, n_head, True, q_offset,
                    n_keys=q_offset + q.shape[0])
    return [be.download(out), be.download(p)]


def attention_at(be, q, k, v, n_head, q_offset):
    """A decoder call whose position the device may read (`at`, as decode's tokens): CUDA's
    attend_part then attends over the whole cache, masked, its p a column per cache row, zero
    past the position; the CPU slices n_keys. Compared up to n_keys."""
    out = be.empty(q.shape)
    at = be.upload(np.array([q_offset, 77], np.int32))
    n = q_offset + q.shape[0]
    p = be.download(K.attention(be, be.upload(q), be.upload(k), be.upload(v), out, n_head, True,
                                q_offset, n_keys=n, at=at))
    assert p.shape[2] in (n, k.shape[0]) and not p[..., n:].any(), p.shape
    return [be.download(out), p[..., :n]]


def embed_append(be, table, pos_table, ids, qkv):
    """A decoder call's embeddings (embed_at: token ids and position from one device array) and
    the keys and values of its [q | k | v] appended to a cache at that position (kv_append)."""
    tokens = be.upload(np.concatenate([[2], ids]).astype(np.int32))
    out = be.empty((ids.shape[0], table.shape[1]))
    K.embed_at(be, be.weight(table, gemv=True), be.upload(pos_table), tokens, out)
    cache_k, cache_v = be.zeros((6, qkv.shape[1] // 3)), be.zeros((6, qkv.shape[1] // 3))
    K.kv_append(be, be.upload(qkv), cache_k, cache_v, tokens)
    return [be.download(out), be.download(cache_k), be.download(cache_v)]


def attention_portable(be, q, k, v, n_head, causal, q_offset):
    """The three portable launches, for the fast paths' sake (the CPU side of this case runs BLAS)."""
    from nwhisper.kernels.attention import attention_portable as portable
    p = be.empty((n_head, q.shape[0], k.shape[0]))
    out = be.empty(q.shape)
    portable(be, be.upload(q), be.upload(k), be.upload(v), out, p, causal, q_offset)
    return [be.download(out), be.download(p)]


def attend_row(be, q, k, v, n_head, causal, q_offset):
    """The decoder-step attention body (kernels.attention.attend_row) over a row-major cache, as
    the CPU's self-attention launches it, probabilities kept."""
    from nwhisper.kernels.attention import attend_rows
    nq, width = q.shape
    p = be.empty((n_head, nq, k.shape[0]))
    out = be.empty(q.shape)
    at = be.upload(np.array([q_offset], np.int32))   # the position read on the device, as a step does
    attend_rows(be, be.upload(q), be.upload(k), be.upload(v), out, p, True, True, causal, 0, at)
    return [be.download(out), be.download(p)]


def attention_int8_kv(be, q, k, v, n_head):
    """compute_type="int8"'s cross-attention: keys and values as Int8Heads (quantised per key)."""
    from nwhisper.kernels.attention import heads_int8
    kh, vh = heads_int8(be, be.upload(k), n_head), heads_int8(be, be.upload(v), n_head)
    out = be.empty(q.shape)
    p = K.attention(be, be.upload(q), kh, vh, out, n_head)
    return [be.download(out), be.download(p), be.download(kh.q).astype(np.float32),
            be.download(kh.scale)]


def exp_rows(be, x):
    """The softmax's exponential (reduce.exp_row): the CPU's bit-built 2^n against CUDA's expf."""
    x = be.upload(x.copy())
    total = be.empty((x.shape[0], 1))
    K.exp_rows(be, x, total)
    return [be.download(x), be.download(total)]


def log_mel(be, signal, n_frames, live):
    """The spectral kernels on a tiny spectrogram (n_fft 16, 9 bins, 4 mel bands, hop 4)."""
    from nwhisper.kernels import spectral

    n_fft, hop, n_freq, n_mels = 16, 4, 9, 4
    angle = 2 * np.pi * np.outer(np.arange(n_freq), np.arange(n_fft)) / n_fft
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    filters = np.abs(np.random.default_rng(1).standard_normal((n_mels, n_freq)))
    out = be.empty((n_frames, n_mels))
    spectral.log_mel(be, be.upload(signal), be.upload(window), be.upload(np.cos(angle)),
                     be.upload(np.sin(angle)), be.upload(filters), live, hop, out)
    return [be.download(out)]


def silero_vad(be, chunks):
    """Silero's whole chunk kernel, two streams, state carried over successive chunks."""
    from nwhisper.vad.silero import Silero

    vad = Silero(be, streams=2)
    return [np.asarray(vad.step(c)) for c in chunks]


def silero_vad_run(be, chunks):
    """Silero over a run of one stream's chunks: their encoders in one launch, then the LSTM
    through them in one item (Silero.run), in two calls (the state carried between)."""
    from nwhisper.vad.silero import Silero

    vad = Silero(be)
    return [vad.run(chunks[:3]), vad.run(chunks[3:])]


def speakers_fbank(be, windows):
    """The speaker network's Kaldi fbank (80 bands, mean-normalised per window), two windows of a
    tone in noise: its faint bands are where float32 arithmetic would differ (speaker_ops.py)."""
    from nwhisper.speakers.fbank import fbank

    return [be.download(fbank(be, be.upload(windows), portable=True))]


def campplus_tiny(be, windows):
    """The speaker network's every body (fbank, its 2-D front end, TDNN, CAM dense blocks,
    statistics pooling) on a tiny random-weight CAM++ (speakers_tiny.py), two windows at once:
    their embeddings. Under the simulator its GEMMs run the portable linear_elem: the tiled
    GEMM's blocks are hundreds of simulator threads each (3 s a product), and the linear cases
    above hold the tiled GEMM itself; a real GPU runs its fast paths."""
    from nwhisper.speakers import weights
    from nwhisper.speakers.campplus import CAMPPlus

    simulated = getattr(be, "simulator", False)
    if simulated:
        be.fast_paths = False
    try:
        net = CAMPPlus(be, dims=SPEAKERS_TINY, params=weights.fold(random_state(), SPEAKERS_TINY))
        return [net.embed(windows)]
    finally:
        if simulated:
            be.fast_paths = True


CASES = [
    ("layernorm", layernorm, (rand(6, 32) * 3 + 1, rand(32), rand(32))),
    ("gelu", gelu, (rand(5, 16) * 3,)),
    ("pick_text", pick, (rand(1, 300) * 3, (0, 30, 300, 0))),
    ("pick_rule5", pick, (np.concatenate([rand(1, 30) - 9, rand(1, 270)], axis=1), (5, 40, 300, 1))),
    ("softmax_causal_portable", softmax_portable, (rand(6, 300) * 5, 0.3, 3, True, 2)),
    ("exp_rows", exp_rows, (np.where(rand(4, 50) > 1.2, -np.inf, rand(4, 50) * 40).astype(np.float32),)),
    ("elementwise", elementwise, (rand(4, 8), rand(4, 8), rand(7, 8))),
    ("elementwise_f16_table", elementwise, (rand(4, 8), rand(4, 8), rand(7, 8, dtype=np.float16))),
    ("embed_f32", embed, (rand(10, 8), np.array([3, 0, 9], np.int32))),
    ("embed_f16", embed, (rand(10, 8, dtype=np.float16), np.array([9, 9, 1], np.int32))),
    ("conv1d_s1", conv1d, (rand(8, 4), rand(6, 4, 3), rand(6), 1)),
    ("conv1d_s2_f16", conv1d, (rand(9, 4), rand(6, 4, 3, dtype=np.float16), rand(6), 2)),
    # the GEMV at 256 lanes an output (its own choice for these few), 64 (gemv_lanes 1: 4 outputs
    # a block) and 32 (gemv_lanes 0: 8 a block); blocks whose last outputs are past n_out
    ("linear_gemv_bias", linear, (rand(2, 16), rand(5, 16), rand(5))),
    ("linear_gemv_f16_nobias", gemv_lanes(0, linear), (rand(1, 37), rand(19, 37, dtype=np.float16), None)),
    ("linear_tiled_bias", linear, (rand(20, 21), rand(18, 21), rand(18))),
    ("linear_tiled_f16", linear, (rand(17, 35), rand(33, 35, dtype=np.float16), rand(33))),
    ("linear_portable_f16", linear_portable, (rand(5, 35), rand(9, 35, dtype=np.float16), rand(9))),
    ("linear_int8_bias", linear_int8, (rand(3, 37), rand(10, 37), rand(10))),
    ("logits_f16", gemv_lanes(0, logits), (rand(2, 16), rand(20, 16, dtype=np.float16))),
    ("attention_full", attention, (rand(6, 16), rand(6, 16), rand(6, 16), 2, False, 0)),
    ("attention_causal", attention, (rand(2, 16), rand(7, 16), rand(7, 16), 2, True, 4)),
    ("log_mel", log_mel, (rand(5 * 4 + 16).astype(np.float64), 8, 5)),
    ("silero_vad", silero_vad, (rand(2, 2, 512) * 0.1,)),
    ("silero_vad_run", silero_vad_run, (rand(5, 512) * 0.1,)),
    ("speakers_fbank", speakers_fbank, (voices(2, 720, seed=6),)),
    ("campplus_tiny", campplus_tiny, (voices(2, 720),)),
    ("attention_decode", attention, (rand(1, 16), rand(8, 16), rand(8, 16), 4, True, 7)),
    ("attention_int8_kv", attention_int8_kv, (rand(2, 16), rand(9, 16), rand(9, 16), 4)),
    ("layernorm_wide_portable", layernorm_portable, (rand(3, 300) * 3 + 1, rand(300), rand(300))),
    ("layernorm_wide", layernorm, (rand(3, 300) * 3 + 1, rand(300), rand(300))),
    # _cuda_fast: attend_part/join up to 4 queries (several chunks of keys), scores/values_tiled above
    # (several tiles each way; causal, as a prompt's)
    ("attention_long_keys", attention, (rand(1, 16), rand(40, 16), rand(40, 16), 2, False, 0)),
    ("attention_many", attention, (rand(17, 16), rand(20, 16), rand(20, 16), 1, False, 0)),
    ("attention_prompt_causal", attention, (rand(9, 16), rand(11, 16), rand(11, 16), 2, True, 2)),
    ("attention_causal_portable", attention_portable, (rand(3, 16), rand(7, 16), rand(7, 16), 2, True, 4)),
    ("attend_row_causal", attend_row, (rand(3, 16), rand(7, 16), rand(7, 16), 2, True, 4)),
    ("attention_cache_step", attention_cache, (rand(1, 16), garbage_past(7, rand(12, 16)),
                                               garbage_past(7, rand(12, 16)), 2, 6)),
    ("attention_cache_prompt", attention_cache, (rand(6, 16), garbage_past(9, rand(15, 16)),
                                                 garbage_past(9, rand(15, 16)), 2, 3)),
    ("attention_at_step", attention_at, (rand(1, 16), garbage_past(7, rand(12, 16)),
                                         garbage_past(7, rand(12, 16)), 2, 6)),
    ("attention_at_chunks", attention_at, (rand(1, 16), rand(70, 16) * 5, rand(70, 16), 1, 40)),
    ("attention_at_prompt", attention_at, (rand(2, 16), rand(15, 16) * 5, rand(15, 16), 2, 4)),
    ("embed_append", embed_append, (rand(10, 8, dtype=np.float16), rand(7, 8), np.array([9, 0, 4], np.int32),
                                    rand(3, 24))),
    ("linear_ln_gemv_f16", gemv_lanes(1, linear_ln), (rand(2, 37) * 3 + 1, rand(5, 37, dtype=np.float16),
                                                      rand(5), rand(37), rand(37))),
    ("linear_ln_tiled", linear_ln, (rand(9, 21) * 3 + 1, rand(18, 21), rand(18), rand(21), rand(21))),
    ("linear_add_gemv", gemv_lanes(0, linear_add), (rand(2, 21), rand(18, 21), rand(18), rand(2, 18))),
    ("linear_add_tiled_f16", linear_add, (rand(17, 35), rand(33, 35, dtype=np.float16), None, rand(17, 33))),
]


def describe(arg):
    """A launch argument's type, as JSON: what the CUDA compiler would type it as."""
    if isinstance(arg, bool):
        return ["bool"]
    if isinstance(arg, int):
        return ["int64"]
    if isinstance(arg, np.generic):
        return [arg.dtype.name]
    return ["array", arg.dtype.name, arg.ndim]


def recording(be, signatures):
    """Make be.launch record the argument types of each body into `signatures`."""
    launch = be.launch

    def record(kernel, count, *args, work=None):
        sig = [describe(a) for a in args]
        if sig not in signatures.setdefault(kernel.__name__, []):
            signatures[kernel.__name__].append(sig)
        launch(kernel, count, *args, work=work)
    be.launch = record


def claimed(share, name):
    """Whether this process runs case `name`: always without a share directory, else when it
    is the first to create DIR/name."""
    if share is None:
        return True
    try:
        os.close(os.open(os.path.join(share, name), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def simulate(signatures_path, gpu=False, share=None):
    if not gpu and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        sys.exit("cudasim_check.py needs NUMBA_ENABLE_CUDASIM=1 in the environment (or --gpu)")
    assert isinstance(backend.get("cuda"), backend.CudaBackend)
    if not gpu:
        sys.setswitchinterval(SWITCH_S)
    cpu, sim = backend.get("cpu"), backend.CudaBackend(fast_paths=True)
    assert sim.simulator != gpu
    signatures = {}
    recording(sim, signatures)
    report = {"cases": {}, "failed": []}
    t0 = time.perf_counter()
    for name, case, inputs in CASES:
        if not claimed(share, name):
            continue
        start = time.perf_counter()
        want = case(cpu, *inputs)
        got = case(sim, *inputs)
        diff = max(float(np.max(np.abs(g.astype(np.float64) - w) / np.maximum(1.0, np.abs(w))))
                   for g, w in zip(got, want))
        ok = all(g.shape == w.shape and g.dtype == w.dtype for g, w in zip(got, want)) and diff <= TOL
        report["cases"][name] = diff
        if not ok:
            report["failed"].append(name)
        print(f"CASE {name} maxdiff={diff:.3g} {'ok' if ok else 'FAILED'} "
              f"{time.perf_counter() - start:.1f} s", flush=True)
    report["seconds"] = round(time.perf_counter() - t0, 2)
    report["bodies"] = sorted(signatures)
    if signatures_path:
        with open(signatures_path, "w") as f:
            json.dump(signatures, f)
    print("REPORT " + json.dumps(report), flush=True)
    return 1 if report["failed"] else 0


def compile_ptx(signatures_path, part=0, parts=1):
    """Compile every recorded body signature, and the CUDA-only GEMMs, to PTX (every parts-th
    of them from the part-th: processes side by side); report errors and float64 use."""
    from numba import cuda, types
    from numba.np.numpy_support import from_dtype

    from nwhisper.kernels import _compile, _cuda_fast
    from nwhisper.kernels.spectral import FLOAT64_BODIES
    from nwhisper.kernels.speaker_ops import FLOAT64_BODIES as SPEAKER_FLOAT64_BODIES
    from nwhisper.kernels._compile import for_cuda

    def numba_type(d):
        if d[0] == "array":
            return types.Array(from_dtype(np.dtype(d[1])), d[2], "C")
        return types.boolean if d[0] == "bool" else from_dtype(np.dtype(d[0]))

    with open(signatures_path) as f:
        signatures = json.load(f)
    bodies = _compile.bodies()
    jobs = []  # (label, function, argument types, device function?)
    for name, sigs in signatures.items():
        for sig in sigs:
            argtypes = (types.int64,) + tuple(numba_type(d) for d in sig)
            jobs.append((f"{name}{argtypes}", for_cuda(bodies[name]), argtypes, True))  # as launched
    f32 = types.Array(types.float32, 2, "C")
    vec = types.Array(types.float32, 1, "C")
    for wtype in (types.float32, types.float16):
        w = types.Array(wtype, 2, "C")
        jobs.append((f"gemm_tiled({wtype})", _cuda_fast.gemm_tiled.py_func,
                     (f32, w, vec, f32, types.int64, types.int64, types.int64, types.boolean), False))
        jobs.append((f"gemv({wtype})", _cuda_fast.gemv.py_func,
                     (f32, w, vec, f32, types.int64, types.int64, types.boolean, types.int64, vec, vec,
                      types.float32), False))
    jobs.append(("softmax_rows", _cuda_fast.softmax_rows.py_func,
                 (f32, types.int64, types.float32, types.int64, types.boolean, types.int64), False))
    f32_3 = types.Array(types.float32, 3, "C")
    i64 = types.int64
    jobs.append(("layernorm_rows", _cuda_fast.layernorm_rows.py_func, (f32, vec, vec, f32, i64, types.float32), False))
    at = types.Array(types.int32, 1, "C")
    jobs.append(("attend_part", _cuda_fast.attend_part.py_func,
                 (f32, f32, f32, f32_3, f32_3, i64, i64, i64, types.float32, types.boolean, i64, at), False))
    jobs.append(("attend_join", _cuda_fast.attend_join.py_func,
                 (f32_3, f32_3, f32, i64, i64, i64, types.float32, types.boolean, i64, at), False))
    jobs.append(("scores_tiled", _cuda_fast.scores_tiled.py_func, (f32, f32, f32_3, i64, i64, i64), False))
    jobs.append(("values_tiled", _cuda_fast.values_tiled.py_func, (f32_3, f32, f32, i64, i64, i64), False))
    report = {"compiled": 0, "f64": [], "errors": {},
              "unexercised": sorted(set(bodies) - set(signatures))}
    for label, fn, argtypes, device in jobs[part::parts]:
        try:
            ptx, _ = cuda.compile_ptx(fn, argtypes, device=device, cc=(7, 5))
        except Exception as e:
            report["errors"][label] = str(e).splitlines()[0][:300]
            continue
        report["compiled"] += 1
        # the log-mel's and the speakers' fbank's bodies are float64 on purpose (kernels/spectral.py
        # and kernels/speaker_ops.py say why)
        if ".f64" in ptx and label.split("(")[0] not in FLOAT64_BODIES + SPEAKER_FLOAT64_BODIES:
            report["f64"].append(label)
    print("REPORT " + json.dumps(report), flush=True)
    return 1 if report["errors"] or report["f64"] else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--ptx"]:
        sys.exit(compile_ptx(args[1], *map(int, args[2:4])))
    share = None
    if "--share" in args:
        share = args.pop(args.index("--share") + 1)
        args.remove("--share")
    sys.exit(simulate(args[1] if args[:1] == ["--signatures"] else None, gpu=args[:1] == ["--gpu"], share=share))
