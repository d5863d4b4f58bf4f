"""Diarization error rate as pyannote.metrics 4.2 computes it, in a page, so the suite needs no pyannote.

    der(reference, hypothesis, collar=0.5)        # turns: [(start s, end s, speaker)]

`DiarizationErrorRate(collar=C, skip_overlap=False)` with no UEM: the scored time is the span
from the first to the last turn of either side, less a window of C (total width) centred on
every start and end of a reference turn; both sides are cut to it. Hypothesis speakers are
mapped one-to-one onto reference speakers to maximise the time they share (the Hungarian
method; a pair that shares no time is not mapped). Then on every stretch where the speakers
present do not change, with r reference and h hypothesis turns present of which c agree:
missed += max(r - h, 0), false alarm += max(h - r, 0), confusion += min(r, h) - c, total += r,
each times the stretch's length. DER = (missed + false alarm + confusion) / total.
Held to pyannote.metrics' own numbers by tests/oracle/test_diarization.py.
"""

from collections import Counter

from scipy.optimize import linear_sum_assignment


def _scored(reference, hypothesis, collar):
    """[(start, end)]: the time that counts, sorted and disjoint."""
    turns = list(reference) + list(hypothesis)
    if not turns:
        return []
    lo, hi = min(t[0] for t in turns), max(t[1] for t in turns)
    cuts = sorted((t - collar / 2, t + collar / 2) for a, b, _ in reference for t in (a, b)) \
        if collar > 0 else []
    out, at = [], lo
    for a, b in cuts:
        if a > at:
            out.append((at, min(a, hi)))
        at = max(at, b)
    if at < hi:
        out.append((at, hi))
    return [(a, b) for a, b in out if b > a]


def _stretches(reference, hypothesis, scored):
    """(length, reference speakers Counter, hypothesis speakers Counter) of every stretch of
    scored time on which the turns present do not change."""
    edges = sorted({t for a, b, _ in list(reference) + list(hypothesis) for t in (a, b)}
                   | {t for span in scored for t in span})
    for a, b in zip(edges, edges[1:]):
        m = (a + b) / 2
        if b <= a or not any(s <= m < e for s, e in scored):
            continue
        yield (b - a, Counter(w for s, e, w in reference if s <= m < e),
               Counter(w for s, e, w in hypothesis if s <= m < e))


def der(reference, hypothesis, collar=0.0, detailed=False):
    """The DER of hypothesis turns against reference turns; with detailed, a dict of it and its
    parts in pyannote.metrics' names."""
    reference = [(float(a), float(b), w) for a, b, w in reference if b > a]
    hypothesis = [(float(a), float(b), ("hyp", w)) for a, b, w in hypothesis if b > a]
    stretches = list(_stretches(reference, hypothesis, _scored(reference, hypothesis, collar)))
    rl = sorted({w for *_, w in reference}, key=str)
    hl = sorted({w for *_, w in hypothesis}, key=str)
    shared = [[sum(d * r[x] * h[y] for d, r, h in stretches) for x in rl] for y in hl]
    mapping = {}
    if rl and hl:
        for i, j in zip(*linear_sum_assignment([[-v for v in row] for row in shared])):
            if shared[i][j] > 0:
                mapping[hl[i]] = rl[j]
    parts = dict.fromkeys(("missed detection", "false alarm", "confusion", "total"), 0.0)
    for d, r, h in stretches:
        nr, nh = sum(r.values()), sum(h.values())
        agree = sum(min(n, r[mapping[w]]) for w, n in h.items() if w in mapping)
        parts["missed detection"] += d * max(nr - nh, 0)
        parts["false alarm"] += d * max(nh - nr, 0)
        parts["confusion"] += d * (min(nr, nh) - agree)
        parts["total"] += d * nr
    errors = parts["missed detection"] + parts["false alarm"] + parts["confusion"]
    rate = errors / parts["total"] if parts["total"] else float(errors > 0)
    return {"diarization error rate": rate, **parts} if detailed else rate
