"""The pure logic of the pipeline, by itself: DTW's path (against every monotone path of small
matrices, enumerated), punctuation merging (openai-whisper's rule, on the cases its tests name),
the VAD clock that maps joined speech back to the recording, and the marks of made-up words."""

import types

import numpy as np
import pytest

from nwhisper import timing
from nwhisper.records import TranscribeOptions, Word
from nwhisper.sources import Clock
from nwhisper.hallucination import is_anomaly, word_anomaly


def monotone_paths(n, m):
    """Every path from (0, 0) to (n-1, m-1) by steps (1, 0), (0, 1), (1, 1)."""
    def walk(i, j):
        if (i, j) == (n - 1, m - 1):
            yield [(i, j)]
            return
        for di, dj in ((1, 1), (1, 0), (0, 1)):
            if i + di < n and j + dj < m:
                for rest in walk(i + di, j + dj):
                    yield [(i, j)] + rest
    return list(walk(0, 0))


@pytest.mark.parametrize("shape", [(1, 1), (2, 3), (3, 3), (3, 5), (4, 4)])
def test_dtw_path_is_a_cheapest_monotone_path(shape):
    rng = np.random.default_rng(sum(shape))
    for _ in range(20):
        x = rng.standard_normal(shape).astype(np.float32)
        path = timing.dtw(x)
        steps = list(zip(path[0].tolist(), path[1].tolist()))
        assert steps[0] == (0, 0) and steps[-1] == (shape[0] - 1, shape[1] - 1)
        assert all((b[0] - a[0], b[1] - a[1]) in ((1, 1), (1, 0), (0, 1)) for a, b in zip(steps, steps[1:]))
        best = min(sum(float(x[i, j]) for i, j in p) for p in monotone_paths(*shape))
        assert sum(float(x[i, j]) for i, j in steps) == pytest.approx(best, abs=1e-5)


def _aligned(words):
    return [types.SimpleNamespace(word=w, tokens=[k]) for k, w in enumerate(words)]


@pytest.mark.parametrize("words,want", [
    ([" Hello", ",", " world", "."], [" Hello,", " world."]),          # appended marks join the word before
    ([" He", " said", ' "', "yes", '"', "."], [" He", " said", ' "yes".']),   # a prepended quote, the one after
    ([" ¿", "Qué", "?"], [" ¿Qué?"]),
    ([" a ", "."], [" a ", "."]),                                        # not after a word that ends in a space
])
def test_punctuation_merges_into_its_word(words, want):
    alignment = _aligned(words)
    timing.merge_punctuations(alignment, TranscribeOptions.prepend_punctuations,
                              TranscribeOptions.append_punctuations)
    assert [a.word for a in alignment if a.word] == want
    assert sorted(t for a in alignment for t in a.tokens) == list(range(len(words)))   # no token lost


def test_the_vad_clock_maps_joined_speech_back_to_the_recording():
    sr = 16000
    spans = [(2 * sr, 5 * sr), (10 * sr, 12 * sr), (20 * sr, 21 * sr)]    # 3 s, 2 s, 1 s of speech
    clock = Clock(spans, sr, pad_s=0.0)
    assert clock(0.0) == 2.0 and clock(1.5) == 3.5 and clock(3.5) == 10.5 and clock(5.25) == 20.25
    assert clock(3.0) == 10.0 and clock(3.0, end=True) == 5.0          # a junction: the end belongs before
    # a span that only grazes the next region (< 0.2 s of it) is not stretched over the silence
    assert clock.span(1.0, 3.1) == (3.0, 5.0)
    # one that covers both regions spans the recording between them
    assert clock.span(2.0, 4.5) == (4.0, 11.5)


def test_made_up_words_are_marked_as_openai_marks_them():
    def w(start, end, p):
        return Word(start, end, " word", p)
    assert word_anomaly(w(0.0, 0.5, 0.9)) == 0.0
    assert word_anomaly(w(0.0, 0.5, 0.1)) == 1.0                      # improbable
    assert word_anomaly(w(0.0, 0.033, 0.9)) == pytest.approx(1.5)     # far too short: (0.133 - 0.033) · 15
    assert word_anomaly(w(0.0, 3.0, 0.9)) == pytest.approx(1.0)       # too long: 3 - 2
    seg = types.SimpleNamespace(words=[w(0, 0.05, 0.1), w(0.05, 0.1, 0.1), w(0.1, 0.2, 0.9)])
    assert is_anomaly(seg)                                              # score ≥ 3
    seg = types.SimpleNamespace(words=[w(0, 0.5, 0.9), w(0.5, 1.0, 0.9), w(1.0, 1.4, 0.1)])
    assert not is_anomaly(seg)
    assert not is_anomaly(None) and not is_anomaly(types.SimpleNamespace(words=[]))
