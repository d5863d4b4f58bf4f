"""The dispatch object that model code and kernels talk to: arrays, transfers, prepared weights,
kernel launches, a backend's own fast paths and the replay of a decoder step.

    be = backend.get("auto")                  # CpuBackend or CudaBackend
    x = be.empty((1500, d), np.float32)
    be.launch(layernorm_row, rows, x, w, b, y, d, np.float32(1e-5))   # one body, either target
    linear(be, y, be.weight(W), bias, out)    # kernels.matmul: out = y @ W.T + bias

base.py  Backend: the protocol, grouped (memory, weights, launch, fast paths, replay), each member
         with its contract; the shared mechanisms (launcher lookup, scratch buffers, the replay's
         bookkeeping in a StepRecording) and the portable defaults of the fast paths
cpu.py   CpuBackend: NumPy arrays, Numba parallel loops, BLAS from Numba's own threads
cuda.py  CudaBackend: numba.cuda device arrays, CUDA grids and their fast paths; whether CUDA
         can run here (cuda_unusable)
"""

from nwhisper.backend.base import Backend, StepRecording
from nwhisper.backend.cpu import CpuBackend
from nwhisper.backend.cuda import CudaBackend, cuda_unusable

__all__ = ["Backend", "StepRecording", "CpuBackend", "CudaBackend", "cuda_unusable", "get"]


def get(kind="auto"):
    """A backend: 'cpu', 'cuda' (RuntimeError saying why when unusable), or 'auto' (CUDA if usable)."""
    if kind == "cpu":
        return CpuBackend()
    if kind not in ("auto", "cuda"):
        raise ValueError(f"unknown backend {kind!r}: expected 'auto', 'cpu' or 'cuda'")
    why = cuda_unusable()
    if why is None:
        return CudaBackend()
    if kind == "cuda":
        raise RuntimeError(f"the CUDA backend cannot run: {why}")
    return CpuBackend()
