"""CpuBackend.replay: a decoder step's calls recorded once and played again without the Python
that chose them (Backend.replay's state machine; the CUDA graph's side is in
test_cuda_driver.py).

Truth: the same model decoding the same tokens with replays off (every step run through the
model's code). A played step must give the same logits bit for bit at every position -- the
position reaches its kernels through `tokens`, not through the recorded arguments -- for each
kind of weight a step can multiply: f16 bits and int8 rows on linear_elem, float32 on BLAS
(kernels/blas.py), and on NumPy's own BLAS (NWHISPER_NUMPY_BLAS=1, in a process of its own).
"""

import os
import subprocess
import sys

import numpy as np
import paths
import pytest
from helpers_models import tiny_dims, tiny_random_checkpoint
from nwhisper import backend
from nwhisper.model import Whisper

HERE = os.path.dirname(os.path.abspath(__file__))   # the subprocesses import this module


def steps(ck, compute_type, replays, n=24):
    """Logits of n one-token steps after a two-token prompt, and the backend."""
    be = backend.get("cpu")
    be.replays = replays
    m = Whisper(ck, be, compute_type)
    mel = np.random.default_rng(1).standard_normal((2 * ck.dims.n_audio_ctx, ck.dims.n_mels))
    state = m.new_state(m.encode(mel.astype(np.float32)))
    m.decode(state, np.array([1, 2], np.int32))
    out = [be.download(m.decode(state, np.array([3 + i % 5], np.int32))) for i in range(n)]
    return np.array(out), be, state


@pytest.mark.parametrize("dtype, compute_type", [(np.float16, "float32"), (np.float16, "int8"),
                                                 (np.float32, "float32")])
def test_replayed_steps_equal_run_steps(dtype, compute_type):
    ck = tiny_random_checkpoint(tiny_dims(width=32, heads=4, layers=2, n_audio_ctx=24, n_text_ctx=40),
                                dtype=dtype)
    plain, _, _ = steps(ck, compute_type, replays=False)
    played, be, state = steps(ck, compute_type, replays=True)
    np.testing.assert_array_equal(played, plain)
    generation, tape = state.recording.generation, state.recording.tape
    assert generation == be.scratch_generation and len(tape) >= 10   # it was recorded, then played
    assert all(callable(fn) for fn, _ in tape)
    # the launchers are played as the compiled code their dispatchers chose, not re-dispatched
    assert not any(hasattr(fn, "overloads") for fn, _ in tape), [fn for fn, _ in tape]


def test_numpy_blas_steps_replay_too():
    """float32 weights on NumPy's matmul (where kernels/blas.py does not run): recorded as host
    calls like the rest."""
    code = """
import sys, numpy as np
from test_replay import steps
from helpers_models import tiny_dims, tiny_random_checkpoint
ck = tiny_random_checkpoint(tiny_dims(width=32, heads=4, layers=2, n_audio_ctx=24, n_text_ctx=40), dtype=np.float32)
a = steps(ck, "float32", False)[0]
b, be, state = steps(ck, "float32", True)
assert state.recording.tape, "not recorded"
print("SAME" if np.array_equal(a, b) else "DIFFERENT", np.abs(a - b).max())
"""
    env = paths.env(NWHISPER_NUMPY_BLAS="1", PYTHONPATH=HERE)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith("SAME"), proc.stdout + proc.stderr[-2000:]


def test_a_position_read_on_the_host_is_never_recorded():
    """A cache longer than attend_row's SHORT_KEYS runs on BLAS with the position from the
    host: the step runs through the model's code every time, and stays right."""
    from nwhisper.kernels.attention import SHORT_KEYS
    ck = tiny_random_checkpoint(tiny_dims(width=32, heads=4, layers=1, n_audio_ctx=24,
                                          n_text_ctx=SHORT_KEYS + 8))
    plain, _, _ = steps(ck, "float32", replays=False, n=6)
    played, be, state = steps(ck, "float32", replays=True, n=6)
    np.testing.assert_array_equal(played, plain)
    assert state.recording.tape is None and state.recording.fixed is False


def test_prompt_and_steps_compile_the_self_attention_once():
    """A prompt's rows, a step's one row and a beam's row reach kv_append and attend_row as one
    array type (C-contiguous), so each range function compiles once: as column views of the stacked
    [q | k | v] product, several rows were strided and one row was not, and both kernels
    compiled twice (~1.5 s of a first-ever command). In a process of its own, where nothing
    else has called them."""
    code = """
import sys, numpy as np
from test_replay import steps
from helpers_models import tiny_dims, tiny_random_checkpoint
from nwhisper.kernels import _launch_cpu as L
from nwhisper.model import Whisper
ck = tiny_random_checkpoint(tiny_dims(width=32, heads=4, layers=2, n_audio_ctx=24, n_text_ctx=40))
_, be, _ = steps(ck, "float32", True, n=4)
m = Whisper(ck, be, "float32")
single = m.new_state(m.encode(np.zeros((2 * ck.dims.n_audio_ctx, ck.dims.n_mels), np.float32)))
m.decode(single, np.array([1, 2], np.int32))
m.decode_batch(m.new_batch(single, 3), np.array([3, 4, 5], np.int32))   # beam search's steps
names = ("attend_row_range", "kv_append_elem_range")
print({name: len(getattr(L, name).signatures) for name in names})
"""
    proc = subprocess.run([sys.executable, "-c", code], env=paths.env(PYTHONPATH=HERE), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = eval(proc.stdout.strip().splitlines()[-1])
    assert all(n == 1 for n in counts.values()), counts     # they ran, each for one array type
