"""nwhisper: Whisper speech recognition on single-source Numba kernels (CPU and CUDA)."""
