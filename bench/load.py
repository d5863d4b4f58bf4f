"""How long a model takes to load, and how much memory it holds, from each container.

    python3 bench/load.py [MODEL ...] [--runs 5]        (default: tiny.en base)

Each model is converted once into a temporary directory (HF directory, ggml file); then every
container is loaded in a fresh subprocess, --runs times, and the medians are printed:

    load ms     resolve + parse + validate (tensors memory-mapped, not yet read)
    touch ms    reading every tensor byte once afterwards (page-ins from the page cache)
    base MB     the subprocess's resident memory before loading (Python + NumPy)
    peak MB     its peak resident memory (VmHWM) after the touch; mapped pages count here
                although they are file-backed and shared, not private copies
    disk MB     the weights' size on disk
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # run from a checkout
sys.path.insert(0, ROOT)

CHILD = r"""
import json, sys, time
import numpy as np

def vm(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
from nwhisper.io.registry import load_checkpoint
base = vm("VmRSS:")
t0 = time.perf_counter()
ck = load_checkpoint(sys.argv[1])
t1 = time.perf_counter()
s = 0
for t in ck.tensors.values():
    s += int(np.asarray(t).view(np.uint8).reshape(-1)[::4096].sum())   # one byte per page
t2 = time.perf_counter()
print(json.dumps({"load": (t1 - t0) * 1e3, "touch": (t2 - t1) * 1e3, "base": base, "peak": vm("VmHWM:")}))
"""


def disk_mb(path):
    if os.path.isfile(path):
        return os.path.getsize(path) / 1e6
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
               if f.startswith("model.")) / 1e6


def measure(src, n_runs):
    runs = []
    for _ in range(n_runs):
        out = subprocess.run([sys.executable, "-c", CHILD, src], capture_output=True, text=True, check=True,
                             cwd=ROOT)
        runs.append(json.loads(out.stdout))
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", default=["tiny.en", "base"], metavar="MODEL",
                   help="model names or paths (default: tiny.en base)")
    p.add_argument("--runs", type=int, default=5, help="fresh subprocesses per container (median)")
    args = p.parse_args()
    from nwhisper.io.convert import convert
    from nwhisper.io.registry import resolve

    print(f"{'model':8} {'container':9} {'load ms':>8} {'touch ms':>9} {'base MB':>8} {'peak MB':>8} {'disk MB':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            src = resolve(name)
            hf = convert(name, os.path.join(tmp, name + "-hf"), to="hf")
            gg = convert(name, os.path.join(tmp, name + ".ggml.bin"), to="ggml")
            ct2_disk = sum(os.path.getsize(p) for p in src.parts) / 1e6 if src.parts else disk_mb(src.path)
            for container, path, size in (("ct2", name, ct2_disk), ("hf", hf, disk_mb(hf)),
                                          ("ggml", gg, disk_mb(gg))):
                m = measure(path, args.runs)
                print(f"{name:8} {container:9} {m['load']:8.1f} {m['touch']:9.1f} {m['base']:8.1f} "
                      f"{m['peak']:8.1f} {size:8.1f}", flush=True)


if __name__ == "__main__":
    main()
