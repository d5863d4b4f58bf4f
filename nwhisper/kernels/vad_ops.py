"""Silero VAD's 16 kHz network, one 512-sample chunk of one stream per work item.

The network is tiny (about 0.7 M multiply-adds a chunk) and sequential from one chunk to the
next, so one work item runs all of it for one stream: on the CPU a single call is faster than a
launch per layer, and on CUDA many streams run side by side, one thread each. Only its LSTM
carries state, though: a whole recording's chunks are encoded side by side, one item each, with
the LSTM's product with its input (which needs no state), and then one item runs the LSTM
through them in order (the body's phases 1 and 2).

Reference: silero-vad 6.x `silero_vad.onnx` (16 kHz branch); its graph, as fixtures/export_silero.py reads it:
    x = context[64] ++ chunk[512], reflect-padded right by 64   -> 640 samples
    STFT: |conv1d(x, basis[258, 256], stride 128)|               -> mag[4 frames, 129 bins]
    4 x (Conv1d k=3 pad=1 + ReLU): 129->128 s1, 128->64 s2, 64->64 s2, 64->128 s1  -> [1, 128]
    LSTMCell(128, 128), gates i, f, g, o (PyTorch order)
    p = sigmoid(w . relu(h') + b)
Every dot product is summed in the order onnxruntime's MLAS sums it (sgemm.cpp and the x86-64
SgemmKernel*.S kernels), so that the probabilities agree to ~4e-6 rather than ~3e-5: at a few
chunks the network is that sensitive to float32 rounding in the encoder. The STFT and encoders 0
and 1 (several output frames) are im2col + SGEMM: one multiply-add chain per output from zero over
(input channel, tap), the bias added after. Encoders 2 and 3 have one output frame, for which
MLAS takes its M=1 path: a dot product in 8 lanes by index mod 8, the lanes added as
((l0+l1)+l2)+l3 + ((l4+l5)+l6)+l7. The LSTM's gates are (x W_ih^T) + (h W_hh^T), each its own
chain (its prepacked weights take the SGEMM path), plus (b_ih + b_hh); the decoder's 1x1 conv
sums four products at a time. The chains run over the inputs in the outer loop and the outputs
in the inner one: contiguous, independent lanes that vectorise without reassociating any sum. So
the weights come in transposed, (in, tap, out) and (in, out), by nwhisper.vad.silero.
"""

import math

import numpy as np

from nwhisper.kernels._compile import kernel


