"""Long recordings, batched: nwhisper's transcribe(batch_size=8) against faster-whisper's
BatchedInferencePipeline(batch_size=8), and both tools unbatched, on one recording of 10 minutes.

    python3 bench/batched.py [--models tiny.en] [--computes float32,int8] [--minutes 10] [--batch 8]
                             [--systems nwhisper-batched,fw-batched] [--rounds 3]

The recording: the fixtures' English clips (fixtures/index.tsv) in a shuffled order (fixed
seeds) with pauses of 1-4 s between them, the set repeated until --minutes; its reference
transcript is the clips' own transcripts in that order. Every system runs in a fresh subprocess
(nwhisper in this interpreter, faster-whisper in the oracle venv, --peer-python) on the same
16 kHz samples (an .npy), with 2 threads, the model package's CT2 weights (faster-whisper loads
that directory; nwhisper the package), greedy, temperature 0 with no fallback, language "en":
a warm-up run on the first minute, then the whole recording, timed.

    nwhisper          transcribe(): long-form windows, conditioned on the previous text, no VAD
    nwhisper-batched  transcribe(batch_size=N): Silero chunks of <= 30 s, N windows at a time
    fw                WhisperModel.transcribe(beam_size=1): the same long-form loop
    fw-batched        BatchedInferencePipeline(model).transcribe(batch_size=N, beam_size=1):
                      its own VAD chunks, without timestamps (its default)

windows = encoder passes over the whole recording (nwhisper's chunks and the rests it decodes
again; faster-whisper's chunks). WER = word edits / reference words (lower case, punctuation dropped; "Mr." and "mister" differ,
so no system reaches 0); each system's text is kept in --work. Ratios are against fw-batched:
< 1 means faster than it. bfloat16 (nwhisper's, on a CPU with AVX-512 BF16) stands beside
faster-whisper's float32: CTranslate2 has no bfloat16 on the CPU. With --rounds N every system runs N times, the systems' order
reversed every other round, and the table gives each one's median and its spread (max / min):
on a shared machine whose speed drifts by tens of percent within minutes, one run of each
system apart in time says little.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import ROOT, THREADS  # noqa: E402
from transcribe import child_env, ct2_dir, word_edits, words  # noqa: E402

SYSTEMS = ["nwhisper", "nwhisper-batched", "fw", "fw-batched"]

CHILD = r"""
import json, sys, time
import numpy as np
a = json.loads(sys.argv[1])
x = np.load(a["npy"])
t0 = time.perf_counter()
windows = [0]
if a["system"].startswith("nwhisper"):
    import nwhisper
    m = nwhisper.load(a["model"], device="cpu", compute_type=a["compute"])
    encode = m.model.encode
    def counted(mel, *args, **kw):          # one encoder pass a window
        windows[0] += 1
        return encode(mel, *args, **kw)
    m.model.encode = counted
    kw = {"batch_size": a["batch"]} if a["system"] == "nwhisper-batched" else {}
    run = lambda y: "".join(s.text for s in m.transcribe(y, language="en" if m.dims.is_multilingual else None, **kw)[0])
else:
    from faster_whisper import BatchedInferencePipeline, WhisperModel
    m = WhisperModel(a["ct2"], device="cpu", compute_type=a["compute"], cpu_threads=a["threads"])
    encode = m.encode
    def counted(features):                  # a batch of windows a call
        windows[0] += features.shape[0] if features.ndim == 3 else 1
        return encode(features)
    m.encode = counted
    if a["system"] == "fw-batched":
        p = BatchedInferencePipeline(m)
        run = lambda y: "".join(s.text for s in p.transcribe(y, language="en", batch_size=a["batch"], beam_size=1,
                                                                 temperature=0)[0])
    else:
        run = lambda y: "".join(s.text for s in m.transcribe(y, language="en", beam_size=1, temperature=0)[0])
