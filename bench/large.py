"""The large models at full size, beside faster-whisper on the same weights: load, memory, the
encoder's time per 30 s window and the decoder's per token, float32, int8 and bfloat16.

    python3 bench/large.py [--models large-v3-turbo,large-v3] [--computes float32,int8,bfloat16] [--windows 2]

Random float16 weights in each model's exact shapes (large-v3: 32 + 32 layers, 1280 wide, 20
heads, 128 mel bands, 51866 tokens; turbo: its 4 decoder layers), written once into --work as a
Hugging Face directory (nwhisper.io.safetensors.write_hf, with a 100-language tokenizer.json made
from base's) and converted by CTranslate2's own ct2-transformers-converter (the oracle venv) to
a float16 CT2 directory. Both systems load that CT2 directory. Speed does not depend on the
values, only the shapes; the numbers are not checked here (tests/oracle/test_v3_shapes.py checks
them on small checkpoints of the same layouts).

Each system × compute type runs in a fresh subprocess with 2 threads, after one unrecorded run of
each (Numba's kernel cache and the page cache warm): load (s), RSS after load
(MiB: VmRSS; and VmHWM, the peak), again at the end (after the encoder and decoder ran: a
model's memory that loading let go and using brings back counts there), the encoder on a random log-mel (one warm-up window, then the
median of --windows), and the decoder's ms per token after a 64-token prompt (nwhisper: the
median of 31 single-token Whisper.decode steps at positions 65…95; faster-whisper, whose decoder
step is not exposed alone: generate on the same encoder output with two max_length values, the
time difference over the difference in generated tokens, which it prints). Ratio = nwhisper / faster-whisper (≤ 1: nwhisper at least as
fast or as light). bfloat16 stands beside faster-whisper's float32: CTranslate2 has no bfloat16 on
the CPU (get_supported_compute_types("cpu")); nwhisper's runs only on a CPU with AVX-512 BF16
(elsewhere it is float32, and the table says so).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PEER_COMPUTE = {"bfloat16": "float32"}    # CTranslate2 has no bfloat16 on the CPU
ROOT = os.path.dirname(HERE)
DECODER_LAYERS = {"large-v3": 32, "large-v3-turbo": 4}

CHILD = r"""
import json, os, sys, time
A = json.loads(sys.argv[1])
import numpy as np

def rss():
    f = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
    return int(f["VmRSS"].split()[0]) / 1024, int(f["VmHWM"].split()[0]) / 1024

rng = np.random.default_rng(0)
mel = rng.standard_normal((3000, 128)).astype(np.float32) * 0.5
prompt = [50258, 50259, 50360] + [int(t) for t in rng.integers(0, 50000, 61)]
out = {}
t0 = time.perf_counter()
if A["system"] == "nwhisper":
    import nwhisper
    m = nwhisper.load(A["ct2"], device="cpu", compute_type=A["compute"])
    out["load_s"] = time.perf_counter() - t0
    out["computed"] = m.model.compute_type
    out["rss_mib"], out["hwm_mib"] = rss()
    w = m.model
    times = []
    for i in range(A["windows"] + 1):
        t = time.perf_counter(); enc = w.encode(mel); times.append(time.perf_counter() - t)
    out["encoder_s"] = float(np.median(times[1:]))
    state = w.new_state(enc)
    w.decode(state, np.array(prompt, np.int32))
    steps = []
    token = np.array([220], np.int32)
    for i in range(32):
        t = time.perf_counter(); w.decode(state, token); steps.append(time.perf_counter() - t)
    out["step_ms"] = float(np.median(steps[1:])) * 1e3
else:
    import ctranslate2
    from faster_whisper import WhisperModel
    fw = WhisperModel(A["ct2"], device="cpu", compute_type=A["compute"], cpu_threads=2)
    out["load_s"] = time.perf_counter() - t0
    out["rss_mib"], out["hwm_mib"] = rss()
    feats = ctranslate2.StorageView.from_array(mel.T[None].copy())
    times = []
    for i in range(A["windows"] + 1):
        t = time.perf_counter(); enc = fw.model.encode(feats, to_cpu=True); times.append(time.perf_counter() - t)
    out["encoder_s"] = float(np.median(times[1:]))

    def gen(n):
        t = time.perf_counter()
        r = fw.model.generate(enc, [prompt], beam_size=1, max_length=n, suppress_blank=False, suppress_tokens=[])
        return time.perf_counter() - t, len(r[0].sequences_ids[0])
    gen(65)
    short = sorted(gen(65) for _ in range(3))[1]
    long = sorted(gen(96) for _ in range(3))[1]
    extra = long[1] - short[1]
    out["step_ms"] = (long[0] - short[0]) / extra * 1e3 if extra > 0 else None
    out["tokens"] = [short[1], long[1]]
