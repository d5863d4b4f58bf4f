"""The speaker network's kernels (CAM++, nwhisper.speakers.campplus): Kaldi fbank frames, the
im2col unrolls of its 2-D and dilated 1-D convolutions, and the small per-row steps between its
GEMMs (ReLU, a batch norm kept as scale and shift, the context-aware mask, statistics pooling).

Layouts are channels-last, a batch of W windows stacked: the 2-D front end holds (W, T, F, C)
(time, frequency, channel), the 1-D layers (W, T, C), both seen as (rows, C) by the GEMMs
(kernels.matmul.linear) that do the convolutions' arithmetic after an im2col. One work item is
one row (a frame, an output position), so a launch covers every window at once.

Reference: 3D-Speaker's speakerlab/models/campplus (DTDNN.py, layers.py) and
torchaudio.compliance.kaldi.fbank, which Kaldi's compute-fbank-feats defines.
"""

import math

import numpy as np

from nwhisper.kernels._compile import kernel

# The fbank computes in float64, an exception to float32 in nwhisper's kernels as the log-mel is
# (kernels/spectral.py): a faint band's energy is a small remainder of a frame's large DFT terms,
# so float32 rounding, in sums ordered differently (the CPU's vectorised ones, a GPU's) or in a
# multiply-add fused on one side only, moved its log by up to 9e-6 between the two backends (the
# log turns a relative error into the features' absolute one). In float64 they agree to the
# float32 result's rounding.
FLOAT64_BODIES = ("fbank_frame", "center_columns")


@kernel
def fbank_frame(i, audio, out, window, cos_t, sin_t, filters, frame, power, n_frames, hop):
    """out[w, f, m] = log(max(Σ_k filters[m, k] · |DFT(x)[k]|², FLT_EPSILON)), w, f = divmod(i,
    n_frames): Kaldi's log mel energies of frame f of window w (no dither, no energy term), x the
    frame's samples audio[w, f·hop : f·hop + L] with its mean removed, pre-emphasised (0.97, the
    first sample against itself), times the Povey window, zero-padded to the DFT's length.

    audio (W, S) f32 in [-1, 1]; out (W, n_frames, n_mels) f32; window (L,) f32; cos_t, sin_t
    (n_freq, L) f32, the DFT's rows over the frame's L samples (the padding adds nothing);
    filters (n_mels, n_freq) f32; scratch frame (W·n_frames, L) f64, power (W·n_frames, n_freq)
    f64. Computed in float64 (FLOAT64_BODIES says why), rounded to float32 once, at the end.
    """
    w = i // n_frames
    f = i - w * n_frames
    n = frame.shape[1]
    base = f * hop
    total = 0.0
    for j in range(n):
        v = np.float64(audio[w, base + j])
        frame[i, j] = v
        total += v
    mean = total / n
    for j in range(n):
        frame[i, j] = frame[i, j] - mean
    # from the end, so that each sample is reduced by its predecessor's value before emphasis
    for j in range(n - 1, 0, -1):
        frame[i, j] = frame[i, j] - 0.97 * frame[i, j - 1]
    frame[i, 0] = frame[i, 0] - 0.97 * frame[i, 0]
    for j in range(n):
        frame[i, j] = frame[i, j] * window[j]
    for k in range(cos_t.shape[0]):
        re = 0.0
        im = 0.0
        for j in range(n):
            re += frame[i, j] * cos_t[k, j]
            im += frame[i, j] * sin_t[k, j]
        power[i, k] = re * re + im * im
    for m in range(filters.shape[0]):
        acc = 0.0
        for k in range(filters.shape[1]):
            acc += filters[m, k] * power[i, k]
        out[w, f, m] = np.float32(math.log(max(acc, 1.1920928955078125e-07)))


@kernel
def center_columns(i, x):
    """x[w, :, m] -= mean over frames of x[w, :, m], w, m = divmod(i, M): 3D-Speaker's
    per-window mean normalisation of its features. x (W, T, M) f32, in place; the mean summed in
    float64."""
    n_t = x.shape[1]
    w = i // x.shape[2]
    m = i - w * x.shape[2]
    acc = 0.0
    for t in range(n_t):
        acc += x[w, t, m]
    mean = np.float32(acc / n_t)
    for t in range(n_t):
        x[w, t, m] = x[w, t, m] - mean


@kernel
def im2col2d_row(r, x, cols, f_out, k, stride_f):
    """cols[r, (kt·k + kf)·C + c] = x[w, t + kt − p, fo·stride_f + kf − p, c] or 0 outside,
    (w, t, fo) the position r in (W, T, f_out) order, p = (k − 1) / 2: one output position of a
    k×k convolution, padding p, stride (stride_f, 1) over (frequency, time).

    x (W, T, F_in, C) f32; cols (W·T·f_out, k·k·C) f32; the weights it multiplies are
    (C_out, kt, kf, C), nwhisper.speakers.campplus puts them so.
    """
    n_t = x.shape[1]
    f_in = x.shape[2]
    n_c = x.shape[3]
    pad = (k - 1) // 2
    fo = r % f_out
    wt = r // f_out
    t = wt % n_t
    w = wt // n_t
    j = 0
    for kt in range(k):
        ti = t + kt - pad
        for kf in range(k):
            fi = fo * stride_f + kf - pad
            inside = ti >= 0 and ti < n_t and fi >= 0 and fi < f_in
            for c in range(n_c):
                cols[r, j] = x[w, ti, fi, c] if inside else np.float32(0.0)
                j += 1


