"""CAM++ in plain NumPy, float64, read line by line off 3D-Speaker's speakerlab/models/campplus
(DTDNN.py, layers.py): channels first, one window, every batch norm applied where the model
applies it (nothing folded), from the checkpoint's own tensor names. The reference the kernels'
layout, folding and segment pooling are checked against where the trained weights are not
installed (tests/unit/test_speaker_weights.py)."""

import numpy as np

EPS = 1e-5
SEG_LEN = 100


def relu(x):
    return np.maximum(x, 0.0)


def bn(s, name, x, affine=True):
    """BatchNorm in inference over dim 0 of x."""
    shape = (-1,) + (1,) * (x.ndim - 1)
    y = (x - s[f"{name}.running_mean"].reshape(shape)) / np.sqrt(s[f"{name}.running_var"].reshape(shape) + EPS)
    if affine:
        y = y * s[f"{name}.weight"].reshape(shape) + s[f"{name}.bias"].reshape(shape)
    return y


def conv2d(x, w, stride_f):
    """nn.Conv2d(kernel k, stride (stride_f, 1), padding (k - 1) / 2, no bias): x (C, F, T)."""
    k = w.shape[2]
    p = (k - 1) // 2
    xp = np.pad(x, ((0, 0), (p, p), (p, p)))
    f_out = (x.shape[1] + 2 * p - k) // stride_f + 1
    t = x.shape[2]
    out = np.zeros((w.shape[0], f_out, t))
    for kf in range(k):
        for kt in range(k):
            out += np.einsum("oc,cft->oft", w[:, :, kf, kt],
                             xp[:, kf:kf + stride_f * (f_out - 1) + 1:stride_f, kt:kt + t])
    return out


def conv1d(x, w, bias=None, stride=1, padding=0, dilation=1):
    """nn.Conv1d: x (C, T), w (O, C, k)."""
    k = w.shape[2]
    xp = np.pad(x, ((0, 0), (padding, padding)))
    t_out = (x.shape[1] + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    out = sum(w[:, :, j] @ xp[:, j * dilation:j * dilation + stride * (t_out - 1) + 1:stride]
              for j in range(k))
    return out if bias is None else out + bias[:, None]


def embed(s, feats, dims):
    """CAMPPlus.forward of one window's features (T, F) -> (embedding_size,)."""
    s = {k: np.asarray(v, np.float64) for k, v in s.items()}
    x = feats.T[None].astype(np.float64)                                     # FCM: (1, F, T)
    out = relu(bn(s, "head.bn1", conv2d(x, s["head.conv1.weight"], 1)))
    for layer in (1, 2):
        for b in (0, 1):
            p = f"head.layer{layer}.{b}"
            stride = 2 if b == 0 else 1
            h = relu(bn(s, f"{p}.bn1", conv2d(out, s[f"{p}.conv1.weight"], stride)))
            h = bn(s, f"{p}.bn2", conv2d(h, s[f"{p}.conv2.weight"], 1))
            short = bn(s, f"{p}.shortcut.1", conv2d(out, s[f"{p}.shortcut.0.weight"], stride)) if b == 0 else out
            out = relu(h + short)
    out = relu(bn(s, "head.bn2", conv2d(out, s["head.conv2.weight"], 2)))
    x = out.reshape(-1, out.shape[2])                                        # (C·F, T)
    x = relu(bn(s, "xvector.tdnn.nonlinear.batchnorm",
                conv1d(x, s["xvector.tdnn.linear.weight"], stride=2, padding=2)))
    for i, (layers, k, dilation) in enumerate(dims.blocks, 1):
        for j in range(1, layers + 1):
            p = f"xvector.block{i}.tdnnd{j}"
            h = conv1d(relu(bn(s, f"{p}.nonlinear1.batchnorm", x)), s[f"{p}.linear1.weight"])
            h = relu(bn(s, f"{p}.nonlinear2.batchnorm", h))
            c = f"{p}.cam_layer"
            y = conv1d(h, s[f"{c}.linear_local.weight"], padding=(k - 1) // 2 * dilation, dilation=dilation)
            t = h.shape[1]
            seg = np.stack([h[:, a:a + SEG_LEN].mean(1) for a in range(0, t, SEG_LEN)], 1)
            context = h.mean(1, keepdims=True) + np.repeat(seg, SEG_LEN, axis=1)[:, :t]
            g = relu(conv1d(context, s[f"{c}.linear1.weight"], s[f"{c}.linear1.bias"]))
            m = 1.0 / (1.0 + np.exp(-conv1d(g, s[f"{c}.linear2.weight"], s[f"{c}.linear2.bias"])))
            x = np.concatenate([x, y * m], 0)
        x = conv1d(relu(bn(s, f"xvector.transit{i}.nonlinear.batchnorm", x)), s[f"xvector.transit{i}.linear.weight"])
    x = relu(bn(s, "xvector.out_nonlinear.batchnorm", x))
    stats = np.concatenate([x.mean(1), x.std(1, ddof=1)])
    return bn(s, "xvector.dense.nonlinear.batchnorm", s["xvector.dense.linear.weight"][:, :, 0] @ stats,
              affine=False)
