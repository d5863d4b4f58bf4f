"""The Python API, in the shape faster-whisper users know:

    import nwhisper
    model = nwhisper.load("tiny.en")                 # a name, or a path to any container
    segments, info = model.transcribe("clip.wav")
    print("".join(s.text for s in segments))

A loaded model is reusable: the weights are on the backend once, and every `transcribe` pays
only for its own audio (this is the seam the server stands on).
"""

from __future__ import annotations

import numpy as np

from . import backend as B
from .io.audio import load_audio
from .io.registry import DEFAULT_MODEL, load_checkpoint
from .model import Whisper
from .tokenizer import Tokenizer
from .transcribe import Transcriber


class WhisperModel:
    """A checkpoint loaded onto a backend, with its tokenizer."""

    def __init__(self, name_or_path=DEFAULT_MODEL, device="auto"):
        self.checkpoint = ck = load_checkpoint(name_or_path)
        self.backend = B.get(device)
        self.dims = ck.dims
        self.tokenizer = Tokenizer.from_checkpoint(ck)
        self.model = Whisper(ck, self.backend)
        self._transcriber = Transcriber(self.model, self.tokenizer, ck)

    def encode(self, audio):
        """Encoder states of the first 30 s of `audio` (path, bytes or 16 kHz samples),
        as a host (n_audio_ctx, n_audio_state) float32 array."""
        from . import mel as M

        samples = _samples(audio)[:M.N_SAMPLES]
        mel = M.log_mel(samples, self.dims.n_mels, 2 * self.dims.n_audio_ctx)
        return self.backend.download(self.model.encode(mel))

    def transcribe(self, audio, language=None, task="transcribe", max_tokens=224,
                   timestamps=False, condition_on_previous_text=True):
        """audio: a path, bytes, or 16 kHz mono float32 samples → ([Segment], TranscriptionInfo)."""
        if task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', not {task!r}")
        if task == "translate" and not self.dims.is_multilingual:
            raise ValueError("this model is English-only: it cannot translate")
        if language is not None:
            language = language.strip().lower()
            self.tokenizer.language_id(language)    # an unknown code is named in the error
        return self._transcriber.transcribe(_samples(audio), language=language, task=task,
                                            max_tokens=max_tokens, timestamps=timestamps,
                                            condition_on_previous_text=condition_on_previous_text)


def _samples(audio):
    if isinstance(audio, np.ndarray):
        return audio.astype(np.float32, copy=False)
    return load_audio(audio)


def load(name_or_path=DEFAULT_MODEL, device="auto"):
    return WhisperModel(name_or_path, device)
