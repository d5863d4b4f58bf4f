"""The log-mel spectrogram's kernels: windowed DFT power, mel filter bank + log10, clamp + scale.

These bodies compute in float64, the one exception to float32 in nwhisper's kernels. The log
compresses eight decades: a mel bin 1e-8 below the loudest is still inside the clamp, and a
float32 DFT of 400 samples carries rounding of ~1e-6 of the frame's amplitude, ~1e-2 relative
in such a bin: a float32 DFT misses Hugging Face's WhisperFeatureExtractor by more than the
2e-5 it is held to; float64 agrees to float32 output rounding.

CPU fast path: NumPy's real FFT (pocketfft, float64) of all frames at once, far cheaper than the
portable body's direct DFT on the CPU, and the filter bank, log10, maximum and clamp in NumPy
(float64, then rounded to float32 as the bodies round): no kernel of this module is compiled for
a first transcription on the CPU (~1 s of compiling). Tested against the bodies. (On a GPU the
direct DFT is a well-shaped, embarrassingly parallel job.)
"""

import math

import numpy as np

from nwhisper.kernels._compile import kernel

FLOAT64_BODIES = ("stft_power_frame", "mel_log_frame", "mel_max", "mel_normalize_row")


@kernel
def stft_power_frame(f, signal, window, cos_t, sin_t, power, hop, n_fft, n_freq):
    """power[f, k] = |Σ_i signal[f·hop + i] · window[i] · e^(−2πi·ik/n_fft)|², k < n_freq.

    signal (f·hop + n_fft,) f64, already centre-padded; window (n_fft,) f64;
    cos_t, sin_t (n_freq, n_fft) f64; power (frames, n_freq) f64. One work item per frame.
    """
    base = f * hop
    for k in range(n_freq):
        re = 0.0
        im = 0.0
        for i in range(n_fft):
            v = signal[base + i] * window[i]
            re += v * cos_t[k, i]
            im += v * sin_t[k, i]
        power[f, k] = re * re + im * im


@kernel
def mel_log_frame(f, power, filters, logspec, n_mels, n_freq):
    """logspec[f, m] = log10(max(Σ_k filters[m, k] · power[f, k], 1e-10)).

    power (frames, n_freq) f64; filters (n_mels, n_freq) f64; logspec (frames, n_mels) f64.
    """
    for m in range(n_mels):
        acc = 0.0
        for k in range(n_freq):
            acc += filters[m, k] * power[f, k]
        logspec[f, m] = math.log10(max(acc, 1e-10))


@kernel
def mel_max(i, logspec, live, top):
    """top[0] = the largest value of logspec[:live] (one work item: a 3000 × 128 scan)."""
    best = -1e300
    for r in range(live):
        for m in range(logspec.shape[1]):
            best = max(best, logspec[r, m])
    top[0] = best


@kernel
def mel_normalize_row(r, logspec, top, live, floor_log, out):
    """out[r] = (max(x, top − 8) + 4) / 4 as float32, x = logspec[r] for live rows and the
    all-zero frame's log10 (floor_log = −10) for the rows past the audio."""
    lo = top[0] - 8.0
    for m in range(out.shape[1]):
        x = logspec[r, m] if r < live else floor_log
        x = lo if x < lo else x
        out[r, m] = np.float32((x + 4.0) / 4.0)


# The host's FFT takes this many frames at a time: its float64 and complex temporaries (~10 KB
# a frame) would otherwise hold 29 MB for a 30 s window, on top of the encoder's buffers.
HOST_FFT_FRAMES = 256


def stft_power(be, signal, window, cos_t, sin_t, power, hop):
    """power (frames, n_freq) = |DFT(windowed frames)|² of `signal`, float64."""
    frames, n_freq = power.shape
    n_fft = window.shape[0]
    if be.on_host:       # NumPy's FFT, each frame on its own; elsewhere the DFT as a body
        framed = np.lib.stride_tricks.sliding_window_view(signal, n_fft)[::hop][:frames]
        for a in range(0, frames, HOST_FFT_FRAMES):
            spec = np.fft.rfft(framed[a:a + HOST_FFT_FRAMES] * window, axis=1)[:, :n_freq]
            np.add(spec.real ** 2, spec.imag ** 2, out=power[a:a + HOST_FFT_FRAMES])
        return
    be.launch(stft_power_frame, frames, signal, window, cos_t, sin_t, power, hop, n_fft, n_freq)


def _log_frames(be, signal, window, cos_t, sin_t, filters, live, hop, n_mels):
    """logspec (live, n_mels) f64: log10 of the mel power of `signal`'s first `live` frames."""
    n_freq = cos_t.shape[0]
    power = be.scratch("mel_power", (max(live, 1), n_freq), np.float64)
    logspec = be.scratch("mel_logspec", (max(live, 1), n_mels), np.float64)
    if live:
        stft_power(be, signal, window, cos_t, sin_t, power, hop)
        if be.on_host:
            np.log10(np.maximum(power[:live] @ filters.T, 1e-10), out=logspec[:live])
        else:
            be.launch(mel_log_frame, live, power, filters, logspec, n_mels, n_freq)
    return logspec


def _peak(be, logspec, live):
    """The largest of logspec[:live] (live ≥ 1), as a (1,) f64 array on the backend."""
    if be.on_host:
        return np.array([logspec[:live].max()])
    top = be.scratch("mel_top", (1,), np.float64)
    be.launch(mel_max, 1, logspec, live, top)
    return top


def log_mel_peak(be, signal, window, cos_t, sin_t, filters, live, hop, n_mels):
    """The largest log10 mel power of `signal`'s first `live` frames (a float; −10 if none):
    the clamp's reference, for a spectrogram made block by block."""
    if not live:
        return -10.0
    logspec = _log_frames(be, signal, window, cos_t, sin_t, filters, live, hop, n_mels)
    return float(be.download(_peak(be, logspec, live))[0])


def log_mel(be, signal, window, cos_t, sin_t, filters, live, hop, out, top=None):
    """out (n_frames, n_mels) f32 = Whisper's normalised log-mel; only the first `live` frames
    see audio (the rest are the zero-frame's floor, not transformed). top: the clamp's
    reference (log_mel_peak of the whole recording, when `signal` is one block of it); None:
    this signal's own."""
    n_frames, n_mels = out.shape
    logspec = _log_frames(be, signal, window, cos_t, sin_t, filters, live, hop, n_mels)
    if top is not None:
        top = be.upload(np.array([top], np.float64))
    elif live:
        top = _peak(be, logspec, live)
    else:                                   # no audio at all: every frame is the floor
        top = be.upload(np.array([-10.0]))
    if be.on_host:
        lo = top[0] - 8.0
        out[:live] = (np.maximum(logspec[:live], lo) + 4.0) / 4.0
        out[live:] = (max(-10.0, lo) + 4.0) / 4.0
        return
    be.launch(mel_normalize_row, n_frames, logspec, top, live, np.float64(-10.0), out)
