"""Peak memory of transcribing a long recording, nwhisper beside faster-whisper.

    python3 bench/memory.py [--minutes 10,60,180] [--model tiny.en] [--compute-type int8]
                            [--work DIR] [--peer-python .oracle/bin/python]

Each recording is fixture speech end to end with 1-3 s pauses (bench/batch_throughput.py's
archive), --minutes long, a 16 kHz FLAC built once in --work (default /tmp/nwhisper-memory-bench).
Each system transcribes it in a fresh process, as a user runs it: `nwhisper transcribe MODEL FILE
--compute-type int8 -f txt`, and faster-whisper's WhisperModel on the same CTranslate2 weights
(greedy, with timestamps, no VAD, 2 threads), its segments read to the end. Printed: the peak
resident set (`/usr/bin/time`'s maximum RSS), wall time, the transcripts' word counts, and a hash
of nwhisper's text (to compare with another commit's run on the same file).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from batch_throughput import build            # noqa: E402  (the same archive of fixture speech)
from transcribe import ct2_dir                # noqa: E402

FASTER_WHISPER = r'''
import sys
from faster_whisper import WhisperModel
m = WhisperModel(sys.argv[2], device="cpu", compute_type=sys.argv[3], cpu_threads=2, num_workers=1)
segments, info = m.transcribe(sys.argv[1], language="en", beam_size=1, best_of=1, temperature=0.0,
                              vad_filter=False, without_timestamps=False)
with open(sys.argv[4], "w") as f:
    for s in segments:
        f.write(s.text.strip() + "\n")
'''


def peak(cmd, env=None):
    """(max RSS in MB, wall seconds) of `cmd`, by /usr/bin/time."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        t0 = time.perf_counter()
        r = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", t.name, *cmd], env=env,
                           capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if r.returncode:
            raise SystemExit(f"{cmd[0]} failed:\n{r.stderr[-2000:]}")
        return int(t.read().split()[-1]) / 1024, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", default="10,60,180")
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--compute-type", default="int8")
    ap.add_argument("--work", default="/tmp/nwhisper-memory-bench")
    ap.add_argument("--peer-python", default=os.path.join(HERE, "..", ".oracle", "bin", "python"))
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    ct2 = os.path.join(args.work, f"{args.model}-ct2")
    if not os.path.exists(os.path.join(ct2, "model.bin")):
        ct2_dir(args.model, ct2)
    env = dict(os.environ, NUMBA_NUM_THREADS="2", OMP_NUM_THREADS="2")
    peer = os.path.exists(args.peer_python)
    print(f"# peak RSS, {args.model} {args.compute_type}, 2 threads; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'minutes':>7}  {'nwhisper MB':>11} {'wall s':>7} {'words':>6}  {'fw MB':>7} {'wall s':>7} {'words':>6}  {'fw/nw':>6}")
    for minutes in [float(m) for m in args.minutes.split(",")]:
        folder = build(args.work, 1, minutes)
        audio = os.path.join(folder, "rec000.flac")
        out = os.path.join(args.work, f"out-{minutes:g}")
        nw_mb, nw_s = peak(["nwhisper", "transcribe", args.model, audio, "--compute-type", args.compute_type,
                            "--lang", "en", "-f", "txt", "-o", out], env)
        with open(os.path.join(out, "rec000.txt"), encoding="utf-8") as f:
            nw_text = f.read()
        row = f"{minutes:7g}  {nw_mb:11.0f} {nw_s:7.1f} {len(nw_text.split()):6d}"
        if peer:
            fw_txt = os.path.join(args.work, f"fw-{minutes:g}.txt")
            fw_mb, fw_s = peak([args.peer_python, "-c", FASTER_WHISPER, audio, ct2, args.compute_type, fw_txt], env)
            with open(fw_txt, encoding="utf-8") as f:
                fw_words = len(f.read().split())
            row += f"  {fw_mb:7.0f} {fw_s:7.1f} {fw_words:6d}  {fw_mb / nw_mb:5.2f}x"
        print(row + f"   nwhisper text sha1 {hashlib.sha1(nw_text.encode()).hexdigest()[:10]}", flush=True)


if __name__ == "__main__":
    main()
