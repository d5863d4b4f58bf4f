"""Where a whole recording holds speech: silero-vad's `get_speech_timestamps` rule over any detector.

    regions = speech_regions(samples)                       # Silero, faster-whisper's vad_filter
    regions = speech_regions(samples, Energy(), ENERGY)     # the energy detector, its own options

A detector (Silero or Energy: one 512-sample chunk at 16 kHz in, p(speech) out, state carried from
chunk to chunk; `run(chunks)`, where it has one, takes many at once) is run over the recording
from a reset state, the last chunk zero-padded. The
probabilities become [(start, end)] sample ranges by the rule of the silero-vad package (6.2.3,
utils_vad.get_speech_timestamps_from_probs; faster-whisper's vad.py has the same rule), learnt from
its source and checked against it on the same recording (tests/test_vad_transcribe.py):

  * hysteresis: speech starts at the first chunk with p ≥ threshold; once in speech, only a chunk
    below neg_threshold (default threshold − 0.15) counts as silence, and a chunk ≥ threshold
    forgets a silence that had begun;
  * a region ends where its silence began, once that silence has lasted min_silence_ms; a region
    of min_speech_ms or less is dropped; one still open at the end runs to the end;
  * speech_pad_ms is added on both sides, except between two regions closer than twice the pad,
    where the gap is split halfway between them.

Not implemented: silero's max_speech_duration_s (splitting long regions) — the regions here are
joined and transcribed window by window, so a region may be as long as it likes (faster-whisper's
vad_filter leaves it at infinity too).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

import numpy as np

SAMPLE_RATE = 16000
CHUNK = 512                   # samples per detector decision (32 ms), both detectors' unit
PAUSE_MS = 160                # speech_chunks cuts a region at a silence this long inside it
MIN_PART_S = 1.0              # ... leaving at least this much of it at the end of a chunk


@dataclass(frozen=True)
class VadOptions:
    """get_speech_timestamps' parameters; the defaults are faster-whisper's `vad_filter=True`
    (its VadOptions), not the silero-vad package's (min_speech 250 ms, min_silence 100 ms,
    pad 30 ms), because they are what skipping silence before Whisper is tuned for."""

    threshold: float = 0.5
    neg_threshold: float | None = None     # None: max(threshold − 0.15, 0.01)
    min_speech_ms: float = 0
    min_silence_ms: float = 2000
    speech_pad_ms: float = 400

    def __post_init__(self):
        if not 0 < self.threshold < 1:
            raise ValueError(f"VAD threshold must be in (0, 1), not {self.threshold}")
        for name in ("min_speech_ms", "min_silence_ms", "speech_pad_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"VAD {name} must be ≥ 0, not {getattr(self, name)}")


SILERO = VadOptions()
# The energy detector's p follows loudness, not voice: a shorter closing silence keeps its regions
# tight, and a 250 ms minimum drops the clicks and bumps it fires on.
ENERGY = VadOptions(min_speech_ms=250, min_silence_ms=1000)


def detector(name):
    """A fresh detector by name: 'silero' (Silero VAD on our kernels) or 'energy'."""
    if name == "silero":
        from .silero import Silero
        return Silero()
    if name == "energy":
        from .energy import Energy
        return Energy()
    raise ValueError(f"unknown VAD {name!r}: use 'silero' or 'energy'")


def options_for(det):
    """The VadOptions a detector's regions are cut with by default: ENERGY for the energy
    detector, SILERO for anything else."""
    return ENERGY if getattr(det, "name", None) == "energy" else SILERO


def chunk_probs(samples, det):
    """p(speech) of every 512-sample chunk of `samples` (the last one zero-padded), from a reset
    detector — as silero-vad's get_speech_timestamps feeds its model."""
    probs = ChunkProbs(det)
    probs.feed(samples)
    return probs.finish()


class ChunkProbs:
    """chunk_probs of samples that arrive in pieces: feed(piece) … finish() → the probabilities."""

    def __init__(self, det):
        self.det, self._rest, self._probs = det, np.zeros(0, np.float32), []
        det.reset()

    def feed(self, samples):
        x = np.concatenate([self._rest, np.asarray(samples, np.float32)])
        whole = len(x) - len(x) % CHUNK
        chunks = x[:whole].reshape(-1, CHUNK)
        run = getattr(self.det, "run", None)     # many chunks at once (Silero.run), where it can
        self._probs.extend(run(chunks) if run else map(self.det, chunks))
        self._rest = x[whole:]

    def finish(self):
        if len(self._rest):
            self.feed(np.zeros(CHUNK - len(self._rest), np.float32))
        return np.array(self._probs, np.float64)


