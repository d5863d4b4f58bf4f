"""Fixture clips as nwhisper reads them, loaded once per test session and checked against the
sha256 of the samples an oracle was given (the golden files store it)."""

import functools
import hashlib
import os

import numpy as np

from nwhisper.io.audio import load_audio

from paths import FIXTURES as FIX

MODELS = ["tiny.en", "base"]                               # the models the oracle tests run


def lang_arg(m, lang):
    """The language to pass model m for a clip in `lang`: None for an English-only model."""
    return lang if m.dims.is_multilingual else None


@functools.lru_cache(maxsize=None)
def _load(clip):
    return load_audio(os.path.join(FIX, clip))


def audio(clip, sha=None):
    """16 kHz float32 samples of fixtures/<clip>; with `sha`, asserts they are the oracle's."""
    a = _load(clip)
    if sha:
        assert hashlib.sha256(a.tobytes()).hexdigest() == sha, f"{clip}: not the samples the oracle saw"
    return a


def extent(x, sr=16000):
    """(start, end) in seconds of the voice in a clean clip: its 10 ms frames 15 dB over its floor
    (the 10th percentile; at most 35 dB below its peak, at least 6 dB below it) — where a
    scene built from clips has its truth."""
    n = sr // 100
    db = 10 * np.log10((x[:len(x) // n * n].reshape(-1, n) ** 2).mean(1) + 1e-10)
    cut = min(max(np.percentile(db, 10) + 15, db.max() - 35), db.max() - 6)
    act = np.flatnonzero(db > cut)
    return act[0] / 100, (act[-1] + 1) / 100
