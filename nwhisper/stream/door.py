"""The live stream's one door to the model, and the jobs it passes through it.

A stream never holds the model: it hands jobs to whoever does (the server's ModelHost) and
awaits their futures on the event loop.

    future = door.submit(final_job(audio, options), FINAL)   # fn(model) on the model's thread
    door.abandon(future)          # the client went: drop it if it has not started
    door.utterance_s              # how long a short utterance takes (None: not known yet)

Jobs run one at a time in (priority, arrival) order: FINAL before DRAFT, so a stream's drafts
give way to anyone's final. A job dropped before it ran fails with Abandoned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from ..records import Cancelled

FINAL, DRAFT = 0, 1          # job priorities: lower runs first


class Abandoned(Exception):
    """The job's client went away before the job ran."""


class Door(Protocol):
    utterance_s: float | None

    def submit(self, fn, priority=FINAL):
        """Queue fn(model); returns an asyncio Future of its result."""

    def abandon(self, future):
        """Drop the job of `future` if it has not started (its future fails with Abandoned)."""


def final_job(audio, options, cancelled=None, embed=False):
    """A FINAL job: transcribe `audio` (16 kHz) with `options` (TranscribeOptions); the result
    is a Heard, or None when `cancelled()` said so (checked between the encoder's layers, after
    them and before each decoder step). embed: also the speaker embedding of the utterance (speakers/online.py)."""
    def run(model):             # on the model's thread
        t = time.perf_counter()
        try:
            segments, info = model.transcribe(audio, options, cancelled=cancelled)
            segments = list(segments)
        except Cancelled:
            return None
        words = [(w.start, w.end, w.word, w.probability) for s in segments for w in s.words or ()]
        embedding = None
        if embed and text_of(segments).strip():
            from ..speakers.online import utterance_embedding
            embedding = utterance_embedding(model.diarizer(), audio)
        return Heard(text_of(segments), time.perf_counter() - t, info.language, words,
                     mean_logprob(segments), embedding)
    return run


@dataclass(frozen=True)
class Heard:
    """What a job made of its audio."""

    text: str
    seconds: float               # how long it took
    language: str
    words: list                  # [(start, end, word, probability)] in the audio's own time,
                                 # with word timestamps asked for; else empty
    logprob: float               # the segments' mean avg_logprob (a confidence: exp of it)
    embedding: object = None     # with embed: the utterance's speaker embedding (or None)


def mean_logprob(segments):
    return sum(s.avg_logprob for s in segments) / len(segments) if segments else 0.0


def text_of(segments):
    return "".join(s.text for s in segments)


def seen(future):
    """Mark a job's outcome as looked at (asyncio logs an exception nobody retrieved)."""
    if not future.cancelled():
        future.exception()
