"""Time a 30 s log-mel: nwhisper's against Hugging Face's WhisperFeatureExtractor, same audio,
same run (the extractor runs in the oracle virtualenv, .oracle/, in a subprocess).

    python3 bench/mel.py [--repeat 20]

Prints the median of `repeat` timings of each, after one warm-up, for 80 and 128 mels.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORACLE = os.path.join(ROOT, ".oracle", "bin", "python")

HF_SNIPPET = r"""
import json, sys, time, numpy as np
from transformers import WhisperFeatureExtractor
a = np.load(sys.argv[1]); out = {}
for n in (80, 128):
    fe = WhisperFeatureExtractor(feature_size=n)
    fe(a, sampling_rate=16000, return_tensors="np")
    ts = []
    for _ in range(int(sys.argv[2])):
        t = time.perf_counter(); fe(a, sampling_rate=16000, return_tensors="np"); ts.append(time.perf_counter() - t)
    out[n] = float(np.median(ts))
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    from nwhisper import mel as M
    from nwhisper.io.audio import load_audio

    a = load_audio(os.path.join(ROOT, "fixtures", "espeak", "en-63s.flac"))[:M.N_SAMPLES]
    ours = {}
    for n in (80, 128):
        M.log_mel(a, n, M.N_FRAMES)
        ts = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            M.log_mel(a, n, M.N_FRAMES)
            ts.append(time.perf_counter() - t)
        ours[n] = float(np.median(ts))
    hf = None
    if os.path.exists(ORACLE):
        with tempfile.NamedTemporaryFile(suffix=".npy") as f:
            np.save(f.name, a)
            p = subprocess.run([ORACLE, "-c", HF_SNIPPET, f.name, str(args.repeat)], capture_output=True, text=True)
            hf = {int(k): v for k, v in json.loads(p.stdout.strip().splitlines()[-1]).items()} if p.returncode == 0 else None
    print(f"30 s log-mel, median of {args.repeat} ({len(a) / 16000:.1f} s of speech)")
    print(f"{'mels':>5} {'nwhisper ms':>12} {'HF extractor ms':>16} {'HF / nwhisper':>14}")
    for n in (80, 128):
        h = hf[n] * 1e3 if hf else float("nan")
        print(f"{n:5d} {ours[n] * 1e3:12.2f} {h:16.2f} {h / (ours[n] * 1e3):14.2f}")


if __name__ == "__main__":
    main()
