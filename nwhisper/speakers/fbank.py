"""Kaldi's log mel filter bank, as 3D-Speaker computes CAM++'s input features, on the kernels.

    feats = fbank(be, windows)       # (W, S) f32 at 16 kHz in [-1, 1] -> (W, T, 80) on be

torchaudio.compliance.kaldi.fbank(wav, num_mel_bins=80, sample_frequency=16000, dither=0) with
its other defaults: 25 ms frames every 10 ms (400 and 160 samples), whole frames only (snip
edges: T = 1 + (S − 400) // 160), the DC offset removed, pre-emphasis 0.97, the Povey window
(Hann ** 0.85), a 512-point power spectrum, 80 triangular bands equally spaced on the mel scale
1127 ln(1 + f / 700) from 20 Hz to 8 kHz, the log floored at float32's epsilon (Kaldi's
energy floor for the bands; no energy term). Then, as speakerlab's FBank(mean_nor=True), each
window's mean over its frames is subtracted from every band. The per-frame body is
kernels.speaker_ops.fbank_frame, a 512-point DFT as two products with its rows; on the host
the same steps run in NumPy with its FFT (_frames_host: under half the body's time; its
features within 2e-4 of the body's, both as near Kaldi's; tests/unit/test_speaker_weights.py).
"""

import functools
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from nwhisper.kernels.speaker_ops import center_columns, fbank_frame

SAMPLE_RATE = 16000
FRAME = 400                 # 25 ms
HOP = 160                   # 10 ms
N_FFT = 512                 # the frame zero-padded to a power of two, as Kaldi's default
N_MELS = 80
LOW_HZ = 20.0               # Kaldi's default low edge; the high edge is the Nyquist frequency


def n_frames(samples):
    """Frames of a window of `samples` samples (Kaldi's snip_edges): 0 if shorter than one."""
    return 0 if samples < FRAME else 1 + (samples - FRAME) // HOP


def povey_window():
    """(400,) f32: the symmetric Hann window raised to 0.85."""
    n = np.arange(FRAME)
    return ((0.5 - 0.5 * np.cos(2 * np.pi * n / (FRAME - 1))) ** 0.85).astype(np.float32)


def dft_rows():
    """(cos, sin): (257, 400) f32 each, the 512-point DFT's rows over a frame's 400 samples."""
    angle = 2 * np.pi * np.outer(np.arange(N_FFT // 2 + 1), np.arange(FRAME)) / N_FFT
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def mel_filters(n_mels=N_MELS):
    """(n_mels, 257) f32: Kaldi's triangles (torchaudio's get_mel_banks), the Nyquist bin's
    column zero."""
    def mel(f):
        return 1127.0 * np.log(1.0 + np.asarray(f, np.float64) / 700.0)

    lo, hi = mel(LOW_HZ), mel(SAMPLE_RATE / 2)
    delta = (hi - lo) / (n_mels + 1)
    left = lo + np.arange(n_mels)[:, None] * delta
    centre, right = left + delta, left + 2 * delta
    bins = mel(SAMPLE_RATE / N_FFT * np.arange(N_FFT // 2))[None, :]
    up = (bins - left) / (centre - left)
    down = (right - bins) / (right - centre)
    banks = np.maximum(0.0, np.minimum(up, down))
    return np.pad(banks, ((0, 0), (0, 1))).astype(np.float32)


def _tables(be, n_mels):
    return be.constant(("speakers.fbank", n_mels), lambda: tuple(
        be.upload(a) for a in (povey_window(), *dft_rows(), mel_filters(n_mels))))


def fbank(be, windows, out=None, n_mels=N_MELS, portable=False):
    """(W, T, n_mels) f32 on `be`: the mean-normalised log mel features of each window.
    windows: (W, S) f32 on `be` (S ≥ 400); out: where to write them (or a new array);
    portable: the body even on the host (as a device runs it: the simulator's check compares)."""
    count, samples = windows.shape
    frames = n_frames(samples)
    if frames < 1:
        raise ValueError(f"a speaker window of {samples} samples is shorter than one fbank frame "
                         f"({FRAME} samples, {1000 * FRAME // SAMPLE_RATE} ms)")
    if out is None:
        out = be.empty((count, frames, n_mels))
    window, cos_t, sin_t, filters = _tables(be, n_mels)
    rows = count * frames
    if be.on_host and not portable:
        _frames_host(windows, out, window, filters)
    else:
        frame = be.scratch("speakers.frame", (rows, FRAME), np.float64)
        power = be.scratch("speakers.power", (rows, cos_t.shape[0]), np.float64)
        be.launch(fbank_frame, rows, windows, out, window, cos_t, sin_t, filters, frame, power,
                  frames, HOP, work=rows * cos_t.size * 2)
    be.launch(center_columns, count * n_mels, out, work=rows * n_mels * 2)
    return out


def _frames_host(windows, out, window, filters):
    """fbank_frame's steps for every frame at once, in float64 with NumPy's FFT: out (W, T,
    n_mels) f32, before the per-window mean is taken off. The windows are shared out among as
    many threads as Numba's (NumPy's FFT and products let go of the GIL)."""
    parts = max(1, min(numba.get_num_threads(), len(windows)))
    cuts = [len(windows) * k // parts for k in range(parts + 1)]
    list(_pool(parts).map(lambda a, b: _frames_part(windows[a:b], out[a:b], window, filters),
                          cuts, cuts[1:]))


@functools.cache
def _pool(threads):
    return ThreadPoolExecutor(threads, thread_name_prefix="nwhisper-fbank")


def _frames_part(windows, out, window, filters):
    """A window at a time: its frames' arrays (~0.5 MB each) stay in the core's cache from one
    step to the next, where a whole part's went out to memory between steps (twice as slow)."""
    to_bands = filters.T.astype(np.float64)
    floor = np.finfo(np.float32).eps
    for i in range(len(windows)):
        x = np.lib.stride_tricks.sliding_window_view(windows[i], FRAME)[::HOP].astype(np.float64)
        x -= x.mean(axis=1, keepdims=True)
        x[:, 1:] -= 0.97 * x[:, :-1]
        x[:, 0] *= 1.0 - 0.97                 # the first sample against itself
        x *= window
        spectrum = np.fft.rfft(x, N_FFT, axis=1)
        power = spectrum.real ** 2 + spectrum.imag ** 2
        out[i] = np.log(np.maximum(power @ to_bands, floor))
