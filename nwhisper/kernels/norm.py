"""Layer normalisation (Whisper's: subtract the mean, divide by the deviation, scale AND shift).

Reference: torch.nn.LayerNorm as used by openai/whisper `model.py` (eps 1e-5, biased variance).
"""

import math

import numpy as np

from nwhisper.kernels._compile import kernel


@kernel
def layernorm_row(r, x, w, b, out, n, eps):
    """out[r] = (x[r] - mean) / sqrt(var + eps) * w + b.

    x, out: (rows, n) f32 (out may be x); w, b: (n,) f32; eps: f32. One work item per row.
    """
    fn = np.float32(n)
    mean = np.float32(0.0)
    for c in range(n):
        mean += x[r, c]
    mean /= fn
    var = np.float32(0.0)
    for c in range(n):
        d = x[r, c] - mean
        var += d * d
    inv = np.float32(1.0) / math.sqrt(var / fn + eps)
    for c in range(n):
        out[r, c] = (x[r, c] - mean) * inv * w[c] + b[c]


def layernorm(be, x, w, b, out, eps=1e-5):
    """out = LayerNorm(x) row by row; x, out: (n, d) f32; w, b: (d,) f32."""
    be.layernorm(x, w, b, out, np.float32(eps))
