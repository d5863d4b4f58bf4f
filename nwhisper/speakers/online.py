"""Speakers of a live session, matched one utterance at a time.

    e = utterance_embedding(diarizer, samples)     # on the model's thread, with the final
    speakers = SessionSpeakers()
    k = speakers.who(e)                            # on the event loop, in utterance order: 0, 1 …

An utterance's embedding is the mean of its windows' (diarize.windows over the whole utterance,
unit length). A session keeps one centroid per speaker (the running mean of its utterances'
embeddings); an utterance joins the most similar one when the cosine reaches SAME, else it is a
new speaker. Matching happens at delivery, in order, so a speculative final that was thrown away
never moves a centroid.
"""

from __future__ import annotations

import numpy as np

from .diarize import MIN_REGION_S, windows

# An utterance joins a speaker at this cosine to its centroid. Short utterances are noisy: one
# speaker's 1–3 s utterances were seen at 0.40–0.92 to each other (the low end a 1961 broadcast),
# two people's at 0.08–0.21 (tests/end_to_end/test_speakers_outputs.py's voices).
SAME = 0.35


def utterance_embedding(diarizer, samples):
    """The unit-length mean embedding of an utterance's windows, or None when it is too short
    to place (under MIN_REGION_S seconds)."""
    spans = windows([(0, len(samples))])
    if not spans:
        return None
    e = diarizer.embed(np.asarray(samples, np.float32), spans).astype(np.float64)
    e /= np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    m = e.mean(axis=0)
    return m / max(np.linalg.norm(m), 1e-12)


class SessionSpeakers:
    def __init__(self):
        self._sums = []          # per speaker: the sum of its utterances' embeddings

    def who(self, embedding):
        """The speaker (0, 1 … by first appearance) of an utterance's embedding; None for none."""
        if embedding is None:
            return None
        if self._sums:
            c = np.stack(self._sums)
            sim = (c / np.linalg.norm(c, axis=1, keepdims=True)) @ embedding
            k = int(np.argmax(sim))
            if sim[k] >= SAME:
                self._sums[k] = self._sums[k] + embedding
                return k
        self._sums.append(np.array(embedding, np.float64))
        return len(self._sums) - 1
