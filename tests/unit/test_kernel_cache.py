"""Copying a function's shipped Numba cache into the user's (nwhisper/kernel_cache.py): which
files, when, and in which order. The whole path — a read-only install whose first commands compile
nothing — is tests/end_to_end/test_install.py."""

import os

import pytest
from numba.core import caching

from nwhisper import kernel_cache

BASE = "_launch_cpu.layernorm_row-40.py311"


def _write(folder, name, data):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def test_a_functions_files_are_copied_once_and_again_when_the_package_ships_newer(tmp_path):
    shipped, cache = tmp_path / "pkg" / "__pycache__", tmp_path / "user"
    cache.mkdir()
    _write(shipped, BASE + ".nbi", b"index")
    _write(shipped, BASE + ".1.nbc", b"one")
    _write(shipped, BASE + ".2.nbc", b"two")
    _write(shipped, "_launch_cpu.layernorm_row-400.py311.nbi", b"another function")
    _write(shipped, "_launch_cpu.layernorm_row_range-46.py311.nbi", b"another function")
    assert kernel_cache.seed(shipped, cache, BASE)
    assert sorted(os.listdir(cache)) == [BASE + ".1.nbc", BASE + ".2.nbc", BASE + ".nbi"]
    assert (cache / (BASE + ".2.nbc")).read_bytes() == b"two"

    _write(cache, BASE + ".3.nbc", b"compiled here")        # the user's own compilation since
    _write(cache, BASE + ".nbi", b"index with three")
    assert not kernel_cache.seed(shipped, cache, BASE)       # the user's index is newer: kept
    assert (cache / (BASE + ".nbi")).read_bytes() == b"index with three"

    newer = os.stat(cache / (BASE + ".nbi")).st_mtime + 10   # a new install ships a newer index
    os.utime(shipped / (BASE + ".nbi"), (newer, newer))
    assert kernel_cache.seed(shipped, cache, BASE)
    assert (cache / (BASE + ".nbi")).read_bytes() == b"index"
    assert not [n for n in os.listdir(cache) if ".nbi." in n or ".nbc." in n], "a temporary file was left"


def test_nothing_is_copied_without_a_shipped_index(tmp_path):
    shipped, cache = tmp_path / "pkg" / "__pycache__", tmp_path / "user"
    cache.mkdir()
    assert not kernel_cache.seed(shipped, cache, BASE)      # no __pycache__ at all
    _write(shipped, BASE + ".1.nbc", b"data whose index is gone")
    assert not kernel_cache.seed(shipped, cache, BASE)
    assert os.listdir(cache) == []


def test_the_seeded_locator_stands_where_numbas_user_wide_one_did():
    classes = caching.CacheImpl._locator_classes
    assert kernel_cache.SeededUserWideCacheLocator in classes
    assert caching.UserWideCacheLocator not in classes
    assert classes.index(kernel_cache.SeededUserWideCacheLocator) > classes.index(caching.InTreeCacheLocator)


LOADED = """
import json
import sys
import numpy as np
from nwhisper import backend, kernels as K
x = np.arange(8, dtype=np.float32).reshape(2, 4)
out = np.empty_like(x)
K.layernorm(backend.get("cpu"), x, np.ones(4, np.float32), np.zeros(4, np.float32), out)
print(json.dumps(out.tolist()), "numba.np.linalg" in sys.modules)
"""


