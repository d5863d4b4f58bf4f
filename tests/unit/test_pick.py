"""Greedy's choice on the device (kernels/pick.py with TimestampRules.ranges) against openai-whisper's
ApplyTimestampRules written out in NumPy over float64 log-probabilities, the way its
whisper/decoding.py applies them (the reference below follows that code's steps one for one),
and against the host filters that beam search and sampling use (TimestampRules.apply)."""

from types import SimpleNamespace

import numpy as np
import pytest

from nwhisper import backend
from nwhisper import kernels as K
from nwhisper.decoding import TimestampRules

# tiny.en's ids
EOT, NO_TS, TS_BEGIN, N_VOCAB = 50256, 50362, 50363, 51864
TOK = SimpleNamespace(eot=EOT, no_timestamps=NO_TS, timestamp_begin=TS_BEGIN)
SUPPRESS = [220, 1, 2, 7, 8, 9, 10, 14, 25, 50257, 50358, 50359, 50360, 50361]
BEGIN = [220, EOT]


def openai_choice(logits, sampled, timestamps, max_initial=50):
    """(token, log P, whether rule 5 dropped the text) as openai-whisper's greedy decoder with
    SuppressBlank, SuppressTokens and ApplyTimestampRules: the filters, then the argmax of the
    filtered row and its log_softmax."""
    x = logits.astype(np.float64).copy()
    fired = False
    if not sampled:
        x[BEGIN] = -np.inf                          # SuppressBlank
    x[SUPPRESS] = -np.inf                           # SuppressTokens
    if timestamps:
        x[NO_TS] = -np.inf
        last_was = len(sampled) >= 1 and sampled[-1] >= TS_BEGIN
        penult_was = len(sampled) < 2 or sampled[-2] >= TS_BEGIN
        if last_was:
            if penult_was:
                x[TS_BEGIN:] = -np.inf
            else:
                x[:EOT] = -np.inf
        stamps = [t for t in sampled if t >= TS_BEGIN]
        if stamps:
            last = stamps[-1] if last_was and not penult_was else stamps[-1] + 1
            x[TS_BEGIN:last] = -np.inf
        if not sampled:
            x[:TS_BEGIN] = -np.inf
            x[TS_BEGIN + max_initial + 1:] = -np.inf
        m = x.max()
        lp = x - (m + np.log(np.exp(x - m).sum()))
        tm = lp[TS_BEGIN:].max()
        if tm > -np.inf and tm + np.log(np.exp(lp[TS_BEGIN:] - tm).sum()) > lp[:TS_BEGIN].max():
            fired = np.isfinite(lp[:TS_BEGIN]).any()
            x[:TS_BEGIN] = -np.inf
    t = int(np.argmax(x))
    m = x.max()
    return t, float(x[t] - (m + np.log(np.exp(x - m).sum()))), fired


def device_choice(be, logits, sampled, timestamps, max_initial=50):
    mask = np.zeros((1, N_VOCAB), np.float32)
    mask[0, SUPPRESS] = -np.inf
    if not sampled:
        mask[0, BEGIN] = -np.inf
    if timestamps:
        mask[0, NO_TS] = -np.inf
        allowed = TimestampRules(TOK, N_VOCAB, max_initial * 0.02).ranges(sampled) + (1,)
    else:
        allowed = (0, TS_BEGIN, N_VOCAB, 0)
    out = be.empty((2,), np.float32)
    K.pick(be, be.upload(logits[None].copy()), be.upload(mask), be.upload(np.asarray(allowed, np.int32)),
           TS_BEGIN, out)
    t, lp = be.download(out).tolist()
    return int(t), lp


def history(rng):
    """A sampled sequence of text tokens and rising timestamps (sometimes lone, sometimes paired)."""
    seq, stamp = [], TS_BEGIN + int(rng.integers(0, 40))
    for _ in range(int(rng.integers(0, 12))):
        r = rng.random()
        if r < 0.3:
            stamp += int(rng.integers(0, 30))
            seq.append(min(stamp, N_VOCAB - 1))
        else:
            seq.append(int(rng.integers(0, EOT)))
    return seq


@pytest.fixture(scope="module")
def be():
    return backend.get("cpu")


@pytest.mark.parametrize("timestamps", [True, False])
def test_pick_matches_openai_rules(be, timestamps):
    rng = np.random.default_rng(7 + timestamps)
    rule5 = 0
    for case in range(150):
        logits = (rng.standard_normal(N_VOCAB) * 3).astype(np.float32)
        # timestamps sometimes likely enough, together, to outweigh the best text token (rule 5)
        logits[TS_BEGIN:] += np.float32(rng.uniform(-4, 3))
        logits[int(rng.integers(0, N_VOCAB))] += np.float32(rng.uniform(0, 12))
        sampled = history(rng) if case else []
        want = openai_choice(logits, sampled, timestamps)
        got = device_choice(be, logits, sampled, timestamps)
        assert got[0] == want[0], (case, sampled, got, want)
        assert abs(got[1] - want[1]) <= 2e-5 * max(1.0, abs(want[1])), (case, got, want)
        rule5 += want[2]
    print(f"rule 5 fired in {rule5} cases")
    if timestamps:
        assert 10 <= rule5 <= 140, f"rule 5 dropped the text in {rule5} of 150 cases"


def test_pick_ties_go_to_the_lowest_id(be):
    logits = np.full(N_VOCAB, -5.0, np.float32)
    logits[[30000, 900, 45000]] = 4.0            # across chunks: the lowest id wins
    assert device_choice(be, logits, [5], False)[0] == 900
    logits[700] = 4.0                            # within a chunk too
    assert device_choice(be, logits, [5], False)[0] == 700
    logits[TS_BEGIN + 3] = 4.0                   # a timestamp tying the best text token: text
    assert device_choice(be, logits, [5], False)[0] == 700
    logits[:TS_BEGIN] -= 30                      # ... unless rule 5 says the stamps win
    t, lp = device_choice(be, logits, [5], True)
    assert t == TS_BEGIN + 3 and lp == pytest.approx(openai_choice(logits, [5], True)[1], abs=1e-5)


def test_pick_reports_a_row_with_nothing_allowed(be):
    logits = np.full(N_VOCAB, -np.inf, np.float32)
    assert device_choice(be, logits, [5], False) == (-1, -np.inf)


def test_host_rules_match_openai(be):
    """TimestampRules.apply (beam search's and sampling's host filters) on the same cases."""
    rng = np.random.default_rng(3)
    rules = TimestampRules(TOK, N_VOCAB, 1.0)
    for case in range(60):
        logits = (rng.standard_normal(N_VOCAB) * 3).astype(np.float32)
        logits[TS_BEGIN:] += np.float32(rng.uniform(-4, 3))
        sampled = history(rng) if case else []
        row = logits.copy()
        row[SUPPRESS] = -np.inf
        if not sampled:
            row[BEGIN] = -np.inf
        rules.apply(row, sampled)
        assert int(np.argmax(row)) == openai_choice(logits, sampled, True)[0], (case, sampled)
