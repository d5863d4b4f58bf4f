"""Silero VAD on our kernels against onnxruntime running the package's own ONNX file.

Truth: fixtures/golden/silero_probs.npz, per-chunk p(speech) that onnxruntime (1 thread) computed
from silero-vad's silero_vad.onnx over the streams fixtures/export_silero.py's golden_streams()
builds (two minutes of the fixture speech clips; 96 s of silence, hiss, white noise, rumble, a
tone, a sweep, chords, clicks, speech in noise and far-away speech), each from a reset state with
OnnxWrapper's chunking. The same script exported the weights; onnxruntime is not needed here.
The body on the CUDA backend is tests/cuda/test_cudasim.py's (the silero_vad case of
tests/helpers/cudasim_check.py against the CPU, and its PTX in float32).
"""

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
    """Chunk by chunk through __call__ is the same as probs() (run(): the chunks' encoders side
    by side, then the LSTM through them, RUN chunks a launch: here across a boundary), and as
    run() over uneven pieces; reset() starts over."""
    n = silero.RUN + 76
    x = streams["speech"][:n * 512]
    vad.reset()
    one_by_one = np.array([vad(x[i:i + 512]) for i in range(0, len(x), 512)], np.float32)
    np.testing.assert_array_equal(one_by_one, vad.probs(x))
    vad.reset()
    chunks = x.reshape(n, 512)
    pieces = [vad.run(chunks[a:b]) for a, b in [(0, 3), (3, 4), (4, 900), (900, n)]]
    np.testing.assert_array_equal(one_by_one, np.concatenate(pieces))
    np.testing.assert_allclose(one_by_one, golden["speech"][:n], atol=TOL)


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

