"""nwhisper's kernels: one Python body per kernel, compiled for the CPU and for CUDA.

The model calls the ops below; each is a line or two over `be.launch` / `be.gemm` of a backend
from `nwhisper.backend`. Shapes are in each op's docstring; activations are float32.
"""

from nwhisper.kernels.activation import gelu
from nwhisper.kernels.attention import attention
from nwhisper.kernels.conv import conv1d
from nwhisper.kernels.elementwise import add, add_rows, embed, fill, kv_write, scale, to_f32
from nwhisper.kernels.matmul import linear, logits
from nwhisper.kernels.norm import layernorm
from nwhisper.kernels.reduce import argmax, softmax_rows

__all__ = ["add", "add_rows", "argmax", "attention", "conv1d", "embed", "fill", "gelu",
           "kv_write", "layernorm", "linear", "logits", "scale", "softmax_rows", "to_f32"]
