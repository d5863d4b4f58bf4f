"""Silero VAD per 32 ms chunk on one core: nwhisper's kernel against onnxruntime on the same ONNX.

    python3 bench/vad.py [--seconds 130] [--repeat 3]

Both run pinned to one CPU core (sched_setaffinity), one thread each (NUMBA_NUM_THREADS=1 here;
intra_op_num_threads=1 for onnxruntime, which runs silero-vad's own silero_vad.onnx in the oracle
virtualenv, .oracle/, in a subprocess), chunk by chunk as a live stream would: 512 samples and the
carried state in, one probability out. Audio: the speech stream of fixtures/export_silero.py
(the fixture speech clips). Prints the best of `repeat` passes of each, in ms per chunk, and how
far the two sets of probabilities are apart.
"""

import os

os.environ["NUMBA_NUM_THREADS"] = "1"  # before numba is imported

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORACLE = os.path.join(ROOT, ".oracle", "bin", "python")
CHUNK = 512

ORT_SNIPPET = r"""
import json, os, sys, time
import numpy as np, onnxruntime as ort, silero_vad
path = os.path.join(os.path.dirname(silero_vad.__file__), "data", "silero_vad.onnx")
opts = ort.SessionOptions(); opts.intra_op_num_threads = 1; opts.inter_op_num_threads = 1
s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
x = np.load(sys.argv[1]).reshape(-1, 512); sr = np.array(16000, np.int64)
best = None
for _ in range(int(sys.argv[2])):
    state = np.zeros((2, 1, 128), np.float32); ctx = np.zeros((1, 64), np.float32); out = []
    t = time.perf_counter()
    for c in x:
        inp = np.concatenate([ctx, c[None]], axis=1)
        p, state = s.run(None, {"input": inp, "state": state, "sr": sr})
        ctx = inp[:, -64:]; out.append(p[0, 0])
    dt = time.perf_counter() - t
    best = dt if best is None else min(best, dt)
np.save(sys.argv[3], np.array(out, np.float32))
print(json.dumps({"ms_per_chunk": best / len(x) * 1e3, "version": ort.__version__}))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=130.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "fixtures"))
    from export_silero import golden_streams

    from nwhisper import backend
    from nwhisper.vad.silero import Silero

    x = golden_streams()["speech"][:int(args.seconds * 16000)]
    x = np.concatenate([x, np.zeros(-len(x) % CHUNK, np.float32)])
    chunks = x.reshape(-1, CHUNK)
    vad = Silero(backend.get("cpu"))
    vad(chunks[0])                                    # compile (or load from Numba's cache)
    best = None
    for _ in range(args.repeat):
        vad.reset()
        t = time.perf_counter()
        ours = [vad(c) for c in chunks]
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    ours = np.array(ours, np.float32)
    print(f"{len(chunks)} chunks ({len(chunks) * CHUNK / 16000:.0f} s of speech), one core")
    print(f"nwhisper (Numba, silero_chunk)  {best / len(chunks) * 1e3:.3f} ms/chunk")
    if not os.path.exists(ORACLE):
        print("onnxruntime: no .oracle virtualenv here; skipped")
        return
    with tempfile.TemporaryDirectory() as tmp:
        audio, probs = os.path.join(tmp, "x.npy"), os.path.join(tmp, "p.npy")
        np.save(audio, x)
        out = subprocess.run([ORACLE, "-c", ORT_SNIPPET, audio, str(args.repeat), probs],
                             capture_output=True, text=True, check=True)
        ort = json.loads(out.stdout.strip().splitlines()[-1])
        diff = float(np.abs(np.load(probs) - ours).max())
    print(f"onnxruntime {ort['version']} (1 thread)      {ort['ms_per_chunk']:.3f} ms/chunk")
    print(f"max |p_ours - p_onnxruntime| = {diff:.2e}")


if __name__ == "__main__":
    main()
