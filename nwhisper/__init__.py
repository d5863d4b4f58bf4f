"""nwhisper: Whisper speech recognition on single-source Numba kernels (CPU and CUDA).

    import nwhisper
    model = nwhisper.load("tiny.en")
    segments, info = model.transcribe("clip.wav")
"""

from .api import WhisperModel, load
from .transcribe import Segment, TranscriptionInfo

__all__ = ["load", "WhisperModel", "Segment", "TranscriptionInfo"]
