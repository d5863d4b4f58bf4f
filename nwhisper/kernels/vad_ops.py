"""Silero VAD's 16 kHz network, one 512-sample chunk of one stream per work item.

The network is tiny (about 0.7 M multiply-adds a chunk) and strictly sequential from one chunk
to the next, so one work item runs all of it for one stream: on the CPU a single call is faster
than a launch per layer, and on CUDA many streams run side by side, one thread each.

Reference: silero-vad 6.x `silero_vad.onnx` (16 kHz branch); PEERS.md §7 gives the graph:
    x = context[64] ++ chunk[512], reflect-padded right by 64   -> 640 samples
    STFT: |conv1d(x, basis[258, 256], stride 128)|               -> mag[4 frames, 129 bins]
    4 x (Conv1d k=3 pad=1 + ReLU): 129->128 s1, 128->64 s2, 64->64 s2, 64->128 s1  -> [1, 128]
    LSTMCell(128, 128), gates i, f, g, o (PyTorch order)
    p = sigmoid(w . relu(h') + b)
Activations are kept time-major (frame, channel) so every inner loop runs over a contiguous row;
the conv weights come in as (out, k, in), transposed once by nwhisper.vad.silero.
"""

import math

import numpy as np

from nwhisper.kernels._compile import kernel


@kernel
def silero_chunk(s, x, ctx, h, c, prob, basis, w0, b0, w1, b1, w2, b2, w3, b3,
                 wih, whh, bias, wout, bout, frame, mag, a0, a1, a2, a3, gates):
    """One chunk of stream s: prob[s] = p(speech); ctx[s], h[s], c[s] carried to the next chunk.

    x: (S, 512) this chunk's samples; ctx: (S, 64) the previous chunk's last 64 (zeros at reset);
    h, c: (S, 128) LSTM state; prob: (S,). Weights: basis (258, 256) STFT rows (129 cos then 129
    -sin, Hann-windowed); w0 (128, 3, 129), w1 (64, 3, 128), w2 (64, 3, 64), w3 (128, 3, 64)
    with biases b0..b3; wih, whh (512, 128); bias (512,) = bias_ih + bias_hh; wout (128,); bout
    (1,). Scratch per stream: frame (S, 640), mag (S, 4, 129), a0 (S, 4, 128), a1 (S, 2, 64),
    a2 (S, 64), a3 (S, 128), gates (S, 512). All f32.
    """
    zero = np.float32(0.0)
    one = np.float32(1.0)
    # the window: 64 samples of context, the chunk, then a reflection of its end (no edge repeat)
    for i in range(64):
        frame[s, i] = ctx[s, i]
    for i in range(512):
        frame[s, 64 + i] = x[s, i]
    for i in range(64):
        frame[s, 576 + i] = frame[s, 574 - i]
    for i in range(64):
        ctx[s, i] = x[s, 448 + i]
    # STFT magnitude: 4 frames of 256 samples, hop 128
    for t in range(4):
        for k in range(129):
            re = zero
            im = zero
            for n in range(256):
                v = frame[s, t * 128 + n]
                re += basis[k, n] * v
                im += basis[129 + k, n] * v
            mag[s, t, k] = math.sqrt(re * re + im * im)
    # encoder 0: 129 -> 128, stride 1, 4 frames
    for t in range(4):
        for o in range(128):
            acc = b0[o]
            for j in range(3):
                ti = t + j - 1
                if 0 <= ti < 4:
                    for i in range(129):
                        acc += w0[o, j, i] * mag[s, ti, i]
            a0[s, t, o] = max(acc, zero)
    # encoder 1: 128 -> 64, stride 2, 4 -> 2 frames
    for t in range(2):
        for o in range(64):
            acc = b1[o]
            for j in range(3):
                ti = 2 * t + j - 1
                if 0 <= ti < 4:
                    for i in range(128):
                        acc += w1[o, j, i] * a0[s, ti, i]
            a1[s, t, o] = max(acc, zero)
    # encoder 2: 64 -> 64, stride 2, 2 -> 1 frame (taps at frames -1, 0, 1)
    for o in range(64):
        acc = b2[o]
        for j in range(1, 3):
            for i in range(64):
                acc += w2[o, j, i] * a1[s, j - 1, i]
        a2[s, o] = max(acc, zero)
    # encoder 3: 64 -> 128, stride 1, 1 frame (only the centre tap sees data)
    for o in range(128):
        acc = b3[o]
        for i in range(64):
            acc += w3[o, 1, i] * a2[s, i]
        a3[s, o] = max(acc, zero)
    # LSTM cell
    for g in range(512):
        acc = bias[g]
        for i in range(128):
            acc += wih[g, i] * a3[s, i] + whh[g, i] * h[s, i]
        gates[s, g] = acc
    out = bout[0]
    for i in range(128):
        ig = one / (one + math.exp(-gates[s, i]))
        fg = one / (one + math.exp(-gates[s, 128 + i]))
        gg = math.tanh(gates[s, 256 + i])
        og = one / (one + math.exp(-gates[s, 384 + i]))
        cn = fg * c[s, i] + ig * gg
        hn = og * math.tanh(cn)
        c[s, i] = cn
        h[s, i] = hn
        out += wout[i] * max(hn, zero)
    prob[s] = one / (one + math.exp(-out))
