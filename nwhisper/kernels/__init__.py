"""nwhisper's kernels: one Python body per kernel, compiled for the CPU and for CUDA.

The model calls the ops below; each launches bodies on a backend from `nwhisper.backend` (its
protocol: backend/base.py) or chooses one of its variants, once, by `variant()` (matmul, attention). Shapes are in each op's docstring; activations are float32.

    norm.py         layernorm                  activation.py   gelu (erf form)
    reduce.py       exp_rows                   elementwise.py  add, kv_write, add_rows,
    pick.py         pick (greedy's token)                      embed, embed_at, kv_append
    conv.py         conv1d (im2col + GEMM)     attention.py    attention (returns the weights)
    matmul.py       linear, linear_add, logits (GEMM; int8 weights: Int8Weight)

A kernel body is a function decorated with `@kernel` in one of those modules (see _compile.py for
how it becomes a CPU and a CUDA launcher; `python -m nwhisper.kernels` rewrites the generated
_launch_cpu.py / _launch_cuda.py). Fast paths stand beside the portable bodies and are tested
against them: BLAS for GEMMs and attention on the CPU (matmul.variant, attention.variant), the
CPU's int8 and bfloat16 GEMMs (gemm_int8.py, gemm_bf16.py), register-tiled decoder products
(linear_tiles.py), blocked int8 and bfloat16 attention (attention_blocked.py) and fused float32
attention (attention_fused.py), the speaker network's convolutions a cache-sized tile at a time
(conv_tiles.py), and _cuda_fast.py's tiled GEMM, GEMV and block-per-row softmax on CUDA.

Bodies whose ops live with their network: vad_ops.py (nwhisper.vad.silero) and speaker_ops.py
(nwhisper.speakers: fbank and CAM++).

`from nwhisper.kernels import attention` gives the op, not the module: import other names from
`nwhisper.kernels.attention` directly.
"""

from nwhisper.kernels.activation import gelu
from nwhisper.kernels.attention import attention
from nwhisper.kernels.conv import conv1d
from nwhisper.kernels.elementwise import add, add_rows, embed, embed_at, kv_append, kv_write
from nwhisper.kernels.matmul import linear, linear_add, logits
from nwhisper.kernels.norm import layernorm
from nwhisper.kernels.pick import pick
from nwhisper.kernels.reduce import exp_rows

__all__ = ["add", "add_rows", "attention", "conv1d", "embed", "embed_at", "exp_rows", "gelu",
           "kv_append", "kv_write", "layernorm", "linear", "linear_add", "logits", "pick"]
