"""Audio in: a file, bytes or a file object → 16 kHz mono float32 samples.

    load_audio("talk.flac")             # decode, average the channels, resample to 16 kHz
    load_channels("call.wav")           # the same, one array per channel
    Recording("talk.m4a").pieces()      # the same in pieces, decoded again at each call
    resample(x, 44100)                  # band-limited rational resampling of a 1-D signal
    StreamResampler(48000).feed(piece)  # the same, for a signal that arrives in pieces
    pcm16_to_float32(chunk)             # raw little-endian s16 (streaming) → float32

Decoding is libsndfile's, through `soundfile`: WAV at any bit depth (8/16/24/32-bit int, 32/64-bit
float), FLAC, Ogg Vorbis/Opus, MP3 and the rest of its formats; what it does not read (m4a/AAC,
mp4/mov/mkv video, webm, wma …) FFmpeg's libraries decode through PyAV (io/container.py).
Integers are scaled to [-1, 1) as Whisper expects (s16 / 32768). Anything that is not decodable
audio raises `AudioError` (a
`ValueError`) whose one-line message names the input and what is wrong with it; that includes a
file that decodes to zero samples, since there is nothing to transcribe. A path that does not exist
raises the usual `FileNotFoundError`.

Resampling is a polyphase windowed-sinc filter of our own (scipy's `resample_poly` is the oracle
in the tests, not a dependency here). For a ratio up/down (reduced by their gcd), the prototype
low-pass runs at the virtual rate up · sr_in with its cutoff at the lower of the two Nyquist
frequencies; output sample n is the dot product of one phase of that filter with the input around
n · down / up, so no zero-stuffed signal is ever built. The Kaiser window is sized from Kaiser's
formulas for STOPBAND_DB of attenuation over a transition band TRANSITION wide, centred on the
lower Nyquist: for 16 kHz output, 7.6–8.4 kHz, so every frequency above 8.4 kHz is at least
80 dB down before it can alias.
"""

from __future__ import annotations

import functools
import io
import math
import os
import struct

import numba
import numpy as np
import soundfile as sf

from . import container
from .errors import AudioError

SAMPLE_RATE = 16000
MIN_RATE, MAX_RATE = 1000, 768000   # sample rates we accept; a header outside is lying or exotic

STOPBAND_DB = 90.0    # design target, with a margin over the 80 dB the tests demand
TRANSITION = 0.10     # transition band width, as a fraction of the lower Nyquist frequency
KAISER_BETA = 0.1102 * (STOPBAND_DB - 8.7)   # Kaiser's β for A > 50 dB: 8.96
# Kaiser's length estimate N - 1 = (A - 7.95) / (2.285 Δω). With Δω = π · TRANSITION / R at
# the virtual rate (R = max(up, down) virtual samples per lower-rate sample), the half length
# is ZERO_CROSSINGS · R virtual samples: the sinc's zero crossings kept on each side.
ZERO_CROSSINGS = math.ceil((STOPBAND_DB - 7.95) / (2 * 2.285 * math.pi * TRANSITION))   # 58

MAX_TABLE = 1 << 21   # filter coefficients held at once; odd rate pairs are filtered in slices
BLOCK_VALUES = 1 << 22   # decode this many samples (frames × channels) at a time


def load_audio(source, sr=SAMPLE_RATE):
    """Decode `source` to mono float32 at `sr` Hz.

    source: a path (str or os.PathLike), bytes-like data of a whole file, or a binary file object.
    Channels are averaged; the result is resampled when the file's rate differs from `sr`.
    """
    hint, pieces = Recording(source, sr).decode()
    return _gather(pieces, hint)


def load_channels(source, sr=SAMPLE_RATE):
    """Decode `source` to one float32 array per channel at `sr` Hz (load_audio's checks and
    errors; each channel as load_audio would give it alone, to float32 rounding)."""
    name, data = _open(source)
    rate, blocks, _ = decode_blocks(name, data, mix=False)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(name, f"sample rate {rate} Hz is outside the supported {MIN_RATE}–{MAX_RATE} Hz")
    x = np.concatenate(list(blocks))
    if not len(x):
        raise AudioError(name, "holds no audio samples")
    if not np.isfinite(x).all():
        raise AudioError(name, "holds non-finite samples (NaN or infinity)")
    return [resample(x[:, c], rate, sr) if rate != sr else np.ascontiguousarray(x[:, c])
            for c in range(x.shape[1])]