load = time.perf_counter() - t0
run(x[:60 * 16000])
windows[0] = 0
t = time.perf_counter()
text = run(x)
print(json.dumps({"load_s": load, "s": time.perf_counter() - t, "text": text, "windows": windows[0]}))
"""


def build(minutes, work):
    """(samples, reference text): the English fixture clips with pauses, to `minutes`."""
    from nwhisper.io.audio import load_audio

    with open(os.path.join(ROOT, "fixtures", "index.tsv")) as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t") if r["language"] == "en"]
    clips = [(load_audio(os.path.join(ROOT, "fixtures", r["path"])), r["transcript"]) for r in rows]
    parts, ref, total, rnd = [], [], 0, 0
    while total < minutes * 60 * 16000:
        order = np.random.default_rng(rnd).permutation(len(clips))
        gaps = np.random.default_rng(100 + rnd).uniform(1.0, 4.0, len(clips))
        for i, g in zip(order, gaps):
            x, text = clips[i]
            parts += [x, np.zeros(int(g * 16000), np.float32)]
            ref.append(text)
            total += len(x) + int(g * 16000)
        rnd += 1
    samples = np.concatenate(parts)
    path = os.path.join(work, f"long-{minutes}min.npy")
    np.save(path, samples)
    return path, len(samples) / 16000, " ".join(ref)


def run(system, model, compute, npy, ct2, batch, peer_python):
    if system.startswith("fw") and compute == "bfloat16":
        compute = "float32"        # CTranslate2 has no bfloat16 on the CPU
    args = {"system": system, "model": model, "compute": compute, "npy": npy, "ct2": ct2,
            "batch": batch, "threads": THREADS}
    py = sys.executable if system.startswith("nwhisper") else peer_python
    out = subprocess.run([py, "-c", CHILD, json.dumps(args)], capture_output=True, text=True,
                         env=child_env(os.path.join(tempfile.gettempdir(), "nwhisper-bench-numba")))
    if out.returncode:
        raise RuntimeError(f"{system}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny.en")
    ap.add_argument("--computes", default="float32,int8")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--peer-python", default=os.path.join(ROOT, ".oracle", "bin", "python"))
    ap.add_argument("--work", default="/tmp/nwhisper-batched-bench")
    a = ap.parse_args()
    systems = a.systems.split(",")
    if "fw-batched" not in systems or set(systems) - set(SYSTEMS):
        ap.error(f"--systems: some of {','.join(SYSTEMS)}, fw-batched among them (the ratios' base)")
    os.makedirs(a.work, exist_ok=True)
    npy, seconds, ref = build(a.minutes, a.work)
    n_ref = len(words(ref))
    print(f"# batched, {seconds / 60:.1f} min recording ({n_ref} reference words), batch {a.batch}, "
          f"{THREADS} threads; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
          f"{open('/proc/loadavg').read().split()[0]}")
    print(f"{'model':8} {'compute':8} {'system':17} {'s':>7} {'x real':>7} {'vs fw-b':>7} {'WER':>6} "
          f"{'windows':>7} {'load s':>6} {'spread':>6}")
    for model in a.models.split(","):
        ct2 = os.path.join(a.work, f"ct2-{model}")
        if not os.path.isdir(ct2):
            ct2_dir(model, ct2)
        for compute in a.computes.split(","):
            res = {s: [] for s in systems}
            for i in range(a.rounds):
                for s in systems if i % 2 == 0 else systems[::-1]:
                    res[s].append(run(s, model, compute, npy, ct2, a.batch, a.peer_python))
            median = {s: statistics.median(r["s"] for r in res[s]) for s in systems}
            for s in systems:
                r, times = res[s][-1], [r["s"] for r in res[s]]
                with open(os.path.join(a.work, f"{model}-{compute}-{s}.txt"), "w") as f:
                    f.write(r["text"])
                wer = word_edits(r["text"], ref) / n_ref
                print(f"{model:8} {compute:8} {s:17} {median[s]:7.1f} {seconds / median[s]:7.1f} "
                      f"{median[s] / median['fw-batched']:7.2f} {wer:6.3f} {r['windows']:7d} "
                      f"{r['load_s']:6.2f} {max(times) / min(times):6.2f}", flush=True)


if __name__ == "__main__":
    main()