out["end_rss_mib"], out["end_hwm_mib"] = rss()
print("LARGE-JSON " + json.dumps(out))
"""


def make(name, work, oracle_python):
    """The model's HF directory and its CT2 conversion under work (made once); the CT2 path."""
    hf, ct2 = os.path.join(work, name), os.path.join(work, name + ".ct2")
    if os.path.exists(os.path.join(ct2, "model.bin")):
        return ct2
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "fixtures"))
    import numpy as np
    from v3_checkpoints import YUE, _shift, _tokenizer
    from nwhisper.io.checkpoint import Checkpoint, Dims, expected_shapes
    from nwhisper.io.registry import load_checkpoint
    from nwhisper.io.safetensors import write_hf
    d = Dims(n_mels=128, n_audio_ctx=1500, n_audio_state=1280, n_audio_head=20, n_audio_layer=32,
             n_vocab=51866, n_text_ctx=448, n_text_state=1280, n_text_head=20,
             n_text_layer=DECODER_LAYERS[name])
    rng = np.random.default_rng(1)
    tensors = {}
    for t, shape in expected_shapes(d).items():
        if t.endswith("layer_norm.weight"):
            tensors[t] = np.ones(shape, np.float16)
        elif t.endswith(".bias"):
            tensors[t] = np.zeros(shape, np.float16)
        else:
            tensors[t] = (rng.standard_normal(shape, np.float32) * 0.02).astype(np.float16)
    base = load_checkpoint("base")
    os.makedirs(hf, exist_ok=True)
    tok = os.path.join(hf, "tokenizer.json")
    _tokenizer(base.tokenizer_json, tok)
    write_hf(Checkpoint(dims=d, tensors=tensors, path=hf, container="hf", tokenizer_json=tok,
                        suppress_ids=_shift(base.suppress_ids or []),
                        suppress_ids_begin=_shift(base.suppress_ids_begin or []),
                        lang_ids=sorted(_shift(base.lang_ids or []) + [YUE])), hf)
    del tensors
    converter = os.path.join(os.path.dirname(oracle_python), "ct2-transformers-converter")
    subprocess.run([converter, "--model", hf, "--output_dir", ct2, "--quantization", "float16",
                    "--copy_files", "tokenizer.json", "preprocessor_config.json"], check=True)
    return ct2


def child(system, ct2, compute, windows, oracle_python):
    env = dict(os.environ, OMP_NUM_THREADS="2", MKL_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2",
               NUMBA_NUM_THREADS="2")
    py = sys.executable if system == "nwhisper" else oracle_python
    a = json.dumps({"system": system, "ct2": ct2, "compute": compute, "windows": windows})
    p = subprocess.run([py, "-c", CHILD, a], env=env, cwd=ROOT, capture_output=True, text=True)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("LARGE-JSON ")]
    if not line:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    return json.loads(line[-1][len("LARGE-JSON "):])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="large-v3-turbo,large-v3")
    p.add_argument("--computes", default="float32,int8,bfloat16")
    p.add_argument("--windows", type=int, default=2)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "nwhisper-large"))
    p.add_argument("--peer-python", default=os.path.join(ROOT, ".oracle", "bin", "python"))
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    rows = [("load s", "load_s", "{:.2f}"), ("RSS after load MiB", "rss_mib", "{:.0f}"),
            ("peak RSS MiB", "hwm_mib", "{:.0f}"), ("encoder s/window", "encoder_s", "{:.2f}"),
            ("decoder ms/token @64", "step_ms", "{:.1f}"),
            ("RSS at the end MiB", "end_rss_mib", "{:.0f}"), ("peak RSS at the end MiB", "end_hwm_mib", "{:.0f}")]
    for name in args.models.split(","):
        ct2 = make(name, args.work, args.peer_python)
        for compute in args.computes.split(","):
            peer_compute = PEER_COMPUTE.get(compute, compute)
            child("nwhisper", ct2, compute, 0, args.peer_python)   # unrecorded: Numba's cache, the page cache
            child("faster-whisper", ct2, peer_compute, 0, args.peer_python)
            ours = child("nwhisper", ct2, compute, args.windows, args.peer_python)
            peer = child("faster-whisper", ct2, peer_compute, args.windows, args.peer_python)
            print(f"\n{name}, {compute} (nwhisper computed {ours.get('computed', '?')}; "
                  f"faster-whisper {peer_compute}), 2 threads")
            print(f"{'':24}{'nwhisper':>12}{'faster-whisper':>16}{'ratio':>8}")
            for label, key, fmt in rows:
                a, b = ours.get(key), peer.get(key)
                cell = lambda v: fmt.format(v) if isinstance(v, (int, float)) else "n/a"
                ratio = f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-"
                print(f"{label:24}{cell(a):>12}{cell(b):>16}{ratio:>8}")
            for who, r in (("nwhisper", ours), ("faster-whisper", peer)):
                if "error" in r:
                    print(f"  {who}: {r['error']}")
            if "tokens" in peer:
                print(f"  faster-whisper generated {peer['tokens'][0]} and {peer['tokens'][1]} tokens")


if __name__ == "__main__":
    main()
