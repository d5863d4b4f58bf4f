"""Transcribing only the speech of a recording, its times on the recording's clock.

transcribe_speech (vad): the speech regions joined end to end and transcribed as one recording
(faster-whisper's vad_filter). Clock maps times in joined speech back to the recording; the
batched mode's chunks (transcribe.Transcriber._batched) use it too, and speech_after.
"""

from __future__ import annotations

import numpy as np

from . import mel as M
from .records import TranscriptionInfo
from .vad import regions


class Clock:
    """Maps times in the concatenated speech back to the recording: chunk k of the speech
    starts at `joined[k]` seconds there and at `orig[k]` seconds in the recording. `pad_s`:
    the context the regions were padded with on each side."""

    def __init__(self, spans, sr, pad_s):
        self.orig = np.array([a / sr for a, _ in spans])
        lengths = np.array([(b - a) / sr for a, b in spans])
        self.joined = np.concatenate([[0.0], np.cumsum(lengths)[:-1]]) if len(spans) else np.zeros(0)
        self.lengths = lengths
        self.min_overlap = 2 * pad_s + 0.2

    def span(self, a, b):
        """[a, b] of the joined speech on the recording's clock. A piece that only grazes a
        region (a timestamp a little before a junction) is not stretched over the silence
        between: the span is cut to the regions it covers by ≥ min_overlap s (more than the
        padding on both sides of a junction), or to the one it covers most."""
        ends = self.joined + self.lengths
        over = np.minimum(b, ends) - np.maximum(a, self.joined)
        keep = np.nonzero(over >= min(self.min_overlap, max(over.max(), 0.0)))[0]
        if len(keep) == 0:
            return self(a), self(b, end=True)
        k0, k1 = int(keep[0]), int(keep[-1])
        a = min(max(a, self.joined[k0]), ends[k0])
        b = max(min(b, ends[k1]), self.joined[k1])
        return self(a), self(b, end=True)

    def __call__(self, t, end=False):
        # an end time exactly at a junction belongs to the region before it
        k = np.searchsorted(self.joined, t, side="left" if end else "right") - 1
        k = int(min(max(k, 0), len(self.joined) - 1))
        return round(float(self.orig[k] + min(t - self.joined[k], self.lengths[k])), 3)


def transcribe_speech(tr, samples, opts, vad="silero", progress=None, on_segments=None, cancelled=None):
    """Transcribe only the speech regions of `samples`, joined end to end (as faster-whisper's
    vad_filter does); segment and word times mapped back to the recording's clock. Speech that
    straddles a 30 s window boundary stays whole: windows advance by the last complete
    timestamp, as without VAD.
    vad: 'silero' (faster-whisper's vad_filter options) or 'energy' (nwhisper.vad.regions),
    a detector (chunk → p(speech), with reset()), or a function (samples, sr) → [(start, end)]."""
    sr = M.SAMPLE_RATE
    if isinstance(vad, str):
        vad = regions.detector(vad)
    if callable(vad) and hasattr(vad, "reset"):
        opts_vad = regions.options_for(vad)
        found = regions.speech_regions(samples, vad, opts_vad, sr)
    elif callable(vad):
        opts_vad, found = regions.SILERO, vad(samples, sr)
    else:
        raise ValueError(f"vad must be 'silero', 'energy', a detector or a regions function, not {vad!r}")
    duration = len(samples) / sr
    if not found:
        info = TranscriptionInfo(opts.language or "en", 1.0, duration)
        info.duration_after_vad, info.speech_regions = 0.0, []
        return iter(()), info
    joined = np.concatenate([samples[a:b] for a, b in found])
    clock = Clock(found, sr, opts_vad.speech_pad_ms / 1000)
    segs, info = tr.transcribe(joined, opts, progress=progress, on_segments=on_segments, cancelled=cancelled)
    info.duration, info.duration_after_vad = duration, len(joined) / sr
    info.speech_regions = [(round(a / sr, 3), round(b / sr, 3)) for a, b in found]
    return on_recording_clock(segs, clock), info


def on_recording_clock(segments, clock):
    for s in segments:
        s.start, s.end = clock.span(s.start, s.end)
        for w in s.words or []:
            w.start, w.end = clock.span(w.start, w.end)
        yield s


def speech_after(spans, clock, t, sr=M.SAMPLE_RATE):
    """The regions [(start, end)] (recording samples) of joined speech `spans` from its time t
    on (clock: their Clock): the rest of a chunk that a window left undecoded."""
    cut = int(round(clock(t) * sr))
    return [(max(a, cut), b) for a, b in spans if b > cut]
