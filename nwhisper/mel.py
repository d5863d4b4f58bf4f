"""The log-mel spectrogram Whisper was trained on.

    16 kHz samples
      → frames of N_FFT = 400 samples every HOP = 160 (10 ms), centred: reflect-padded by 200
      → periodic Hann window → |DFT|² of the 201 non-negative frequencies
      → Slaney-style mel filter bank (80 bands, or 128 for large-v3)
      → log10 (floored at 1e-10) → clamp to (max − 8) → (x + 4) / 4

The last STFT frame is dropped (openai-whisper and Hugging Face both do: 30 s of audio gives
exactly N_FRAMES = 3000 frames). Output is time-major, (frames, n_mels), which is the layout the
encoder's first convolution reads.

The clamp's max is over the whole spectrogram, so a window is normalised by its loudest frame.
Frames that lie entirely in zero padding hold log10(1e-10) = −10 before the clamp; they are
filled with that value instead of being transformed, so a 2 s utterance pays for 2 s of STFT,
not for the 30 s window it is padded to. The arithmetic runs on the kernels
(nwhisper/kernels/spectral.py), in float64: see there for why.
"""

from __future__ import annotations

import functools

import numpy as np

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_LENGTH = 30
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE      # 480000 samples in a 30 s window
N_FRAMES = N_SAMPLES // HOP_LENGTH          # 3000 frames in a 30 s window
FRAME_SECONDS = HOP_LENGTH / SAMPLE_RATE    # 10 ms a frame
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH   # 100 (seconds → frames, as openai rounds them)
N_FREQ = N_FFT // 2 + 1                     # 201 DFT bins
LOG_FLOOR = -10.0                           # log10 of the 1e-10 power floor
BLOCK_FRAMES = 3000                         # frames transformed at once (their float64 buffers)


def _hz_to_mel(f):
    """Slaney's mel scale (librosa's default, htk=False): linear below 1 kHz, log above."""
    f = np.asarray(f, np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, f / f_sp)


