"""nwhisper: Whisper speech recognition on single-source Numba kernels (CPU and CUDA).

    import nwhisper
    model = nwhisper.load("tiny.en")
    segments, info = model.transcribe("clip.wav")
"""

import os

# OpenBLAS's workers spin for ~2^28 cycles after each GEMM, waiting for the next one; on a 2-core
# machine that spinner takes half of every Numba parallel launch that follows (the encoder
# alternates GEMMs with them), so they spin 2^4 cycles before sleeping (bench/RESULTS.md has the
# gain). Where the CPU backend finds NumPy's own OpenBLAS it runs it in one
# thread, inside Numba's (kernels/blas.py), and this no longer matters; it does for an OpenBLAS
# it cannot call that way. OpenBLAS reads this when it loads, so it only takes effect when NumPy
# is first imported after nwhisper — as in the `nwhisper` command; a user's setting wins.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from . import kernel_cache  # noqa: E402,F401  (before any module defines a cached kernel)
from .records import Segment, TranscribeOptions, TranscriptionInfo, Word  # noqa: E402

__all__ = ["load", "WhisperModel", "Segment", "Word", "TranscriptionInfo", "TranscribeOptions"]


def __getattr__(name):
    """load and WhisperModel, imported on first use: the model and its kernels are not what a
    command's --help or a server's parsers need; __version__, the installed package's."""
    if name in ("load", "WhisperModel"):
        from . import api
        return getattr(api, name)
    if name == "__version__":
        import importlib.metadata
        try:
            return importlib.metadata.version("nwhisper")
        except importlib.metadata.PackageNotFoundError:
            return "unknown"
    raise AttributeError(f"module 'nwhisper' has no attribute {name!r}")