def regions_from_probs(probs, n_samples, opts=SILERO, sr=SAMPLE_RATE):
    """[(start, end)] in samples from per-chunk probabilities, by the rule in the module's
    docstring (the sample arithmetic, int truncations included, is silero-vad's)."""
    neg = opts.neg_threshold if opts.neg_threshold is not None else max(opts.threshold - 0.15, 0.01)
    min_speech = sr * opts.min_speech_ms / 1000
    min_silence = sr * opts.min_silence_ms / 1000
    pad = sr * opts.speech_pad_ms / 1000
    speeches, start, silence_from = [], None, 0     # silence_from: 0 while no silence has begun
    for i, p in enumerate(probs):
        at = CHUNK * i
        if p >= opts.threshold:
            silence_from = 0
            if start is None:
                start = at
            continue
        if start is None or p >= neg:
            continue
        if not silence_from:
            silence_from = at
        if at - silence_from >= min_silence:
            if silence_from - start > min_speech:
                speeches.append([start, silence_from])
            start, silence_from = None, 0
    if start is not None and n_samples - start > min_speech:
        speeches.append([start, n_samples])

    for i, s in enumerate(speeches):
        if i == 0:
            s[0] = int(max(0, s[0] - pad))
        if i < len(speeches) - 1:
            nxt = speeches[i + 1]
            gap = nxt[0] - s[1]
            if gap < 2 * pad:
                s[1] += int(gap // 2)
                nxt[0] = int(max(0, nxt[0] - gap // 2))
            else:
                s[1] = int(min(n_samples, s[1] + pad))
                nxt[0] = int(max(0, nxt[0] - pad))
        else:
            s[1] = int(min(n_samples, s[1] + pad))
    return [(a, b) for a, b in speeches]


def speech_regions(samples, det=None, opts=None, sr=SAMPLE_RATE, probs=None):
    """[(start, end)] in samples where detector `det` (default Silero) hears speech in 16 kHz
    `samples`, under `opts` (default: SILERO for Silero, ENERGY for the energy detector).
    probs: `det`'s chunk_probs of `samples` when they are made already (a pass shared)."""
    if sr != SAMPLE_RATE:
        raise ValueError(f"speech_regions takes 16 kHz samples, not {sr} Hz")
    det = det if det is not None else detector("silero")
    opts = opts if opts is not None else options_for(det)
    probs = chunk_probs(samples, det) if probs is None else probs
    return regions_from_probs(probs, len(samples), opts, sr)


def speech_chunks(samples, det=None, opts=None, max_s=30.0, sr=SAMPLE_RATE, probs=None):
    """The speech of `samples` packed into chunks for windows decoded side by side (transcribe's
    batch_size, as faster-whisper's BatchedInferencePipeline packs them): each chunk a list of
    speech regions [(start, end)] in samples, in order, whose joined length is at most `max_s`.

    Each chunk is filled: regions go in whole while they fit, and the first that does not is cut
    at the last pause inside it (PAUSE_MS of silence, where faster-whisper's batched VAD ends its
    regions) that leaves a part of at least MIN_PART_S which fits; its remainder starts the next
    chunk. Whole regions keep their sentences together; the pauses fill the chunks as tightly as
    faster-whisper's short regions do (fewer windows to decode). A region longer than a chunk
    with no pause in it is cut at its least speech-like 512-sample chunk in the last third
    before the limit. probs: as speech_regions'."""
    det = det if det is not None else detector("silero")
    opts = opts if opts is not None else options_for(det)
    probs = chunk_probs(samples, det) if probs is None else probs
    limit = int(max_s * sr) // CHUNK * CHUNK
    pauses = regions_from_probs(probs, len(samples), replace(
        opts, min_speech_ms=0, min_silence_ms=PAUSE_MS, speech_pad_ms=0), sr)
    cuts = [(b + c) // 2 for (_, b), (c, _) in zip(pauses, pauses[1:])]
    least = int(MIN_PART_S * sr)
    chunks, room = [], 0
    for a, b in regions_from_probs(probs, len(samples), opts, sr):
        while b - a > room:
            i = bisect.bisect_right(cuts, a + room) - 1
            cut = cuts[i] if i >= 0 and cuts[i] >= a + least else None
            if cut is None and room == limit:       # no pause in a whole chunk's length
                lo, hi = (a + limit * 2 // 3) // CHUNK + 1, (a + limit) // CHUNK
                cut = CHUNK * (lo + int(np.argmin(probs[lo:hi])))
            if cut is not None:
                chunks[-1].append((a, cut))
                a = cut
            chunks.append([])
            room = limit
        chunks[-1].append((a, b))
        room -= b - a
    return chunks