@kernel
def im2col1d_row(r, x, cols, t_out, k, stride, dilation, pad):
    """cols[r, kk·C + c] = x[w, t·stride + kk·dilation − pad, c] or 0 outside, (w, t) =
    divmod(r, t_out): one output frame of a dilated Conv1d.

    x (W, T_in, C) f32; cols (W·t_out, k·C) f32; the weights it multiplies are (C_out, k, C).
    """
    t_in = x.shape[1]
    n_c = x.shape[2]
    w = r // t_out
    t = r - w * t_out
    for kk in range(k):
        ti = t * stride + kk * dilation - pad
        inside = ti >= 0 and ti < t_in
        for c in range(n_c):
            cols[r, kk * n_c + c] = x[w, ti, c] if inside else np.float32(0.0)


@kernel
def relu_elem(i, x):
    """x[i] = max(x[i], 0); flat f32, in place."""
    v = x[i]
    x[i] = np.float32(0.0) if v < np.float32(0.0) else v


@kernel
def add_relu_elem(i, a, b, out):
    """out[i] = max(a[i] + b[i], 0): a residual block's sum and its ReLU; flat f32 (out may be a)."""
    v = a[i] + b[i]
    out[i] = np.float32(0.0) if v < np.float32(0.0) else v


@kernel
def scale_shift_relu_row(r, x, scale, shift, out):
    """out[r, c] = max(x[r, c] · scale[c] + shift[c], 0) for c < N: a batch norm that follows a
    concatenation or precedes a convolution (so cannot be folded into one), then its ReLU.

    x (rows, C ≥ N) f32, its first N columns read (a dense block's growing concatenation);
    scale, shift (N,); out (rows, N) f32.
    """
    for c in range(out.shape[1]):
        v = x[r, c] * scale[c] + shift[c]
        out[r, c] = np.float32(0.0) if v < np.float32(0.0) else v


@kernel
def put_columns_row(r, src, dst, c0):
    """dst[r, c0 : c0 + N] = src[r]: a layer's output appended to its dense block's
    concatenation. src (rows, N), dst (rows, C) f32."""
    for c in range(src.shape[1]):
        dst[r, c0 + c] = src[r, c]


@kernel
def cam_gate_row(i, h, ctx, w1, b1, hidden, w2, b2, gate, seg_len):
    """gate[i] = sigmoid(w2 · relu(w1 · ctx[i] + b1) + b2), ctx[i] = mean over all frames of
    h[w] + mean over segment s's frames of h[w], w, s = divmod(i, S), S = ceil(T / seg_len):
    CAMLayer's context (its global mean plus its avg_pool1d(seg_len, ceil_mode) segment, the
    last segment the mean of the frames it has) and the two small layers that make it a gate,
    one item a (window, segment): a launch each cost more than their arithmetic. The context is
    summed frame by frame, along the row (vectorised).

    h (W, T, C) f32; ctx (W·S, C) and hidden (W·S, C/2) f32, scratch; w1 (C/2, C), b1 (C/2,),
    w2 (N, C/2), b2 (N,) f32; gate (W·S, N) f32.
    """
    n_t = h.shape[1]
    n_seg = (n_t + seg_len - 1) // seg_len
    w = i // n_seg
    s = i - w * n_seg
    t0 = s * seg_len
    t1 = min(t0 + seg_len, n_t)
    inv_all = np.float32(1.0) / np.float32(n_t)
    inv_seg = np.float32(1.0) / np.float32(t1 - t0)
    out = ctx[i]
    for c in range(out.shape[0]):
        out[c] = np.float32(0.0)
    for t in range(n_t):
        row = h[w, t]
        for c in range(out.shape[0]):
            out[c] += row[c]
    for c in range(out.shape[0]):
        out[c] *= inv_all
    for t in range(t0, t1):
        row = h[w, t]
        for c in range(out.shape[0]):
            out[c] += row[c] * inv_seg
    mid = hidden[i]
    for o in range(mid.shape[0]):
        acc = b1[o]
        for c in range(out.shape[0]):
            acc += w1[o, c] * out[c]
        mid[o] = max(acc, np.float32(0.0))
    for o in range(gate.shape[1]):
        acc = b2[o]
        for c in range(mid.shape[0]):
            acc += w2[o, c] * mid[c]
        gate[i, o] = np.float32(1.0) / (np.float32(1.0) + math.exp(-acc))


@kernel
def cam_mask_row(r, y, g, dst, c0, n_t, seg_len):
    """dst[r, c0 + c] = y[r, c] · g[w·S + t // seg_len, c], (w, t) = divmod(r, n_t): the local
    convolution's output masked by its segment's context gate, appended to the dense block's
    concatenation.

    y (W·n_t, N) f32; g (W·S, N) f32 the gates (cam_gate_row's); dst (W·n_t, C) f32.
    """
    n_seg = (n_t + seg_len - 1) // seg_len
    w = r // n_t
    t = r - w * n_t
    gate = g[w * n_seg + t // seg_len]
    for c in range(y.shape[1]):
        dst[r, c0 + c] = y[r, c] * gate[c]


@kernel
def stats_pool_elem(i, x, out):
    """out[w, c] = mean_t x[w, t, c], out[w, C + c] = its standard deviation (unbiased, over T − 1),
    w, c = divmod(i, C): statistics pooling. x (W, T ≥ 2, C) f32; out (W, 2C) f32."""
    n_t = x.shape[1]
    n_c = x.shape[2]
    w = i // n_c
    c = i - w * n_c
    acc = np.float32(0.0)
    for t in range(n_t):
        acc += x[w, t, c]
    mean = acc / np.float32(n_t)
    sq = np.float32(0.0)
    for t in range(n_t):
        d = x[w, t, c] - mean
        sq += d * d
    out[w, c] = mean
    out[w, n_c + c] = math.sqrt(sq / np.float32(n_t - 1))
