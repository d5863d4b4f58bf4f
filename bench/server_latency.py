"""Warm server request vs cold CLI, for the same clip: what `nwhisper serve` saves per request.

    python3 bench/server_latency.py [--model tiny.en] [--clip fixtures/jfk.wav] [--runs 5]

cold CLI      spawn `python -m nwhisper transcribe MODEL CLIP` → exit (interpreter, imports,
              model load, first transcription; Numba's kernels from its warm on-disk cache)
warm request  POST /inference to a server that has the model loaded (after one unrecorded
              request), client-side wall time on loopback
after unload  the first request to a server started with --unload-after 1 once it has gone
              idle: the reload plus the transcription
server start  spawn `python -m nwhisper serve` → "serving on" (load + warm-up transcription)

Medians of --runs, cold and warm interleaved round by round; the spread is printed too (these
2-core machines are noisy: check the load averages printed before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_load import EXPECT, ROOT, form, start_server, stop_server  # noqa: E402

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post(url, body, ctype):
    t0 = time.perf_counter()
    req = urllib.request.Request(url + "/inference", data=body, headers={"Content-Type": ctype})
    with _opener.open(req, timeout=600) as r:
        text = json.loads(r.read())["text"]
    assert EXPECT in text, text
    return time.perf_counter() - t0


def health(url):
    with _opener.open(url + "/health", timeout=30) as r:
        return json.loads(r.read())


def summary(xs):
    return f"{statistics.median(xs):6.2f} s  (min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--clip", default=os.path.join(ROOT, "fixtures", "jfk.wav"))
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    body, ctype = form(a.clip)
    env = {k: v for k, v in os.environ.items() if k != "NWHISPER_TOKEN"}
    print(f"# {a.model}, {os.path.basename(a.clip)}; load average {open('/proc/loadavg').read().split()[0]}")

    # Cold and warm alternate, one of each per round, so both see the same machine: on a shared
    # 2-core box another process's burst would otherwise land on one side only.
    t0 = time.perf_counter()
    proc, url = start_server(a.model)
    starts = [time.perf_counter() - t0]
    cold, warm = [], []
    try:
        post(url, body, ctype)                          # unrecorded
        for _ in range(a.runs):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "nwhisper", "transcribe", a.model, a.clip],
                                 cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
            cold.append(time.perf_counter() - t0)
            assert EXPECT in out, out
            warm.append(post(url, body, ctype))
    finally:
        stop_server(proc)

    proc, url = start_server(a.model, "--unload-after", "1")
    reload, load_ms = [], []
    try:
        for _ in range(a.runs):
            while health(url)["status"] != "idle":
                time.sleep(0.1)
            reload.append(post(url, body, ctype))
            load_ms.append(health(url)["last_load_ms"])
    finally:
        stop_server(proc)

    print(f"cold CLI       {summary(cold)}")
    print(f"warm request   {summary(warm)}")
    print(f"after unload   {summary(reload)}   (reload alone: median {statistics.median(load_ms):.0f} ms)")
    print(f"server start   {starts[0]:6.2f} s  (spawn → serving: imports, load, warm-up transcription)")
    print(f"# load average after: {open('/proc/loadavg').read().split()[0]}")
    print(f"warm request saves {statistics.median(cold) - statistics.median(warm):.2f} s per clip "
          f"({statistics.median(cold) / statistics.median(warm):.1f}x faster than the cold CLI)")


if __name__ == "__main__":
    main()
