"""What many test files share: the models, loaded once per session, their encoder passes remembered.

Layout: unit/ (pure logic, parsers, kernels against float64 references), oracle/ (stages against
independent implementations and their golden files), cuda/ (the CUDA backend under Numba's
simulator and its launcher), end_to_end/ (servers, streams, the page, the batch command, as
processes on loopback). helpers/ and fixtures/ are on the import path (pyproject's pytest
`pythonpath`)."""

import collections
import hashlib

import numpy as np
import pytest

import nwhisper

# Encoder passes the session's models remember: a base window's states are 3 MB
ENCODER_MEMO = 64
# Every this many hits, the pass is run again and held to the remembered states, bit for bit
RECHECK_EVERY = 4


def remember_encodes(whisper, size=ENCODER_MEMO, recheck_every=RECHECK_EVERY):
    """Whisper.encode of a host log-mel computed once per session: the oracle tests run the same
    clips through the same model many times (greedy, timestamps, words, beams, languages), and
    the encoder is most of each transcription. It is a pure function of the log-mel, held to
    Hugging Face's encoder on its own (tests/oracle/test_transcribe.py::test_encoder_matches_hf).
    A first pass returns the encoder's own array, so a caller sees what the encoder did to it
    (an output buffer reused by the next pass shows); a remembered one returns a copy, and every
    recheck_every-th of those runs the pass again, returns its array and asserts it equals the
    copy bit for bit. A pass that can be cancelled is always run."""
    encode, memo = whisper.encode, collections.OrderedDict()
    be = whisper.be
    hits = 0

    def remembered(mel, cancelled=None):
        nonlocal hits
        if cancelled is not None or not isinstance(mel, np.ndarray):
            return encode(mel, cancelled)
        key = (mel.shape, mel.dtype.str, hashlib.sha1(np.ascontiguousarray(mel)).digest())
        if key not in memo:
            states = encode(mel)
            memo[key] = be.download(states)
            if len(memo) > size:
                memo.popitem(last=False)
            return states
        memo.move_to_end(key)
        hits += 1
        if hits % recheck_every == 0:
            states = encode(mel)
            assert np.array_equal(be.download(states), memo[key]), \
                "the encoder gave other states for a log-mel it had encoded before"
            return states
        return be.upload(memo[key].copy())
    whisper.encode = remembered
    return whisper


@pytest.fixture(scope="session")
def models():
    """models(name, compute_type="float32"): a CPU model, loaded once for the whole session,
    its encoder passes remembered (remember_encodes)."""
    loaded = {}

    def get(name, compute_type="float32"):
        key = (name, compute_type)
        if key not in loaded:
            loaded[key] = nwhisper.load(name, device="cpu", compute_type=compute_type)
            remember_encodes(loaded[key].model)
        return loaded[key]
    return get