def test_a_kernel_loaded_from_the_cache_runs_without_numbas_compiler_registries(tmp_path):
    """nwhisper's cached CPU kernels load without Numba refreshing its target context (the
    registries a compilation needs: numba.np.linalg among the modules it imports): the process
    that compiles imports them, the next one, loading the same kernels from the cache, does not —
    and computes the same numbers (NumPy's LayerNorm of the rows, to float32 rounding)."""
    import json
    import subprocess
    import sys

    import numpy as np
    from paths import env

    e = env(NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    runs = [subprocess.run([sys.executable, "-c", LOADED], env=e, capture_output=True, text=True,
                           check=True, timeout=300).stdout.rsplit(" ", 1) for _ in range(2)]
    (compiled, registries_then), (loaded, registries_now) = runs
    assert registries_then.strip() == "True" and registries_now.strip() == "False"
    assert compiled == loaded
    x = np.arange(8, dtype=np.float64).reshape(2, 4)
    want = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    assert np.allclose(np.array(json.loads(loaded)), want, rtol=1e-5, atol=1e-6)


FIRST_AND_LATER = """
import pickle, sys
import numpy as np
import nwhisper
from nwhisper import mel as M
from fixture_audio import audio
x = audio("jfk.wav")
out = {}
for compute_type in ("float32", "int8"):
    m = nwhisper.load("tiny.en", device="cpu", compute_type=compute_type)
    states = m.backend.download(m.model.encode(M.log_mel(x, m.dims.n_mels, 2 * m.dims.n_audio_ctx)))
    segments = list(m.transcribe(x, timestamps=True, word_timestamps=True)[0])
    out[compute_type] = (states, [(s.tokens, s.avg_logprob, s.no_speech_prob,
                                   [(w.start, w.end, w.probability) for w in s.words]) for s in segments])
pickle.dump(out, open(sys.argv[1], "wb"))
"""


def test_a_first_run_and_a_later_one_give_the_same_bits(tmp_path):
    """A process that finds no compiled kernels (an empty Numba cache) and one that loads what it
    left: tiny.en's encoder states, float32 and int8, and a transcription's tokens, log-probabilities
    and word times, bit for bit: every launch runs its range function's own code, compiled here
    or loaded (kernels/trampoline.py; a parallel launcher that held its body and was compiled in
    the process that ran it summed exp_row over an encoder's 1500 rows up to 3e-5 away from the
    cached code)."""
    import pickle
    import subprocess
    import sys

    import numpy as np
    import paths

    env = paths.env(NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    runs = []
    for k in range(2):
        subprocess.run([sys.executable, "-c", FIRST_AND_LATER, str(tmp_path / f"{k}.pkl")], env=env,
                       check=True, capture_output=True, timeout=900)
        with open(tmp_path / f"{k}.pkl", "rb") as f:
            runs.append(pickle.load(f))
    for compute_type in ("float32", "int8"):
        (first_states, first), (later_states, later) = runs[0][compute_type], runs[1][compute_type]
        assert np.array_equal(first_states, later_states), compute_type
        assert first == later, compute_type


@pytest.mark.parametrize("compute_type, speakers", [("float32", False), ("int8", False), ("float32", True)])
def test_first_lists_what_a_first_transcription_loads(compute_type, speakers):
    """kernel_cache.FIRST (written by `python -m nwhisper.kernels`) lists, per compute type, the
    cached functions that the default transcription loads (and one that diarizes: the speaker
    network's first), in the order it loads them, with when
    each was asked for and what it took to compile: what the helper compiles ahead when a process
    finds the cache empty. Each names a function that exists, with types that evaluate; and it
    holds most of what this machine's first transcription loads (all of it on a CPU like the one
    it was recorded on: the fast paths differ by CPU)."""
    import subprocess
    import sys

    import paths
    from numba.core import types

    kind = compute_type + kernel_cache.SPEAKERS * speakers
    first = kernel_cache.first_functions(kind)
    assert len(first) >= 10
    assert any("conv_tiles" in name for name, *_ in first) == speakers
    for name, sig, at, cost in first:
        fn = kernel_cache.function(name)
        assert repr(eval(sig, dict(vars(types), bool=types.boolean))) == sig and fn.compile, name
    assert all(cost > 0 for *_, cost in first), "recorded from a full cache"
    assert [at for _, _, at, _ in first] == sorted(at for _, _, at, _ in first)
    first = [(name, sig) for name, sig, _, _ in first]
    got = subprocess.run([sys.executable, "-c", "from nwhisper.precompile import record_first; "
                          f"print(record_first({compute_type!r}, {speakers}), end='')"],
                         env=paths.env(), check=True, capture_output=True, text=True, timeout=900).stdout
    here = [tuple(line.split("\t")[1:3]) for line in got.splitlines()]
    assert {line.split("\t")[0] for line in got.splitlines()} == {kind}
    missing = [name for name, sig in here if (name, sig) not in first]
    assert len(missing) <= len(here) // 4, f"kernel_cache.FIRST is stale ({missing}): run `python -m nwhisper.kernels`"


def test_the_helper_is_sent_the_first_functions_of_the_models_compute_type(monkeypatch):
    """A model says its compute type before its backend loads the first kernel (the CPU backend's
    BLAS loop, a miss that starts the helper on an empty cache): the helper is then sent that
    compute type's list (int8's quantising and blocked attention, which float32's lacks), and
    bfloat16's only where this CPU runs it (elsewhere the model is float32, with a warning)."""
    import nwhisper
    from nwhisper import api
    from nwhisper.kernels import gemm_bf16

    names = lambda: {name for name, *_ in kernel_cache.first_functions()}     # noqa: E731
    monkeypatch.setattr(kernel_cache, "_expected", "float32")
    assert "nwhisper.kernels.attention_fused:_attend_range" in names()
    assert not any("gemm_int8" in name for name in names())
    seen = []
    real_get = api.B.get
    monkeypatch.setattr(api.B, "get", lambda device: (seen.append(kernel_cache._expected), real_get(device))[1])
    nwhisper.load("tiny.en", device="cpu", compute_type="int8")
    assert seen == ["int8"]
    assert "nwhisper.kernels.gemm_int8:_gemm_range" in names()
    if gemm_bf16.available():
        nwhisper.load("tiny.en", device="cpu", compute_type="bfloat16")
        assert seen[-1] == "bfloat16" and "nwhisper.kernels.gemm_bf16:_gemm_range" in names()
    monkeypatch.setattr(gemm_bf16, "available", lambda: False)
    with pytest.warns(RuntimeWarning, match="bfloat16"):
        nwhisper.load("tiny.en", device="cpu", compute_type="bfloat16")
    assert seen[-1] == "float32"


def test_a_command_that_diarizes_sends_the_helper_the_speakers_list(monkeypatch, tmp_path):
    """`nwhisper transcribe --diarize` says so before its model loads: the helper's list is then
    the compute type's recorded with --diarize, the speaker network's functions (which a first
    --diarize asks for first) among them; a kind that was not recorded gives its compute type's."""
    import paths
    from click.testing import CliRunner

    from nwhisper import api
    from nwhisper.cli.main import cli

    class Loaded(Exception):
        pass

    def load(*args, **kwargs):
        raise Loaded(kernel_cache.expected())

    monkeypatch.setattr(kernel_cache, "_expected", "float32")
    monkeypatch.setattr(kernel_cache, "_speakers", False)
    monkeypatch.setattr(api, "load", load)
    wav = paths.fixture("jfk.wav")
    result = CliRunner().invoke(cli, ["transcribe", "tiny.en", wav])
    assert isinstance(result.exception, Loaded) and result.exception.args == ("float32",)
    assert not any("conv_tiles" in name for name, *_ in kernel_cache.first_functions())
    result = CliRunner().invoke(cli, ["transcribe", "--diarize", "tiny.en", wav])
    assert isinstance(result.exception, Loaded) and result.exception.args == ("float32+speakers",)
    names = [name for name, *_ in kernel_cache.first_functions()]
    assert "nwhisper.kernels.conv_tiles:_direct_range" in names or "nwhisper.kernels.conv_tiles:_conv_parts_range" in names
    assert "nwhisper.kernels.attention_fused:_attend_range" in names      # the transcription's too
    assert kernel_cache.first_functions("no-such+speakers") == kernel_cache.first_functions("no-such") == []
    assert kernel_cache.first_functions("bfloat16+speakers") != kernel_cache.first_functions("bfloat16")


AHEAD = """
import glob, os, sys, time
import numpy as np
from nwhisper import kernel_cache
names = ("nwhisper.kernels.attention_fused:_attend_range", "nwhisper.kernels.trampoline:spread",
         "nwhisper.kernels.gemm_f32:_gemm_range", "nwhisper.kernels.blas:_blocks")
first = sorted((line for line in kernel_cache.first_functions("float32") if line[0] in names),
               key=lambda line: names.index(line[0]))
assert len(first) == 4
kernel_cache.first_functions = lambda compute_type=None: first
kernel_cache.helper_order = lambda first: list(range(len(first)))
from nwhisper.kernels import _launch_cpu as launchers
x = np.ones(4, sys.argv[2])
launchers.gelu_elem_range(0, 4, 0, 1, x, x)   # a miss: the helper starts, sent the four ahead
helper = kernel_cache.ApartCompiler.get().proc
t, nice = time.time(), None
while not all(glob.glob(os.path.join(sys.argv[1], "**", name), recursive=True)
              for name in ("attention_fused._attend_range-*.nbi", "trampoline.spread-*.nbi",
                           "gemm_f32._gemm_range-*.nbi", "blas._blocks-*.nbi")):
    assert time.time() - t < 120, "what was sent ahead never reached the cache"
    if nice is None and glob.glob(os.path.join(sys.argv[1], "**", "*.nbi"), recursive=True):
        nice = os.getpriority(os.PRIO_PROCESS, helper.pid)    # compiling: niced by now
    time.sleep(0.1)
if sys.argv[2] == "float32":        # the first run, into an empty cache: seen compiling
    assert nice == os.getpriority(os.PRIO_PROCESS, 0) + kernel_cache.HELPER_NICE, nice
assert kernel_cache.ApartCompiler.get().proc.wait(timeout=120) == 0, "the helper failed"
from nwhisper.kernels import attention_fused, gemm_f32, trampoline
assert not (trampoline.spread.overloads or gemm_f32._gemm_range.overloads
            or attention_fused._attend_range.overloads), "compiled here"
"""


def test_an_empty_cache_has_the_helper_compile_first_ahead(tmp_path):
    """At a process's first cache miss (a serial launcher here) its helper is sent FIRST's
    functions and compiles them into the cache before anyone asks, whatever their order: here
    the fused attention first, which calls Numba's get_thread_id, then the shared parallel loop,
    the float32 GEMM's items (an LLVM intrinsic) and a BLAS loop, whose call into OpenBLAS the helper registers before it
    compiles anything (without it LLVM aborted the helper). Then, in a second process that
    misses another function, the helper finds them in the cache and loads them: the fused
    attention loaded before Numba's threading layer was running aborted the helper, printing
    LLVM's error to the user's terminal. The helper runs niced (HELPER_NICE): it yields a core to
    the process's kernels."""
    import subprocess
    import sys

    import paths

    cache = tmp_path / "cache"
    for dtype in ("float32", "float64"):
        run = subprocess.run([sys.executable, "-c", AHEAD, str(cache), dtype],
                             env=paths.env(NUMBA_CACHE_DIR=str(cache)), capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0 and "LLVM ERROR" not in run.stderr, run.stderr


def test_the_helper_compiles_in_the_order_that_has_the_process_done_soonest():
    """kernel_cache.finish replays FIRST's times (with no helper: exactly as recorded), and
    helper_order puts first the long function the process asks for after a stretch of other
    work (the decoder's product after the encoder's run), which the last-first order left the
    helper compiling when the process asked for it."""
    row = lambda at, cost: ("m:f", "()", at, cost)     # noqa: E731
    first = [row(0.0, 0.5), row(0.6, 0.2), row(2.0, 1.5), row(3.6, 0.3), row(4.0, 0.3),
             row(4.4, 0.3), row(4.8, 0.3)]
    assert abs(kernel_cache.finish(first, []) - (4.8 + 0.3)) < 1e-9
    last_first = list(range(len(first)))[::-1]
    # last first: the helper (from 0.6 s) is still on the long one (1.8-3.3 s) when the process
    # asks for it at 2.0
    assert abs(kernel_cache.finish(first, last_first, start=0.6) - 3.7) < 1e-9
    order = kernel_cache.helper_order(first)
    assert sorted(order) == last_first[::-1] and order[0] == 2
    assert abs(kernel_cache.finish(first, order, start=0.6) - 3.0) < 1e-9    # it is ready at 2.1