@kernel
def silero_chunk(s, x, ctx, h, c, prob, basis, w0, b0, w1, b1, w2, b2, w3, b3,
                 wih, whh, bias, wout, bout, frame, spec, a0, a1, a2, a3, gates, lanes, phase,
                 n_chunks):
    """One chunk of stream s (phase 0): prob[s] = p(speech); ctx[s], h[s], c[s] carried to the
    next chunk. x: (S, 512) this chunk's samples; ctx: (S, 64) the previous chunk's last 64
    (zeros at reset); h, c: (S, 128) LSTM state; prob: (S,).

    A recording's consecutive chunks of one stream, in two launches (the same arithmetic):
    phase 1, item s = chunk s of x (N, 512) with ctx[s] the 64 samples before it: the encoder
    and the LSTM's product with its output, into gates[s, 0] (all chunks side by side); then
    phase 2, one item, s = 0: the LSTM through gates[0 .. n_chunks, 0] in order from state h[0],
    c[0], prob[t] for each chunk t.

    Weights: basis (256, 258) the STFT's rows transposed
    (129 Hann * cos, then 129 Hann * -sin); w0 (129, 3, 128), w1 (128, 3, 64), w2 (64, 3, 64),
    w3 (64, 3, 128) as (in, tap, out), biases b0..b3; wih, whh (128, 512) as (in, gate);
    bias (512,) = bias_ih + bias_hh; wout (128,); bout (1,). Scratch per stream (or chunk):
    frame (S, 640), spec (S, 4, 258), a0 (S, 4, 128), a1 (S, 2, 64), a2 (S, 64), a3 (S, 128),
    gates (S, 2, 512) (the products with x and with h), lanes (S, 8, 128). phase 0 (and
    n_chunks 1) for one chunk of each stream. All f32.
    """
    zero = np.float32(0.0)
    one = np.float32(1.0)
    if phase != 2:
        # the window: 64 samples of context, the chunk, then its end reflected (no edge repeat)
        for i in range(64):
            frame[s, i] = ctx[s, i]
        for i in range(512):
            frame[s, 64 + i] = x[s, i]
        for i in range(64):
            frame[s, 576 + i] = frame[s, 574 - i]
        for i in range(64):
            ctx[s, i] = x[s, 448 + i]
        # STFT: 4 frames of 256 samples, hop 128; spec[t, 0:129] real, spec[t, 129:258] imaginary
        for t in range(4):
            for k in range(258):
                spec[s, t, k] = zero
            for n in range(256):
                v = frame[s, t * 128 + n]
                for k in range(258):
                    spec[s, t, k] += basis[n, k] * v
            for k in range(129):
                re = spec[s, t, k]
                im = spec[s, t, 129 + k]
                spec[s, t, k] = math.sqrt(re * re + im * im)   # the magnitude, in place
        # encoder 0: 129 -> 128, stride 1, 4 frames (input: spec[:, 0:129])
        for t in range(4):
            for o in range(128):
                a0[s, t, o] = zero
            for i in range(129):
                for j in range(3):
                    ti = t + j - 1
                    if 0 <= ti < 4:
                        v = spec[s, ti, i]
                        for o in range(128):
                            a0[s, t, o] += w0[i, j, o] * v
            for o in range(128):
                v = a0[s, t, o] + b0[o]
                a0[s, t, o] = zero if v < zero else v
        # encoder 1: 128 -> 64, stride 2, 4 -> 2 frames
        for t in range(2):
            for o in range(64):
                a1[s, t, o] = zero
            for i in range(128):
                for j in range(3):
                    ti = 2 * t + j - 1
                    if 0 <= ti < 4:
                        v = a0[s, ti, i]
                        for o in range(64):
                            a1[s, t, o] += w1[i, j, o] * v
            for o in range(64):
                v = a1[s, t, o] + b1[o]
                a1[s, t, o] = zero if v < zero else v
        # encoder 2: 64 -> 64, stride 2, 2 -> 1 frame. One output frame: MLAS takes its M=1
        # path, a dot product per output over the im2col column (in, tap), summed in 8 lanes by
        # index mod 8 (multiply, then add), the lanes added as ((l0+l1)+l2)+l3 + ((l4+l5)+l6)+l7.
        for l in range(8):
            for o in range(64):
                lanes[s, l, o] = zero
        for i in range(64):
            for j in range(1, 3):                   # tap 0 sees frame -1: padding
                v = a1[s, j - 1, i]
                l = (3 * i + j) % 8
                for o in range(64):
                    lanes[s, l, o] += w2[i, j, o] * v
        for o in range(64):
            acc = ((((lanes[s, 0, o] + lanes[s, 1, o]) + lanes[s, 2, o]) + lanes[s, 3, o])
                   + (((lanes[s, 4, o] + lanes[s, 5, o]) + lanes[s, 6, o]) + lanes[s, 7, o]))
            acc += b2[o]
            a2[s, o] = zero if acc < zero else acc
        # encoder 3: 64 -> 128, stride 1, 1 frame (only the centre tap sees data), the same M=1 path
        for l in range(8):
            for o in range(128):
                lanes[s, l, o] = zero
        for i in range(64):
            v = a2[s, i]
            l = (3 * i + 1) % 8
            for o in range(128):
                lanes[s, l, o] += w3[i, 1, o] * v
        for o in range(128):
            acc = ((((lanes[s, 0, o] + lanes[s, 1, o]) + lanes[s, 2, o]) + lanes[s, 3, o])
                   + (((lanes[s, 4, o] + lanes[s, 5, o]) + lanes[s, 6, o]) + lanes[s, 7, o]))
            acc += b3[o]
            a3[s, o] = zero if acc < zero else acc
        # the LSTM's product with its input: no state in it, so beside the encoder
        for g in range(512):
            gates[s, 0, g] = zero
        for i in range(128):
            v = a3[s, i]
            for g in range(512):
                gates[s, 0, g] += wih[i, g] * v
        if phase == 1:
            return
    first = s if phase == 0 else 0
    for chunk in range(first, first + (1 if phase == 0 else n_chunks)):
        # LSTM cell, gates i, f, g, o: the input's product (gates[chunk, 0]) + the state's
        for g in range(512):
            gates[s, 1, g] = zero
        for i in range(128):
            u = h[s, i]
            for g in range(512):
                gates[s, 1, g] += whh[i, g] * u
        for g in range(512):
            gates[chunk, 0, g] = gates[chunk, 0, g] + gates[s, 1, g] + bias[g]
        for i in range(128):
            ig = one / (one + math.exp(-gates[chunk, 0, i]))
            fg = one / (one + math.exp(-gates[chunk, 0, 128 + i]))
            gg = math.tanh(gates[chunk, 0, 256 + i])
            og = one / (one + math.exp(-gates[chunk, 0, 384 + i]))
            cn = fg * c[s, i] + ig * gg
            hn = og * math.tanh(cn)
            c[s, i] = cn
            h[s, i] = hn
        # the decoder's 1x1 conv, MLAS's M=1 kernel: four products at a time, added in order,
        # then added to the running sum
        out = zero
        for i in range(0, 128, 4):
            part = wout[i] * max(h[s, i], zero)
            for k in range(i + 1, i + 4):
                part += wout[k] * max(h[s, k], zero)
            out = part + out
        prob[chunk] = one / (one + math.exp(-(out + bout[0])))
