"""Compile the CPU kernels a transcription calls, ahead of the first command.

Numba compiles a kernel the first time it is called with new argument types and keeps the machine
code in its cache: beside the module (`__pycache__`) where that folder is writable, else in the
user's cache folder. With an empty cache the first `nwhisper transcribe` compiles for ~15 s on two
cores and every option that reaches new kernels (int8, word timings, beam search, Silero) adds
seconds more. So the build of a wheel (setup.py) runs this module on the machine that installs it
— Numba compiles for the CPU it runs on, and keys each cached function by the content of its
file, Numba's version and that CPU — and the wheel carries the compiled kernels. Where the
installed package cannot be written, they are copied to the user's cache as each is first asked
for (kernels/cache.py).

`python -m nwhisper.precompile` does it again, into whichever cache Numba would use: after an
upgrade of Numba, or for another model's paths (`--model`).
"""

import argparse
import os
import sys
import time

import numpy as np

from .io.audio import load_audio
from .io.registry import DEFAULT_MODEL

# 4.6 s of jfk.wav (a US-government recording, public domain; fixtures/CREDITS.md), Opus: speech
# with a pause, so that word timings and Silero have something to find
CLIP = os.path.join(os.path.dirname(__file__), "precompile.ogg")
FIRST_PLAYS = 8             # 37 s of it: a second window, whose prompt's attention is another kernel

# What the CLI and the server reach on a CPU: each compute type's default transcription, then the
# options that call kernels the default does not (the rest, --timestamps among them, reuse them).
WORKLOADS = (
    {},
    {"word_timestamps": True},
    {"beam_size": 5},
    {"temperature": 0.5},       # the fallback ladder's sampling
    {"batch_size": 2},
    {"vad": True},              # Silero on our kernels, as the live endpointer runs it
)


def default_compute_types():
    """float32 and int8, and bfloat16 where this CPU runs it (elsewhere a bfloat16 model is
    float32: nothing more to compile)."""
    from .kernels import gemm_bf16
    return ("float32", "int8") + ("bfloat16",) * gemm_bf16.available()


def run(model_name=DEFAULT_MODEL, compute_types=None, out=sys.stderr):
    """Transcribe the clip once per workload and compute type (default_compute_types()); returns
    the seconds taken."""
    from . import load

    compute_types = compute_types or default_compute_types()
    samples = load_audio(CLIP)
    t0 = time.perf_counter()
    for compute_type in compute_types:
        model = load(model_name, device="cpu", compute_type=compute_type)
        for options in WORKLOADS:
            t = time.perf_counter()
            segments, _ = model.transcribe(np.array(samples), **options)
            list(segments)
            print(f"nwhisper precompile: {model_name} {compute_type} {options or 'default'}: "
                  f"{time.perf_counter() - t:.1f} s", file=out)
    t = time.perf_counter()
    speaker_network(samples)
    print(f"nwhisper precompile: the speaker network: {time.perf_counter() - t:.1f} s", file=out)
    return time.perf_counter() - t0


def record_first(compute_type="float32", speakers=False):
    """kernel_cache.FIRST's lines for `compute_type` as this process records them: the default
    model's default transcription of the clip played FIRST_PLAYS times over (two windows, the
    second with the first's text as its prompt, as a user's recording has), as a first `nwhisper
    transcribe` runs it (with `speakers`, `--diarize`'s: the lines' kind is compute_type +
    kernel_cache.SPEAKERS), each function with when it was asked for and what it took to compile
    (in a process that has loaded no kernel yet, with an empty cache and no helper: `python -m
    nwhisper.kernels` runs it so)."""
    from . import kernel_cache, load

    with kernel_cache.recording() as asked:
        model = load(device="cpu", compute_type=compute_type)
        list(model.transcribe(np.tile(load_audio(CLIP), FIRST_PLAYS), diarize=speakers or None)[0])
    kind = compute_type + kernel_cache.SPEAKERS * speakers
    return "".join(f"{kind}\t{name}\t{types}\t{when - asked[0][2]:.2f}\t"
                   f"{kernel_cache.compile_seconds(name, types):.2f}\n" for name, types, when in asked)


def speaker_network(samples):
    """Embed two windows with CAM++ at its real size but random weights: --diarize's kernels,
    compiled without the trained weights (which may not be installed when the wheel is built)."""
    from .backend import get
    from .speakers import weights
    from .speakers.campplus import CAMPPlus

    rng = np.random.default_rng(0)
    state = {name: (rng.uniform(0.5, 1.5, shape) if name.endswith("running_var") else
                    rng.standard_normal(shape) * 0.05).astype(np.float32)
             for name, shape in weights.spec().items()}
    CAMPPlus(get("cpu"), params=weights.fold(state)).embed(np.stack([samples[:24000], samples[8000:32000]]))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m nwhisper.precompile", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"a model name or path (default {DEFAULT_MODEL})")
    p.add_argument("--compute-types", default=",".join(default_compute_types()),
                   help="comma-separated (default: float32,int8, and bfloat16 where the CPU runs it)")
    args = p.parse_args(argv)
    seconds = run(args.model, tuple(args.compute_types.split(",")))
    print(f"nwhisper precompile: done in {seconds:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
