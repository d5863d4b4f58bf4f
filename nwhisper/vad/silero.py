"""Silero VAD (16 kHz, the network silero-vad 6.x ships) on nwhisper's kernels.

    vad = Silero()                    # weights from silero_vad_16k.npz beside this file
    p = vad(chunk)                    # chunk: 512 samples at 16 kHz -> p(speech) in [0, 1]
    ps = vad.run(chunks)              # (n, 512): consecutive chunks -> n p(speech), state carried
    probs = vad.probs(audio)          # a whole recording, from a reset state
    vad.reset()

State is carried from chunk to chunk exactly as silero's OnnxWrapper carries it: the LSTM's h and
c, and the last 64 samples of the previous chunk, which are prepended to the next one (zeros after
a reset). The network itself is one kernel body, nwhisper.kernels.vad_ops.silero_chunk; with
`streams=S` one launch advances S independent streams by one chunk each. run() takes many chunks
of stream 0 at once: their encoders in one parallel launch, then the LSTM through them in one
more, the same arithmetic as chunk by chunk.

The tensors were exported once from the package's silero_vad.onnx by fixtures/export_silero.py
(MIT, LICENSE.silero beside them); the STFT basis is computed here, not stored.
"""

import functools
import os

import numpy as np

from nwhisper import backend as backends
from nwhisper.kernels.vad_ops import silero_chunk

SAMPLE_RATE = 16000
CHUNK = 512                   # samples a step: 32 ms
CONTEXT = 64                  # samples of the previous chunk prepended to each
N_FFT = 256                   # the STFT: 129 bins, hop 128, periodic Hann
HIDDEN = 128
RUN = 1024                    # chunks run() encodes in one launch (33 s; 14 MB of scratch)
WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "silero_vad_16k.npz")


def stft_basis():
    """(258, 256) f32: rows 0..128 are Hann * cos(2 pi k n / 256), rows 129..257 Hann * -sin.

    The ONNX file stores this as stft.forward_basis_buffer; the two agree to 6e-8
    (fixtures/export_silero.py checks).
    """
    k = np.arange(N_FFT // 2 + 1)[:, None]
    n = np.arange(N_FFT)[None, :]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)
    angle = 2 * np.pi * k * n / N_FFT
    return np.concatenate([np.cos(angle) * window, -np.sin(angle) * window]).astype(np.float32)


def weights_available(path=WEIGHTS):
    return os.path.exists(path)


@functools.cache      # a detector is made per recording: reading the file took ~9 ms each time
def load_weights(path=WEIGHTS):
    """The kernel's weight arrays (host, f32), in silero_chunk's argument order; read once per
    path and shared by every detector (none writes them)."""
    try:
        z = np.load(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"Silero VAD weights not found at {path}; run "
                                "fixtures/export_silero.py, or use the energy detector") from None

    def get(name, shape=None):
        a = np.asarray(z[name], np.float32)
        if shape is not None and a.shape != shape:
            raise ValueError(f"{path}: {name} has shape {a.shape}, expected {shape}")
        return a

    def conv(i, out, inp):  # (out, in, k) -> (in, k, out): the kernel's inner loop runs over out
        w = get(f"encoder.{i}.reparam_conv.weight", (out, inp, 3))
        return np.ascontiguousarray(w.transpose(1, 2, 0)), get(f"encoder.{i}.reparam_conv.bias")

    w0, b0 = conv(0, 128, 129)
    w1, b1 = conv(1, 64, 128)
    w2, b2 = conv(2, 64, 64)
    w3, b3 = conv(3, 128, 64)
    wih = np.ascontiguousarray(get("decoder.rnn.weight_ih", (4 * HIDDEN, HIDDEN)).T)
    whh = np.ascontiguousarray(get("decoder.rnn.weight_hh", (4 * HIDDEN, HIDDEN)).T)
    bias = get("decoder.rnn.bias_ih") + get("decoder.rnn.bias_hh")
    wout = get("decoder.decoder.2.weight", (1, HIDDEN, 1)).reshape(HIDDEN)
    bout = get("decoder.decoder.2.bias", (1,))
    basis = np.ascontiguousarray(stft_basis().T)
    return (basis, w0, b0, w1, b1, w2, b2, w3, b3, wih, whh, bias, wout, bout)