def _mel_to_hz(m):
    m = np.asarray(m, np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


def slaney_filters(n_mels, sr=SAMPLE_RATE, n_fft=N_FFT, dtype=np.float64):
    """(n_mels, n_fft//2 + 1) triangular filters on Slaney's mel scale, area-normalised: librosa's
    filters.mel(norm="slaney", htk=False). The maths is float64 and the result is rounded to
    `dtype` where librosa rounds it (each row, then the normalisation), so float32 gives
    openai-whisper's assets/mel_filters.npz bit for bit (what ggml files carry) and float64
    what HF's WhisperFeatureExtractor computes."""
    fft_freqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    mel_pts = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sr / 2), n_mels + 2))
    fdiff = np.diff(mel_pts)
    ramps = np.subtract.outer(mel_pts, fft_freqs)
    weights = np.zeros((n_mels, n_fft // 2 + 1), dtype)
    for i in range(n_mels):
        weights[i] = np.maximum(0.0, np.minimum(-ramps[i] / fdiff[i], ramps[i + 2] / fdiff[i + 1]))
    weights *= (2.0 / (mel_pts[2:n_mels + 2] - mel_pts[:n_mels]))[:, None]
    return weights


@functools.lru_cache(maxsize=4)
def mel_filters(n_mels, sr=SAMPLE_RATE, n_fft=N_FFT):
    """The float64 Slaney filterbank the log-mel uses, computed once per size (read-only)."""
    weights = slaney_filters(n_mels, sr, n_fft)
    weights.setflags(write=False)
    return weights


@functools.lru_cache(maxsize=1)
def hann_window():
    """Periodic Hann (torch.hann_window's default): the DFT-even window, N not N-1 in the cosine."""
    n = np.arange(N_FFT)
    w = 0.5 - 0.5 * np.cos(2 * np.pi * n / N_FFT)
    w.setflags(write=False)
    return w


@functools.lru_cache(maxsize=1)
def dft_basis():
    """(cos, sin) tables of the 201-bin real DFT of a 400-sample frame, float64 (n_freq, n_fft)."""
    angle = 2 * np.pi * np.outer(np.arange(N_FREQ), np.arange(N_FFT)) / N_FFT
    return np.cos(angle), np.sin(angle)


def _tables(be, n_mels):
    """The constant arrays (window, DFT basis, filters) on backend `be`, uploaded once and kept
    as long as the backend lives."""
    def make():
        cos_t, sin_t = dft_basis()
        return (be.upload(hann_window()), be.upload(cos_t), be.upload(sin_t),
                be.upload(mel_filters(n_mels)))
    return be.constant(("mel tables", n_mels), make)


@functools.lru_cache(maxsize=1)
def _cpu():
    from . import backend as B

    return B.get("cpu")


def log_mel(audio, n_mels=80, n_frames=None, be=None):
    """Log-mel of 16 kHz `audio` (float32), time-major (frames, n_mels) float32.

    n_frames: the number of frames wanted, as if `audio` were zero-padded to n_frames·HOP
    samples first (N_FRAMES for one 30 s window); default: the frames the audio itself gives.
    be: the backend to compute on (default: the CPU); the result is on that backend.
    """
    from .kernels import spectral

    be = be or _cpu()
    audio = np.asarray(audio, np.float32)
    n = len(audio)
    if n_frames is None:
        n_frames = n // HOP_LENGTH          # 1 + n//HOP frames, minus the dropped last one
    total = n_frames * HOP_LENGTH           # the (virtually) zero-padded length
    # Frames whose 400-sample window touches the audio; every later frame sees only zeros.
    live = min(n_frames, (n + N_FFT // 2) // HOP_LENGTH + 1) if n else 0
    window, cos_t, sin_t, filters = _tables(be, n_mels)
    out = be.empty((n_frames, n_mels), np.float32)
    tables = (window, cos_t, sin_t, filters)
    if live <= BLOCK_FRAMES:
        signal = be.upload(_padded(audio, total, 0, live * HOP_LENGTH + N_FFT))
        spectral.log_mel(be, signal, *tables, live, HOP_LENGTH, out)
        return out
    # A long recording, block by block (the float64 frames of the whole of it would be ~1.3 GB
    # an hour): first the clamp's reference, the loudest frame of all, then each block
    # normalised against it — the same numbers as one pass, frame for frame.
    blocks = [(f, min(f + BLOCK_FRAMES, live)) for f in range(0, live, BLOCK_FRAMES)]

    def signal(f0, f1):
        return be.upload(_padded(audio, total, f0 * HOP_LENGTH, (f1 - 1) * HOP_LENGTH + N_FFT))

    top = max(spectral.log_mel_peak(be, signal(f0, f1), *tables, f1 - f0, HOP_LENGTH, n_mels)
              for f0, f1 in blocks)
    for f0, f1 in blocks:
        spectral.log_mel(be, signal(f0, f1), *tables, f1 - f0, HOP_LENGTH, out[f0:f1], top=top)
    if live < n_frames:
        spectral.log_mel(be, None, *tables, 0, HOP_LENGTH, out[live:], top=top)
    return out


def _padded(audio, total, lo, hi, n=None, at=0):
    """Samples lo..hi of the centre-padded signal, float64, as torch.stft sees it: the audio
    zero-extended to `total` samples, reflected (without its edge sample) at both ends of that,
    and shifted by N_FFT/2. `audio` may be a stretch of a longer recording: samples at … of an
    n-sample one (it must hold every sample these frames read)."""
    n = len(audio) if n is None else n
    i = np.arange(lo, hi) - N_FFT // 2
    i = np.where(i < 0, -i, i)
    i = np.where(i >= total, 2 * (total - 1) - i, i)
    x = np.zeros(hi - lo, np.float64)
    inside = i < n
    x[inside] = audio[i[inside] - at]
    return x


class LoudestFrame:
    """The clamp's reference of a long recording's log-mel, its loudest frame, from samples
    that arrive in pieces: feed(piece) …, then finish(n_frames) → the number log_mel(audio,
    n_mels, n_frames) normalises by (n_frames ≥ len(audio) // HOP, as the long form asks).
    Frames are taken BLOCK_FRAMES at a time once every sample they read is in, so only about
    a block of samples is held; the last ones, which the end's padding reaches, at finish()."""

    def __init__(self, n_mels, be=None):
        self.be, self.n_mels = be or _cpu(), n_mels
        self.n = 0                                  # samples fed
        self._held, self._at = np.zeros(0, np.float32), 0   # samples _at … n - 1
        self._next = 0                              # the first frame not yet taken
        self._top = LOG_FLOOR

    def feed(self, samples):
        step = BLOCK_FRAMES * HOP_LENGTH
        for k in range(0, len(samples), step):
            self._held = np.concatenate([self._held, samples[k:k + step]])
            self.n += len(samples[k:k + step])
            # frame f reads samples up to f·HOP + N_FFT/2 - 1; none of them is past the end yet
            ready = (self.n - N_FFT // 2) // HOP_LENGTH + 1 if self.n >= N_FFT // 2 else 0
            while ready - self._next >= BLOCK_FRAMES:
                self._take(self._next + BLOCK_FRAMES, self.n + 1)

    def finish(self, n_frames):
        total = n_frames * HOP_LENGTH
        live = min(n_frames, (self.n + N_FFT // 2) // HOP_LENGTH + 1) if self.n else 0
        while self._next < live:
            self._take(min(self._next + BLOCK_FRAMES, live), total)
        return self._top

    def _take(self, f1, total):
        f0 = self._next
        window, cos_t, sin_t, filters = _tables(self.be, self.n_mels)
        x = _padded(self._held, total, f0 * HOP_LENGTH, (f1 - 1) * HOP_LENGTH + N_FFT, self.n, self._at)
        from .kernels import spectral

        peak = spectral.log_mel_peak(self.be, self.be.upload(x), window, cos_t, sin_t, filters,
                                     f1 - f0, HOP_LENGTH, self.n_mels)
        self._top = max(self._top, peak)
        self._next = f1
        drop = max(0, f1 * HOP_LENGTH - N_FFT // 2 - self._at)     # what later frames never read
        self._held, self._at = self._held[drop:], self._at + drop


class LogMelWindows:
    """30 s windows of the log-mel of a recording read once more, front to back: window(seek,
    n_frames) is pad_frames(log_mel(audio, n_mels, n // HOP + 1)[:n // HOP], seek, n_frames),
    frame for frame, without the whole of either ever being held. samples: an
    io.audio.SampleWindow over the recording's pieces; n: its length; top: LoudestFrame's
    finish(n // HOP + 1). Seeks must not go back."""

    def __init__(self, samples, n, top, n_mels, be=None):
        self.samples, self.n, self.top, self.n_mels = samples, n, top, n_mels
        self.be = be or _cpu()
        self.content = n // HOP_LENGTH
        self._total = (self.content + 1) * HOP_LENGTH

    def window(self, seek, n_frames):
        from .kernels import spectral

        size = max(0, min(n_frames, self.content - seek))
        out = np.zeros((n_frames, self.n_mels), np.float32)
        if size:
            lo, hi = seek * HOP_LENGTH, (seek + size - 1) * HOP_LENGTH + N_FFT
            buf, at = self.samples.get(max(0, lo - N_FFT // 2), hi - N_FFT // 2)
            x = _padded(buf, self._total, lo, hi, self.n, at)
            block = self.be.empty((size, self.n_mels), np.float32)
            spectral.log_mel(self.be, self.be.upload(x), *_tables(self.be, self.n_mels), size, HOP_LENGTH,
                             block, top=self.top)
            out[:size] = self.be.download(block)
        return out


def pad_frames(mel, seek, n_frames):
    """mel[seek : seek+n] zero-padded (in the normalised log-mel domain) to n_frames rows: a
    window of a recording's log-mel, as openai-whisper and faster-whisper cut the last one."""
    seg = mel[seek:seek + n_frames]
    if len(seg) == n_frames:
        return np.ascontiguousarray(seg)
    out = np.zeros((n_frames, mel.shape[1]), np.float32)
    out[:len(seg)] = seg
    return out