class Recording:
    """A recording decoded on demand, as many times as it is read, never held whole:

        rec = Recording("talk.m4a")
        for piece in rec.pieces():      # mono float32 at 16 kHz, end to end load_audio's samples
            ...

    A long file is read twice by the long-form transcriber (once for its length and loudness,
    once window by window), so a 3-hour recording needs the memory of a short one. Samples
    already in memory (a float32 array at `sr`) are a recording too. The checks and errors are
    load_audio's: a piece is only yielded once it has passed them."""

    def __init__(self, source, sr=SAMPLE_RATE):
        self.sr = sr
        if isinstance(source, np.ndarray):
            self.name, self._samples = "samples", np.asarray(source, np.float32).reshape(-1)
        else:
            self._samples = None
            self.name, self._data = _open(source)

    def pieces(self):
        return self.decode()[1]

    def decode(self):
        """(the sample count the header declares at `sr`, or 0; the iterator of pieces). The
        container is opened and checked here, before the first piece is asked for."""
        if self._samples is not None:       # views, a block at a time, as a file's pieces come
            x = self._samples
            return len(x), (x[i:i + BLOCK_VALUES] for i in range(0, max(len(x), 1), BLOCK_VALUES))
        if not isinstance(self._data, str):
            self._data.seek(0)
        rate, blocks, frames = decode_blocks(self.name, self._data)
        if not MIN_RATE <= rate <= MAX_RATE:
            raise AudioError(self.name, f"sample rate {rate} Hz is outside the supported "
                                        f"{MIN_RATE}–{MAX_RATE} Hz")
        return -(-frames * self.sr // rate), self._checked(rate, blocks)

    def _checked(self, rate, blocks):
        to_rate = StreamResampler(rate, self.sr) if rate != self.sr else None
        n = 0
        for b in blocks:
            if not np.isfinite(b).all():
                raise AudioError(self.name, "holds non-finite samples (NaN or infinity)")
            n += len(b)
            y = to_rate.feed(b) if to_rate else b
            if len(y):
                yield y
        if n == 0:
            raise AudioError(self.name, "holds no audio samples")
        if to_rate:
            yield to_rate.flush()


class SampleWindow:
    """Forward-only reading of a stream of sample pieces: `get(lo, hi)` → (buffer, at), the
    buffer holding samples at … at + len(buffer) - 1 of the stream, which include lo … hi - 1
    (or up to the end). Samples before the last `lo` asked for are let go; `n` is the stream's
    length once its end has been read (None before)."""

    def __init__(self, pieces):
        self._pieces = iter(pieces)
        self._held, self._at, self.n = [], 0, None
        self._have = 0              # samples held

    def get(self, lo, hi):
        while self.n is None and self._at + self._have < hi:
            piece = next(self._pieces, None)
            if piece is None:
                self.n = self._at + self._have
                break
            self._held.append(piece)
            self._have += len(piece)
        buf = np.concatenate(self._held) if len(self._held) != 1 else self._held[0]
        drop = max(0, min(lo - self._at, len(buf)))
        buf, self._at = buf[drop:], self._at + drop
        self._held, self._have = [buf], len(buf)
        return buf, self._at


def _gather(blocks, hint):
    """The blocks end to end in one array, allocated once for `hint` samples (the header's
    count; a damaged header may say anything, so it is capped, and the array grows if needed)."""
    out = np.empty(min(max(hint or 0, 1), 1 << 27), np.float32)
    n = 0
    for b in blocks:
        if n + len(b) > len(out):
            out = np.resize(out, max(n + len(b), len(out) * 3 // 2))
        out[n:n + len(b)] = b
        n += len(b)
    return out[:n] if len(out) - n <= len(out) // 10 else out[:n].copy()   # a little slack: no copy


def decode_blocks(name, data, mix=True):
    """(sample rate, iterator of mono float32 blocks, the sample count its header declares or 0)
    of a file that _open made readable: libsndfile's formats by soundfile, the rest by PyAV.
    mix=False: the blocks are (frames, channels), the channels kept apart."""
    check_wav_length(data, name)
    try:
        f = sf.SoundFile(data)
    except TypeError:
        # soundfile takes a ".raw" name for headerless PCM, then wants its rate and layout.
        raise AudioError(name, "is headerless raw audio (for 16 kHz s16 mono, read the bytes "
                               "and use pcm16_to_float32)") from None
    except (sf.SoundFileError, RuntimeError) as e:
        if _libsndfile_claims(data):
            raise AudioError(name, f"cannot decode audio: {_one_line(e)}") from None
        return container.decode(name, data, tried=f"libsndfile: {_one_line(e)}", mix=mix)
    declared = f.frames if 0 < f.frames < 1 << 62 else 0
    return f.samplerate, _sf_blocks(name, f, mix), declared


def _sf_blocks(name, f, mix=True):
    # Read in blocks rather than trusting the header's frame count for one allocation: a
    # damaged header may claim far more frames than the file holds.
    try:
        with f:
            channels, declared, n = f.channels, f.frames, 0
            block = max(1, BLOCK_VALUES // channels)
            while True:
                x = f.read(block, dtype="float32", always_2d=True)
                n += len(x)
                if len(x) < block:
                    break
                yield _mixed(x) if mix else x
            # an MP3's or FLAC's header says how long it is: a cut-off copy decodes short
            if 0 < declared < 1 << 62 and (declared - n) / f.samplerate > max(0.5, 0.05 * declared / f.samplerate):
                raise AudioError(name, f"truncated: its header declares {declared / f.samplerate:.2f} s "
                                       f"of audio but only {n / f.samplerate:.2f} s decode")
            if len(x):
                yield _mixed(x) if mix else x
    except (sf.SoundFileError, RuntimeError) as e:
        raise AudioError(name, f"cannot decode audio: {_one_line(e)}") from None


def _mixed(x):
    """(frames, channels) → their average, as Whisper hears a recording."""
    return x[:, 0] if x.shape[1] == 1 else x.mean(axis=1, dtype=np.float32)


# the magic numbers of libsndfile's own containers: a broken one gets libsndfile's reason
_SNDFILE_MAGIC = (b"RIFF", b"RIFX", b"RF64", b"fLaC", b"FORM", b".snd", b"caff", b"wvpk")


def _libsndfile_claims(data):
    if isinstance(data, str):
        with open(data, "rb") as f:
            head = f.read(4)
    else:
        data.seek(0)
        head = data.read(4)
        data.seek(0)
    return head[:4] in _SNDFILE_MAGIC


def pcm16_to_float32(data):
    """Raw little-endian signed 16-bit mono PCM (bytes-like) → float32 in [-1, 1)."""
    data = memoryview(data).cast("B")
    if len(data) % 2:
        raise AudioError("PCM16 data", f"{len(data)} bytes is not a whole number of 2-byte samples")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / np.float32(32768.0)


def resample(x, sr_in, sr_out=SAMPLE_RATE):
    """Band-limited resampling of a 1-D signal from sr_in to sr_out Hz → float32.

    The output has ceil(len(x) · sr_out / sr_in) samples, sample n sitting at input time
    n · sr_in / sr_out (no delay), as with scipy.signal.resample_poly. Outside the signal the
    input counts as zero.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 1:
        raise ValueError(f"resample expects a 1-D signal, got shape {x.shape}")
    for rate in (sr_in, sr_out):
        if int(rate) != rate or not MIN_RATE <= rate <= MAX_RATE:
            raise ValueError(f"sample rate {rate} is not a whole number of Hz in "
                             f"{MIN_RATE}–{MAX_RATE}")
    g = math.gcd(int(sr_in), int(sr_out))
    up, down = int(sr_out) // g, int(sr_in) // g
    if up == down:
        return x.copy()
    n_out = -(-len(x) * up // down)
    left, right, taps = _reach(up, down)
    xp = np.zeros(left + len(x) + right, np.float32)     # the last i0 is len(x) - 1
    xp[left:left + len(x)] = x
    y = np.zeros(n_out, np.float32)        # each output rounded once, from a float64 sum
    # The first output of phase p is the n in [0, up) with n · down ≡ p (mod up).
    first_of_phase = np.zeros(up, np.int64)
    first_of_phase[(np.arange(up) * down) % up] = np.arange(up)
    rows = MAX_TABLE // taps
    if rows >= up:      # every common rate pair: one small table, kept for the next call
        _apply_phases(xp, _whole_table(up, down), first_of_phase, up, down, y)
    else:
        for p0 in range(0, up, rows):
            table = _phase_table(up, down, p0, min(up, p0 + rows))
            _apply_phases(xp, table, first_of_phase[p0:p0 + len(table)], up, down, y)
    return y


class StreamResampler:
    """`resample` of a signal that arrives in pieces (a live stream at 48 kHz):

        r = StreamResampler(48000)
        y = np.concatenate([r.feed(piece) for piece in pieces] + [r.flush()])

    gives resample(np.concatenate(pieces), 48000) to float32 rounding. feed() returns the
    outputs whose filter taps have all arrived (the filter reaches ZERO_CROSSINGS samples of
    the lower rate ahead: 3.6 ms); flush() the rest, with the input after the end taken as zero.
    Only the input the next output still reads is kept."""

    def __init__(self, sr_in, sr_out=SAMPLE_RATE):
        resample(np.zeros(1, np.float32), sr_in, sr_out)   # validates the rates
        g = math.gcd(int(sr_in), int(sr_out))
        self.up, self.down = int(sr_out) // g, int(sr_in) // g
        self.left, self.right, _ = _reach(self.up, self.down)
        self._x = np.zeros(self.left, np.float32)    # input from absolute index _start on
        self._start = -self.left                      # (zeros before the signal)
        self._received = 0                            # input samples fed
        self._done = 0                                # outputs returned

    def feed(self, x):
        x = np.asarray(x, np.float32).reshape(-1)
        if self.up == self.down:
            self._received += len(x)
            return x.copy()
        self._x = np.concatenate([self._x, x])
        self._received += len(x)
        # output n reads input up to n · down // up + right
        ready = ((self._received - 1 - self.right) * self.up) // self.down + 1 if self._received > self.right else 0
        return self._emit(max(ready, self._done))

    def flush(self):
        """The outputs that remain: resample's length, ceil(received · up / down), in all."""
        if self.up == self.down:
            return np.zeros(0, np.float32)
        self._x = np.concatenate([self._x, np.zeros(self.right + 1, np.float32)])
        return self._emit(-(-self._received * self.up // self.down))

    def _emit(self, upto):
        up, down = self.up, self.down
        if upto <= self._done:
            return np.zeros(0, np.float32)
        k = self._done // up              # start at an output whose phase is 0: i0 = k · down
        base = k * down - self.left - self._start
        y = np.zeros(upto - k * up, np.float32)
        first = np.zeros(up, np.int64)
        first[(np.arange(up) * down) % up] = np.arange(up)
        _apply_phases(self._x[base:], _whole_table(up, down), first, up, down, y)
        out = y[self._done - k * up:]
        self._done = upto
        keep = (self._done // up) * down - self.left - self._start   # the next call's base
        self._x, self._start = self._x[keep:], self._start + keep
        return out


def _reach(up, down):
    """(left, right, taps): input samples before and after n · down // up that the filter
    touches, and taps = left + 1 + right coefficients per phase."""
    half = ZERO_CROSSINGS * max(up, down)      # prototype half length, in virtual samples
    left = half // up
    right = (up - 1 + half) // up
    return left, right, left + 1 + right


def _phase_table(up, down, p0, p1):
    """Filter phases p0 … p1-1 → (p1 - p0, taps) float64, each row with unit DC gain.

    Row p, column m weights input i0(n) - left + m for every output n of phase p, where
    i0(n) = n · down // up and p = n · down - i0 · up; that input lies k = p - (m - left) · up
    virtual samples from the output, and the weight is the prototype at k:
    sinc(k / R) · kaiser(k) with R = max(up, down), which cuts at the lower Nyquist.
    """
    left, _, taps = _reach(up, down)
    r = max(up, down)
    half = ZERO_CROSSINGS * r
    p = np.arange(p0, p1, dtype=np.float64)[:, None]
    k = p - (np.arange(taps) - left) * float(up)
    inside = np.abs(k) <= half
    t = np.where(inside, k / half, 0.0)
    h = np.sinc(k / r) * np.i0(KAISER_BETA * np.sqrt(1.0 - t * t)) * inside
    # Normalising each phase (rather than the whole prototype) makes DC gain exactly 1 for every
    # output sample; the per-phase sums differ only by the filter's ripple (< 1e-4).
    h /= h.sum(axis=1, keepdims=True)
    return h


@functools.lru_cache(maxsize=16)
def _whole_table(up, down):
    table = _phase_table(up, down, 0, up)
    table.setflags(write=False)
    return table


@numba.njit(cache=True, nogil=True, fastmath=True)
def _apply_phases(xp, table, first, up, down, y):
    """For each phase row r: y[n] = Σ_m table[r, m] · xp[n · down // up + m] for the outputs
    n = first[r], first[r] + up, … of that phase.  xp: zero-padded input (float32), y: float32
    (the sum is float64, rounded once as it is stored)."""
    taps = table.shape[1]
    for r in range(table.shape[0]):
        for n in range(first[r], y.shape[0], up):
            i0 = (n * down) // up
            acc = 0.0
            for m in range(taps):
                acc += table[r, m] * xp[i0 + m]
            y[n] = acc


def check_wav_length(source, name):
    """Raise AudioError if `source` (a path or a seekable binary file) is a RIFF/WAVE file whose
    data chunk declares more bytes than follow it: libsndfile would decode the part that is
    there, and a cut-off upload or copy would come back as a confident transcript of half the
    recording. A streamed WAV's placeholder sizes (0 or 0xFFFFFFFF, and RF64's) mean "unknown"
    and pass; other formats pass untouched."""
    f = open(source, "rb") if isinstance(source, str) else source
    try:
        start = f.tell()
        total = f.seek(0, io.SEEK_END) - start
        f.seek(start)
        head = f.read(12)
        if len(head) < 12 or head[8:12] != b"WAVE" or head[:4] not in (b"RIFF", b"RIFX"):
            return
        order = "<I" if head[:4] == b"RIFF" else ">I"
        pos = 12
        while pos + 8 <= total:
            f.seek(start + pos)
            chunk = f.read(8)
            (size,) = struct.unpack(order, chunk[4:8])
            if chunk[:4] == b"data":
                have = total - pos - 8
                if size not in (0, 0xFFFFFFFF) and have < size:
                    raise AudioError(name, f"truncated WAV: its data chunk declares {size} bytes "
                                           f"of samples but only {have} follow")
                return
            pos += 8 + size + (size & 1)       # chunks are padded to an even length
    finally:
        if f is source:
            f.seek(start)
        else:
            f.close()


def _open(source):
    """(name for messages, something soundfile can open) for a path, bytes or a file object."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file")
        if os.path.isdir(path):
            raise IsADirectoryError(f"{path}: is a directory, not an audio file")
        if os.path.getsize(path) == 0:
            raise AudioError(path, "is empty (0 bytes)")
        return path, path
    if isinstance(source, (bytes, bytearray, memoryview)):
        name, data = "audio bytes", bytes(source)
    elif hasattr(source, "read"):
        # Read it whole: soundfile needs to seek, and pipes and sockets cannot.
        name, data = str(getattr(source, "name", "audio file object")), source.read()
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"{name}: the file object must be opened in binary mode")
    else:
        raise TypeError(f"load_audio takes a path, bytes or a binary file object, "
                        f"not {type(source).__name__}")
    if len(data) == 0:
        raise AudioError(name, "is empty (0 bytes)")
    return name, io.BytesIO(data)


def _one_line(error):
    """libsndfile's message without soundfile's "Error opening <file>: " prefix or newlines."""
    text = str(getattr(error, "error_string", None) or error)
    return " ".join(text.split())
