"""GELU, the exact one: x * Phi(x) = x / 2 * (1 + erf(x / sqrt(2))).

HF's ACT2FN["gelu"] and torch.nn.functional.gelu (approximate='none') are this function; the tanh
approximation differs by up to ~5e-4 and would bias every MLP slightly.

erf is evaluated as Eigen's and XLA's float32 erf (what jax.nn.gelu(approximate=False) runs on
XLA): an odd rational function of degree 13/12 on z clamped to [-4, 4], where erf(4) rounds to 1
in float32. Within 1e-6 of the true GELU relative to max(1, |x|) (tests/unit/test_kernels.py), and,
unlike math.erf (a libm call per element), it vectorises.
"""

import numpy as np

from nwhisper.kernels._compile import kernel


@kernel
def gelu_elem(i, x, out):
    """out[i] = x[i] / 2 * (1 + erf(x[i] / sqrt(2))); x, out: flat f32 (out may be x)."""
    v = x[i]
    z = v * np.float32(0.7071067811865476)     # clamped to [-4, 4] (_compile.py: no min/max)
    z = np.float32(-4.0) if z < np.float32(-4.0) else z
    z = np.float32(4.0) if z > np.float32(4.0) else z
    z2 = z * z
    p = np.float32(-2.72614225801306e-10)  # numerator: z * p(z^2)
    p = p * z2 + np.float32(2.77068142495902e-08)
    p = p * z2 + np.float32(-2.10102402082508e-06)
    p = p * z2 + np.float32(-5.69250639462346e-05)
    p = p * z2 + np.float32(-7.34990630326855e-04)
    p = p * z2 + np.float32(-2.95459980854025e-03)
    p = p * z2 + np.float32(-1.60960333262415e-02)
    q = np.float32(-1.45660718464996e-05)  # denominator: q(z^2)
    q = q * z2 + np.float32(-2.13374055278905e-04)
    q = q * z2 + np.float32(-1.68282697438203e-03)
    q = q * z2 + np.float32(-7.37332916720468e-03)
    q = q * z2 + np.float32(-1.42647390514189e-02)
    out[i] = np.float32(0.5) * v * (np.float32(1.0) + z * p / q)


def gelu(be, x, out):
    """out = gelu(x) elementwise; x, out: same-shape contiguous f32 (out may be x)."""
    be.launch(gelu_elem, x.size, be.flat(x), be.flat(out),
              work=x.size // 8)   # vectorised: serial is faster up to ~16 K elements (measured)
