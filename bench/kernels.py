"""Kernel timings at Whisper tiny/base shapes on the CPU backend, and the cost of compiling them.

    python bench/kernels.py [--models tiny,base] [--repeat 20] [--no-compile]

Per op: the best wall time of `repeat` calls after one warm-up call (the best, not the median: on a
shared machine the others measure the neighbours), at the shapes one 30 s window gives (encoder:
1500 positions; decoder step: one token over a KV cache; vocabulary 51864).
Attention is timed on both CPU paths (BLAS per head, which K.attention takes on the CPU, and the
portable bodies, which CUDA runs).

Compile cost: fresh subprocesses import nwhisper, make a CPU backend and run every op once on tiny
shapes, first with an empty Numba cache directory (cold: everything compiles) and then again with
the same directory (warm: everything loads from the cache).
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nwhisper import backend  # noqa: E402
from nwhisper import kernels as K  # noqa: E402

MODELS = {  # d_model, heads, n_mels (openai/whisper ModelDimensions)
    "tiny": (384, 6, 80),
    "base": (512, 8, 80),
    "small": (768, 12, 80),
}
N_CTX_AUDIO = 1500  # encoder positions of a 30 s window
N_CTX_TEXT = 448    # decoder context
N_VOCAB = 51864


def timed(fn, repeat, budget=2.0):
    """Best of `repeat` calls after a warm-up call; fewer calls when one takes long (`budget` s)."""
    t = time.perf_counter()
    fn()
    repeat = max(2, min(repeat, int(budget / (time.perf_counter() - t))))
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def op_table(be, d, heads, n_mels, repeat):
    """[(name, seconds)] for one model size."""
    rng = np.random.default_rng(0)

    def r(*shape, dtype=np.float32):
        return rng.standard_normal(shape).astype(dtype)

    attention = sys.modules["nwhisper.kernels.attention"]
    T = N_CTX_AUDIO
    x, y = r(T, d), be.empty((T, d))
    h = be.empty((T, 4 * d))
    w_dd, w_up, w_down = (be.weight(r(o, i, dtype=np.float16)) for o, i in
                          [(d, d), (4 * d, d), (d, 4 * d)])
    bias_d, bias_up = r(d), r(4 * d)
    lnw, lnb = r(d), r(d)
    mel, c1, c2 = r(2 * T, n_mels), be.empty((2 * T, d)), be.empty((T, d))
    conv1_w, conv2_w = be.upload(r(d, n_mels, 3, dtype=np.float16)), be.upload(r(d, d, 3, dtype=np.float16))
    tok = be.weight(r(N_VOCAB, d, dtype=np.float16))
    pos = be.upload(r(N_CTX_TEXT, d, dtype=np.float16))
    x1, y1, h1 = r(1, d), be.empty((1, d)), be.empty((1, 4 * d))
    logits, ids = be.empty((1, N_VOCAB)), np.array([50258], np.int32)
    mask, choice = be.upload(np.zeros((1, N_VOCAB), np.float32)), be.empty((2,))
    rules = be.upload(np.array([0, N_VOCAB - 1501, N_VOCAB, 1], np.int32))  # timestamps: rule 5 on
    kcache, vcache = r(N_CTX_TEXT, d), r(N_CTX_TEXT, d)
    half = N_CTX_TEXT // 2

    def both_paths(name, q, k, v, out, causal=False, q_offset=0):
        p = be.scratch("bench.p", (heads, q.shape[0], k.shape[0]))
        paths = (("blas", lambda: attention.attention_blas(be, q, k, v, out, heads, p, causal, q_offset)),
                 ("portable", lambda: attention.attention_portable(be, q, k, v, out, p, causal, q_offset)))
        return [(f"{name} [{path}]", timed(fn, repeat)) for path, fn in paths]

    rows = [
        ("conv1 (3000,80)->(3000,d) s1", timed(lambda: K.conv1d(be, mel, conv1_w, bias_d, c1, 1), repeat)),
        ("conv2 (3000,d)->(1500,d) s2", timed(lambda: K.conv1d(be, c1, conv2_w, bias_d, c2, 2), repeat)),
        ("layernorm (1500,d)", timed(lambda: K.layernorm(be, x, lnw, lnb, y), repeat)),
        ("linear (1500,d)x(d,d)+b", timed(lambda: K.linear(be, x, w_dd, bias_d, y), repeat)),
        ("linear (1500,d)x(d,4d)+b", timed(lambda: K.linear(be, x, w_up, bias_up, h), repeat)),
        ("linear (1500,4d)x(4d,d)+b", timed(lambda: K.linear(be, h, w_down, bias_d, y), repeat)),
        ("gelu (1500,4d)", timed(lambda: K.gelu(be, h, h), repeat)),
        ("add (1500,d)", timed(lambda: K.add(be, x, y, y), repeat)),
    ]
    rows += both_paths("attention encoder 1500x1500", x, x, x, y)
    rows.append(("attention encoder 1500x1500 [blas, no weights]",
                 timed(lambda: attention.attention_blas(be, x, x, x, y, heads, None, False, 0), repeat)))
    rows += [
        ("layernorm (1,d)", timed(lambda: K.layernorm(be, x1, lnw, lnb, y1), repeat)),
        ("linear (1,d)x(d,d)+b", timed(lambda: K.linear(be, x1, w_dd, bias_d, y1), repeat)),
        ("linear (1,d)x(d,4d)+b", timed(lambda: K.linear(be, x1, w_up, bias_up, h1), repeat)),
        ("gelu (1,4d)", timed(lambda: K.gelu(be, h1, h1), repeat)),
        ("embed + add_rows (1,d)", timed(lambda: (K.embed(be, tok, ids, y1),
                                                  K.add_rows(be, y1, pos, 7)), repeat)),
        ("kv_write (1,d)", timed(lambda: K.kv_write(be, kcache, half, x1), repeat)),
    ]
    rows += both_paths(f"attention self step 1x{half}", x1, kcache[:half], vcache[:half], y1,
                       True, half - 1)
    rows += both_paths("attention cross step 1x1500", x1, x, x, y1)
    rows += [
        ("logits (1,d)x(V,d)", timed(lambda: K.logits(be, x1, tok, logits), repeat)),
        ("pick (1,V): greedy's token", timed(lambda: K.pick(be, logits, mask, rules, logits.shape[1] - 1501,
                                                              choice), repeat)),
    ]
    return rows


# Run in a fresh interpreter: every op once, small shapes, then the wall time since start.
COMPILE_PROBE = r"""
import time; t0 = time.perf_counter()
import numpy as np
from nwhisper import backend, kernels as K
be = backend.get("cpu")
r = lambda *s: np.ones(s, np.float32)
x, y, w, b = r(4, 8), r(4, 8), be.weight(r(8, 8)), r(8)
K.layernorm(be, x, b, b, y); K.gelu(be, x, y); K.add(be, x, y, y)
K.linear(be, x, w, b, y); K.logits(be, x, w, y)
K.conv1d(be, r(6, 8), be.upload(r(8, 8, 3)), b, be.empty((6, 8)), 1)
K.attention(be, x, x, x, y, 2); K.attention(be, x[:1], x, x, y[:1], 2, True, 3)
be.softmax_rows(y); K.pick(be, y[:1], y[:1] * 0, np.array([0, 4, 8, 1], np.int32), 4, be.empty((2,)))
K.embed(be, x, np.array([1], np.int32), y[:1]); K.add_rows(be, y, x, 0); K.kv_write(be, y, 1, x[:2])
print(f"{time.perf_counter() - t0:.2f}")
"""

IMPORT_PROBE = r"""
import time; t0 = time.perf_counter()
import numba, numpy
print(f"{time.perf_counter() - t0:.2f}")
"""


def subprocess_seconds(code, cache_dir):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir,
               PYTHONPATH=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,base", help="comma-separated: " + ",".join(MODELS))
    ap.add_argument("--repeat", type=int, default=20, help="timed calls per op (best reported)")
    ap.add_argument("--no-compile", action="store_true", help="skip the cold/warm compile probe")
    args = ap.parse_args()

    import numba
    print(f"numba {numba.__version__}, {numba.config.NUMBA_NUM_THREADS} threads, "
          f"threading layer: {os.environ.get('NUMBA_THREADING_LAYER', 'default')}, "
          f"load average {os.getloadavg()[0]:.1f}")
    if not args.no_compile:
        with tempfile.TemporaryDirectory() as cache:
            base = subprocess_seconds(IMPORT_PROBE, cache)
            cold = subprocess_seconds(COMPILE_PROBE, cache)
            warm = subprocess_seconds(COMPILE_PROBE, cache)
        print(f"import numba+numpy {base:.2f} s; every op once in a fresh process: "
              f"cold cache {cold:.2f} s, warm cache {warm:.2f} s")

    be = backend.get("cpu")
    names = args.models.split(",")
    tables = {m: op_table(be, *MODELS[m], args.repeat) for m in names}
    width = max(len(name) for rows in tables.values() for name, _ in rows)
    print(f"{'op (ms)':<{width}}  " + "  ".join(f"{m:>8}" for m in names))
    for i, (name, _) in enumerate(tables[names[0]]):
        print(f"{name:<{width}}  " + "  ".join(f"{tables[m][i][1] * 1e3:8.3f}" for m in names))


if __name__ == "__main__":
    main()
