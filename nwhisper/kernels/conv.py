"""The encoder's two Conv1d layers (kernel 3, padding 1; stride 1 then 2), as im2col + GEMM.

Time-major layout: x (T_in, C_in), out (T_out, C_out). Unrolling the input into columns makes
each convolution one GEMM, which the backend runs on BLAS (CPU) or its GEMM kernel (CUDA):

    cols[t, ci * 3 + k] = x[t * stride + k - 1, ci]   (0 outside the input)
    out = cols @ w.reshape(C_out, C_in * 3).T + b
"""

import numpy as np

from nwhisper.kernels._compile import kernel
from nwhisper.kernels.matmul import linear

KERNEL_SIZE = 3  # both Whisper convolutions; padding 1 keeps conv1 at T frames


@kernel
def im2col_elem(i, x, cols, t_in, c_in, stride):
    """cols[t, ci * 3 + k] = x[t * stride + k - 1, ci] or 0; x (t_in, c_in), cols (T_out, c_in * 3)."""
    width = c_in * 3
    t = i // width
    j = i - t * width
    ci = j // 3
    src = t * stride + (j - ci * 3) - 1
    if src >= 0 and src < t_in:
        cols[t, j] = x[src, ci]
    else:
        cols[t, j] = np.float32(0.0)


def im2col_numpy(x, cols, stride):
    """The CPU's im2col: three strided copies of the zero-padded input, one per tap, instead of
    one launch item per element (whose index arithmetic made it 6x slower); tested equal to
    im2col_elem."""
    t_out, c_in = cols.shape[0], x.shape[1]
    padded = np.zeros((x.shape[0] + 2, c_in), np.float32)
    padded[1:-1] = x
    taps = cols.reshape(t_out, c_in, KERNEL_SIZE)
    for k in range(KERNEL_SIZE):
        taps[:, :, k] = padded[k:k + stride * (t_out - 1) + 1:stride]


def out_len(t_in, stride):
    """T_out of a kernel-3, padding-1 convolution."""
    return (t_in + 2 - KERNEL_SIZE) // stride + 1


def conv1d(be, x, w, b, out, stride):
    """out = conv1d(x, w, b, stride, padding=1); x (T_in, C_in) f32, w (C_out, C_in, 3) f32/f16
    or the same prepared by be.weight, b (C_out,), out (T_out, C_out) f32."""
    t_in, c_in = x.shape
    c_out = w.shape[0]
    t_out = out_len(t_in, stride)
    if out.shape != (t_out, c_out):
        raise ValueError(f"conv1d: out is {out.shape}, expected {(t_out, c_out)}")
    cols = be.workspace((t_out, c_in * KERNEL_SIZE))
    if be.on_host:
        im2col_numpy(x, cols, stride)
    else:
        be.launch(im2col_elem, cols.size, x, cols, t_in, c_in, stride)
    linear(be, cols, be.weight(w.reshape(c_out, c_in * KERNEL_SIZE)), b, out)
