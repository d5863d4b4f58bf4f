"""The records of a transcription, and the options that shape it — below every stage, so the
window loop (transcribe.py), word timing (timing.py), the API and the writers share them.

    TranscribeOptions(language="en", beam_size=5)    # every option's one default; checked here
    Segment(id, seek, start, end, text, tokens, avg_logprob, no_speech_prob, …, words)
    Word(start, end, word, probability)
    TranscriptionInfo(language, language_probability, duration, …)

Segment, Word and TranscriptionInfo are faster-whisper's records, field for field where it has
them.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

# load(compute_type=): HF's arithmetic, CTranslate2's int8, or float32's with bfloat16 products
COMPUTE_TYPES = ("float32", "int8", "bfloat16")


@dataclass
class Segment:
    """One piece of the transcript (faster-whisper's record, field for field where it has one)."""

    id: int
    seek: int                     # the window's start, in mel frames
    start: float                  # seconds on the recording's clock
    end: float
    text: str
    tokens: list
    avg_logprob: float
    no_speech_prob: float
    temperature: float = 0.0
    compression_ratio: float = 0.0
    words: list | None = None     # [Word] with word timestamps
    speaker: str | None = None    # with diarize: SPEAKER_00, SPEAKER_01 … (by first appearance)


@dataclass
class Word:
    start: float
    end: float
    word: str
    probability: float
    speaker: str | None = None


@dataclass(frozen=True)
class TranscribeOptions:
    """The window loop's policy: openai-whisper's transcribe() arguments and defaults, except
    the temperature — a single 0.0 (no fallback) unless the fallback ladder is asked for."""

    language: str | None = None
    task: str = "transcribe"
    max_tokens: int = 224
    timestamps: bool = False
    condition_on_previous_text: bool = True
    beam_size: int | None = None
    best_of: int | None = 5
    patience: float = 1.0
    temperature: tuple = (0.0,)                 # openai's fallback: FALLBACK_TEMPERATURES
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6     # None or ≥ 1: never skip a window
    word_timestamps: bool = False
    hallucination_silence_threshold: float | None = None   # s; with word timestamps (openai's)
    initial_prompt: str | None = None           # text given as the previous text of the first window
    hotwords: str | None = None                 # words to bias toward, before the previous text of
                                                # every window (faster-whisper's hotwords)
    audio_ctx: int | None = None                # encoder positions (whisper.cpp's audio_ctx):
                                                # None = the model's (30 s); fewer encode only
                                                # audio_ctx · 20 ms (short-form only)
    batch_size: int = 1                         # > 1: the speech cut into chunks of ≤ 30 s, that many
                                                # decoded at once (sources.chunks)
    diarize: bool = False                       # who spoke: each segment's (and word's) speaker
    num_speakers: int | None = None             # with diarize: how many (None: estimated ...
    min_speakers: int | None = None             # ... within these bounds)
    max_speakers: int | None = None
    prepend_punctuations: str = "\"'“¿([{-"
    append_punctuations: str = "\"'.。,，!！?？:：”)]}、"

    def __post_init__(self):
        """What can be checked without a model (the model checks the language and audio_ctx)."""
        t = self.temperature
        temps = tuple(float(x) for x in t) if isinstance(t, (tuple, list)) else (float(t),)
        object.__setattr__(self, "temperature", temps)
        if not temps or any(not x >= 0 for x in temps):
            raise ValueError(f"temperature must be ≥ 0 (a number or a sequence of them), not {t!r}")
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', not {self.task!r}")
        if not (isinstance(self.max_tokens, int) and self.max_tokens >= 1):
            raise ValueError(f"max_tokens must be a whole number ≥ 1, not {self.max_tokens!r}")
        if self.beam_size is not None and self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, not {self.beam_size}")
        if self.best_of is not None and self.best_of < 1:
            raise ValueError(f"best_of must be at least 1, not {self.best_of}")
        if not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            raise ValueError(f"batch_size must be a whole number ≥ 1, not {self.batch_size!r}")
        if self.batch_size > 1:
            if temps[0] != 0 or (self.beam_size or 1) > 1:
                raise ValueError("batch_size > 1 decodes greedily: the first temperature 0, no beam_size")
            if self.hallucination_silence_threshold is not None or self.audio_ctx is not None:
                raise ValueError("batch_size > 1 decodes each chunk as one window: no "
                                 "hallucination_silence_threshold, no audio_ctx")
        counts = {k: getattr(self, k) for k in ("num_speakers", "min_speakers", "max_speakers")}
        if any(v is not None for v in counts.values()) and not self.diarize:
            raise ValueError("num_speakers, min_speakers and max_speakers go with diarize=True")
        for k, v in counts.items():
            if v is not None and not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{k} must be a whole number ≥ 1, not {v!r}")
        if self.num_speakers is not None and (self.min_speakers or self.max_speakers):
            raise ValueError("give num_speakers, or min_speakers/max_speakers, not both")
        if self.min_speakers and self.max_speakers and self.min_speakers > self.max_speakers:
            raise ValueError(f"min_speakers ({self.min_speakers}) is more than max_speakers ({self.max_speakers})")
        if self.hotwords is not None and not isinstance(self.hotwords, str):
            raise ValueError(f"hotwords is a string of words, not {type(self.hotwords).__name__}")
        if self.hallucination_silence_threshold is not None:
            if not self.word_timestamps:
                raise ValueError("hallucination_silence_threshold works on word timings: it needs "
                                 "word_timestamps=True")
            if not self.hallucination_silence_threshold >= 0:
                raise ValueError(f"hallucination_silence_threshold must be ≥ 0 seconds, not "
                                 f"{self.hallucination_silence_threshold}")


FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


class Cancelled(Exception):
    """transcribe(cancelled=…) said stop: the result was no longer wanted."""


def stop_if(cancelled):
    """Raise Cancelled when `cancelled` (a callable or None) says so."""
    if cancelled is not None and cancelled():
        raise Cancelled()


@dataclass
class TranscriptionInfo:
    language: str
    language_probability: float
    duration: float               # seconds of audio
    all_language_probs: dict | None = None
    duration_after_vad: float | None = None
    speech_regions: list = field(default_factory=list)   # [(start_s, end_s)] with vad
    speaker_turns: list = field(default_factory=list)    # [(start_s, end_s, speaker)] with diarize


@dataclass
class DecodingResult:
    """One window's decoding: its tokens and the numbers the fallback and the no-speech skip read."""

    tokens: list                        # sampled tokens, without the prompt and without EOT
    sum_logprob: float = 0.0
    no_speech_prob: float = float("nan")
    language: str | None = None
    prompt: list = field(default_factory=list)
    temperature: float = 0.0
    text: str = ""

    @property
    def compression_ratio(self):
        return compression_ratio(self.text)

    @property
    def avg_logprob(self):
        # openai-whisper divides by len + 1: the end-of-text token's log-probability is included.
        return self.sum_logprob / (len(self.tokens) + 1)


def compression_ratio(text):
    """len(utf-8) / len(zlib(utf-8)) — openai-whisper's repetition signal (> 2.4: fall back)."""
    b = text.encode("utf-8")
    return len(b) / len(zlib.compress(b)) if b else 0.0
