"""Who spoke when in a recording, and which speaker said each segment and word.

    d = Diarizer(backend)                                   # CAM++ from the installed weights
    turns = d(samples, num_speakers=None)                   # [Turn(start, end, speaker)], seconds
    assign(segments, turns)                                 # segment.speaker, word.speaker

The speech (Silero, with the silero-vad package's own tight defaults: 250 ms of speech, a
100 ms silence ends a region, 30 ms of padding) is cut into 1.5 s windows side by side (a region
shorter than a window is one window of its own length, down to MIN_REGION_S); each window gets a
CAM++ embedding and the embeddings are clustered (cluster.py). Where two neighbouring windows
of a region are given different speakers, one more window, straddling their boundary, is
embedded and given the speaker whose centroid it is nearest (refine): the change is placed to
half a window, as with windows every 0.75 s, for the price of one window per change instead of
twice the windows. Each window speaks for its span up to the middle of its overlap with the
next one; touching pieces of one speaker are one turn.
Speakers are numbered by first appearance and named as pyannote names them (SPEAKER_00 …).

A segment (or word) gets the speaker whose turns it overlaps longest; one that overlaps none
(between turns) gets the nearest turn's speaker, so every segment and word has one once any
speech was found.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..vad.regions import VadOptions, speech_regions
from ..vad.silero import Silero
from .cluster import cluster, nearest

SAMPLE_RATE = 16000
WINDOW_S = 1.5               # CAM++'s training segments: its embeddings are steadiest at this length
STEP_S = 1.5                 # side by side: every second of speech embedded once (refine() adds the
                             # straddling windows where the speaker changes)
MIN_REGION_S = 0.25          # a shorter region is too little voice to place
REGIONS = VadOptions(min_speech_ms=250, min_silence_ms=100, speech_pad_ms=30)


@dataclass(frozen=True)
class Turn:
    start: float
    end: float
    speaker: int

    @property
    def name(self):
        return speaker_name(self.speaker)


def speaker_name(k):
    return f"SPEAKER_{k:02d}"


class Diarizer:
    """The speaker network on a backend, and the steps around it."""

    def __init__(self, be=None, weights_path=None, download=False, compute_type="float32"):
        """download: fetch the weights when they are nowhere here (fetch.py), saying so;
        compute_type: the transcription model's, for the network's products (CAMPPlus)."""
        from .campplus import CAMPPlus
        from .fetch import find

        self.net = CAMPPlus(be, find(weights_path, download), compute_type=compute_type)
        self.vad = Silero(self.net.be)   # kept: its buffers for a recording's chunks are made once

    def __call__(self, samples, num_speakers=None, min_speakers=None, max_speakers=None, regions=None):
        """samples: 16 kHz mono float32; regions: [(start, end)] in samples (default Silero's)."""
        samples = np.asarray(samples, np.float32)
        if regions is None:
            regions = speech_regions(samples, self.vad, opts=REGIONS)
        spans = windows(regions)
        if not spans:
            return []
        emb = self.embed(samples, spans)
        labels = cluster(emb, num_speakers, min_speakers, max_speakers)
        return turns(*self.refine(samples, spans, emb, labels))

    def refine(self, samples, spans, emb, labels):
        """spans and labels with a window straddling each change of speaker inside a region,
        labelled by the nearest centroid, in order."""
        extra = straddling(spans, labels)
        if not extra:
            return spans, labels
        extra_labels = nearest(self.embed(samples, extra), emb, labels)
        both = sorted(zip(list(spans) + extra, list(labels) + list(extra_labels)))
        return [s for s, _ in both], [k for _, k in both]

    def embed(self, samples, spans):
        """(len(spans), 192): the windows of one length in one call."""
        out = np.empty((len(spans), self.net.dims.embedding_size), np.float32)
        by_length = {}
        for i, (a, b) in enumerate(spans):
            by_length.setdefault(b - a, []).append(i)
        for n, idx in by_length.items():
            out[idx] = self.net.embed(np.stack([samples[spans[i][0]:spans[i][0] + n] for i in idx]))
        return out


def windows(regions, sr=SAMPLE_RATE):
    """[(start, end)] sample spans: WINDOW_S every STEP_S over each region, the last one ending
    at the region's end; a region shorter than a window is one span."""
    w, step, least = int(WINDOW_S * sr), int(STEP_S * sr), int(MIN_REGION_S * sr)
    out = []
    for a, b in regions:
        if b - a < least:
            continue
        if b - a <= w:
            out.append((a, b))
            continue
        starts = list(range(a, b - w + 1, step))
        if starts[-1] + w < b:
            starts.append(b - w)
        out += [(s, s + w) for s in starts]
    return out


def straddling(spans, labels):
    """[(start, end)]: a window centred on the boundary of each two touching windows (one
    region) that were given different speakers, as long as the shorter of the two."""
    out = []
    for (a, b), (c, d), k, j in zip(spans, spans[1:], labels, labels[1:]):
        if k != j and c <= b:
            w = min(b - a, d - c)
            mid = (b + c) // 2
            start = min(max(mid - w // 2, a), d - w)
            out.append((start, start + w))
    return out


def turns(spans, labels, sr=SAMPLE_RATE):
    """Each window speaks for its span, overlaps split halfway; touching pieces of one speaker
    join."""
    out = []
    for i, ((a, b), k) in enumerate(zip(spans, labels)):
        if i > 0 and spans[i - 1][1] > a:
            a = (a + spans[i - 1][1]) // 2
        if i + 1 < len(spans) and spans[i + 1][0] < b:
            b = (spans[i + 1][0] + b) // 2
        if out and out[-1][2] == k and out[-1][1] >= a:
            out[-1][1] = b
        else:
            out.append([a, b, int(k)])
    return [Turn(a / sr, b / sr, k) for a, b, k in out if b > a]


def speaker_of(start, end, turns_):
    """The speaker (int) whose turns [start, end] overlaps longest, else the nearest turn's;
    None when there are no turns."""
    if not turns_:
        return None
    overlap = {}
    for t in turns_:
        o = min(end, t.end) - max(start, t.start)
        if o > 0:
            overlap[t.speaker] = overlap.get(t.speaker, 0.0) + o
    if overlap:
        return max(overlap, key=lambda k: (overlap[k], -k))
    return min(turns_, key=lambda t: max(t.start - end, start - t.end)).speaker


def assign(segments, turns_):
    """Set .speaker on each segment and on each of its words (names, SPEAKER_00 …); yields the
    segments, so it can wrap the transcriber's iterator."""
    for s in segments:
        if turns_:
            s.speaker = speaker_name(speaker_of(s.start, s.end, turns_))
            for w in s.words or ():
                w.speaker = speaker_name(speaker_of(w.start, w.end, turns_))
        yield s