class Silero:
    """p(speech) per 512-sample chunk for `streams` independent streams on backend `be`."""

    name = "silero"

    def __init__(self, be=None, streams=1, path=WEIGHTS):
        self.be = be or backends.get("cpu")
        self.streams = streams
        self.weights = tuple(self.be.upload(w) for w in load_weights(path))
        self._scratch = self._make_scratch(streams)
        self._run_scratch = self._scratch       # run()'s, grown to RUN chunks at most
        self._prob = self.be.empty((streams,))
        self.reset()

    def _make_scratch(self, rows):
        """silero_chunk's scratch for `rows` streams (or chunks)."""
        return tuple(self.be.empty(shape) for shape in (
            (rows, CONTEXT + CHUNK + CONTEXT), (rows, 4, N_FFT + 2), (rows, 4, 128), (rows, 2, 64),
            (rows, 64), (rows, 128), (rows, 2, 4 * HIDDEN), (rows, 8, 128)))

    def reset(self):
        """Zero the LSTM state and the context of every stream (as OnnxWrapper.reset_states)."""
        s = self.streams
        self._ctx = self.be.zeros((s, CONTEXT))
        self._h = self.be.zeros((s, HIDDEN))
        self._c = self.be.zeros((s, HIDDEN))

    def step(self, chunks):
        """Advance every stream by one chunk. chunks: (streams, 512) f32 -> (streams,) p(speech)."""
        x = np.ascontiguousarray(chunks, np.float32)
        if x.shape != (self.streams, CHUNK):
            raise ValueError(f"Silero.step takes ({self.streams}, {CHUNK}) samples at 16 kHz, "
                             f"got {x.shape}")
        self.be.launch(silero_chunk, self.streams, self.be.upload(x), self._ctx, self._h, self._c,
                       self._prob, *self.weights, *self._scratch, 0, 1)
        return self.be.download(self._prob)

    def run(self, chunks):
        """p(speech) of consecutive chunks of stream 0, (n, 512) f32 -> (n,), continuing its
        state (as n step() calls would, to the same floats): per RUN chunks, each chunk's encoder
        side by side, then the LSTM through them."""
        if self.streams != 1:
            raise ValueError("Silero.run carries one stream; make it with streams=1")
        x = np.ascontiguousarray(chunks, np.float32)
        if x.ndim != 2 or x.shape[1] != CHUNK:
            raise ValueError(f"Silero.run takes (n, {CHUNK}) samples at 16 kHz, got {x.shape}")
        be, out = self.be, np.empty(len(x), np.float32)
        for a in range(0, len(x), RUN):
            part = x[a:a + RUN]
            n = len(part)
            ctx = np.empty((n, CONTEXT), np.float32)
            ctx[0] = be.download(self._ctx)[0]
            ctx[1:] = part[:-1, CHUNK - CONTEXT:]
            if len(self._run_scratch[0]) < n:
                self._run_scratch = self._make_scratch(n)
            prob = be.empty((n,))
            args = (be.upload(part), be.upload(ctx), self._h, self._c, prob, *self.weights,
                    *self._run_scratch)
            be.launch(silero_chunk, n, *args, 1, n, work=n * 700_000)
            be.launch(silero_chunk, 1, *args, 2, n, work=1)
            self._ctx = be.upload(part[-1:, CHUNK - CONTEXT:].copy())
            out[a:a + n] = be.download(prob)
        return out

    def __call__(self, chunk):
        """p(speech) of one 512-sample chunk of stream 0."""
        return float(self.step(np.reshape(chunk, (1, CHUNK)))[0])

    def probs(self, audio):
        """p(speech) per chunk of `audio` (1-D, 16 kHz; tail zero-padded), from a reset state."""
        if self.streams != 1:
            raise ValueError("Silero.probs runs one stream; make it with streams=1")
        x = np.asarray(audio, np.float32)
        self.reset()
        return self.run(np.concatenate([x, np.zeros(-len(x) % CHUNK, np.float32)]).reshape(-1, CHUNK))
