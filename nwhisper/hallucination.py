"""openai-whisper's hallucination_silence_threshold: the rules (learnt from its transcribe.py) that
find text the model made up in a silence, on the word timings of one window, and where the next
window starts instead. Times are on the recording's clock; seeks are in mel frames.
"""

from __future__ import annotations

from .mel import FRAME_SECONDS, FRAMES_PER_SECOND
from .records import TranscribeOptions

PUNCTUATION = TranscribeOptions.prepend_punctuations + TranscribeOptions.append_punctuations


def last_word_end(segments):
    """The end of the last word of the window, or of its last segment if it has no words
    (openai's get_end); None for no segments."""
    ends = [w.end for s in segments for w in (s.words or [])]
    if ends:
        return ends[-1]
    return segments[-1].end if segments else None


def word_anomaly(w):
    """How unlike a spoken word `w` is: improbable (p < 0.15), far too short (< 0.133 s) or too
    long (> 2 s) — the marks of text the model made up."""
    score = 1.0 if w.probability < 0.15 else 0.0
    d = w.end - w.start
    if d < 0.133:
        score += (0.133 - d) * 15
    if d > 2.0:
        score += d - 2.0
    return score


def is_anomaly(seg):
    """A segment whose first 8 words (punctuation aside) are mostly anomalous: score ≥ 3, or
    about one per word. (A word counts as punctuation when it is a substring of PUNCTUATION:
    openai's test, kept as it is.)"""
    if seg is None or not seg.words:
        return False
    words = [w for w in seg.words if w.word not in PUNCTUATION][:8]
    score = sum(word_anomaly(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def skip_hallucinations(segs, threshold, seek, size, n_frames, content, single_ending, next_seek, last_speech):
    """openai's hallucination_silence_threshold for one decoded window (segments with words):
    (next seek, segments to keep — None to drop the whole window).

    * After a window that ends in speech, the next starts at the last word when more than
      `threshold` s of the 30 s window follow it, else at the window's end.
    * A first segment that looks made up, after more than `threshold` s of silence: the window
      is dropped and decoding restarts at that segment (the silence before it is skipped).
    * Any segment that looks made up and has silence (> threshold, or the recording's or
      window's edge) or other made-up text on both sides: it and what follows are dropped, and
      the next window starts at it (at least 1 s on); if the recording ends within `threshold`
      after it, decoding stops."""
    offset = seek * FRAME_SECONDS
    window_end = (seek + n_frames) * FRAME_SECONDS
    if not single_ending:
        end = last_word_end(segs)
        if end is not None and end > offset:
            next_seek = round(end * FRAMES_PER_SECOND) if window_end - end > threshold else seek + size
    worded = [s for s in segs if s.words]
    if worded and is_anomaly(worded[0]):
        gap = worded[0].start - offset
        if gap > threshold:
            return seek + round(gap * FRAMES_PER_SECOND), None
    last_end = last_speech
    for i, s in enumerate(segs):
        if not s.words:
            continue
        if is_anomaly(s):
            following = next((t for t in segs[i + 1:] if t.words), None)
            next_start = following.words[0].start if following else offset + size * FRAME_SECONDS
            silence_before = s.start - last_end > threshold or s.start < threshold or s.start - offset < 2.0
            silence_after = (next_start - s.end > threshold or is_anomaly(following)
                             or window_end - s.end < 2.0)
            if silence_before and silence_after:
                next_seek = round(max(offset + 1, s.start) * FRAMES_PER_SECOND)
                if content * FRAME_SECONDS - s.end < threshold:
                    next_seek = content
                return next_seek, segs[:i]
        last_end = s.end
    return next_seek, segs
