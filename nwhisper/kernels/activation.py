"""GELU, the exact one: x * Phi(x) with the error function.

HF's ACT2FN["gelu"] and torch.nn.functional.gelu (approximate='none') are this function; the tanh
approximation differs by up to ~5e-4 and would bias every MLP slightly.
"""

import math

import numpy as np

from nwhisper.kernels._compile import kernel


@kernel
def gelu_elem(i, x, out):
    """out[i] = x[i] / 2 * (1 + erf(x[i] / sqrt(2))); x, out: flat f32 (out may be x)."""
    v = x[i]
    out[i] = np.float32(0.5) * v * (np.float32(1.0) + math.erf(v * np.float32(0.7071067811865476)))


def gelu(be, x, out):
    """out = gelu(x) elementwise; x, out: same-shape contiguous f32 (out may be x)."""
    be.launch(gelu_elem, x.size, x.reshape(-1), out.reshape(-1))
