"""What the window loop transcribes: a recording's audio as pieces, each on a clock back to it.

    source = sources.of("talk.m4a")                      # the recording itself
    source = sources.of(samples, vad="silero")           # its speech joined (faster-whisper's vad_filter)
    source = sources.of(samples, batch_size=8)           # its speech in chunks of ≤ 30 s (batched mode)

A source is a list of Pieces and what the recording's TranscriptionInfo says about it (its
duration, and with a VAD the speech regions found). A Piece is audio the loop decodes on its own
time axis — samples in memory, or a Recording read in passes — and the Clock that maps its times
back to the recording's (None: they are the recording's already). A chunk is decoded as one
window; where its text ends early, the rest of its speech is decoded again (Piece.rest), in the
window of a later chunk with room for it (requeue) or in one of its own.
Nothing here decodes: transcribe.Transcriber reads the pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import mel as M
from .io.audio import Recording, load_audio
from .vad import regions

SR = M.SAMPLE_RATE
REST_S = 1.0   # s of a chunk's speech left after its last segment that is decoded again


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

    def place(self, segments):
        """Move segments (and their words) from the joined speech's clock to the recording's."""
        for s in segments:
            s.start, s.end = self.span(s.start, s.end)
            for w in s.words or []:
                w.start, w.end = self.span(w.start, w.end)
        return segments


@dataclass
class Piece:
    """Audio decoded on its own time axis: `samples` in memory, or `recording` (read in passes,
    never held whole) when samples is None. clock: to the recording's time (None: the same).
    spans: a chunk's speech regions in `full`, the recording's samples (so that its rest can be
    decoded again), in the recording's order."""

    samples: np.ndarray | None
    recording: Recording | None = None
    clock: Clock | None = None
    spans: list | None = None
    full: np.ndarray | None = None

    def rest(self, t):
        """The Piece of a chunk's speech after its time t, when the text ended more than REST_S
        before the speech did and more than REST_S of speech is left; else None."""
        if self.spans is None or len(self.samples) / SR - t <= REST_S:
            return None
        cut = int(round(self.clock(t) * SR))
        spans = [(max(a, cut), b) for a, b in self.spans if b > cut]
        if sum(b - a for a, b in spans) <= REST_S * SR:
            return None
        return chunk_piece(self.full, spans)

    def with_rest(self, rest):
        """This chunk and another chunk's rest as one chunk: the speech of both in one window."""
        return chunk_piece(self.full, sorted(self.spans + rest.spans))


def requeue(queue, rest, within):
    """Put a chunk's rest into the window of the first of the next `within` queued chunks with
    room for it (a window fewer to decode; its speech then starts that window), else at the
    queue's head as a window of its own."""
    for i in range(min(within, len(queue))):
        p = queue[i]
        if p.spans is not None and len(p.samples) + len(rest.samples) <= M.N_SAMPLES:
            queue[i] = p.with_rest(rest)
            return
    queue.appendleft(rest)


@dataclass
class Source:
    """A recording as the loop reads it. duration: the recording's seconds (None: found by the
    loop's first pass over a file); speech_regions [(start_s, end_s)] and duration_after_vad
    when a VAD chose the speech; chunked: each piece is one window of joined speech (batched)."""

    pieces: list
    duration: float | None = None
    speech_regions: list | None = None
    duration_after_vad: float | None = None
    chunked: bool = False


def of(audio, vad=False, batch_size=1, silero=None):
    """The Source for transcribe(audio, vad=…, batch_size=…): audio a path, bytes, a file object
    or 16 kHz mono float32 samples. vad: False/None (the whole recording), True or 'silero',
    'energy', a detector (chunk → p(speech), with reset()), or a function (samples, sr) →
    [(start, end)] in samples. batch_size > 1: Silero's speech in chunks. silero: Silero's
    chunk_probs of the samples when they are made already (the speakers' pass, shared)."""
    if batch_size > 1:
        return chunks(samples_of(audio), silero)
    if vad is not None and vad is not False:
        return speech(samples_of(audio), "silero" if vad is True else vad, silero)
    return whole(audio)


def whole(audio):
    """The recording itself: samples as given, a file read in passes."""
    if isinstance(audio, np.ndarray):
        x = audio.astype(np.float32, copy=False)
        return Source([Piece(x, Recording(x))], duration=len(x) / SR)
    return Source([Piece(None, Recording(audio))])


def speech(samples, vad="silero", silero=None):
    """Only the speech regions of `samples`, joined end to end (as faster-whisper's vad_filter):
    one piece, on a Clock back to the recording. Speech that straddles a 30 s window stays whole:
    the joined speech is transcribed as any recording is."""
    probs = silero if vad == "silero" else None
    if isinstance(vad, str):
        vad = regions.detector(vad)
    if callable(vad) and hasattr(vad, "reset"):
        opts = regions.options_for(vad)
        found = regions.speech_regions(samples, vad, opts, SR, probs)
    elif callable(vad):
        opts, found = regions.SILERO, vad(samples, SR)
    else:
        raise ValueError(f"vad must be 'silero', 'energy', a detector or a regions function, not {vad!r}")
    pieces = []
    if found:
        joined = np.concatenate([samples[a:b] for a, b in found])
        pieces = [Piece(joined, Recording(joined), Clock(found, SR, opts.speech_pad_ms / 1000))]
    return Source(pieces, duration=len(samples) / SR, speech_regions=_seconds(found),
                  duration_after_vad=sum(b - a for a, b in found) / SR)


def chunks(samples, silero=None):
    """faster-whisper's batched mode: Silero's speech packed into chunks of ≤ 30 s
    (regions.speech_chunks), each chunk's regions joined as one window."""
    found = regions.speech_chunks(samples, regions.detector("silero"), probs=silero)
    spans = [r for c in found for r in c]
    return Source([chunk_piece(samples, c) for c in found],
                  duration=len(samples) / SR, speech_regions=_seconds(spans),
                  duration_after_vad=sum(b - a for a, b in spans) / SR, chunked=True)


def chunk_piece(samples, spans):
    x = np.concatenate([samples[a:b] for a, b in spans])
    return Piece(x, None, Clock(spans, SR, regions.SILERO.speech_pad_ms / 1000), spans, samples)


def _seconds(spans):
    return [(round(a / SR, 3), round(b / SR, 3)) for a, b in spans]


def samples_of(audio):
    """16 kHz mono float32 samples of a path, bytes, a file object, or samples."""
    if isinstance(audio, np.ndarray):
        return audio.astype(np.float32, copy=False)
    return load_audio(audio)
