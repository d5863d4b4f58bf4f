"""Silero VAD on our kernels against onnxruntime running the package's own ONNX file.

Truth: fixtures/golden/silero_probs.npz, per-chunk p(speech) that onnxruntime (1 thread) computed
from silero-vad's silero_vad.onnx over the streams fixtures/export_silero.py's golden_streams()
builds (two minutes of the fixture speech clips; 96 s of silence, hiss, white noise, rumble, a
tone, a sweep, chords, clicks, speech in noise and far-away speech), each from a reset state with
OnnxWrapper's chunking. The same script exported the weights; onnxruntime is not needed here.
"""

import subprocess
import sys

import numpy as np
import paths
import pytest
from export_silero import golden_streams

from nwhisper import backend
from nwhisper.vad import silero

TOL = 1e-5  # per-chunk agreement with onnxruntime that the VAD is held to


@pytest.fixture(scope="module")
def streams():
    return golden_streams()


@pytest.fixture(scope="module")
def golden():
    return paths.golden("silero_probs.npz")


@pytest.fixture(scope="module")
def vad():
    return silero.Silero(backend.get("cpu"))


@pytest.mark.parametrize("name", ["speech", "synthetic"])
def test_probabilities_match_onnxruntime(vad, streams, golden, name):
    ours = vad.probs(streams[name])
    ref = golden[name]
    assert ours.shape == ref.shape
    diff = np.abs(ours.astype(np.float64) - ref)
    print(f"{name}: {len(ref)} chunks ({len(ref) * 0.032:.0f} s), max |Δ| {diff.max():.2e}, "
          f"p99 {np.percentile(diff, 99):.2e} (onnxruntime {golden['onnxruntime']})")
    assert diff.max() <= TOL, f"max |Δ| {diff.max():.3g} at chunk {diff.argmax()}"


def test_golden_covers_speech_and_non_speech(golden):
    """The goldens exercise both sides of the threshold, over several minutes."""
    total = sum(len(golden[k]) for k in ("speech", "synthetic")) * 0.032
    assert total >= 180
    assert (golden["speech"] > 0.5).mean() > 0.5
    assert (golden["synthetic"] < 0.5).mean() > 0.7


def test_stft_basis_is_hann_windowed_dft():
    """The computed basis (the ONNX's stored one agrees to 6e-8, checked at export)."""
    basis = silero.stft_basis().astype(np.float64)
    window = np.hanning(257)[:256]                   # periodic Hann
    spectrum = np.fft.rfft(np.eye(256) * window[None, :], axis=1).T   # (129, 256)
    assert np.abs(basis[:129] - spectrum.real).max() < 1e-6
    assert np.abs(basis[129:] - spectrum.imag).max() < 1e-6


def test_state_carries_across_calls(vad, streams, golden):
    """Chunk by chunk through __call__ is the same as probs(); reset() starts over."""
    x = streams["speech"][:200 * 512]
    vad.reset()
    one_by_one = np.array([vad(x[i:i + 512]) for i in range(0, len(x), 512)], np.float32)
    np.testing.assert_array_equal(one_by_one, vad.probs(x))
    np.testing.assert_allclose(one_by_one, golden["speech"][:200], atol=TOL)


def test_streams_in_one_launch_are_independent(streams):
    """Three streams advanced together give what each gives alone."""
    x = streams["speech"]
    parts = [x[:100 * 512], x[300 * 512:400 * 512], streams["synthetic"][:100 * 512]]
    be = backend.get("cpu")
    many = silero.Silero(be, streams=3)
    together = np.stack([many.step(np.stack([p[i:i + 512] for p in parts]))
                         for i in range(0, 100 * 512, 512)])
    alone = silero.Silero(be)
    for k, p in enumerate(parts):
        np.testing.assert_array_equal(together[:, k], alone.probs(p))


def test_short_chunk_is_refused(vad):
    with pytest.raises(ValueError, match="512"):
        vad.step(np.zeros((1, 256), np.float32))


def test_missing_weights_say_where(tmp_path):
    with pytest.raises(FileNotFoundError, match="energy detector"):
        silero.load_weights(str(tmp_path / "none.npz"))


SIM = r"""
import json, sys
import numpy as np
from nwhisper import backend
from nwhisper.vad.silero import Silero
rng = np.random.default_rng(0)
x = (rng.standard_normal((3, 2, 512)) * 0.1).astype(np.float32)
cpu, sim = Silero(backend.get("cpu"), streams=2), Silero(backend.CudaBackend(), streams=2)
diff = max(float(np.abs(cpu.step(c) - sim.step(c)).max()) for c in x)
print("REPORT", json.dumps({"maxdiff": diff}))
"""


@pytest.mark.cudasim
@pytest.mark.slow
def test_same_body_under_the_cuda_simulator():
    """The one kernel body as a CUDA grid under Numba's simulator (2 streams, 3 chunks)."""
    env = paths.env(NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", SIM], env=env, capture_output=True,
                          text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")]
    assert lines, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    import json
    diff = json.loads(lines[-1][7:])["maxdiff"]
    print(f"CPU vs CUDA simulator: max |Δ| {diff:.2e}")
    assert diff <= 1e-5


PTX = r"""
from numba import cuda, types
from nwhisper.kernels.vad_ops import silero_chunk
f1, f2, f3 = (types.Array(types.float32, n, "C") for n in (1, 2, 3))
sig = (types.int64, f2, f2, f2, f2, f1, f2, f3, f1, f3, f1, f3, f1, f3, f1, f2, f2, f1, f1, f1,
       f2, f3, f3, f3, f2, f2, f2, f2, f3)
ptx, _ = cuda.compile_ptx(silero_chunk, sig, device=True, cc=(7, 5))
print("F64" if ".f64" in ptx else "OK", len(ptx.splitlines()))
"""


@pytest.mark.cudasim
@pytest.mark.slow
def test_body_compiles_for_cuda_in_float32():
    """The real CUDA compiler (NVVM, no GPU needed) takes the body, and no float64 is left."""
    from numba.cuda.cudadrv import nvvm
    assert nvvm.is_available(), "NVVM is not installed: the test extra's numba-cuda[cu13] brings it"
    proc = subprocess.run([sys.executable, "-c", PTX], env=paths.env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.stdout.startswith("OK"), f"{proc.stdout}\n{proc.stderr[-3000:]}"
