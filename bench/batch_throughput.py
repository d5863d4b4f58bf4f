"""`nwhisper batch` throughput: audio seconds per wall second, one worker, N workers, and Ray.

    python3 bench/batch_throughput.py [--files 6] [--minutes 1] [--model tiny.en]
                                      [--compute-type int8] [--workers 2] [--work DIR]

The archive is built once in --work (default /tmp/nwhisper-batch-bench): --files recordings of
--minutes each, fixture speech (librivox and espeak readers, the cards) end to end with 1-3 s
pauses, each file a different rotation of the clips, written as FLAC. Each configuration runs
`nwhisper batch ARCHIVE -o OUT -f txt,json` on a fresh OUT (model load included, as a user
waits for it) and prints wall time, audio / wall, and the ratio to one worker. `--ray local`
starts its own Ray, which is part of its time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import soundfile as sf

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "fixtures")
CLIPS = ["librivox/sense_and_sensibility_01_austen_64kb-0870.flac", "cards/001.wav",
         "espeak/en-11s.flac", "librivox/sense_and_sensibility_01_austen_64kb-0890.flac",
         "cards/005.wav", "librivox/sense_and_sensibility_01_austen_64kb-0920.flac",
         "forever.wav", "jfk.wav"]
SR = 16000


def build(work, files, minutes):
    folder = os.path.join(work, f"archive-{files}x{minutes:g}min")
    if os.path.isdir(folder) and len(os.listdir(folder)) == files:
        return folder
    os.makedirs(folder, exist_ok=True)
    clips = [sf.read(os.path.join(FIX, c), dtype="float32", always_2d=True)[0].mean(axis=1) for c in CLIPS]
    rng = np.random.default_rng(0)
    for i in range(files):
        parts, n, k = [], 0, i
        while n < minutes * 60 * SR:
            x = clips[k % len(clips)]
            gap = np.zeros(int(rng.uniform(1, 3) * SR), np.float32)
            parts += [x, gap]
            n += len(x) + len(gap)
            k += 1
        sf.write(os.path.join(folder, f"rec{i:03d}.flac"), np.concatenate(parts)[:int(minutes * 60 * SR)], SR)
    return folder


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=6)
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--compute-type", default="int8")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", default="/tmp/nwhisper-batch-bench")
    a = ap.parse_args()
    archive = build(a.work, a.files, a.minutes)
    audio_s = a.files * a.minutes * 60
    runs = [("1 worker", ["--workers", "1"]), (f"{a.workers} workers", ["--workers", str(a.workers)]),
            (f"Ray local, {a.workers} workers", ["--workers", str(a.workers), "--ray", "local"])]
    print(f"# nwhisper batch, {a.files} files x {a.minutes:g} min ({audio_s / 60:g} min of audio), "
          f"{a.model} {a.compute_type}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"{os.cpu_count()} cores")
    print(f"{'run':24} {'wall s':>7} {'audio/wall':>10} {'vs 1 worker':>11}")
    base = None
    for name, extra in runs:
        out = os.path.join(a.work, "out")
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "nwhisper", "batch", archive, "-o", out, "-f", "txt,json",
                            "-m", a.model, "--compute-type", a.compute_type, "--no-progress", *extra],
                           cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if r.returncode != 0:
            print(f"{name:24} failed: {r.stderr[-500:]}")
            continue
        base = base or wall
        print(f"{name:24} {wall:7.1f} {audio_s / wall:9.1f}x {base / wall:10.2f}x", flush=True)


if __name__ == "__main__":
    main()
