"""Fixture clips as nwhisper reads them, loaded once per test session and checked against the
sha256 of the samples an oracle was given (the golden files store it)."""

import functools
import hashlib
import os

from nwhisper.io.audio import load_audio

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")


@functools.lru_cache(maxsize=None)
def _load(clip):
    return load_audio(os.path.join(FIX, clip))


def audio(clip, sha=None):
    """16 kHz float32 samples of fixtures/<clip>; with `sha`, asserts they are the oracle's."""
    a = _load(clip)
    if sha:
        assert hashlib.sha256(a.tobytes()).hexdigest() == sha, f"{clip}: not the samples the oracle saw"
    return a
