"""Log-mel against Hugging Face's WhisperFeatureExtractor.

Golden values: fixtures/golden/logmel-*.npz, made by fixtures/make_golden.py with transformers
5.24.0 (torch 2.13.0 CPU) through both of the extractor's paths: `mel80`/`mel128` from its
torch path (float32 STFT), `*_np` from its numpy path (float64 STFT). We compute in float64, so
we agree with the numpy path to float32 rounding and with the torch path within its own
float32 error.
"""

import glob
import os

import numpy as np
import pytest

from nwhisper import mel as M
from nwhisper.io.audio import load_audio

from paths import GOLDEN as GOLDEN_DIR, fixture

GOLDEN = sorted(glob.glob(os.path.join(GOLDEN_DIR, "logmel-*.npz")))


@pytest.mark.parametrize("path", GOLDEN, ids=os.path.basename)
@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("oracle", ["_np", ""], ids=["hf-numpy", "hf-torch"])
def test_log_mel_matches_hf(path, n_mels, oracle):
    g = np.load(path)
    audio = load_audio(fixture(str(g["clip"])))
    assert len(audio) == int(g["n_samples"])
    ours = M.log_mel(audio, n_mels, M.N_FRAMES)           # (3000, n_mels), time-major
    ref = g[f"mel{n_mels}{oracle}"]                         # (n_mels, frames reaching audio)
    k = ref.shape[1]
    d_audio = np.abs(ours[:k].T - ref).max()
    d_pad = np.abs(ours[k:] - g[f"pad{n_mels}{oracle}"]).max()
    assert max(d_audio, d_pad) <= 2e-5, f"max |Δ| = {d_audio:.3g} (audio frames), {d_pad:.3g} (padding)"


def test_mel_filters_are_slaney_triangles():
    f = M.mel_filters(80)
    assert f.shape == (80, 201) and (f >= 0).all()
    peaks = f.argmax(axis=1)
    assert (np.diff(peaks) >= 0).all()
    # Slaney normalisation: height 2 / bandwidth makes every triangle's area over Hz one
    # (sampled on the 40 Hz bin grid, so only approximately for the narrow low filters)
    area = f.sum(axis=1) * (8000 / 200)
    assert np.allclose(area, 1.0, atol=0.1), area


def test_only_the_audio_is_transformed():
    """Frames past the audio are the clamp floor: a short clip padded to 3000 frames equals the
    same clip's frames followed by that constant."""
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(16000) * 0.1).astype(np.float32)
    full = M.log_mel(audio, 80, M.N_FRAMES)
    assert np.all(full[110:] == full[-1, 0])
    # and agrees with a plain float64 STFT of the explicitly padded signal
    x = np.zeros(M.N_SAMPLES)
    x[:16000] = audio
    p = np.pad(x, 200, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(p, 400)[::160][:3000] * M.hann_window()
    spec = np.log10(np.maximum((np.abs(np.fft.rfft(frames)) ** 2) @ M.mel_filters(80).T, 1e-10))
    spec = (np.maximum(spec, spec.max() - 8) + 4) / 4
    assert np.abs(spec - full).max() < 1e-6


@pytest.mark.parametrize("seconds,n_frames", [(63.3, None), (63.3, "long-form"), (30.0, 3000),
                                              (29.99, 3000), (4.4, 3000), (0.03, None)])
def test_block_by_block_is_the_one_pass_spectrogram(monkeypatch, seconds, n_frames):
    """A long recording's log-mel is made in blocks of frames (bounded memory), clamped to the
    loudest frame of all: the same float32 numbers as one pass over the whole signal, which is
    HF's (test_log_mel_matches_hf). Blocks of 700 frames here, so every case is cut."""
    x = load_audio(fixture("espeak", "en-63s.flac"))[:int(seconds * M.SAMPLE_RATE)]
    nf = len(x) // M.HOP_LENGTH + 1 if n_frames == "long-form" else n_frames
    monkeypatch.setattr(M, "BLOCK_FRAMES", 10 ** 9)
    whole = M.log_mel(x, 80, nf).copy()
    monkeypatch.setattr(M, "BLOCK_FRAMES", 700)
    np.testing.assert_array_equal(M.log_mel(x, 80, nf), whole)


def test_the_padded_signal_is_torch_stfts():
    """The centre padding built piecewise = the whole signal zero-extended, then np.pad's reflect
    (torch.stft's center=True), for audio shorter than, equal to and longer than the window."""
    rng = np.random.default_rng(0)
    for n, n_frames in [(1000, 6), (480000, 3000), (479963, 3000), (480150, 3000), (401, 3), (5, 3000)]:
        audio = rng.standard_normal(n).astype(np.float32)
        total = n_frames * M.HOP_LENGTH
        live = min(n_frames, (n + M.N_FFT // 2) // M.HOP_LENGTH + 1)
        x = np.zeros(total, np.float64)
        x[:min(n, total)] = audio[:total]
        want = np.pad(x, M.N_FFT // 2, mode="reflect")[:live * M.HOP_LENGTH + M.N_FFT]
        np.testing.assert_array_equal(M._padded(audio, total, 0, len(want)), want)
        np.testing.assert_array_equal(M._padded(audio, total, 333, len(want)), want[333:])


@pytest.mark.parametrize("seconds", [20.0, 30.0, 30.01, 31.0, 65.0, 200.0])
def test_windows_of_a_recording_read_in_pieces_are_the_whole_log_mel(seconds):
    """The long form reads a file twice, never whole: LoudestFrame finds the clamp's reference
    from its pieces, LogMelWindows computes each window's frames from the second pass. Every
    window is the same float32 numbers as pad_frames of the whole recording's log-mel (one
    pass, which test_log_mel_matches_hf holds to HF), at seeks that cut blocks and the end."""
    from nwhisper.io.audio import SampleWindow

    speech = load_audio(fixture("espeak", "en-63s.flac"))
    n = int(seconds * M.SAMPLE_RATE) + 77
    x = np.resize(speech, n) * np.float32(1.3)
    content = n // M.HOP_LENGTH
    whole = M.log_mel(x, 80, content + 1)[:content]
    pieces = [x[i:i + 100003] for i in range(0, n, 100003)]
    loudest = M.LoudestFrame(80)
    for p in pieces:
        loudest.feed(p)
    windows = M.LogMelWindows(SampleWindow(pieces), n, loudest.finish(content + 1), 80)
    for seek in sorted({0, 1, 2, 1500, 2999, 3000, 5000, content - 2500, content - 1}):
        if 0 <= seek < content:
            np.testing.assert_array_equal(windows.window(seek, M.N_FRAMES), M.pad_frames(whole, seek, M.N_FRAMES))
