"""Greedy choice of the next token on the device: filters, timestamp rules, argmax, log-probability.

A greedy step needs ONE token and its log-probability from a row of 51865 logits. Done on the
host that meant copying the row back every step and three NumPy passes over it; here it is two
launches and one (2,) float32 comes back: [token, log P(token)].

What is allowed of the row is an additive mask (the suppressed tokens, 0 or -inf) and four
int32 `rules` that OpenAI's timestamp rules reduce to at every step (decoding.TimestampRules
.ranges): text tokens from `rules[0]` up to the first timestamp `ts_begin`, timestamps from
`rules[1]` up to `rules[2]`, and, when `rules[3]` is set, rule 5: when the timestamps' summed
probability beats every text token, only a timestamp may follow. Without timestamps the rules
allow the whole row and rule 5 is off.

  pick_part   chunk c of the row: for the text tokens and for the timestamps in it, the largest
              logit, the first index holding it and Σ exp(logit - largest) — each a pass that
              vectorises on the CPU (vecmath.py)
  pick_join   the chunks merged (the first chunk holding a maximum holds its first index), rule
              5 applied, the token and its log-probability written

The log-probability is that of the filtered row (suppressed tokens removed, the rest
renormalised), as openai-whisper's sum_logprob is.
"""

import math

import numpy as np

from nwhisper.kernels._compile import kernel
from nwhisper.kernels.vecmath import fast_exp, from_key, order_key

# Chunks of the row: on the host few (each costs a loop's set-up), on a device a thread each.
HOST_PARTS, DEVICE_PARTS = 32, 128


@kernel
def pick_part(c, logits, mask, rules, parts, chunk, ts_begin):
    """parts[c] = (max, first argmax, Σ exp(x - max)) of the allowed text tokens, then the same
    of the allowed timestamps, among x = logits[0] + mask[0] over [c*chunk, (c+1)*chunk);
    (-inf, -1, 0) for a side with none. logits, mask (1, V) f32; rules (4,) int32; parts
    (chunks, 6) f32 (an index is exact in float32 below 2^24)."""
    n = logits.shape[1]
    none = np.float32(-math.inf)   # float32 constants: a Python float would compare in float64
    lo = c * chunk
    hi = min(n, lo + chunk)
    for side in range(2):
        if side == 0:
            a, b = max(lo, rules[0]), min(hi, ts_begin)
        else:
            a, b = max(lo, rules[1]), min(hi, rules[2])
        # views indexed from 0: a loop from a variable start keeps Numba's negative-index
        # check in every iteration, and then does not vectorise
        xs = logits[0, a:b]
        ms = mask[0, a:b]
        count = xs.shape[0]
        top = order_key(none)
        for j in range(count):
            k = order_key(xs[j] + ms[j])
            top = k if k > top else top
        m = from_key(top)
        # the first index holding m, as a minimum over the row (a search that stops at the
        # first hit does not vectorise), and the sum in the same pass
        best = np.int32(count)
        total = np.float32(0.0)
        if m > none:   # (a NaN maximum, from diverged logits, leaves the chunk's side empty)
            for j in range(count):
                v = xs[j] + ms[j]
                at = np.int32(j) if v == m else np.int32(count)
                best = at if at < best else best
                total += np.float32(fast_exp(v - m))
        parts[c, 3 * side] = m
        parts[c, 3 * side + 1] = np.float32(a + best) if best < count else np.float32(-1.0)
        parts[c, 3 * side + 2] = total


@kernel
def pick_join(r, parts, rules, out):
    """out = [token, its log-probability] from pick_part's chunks (one work item, r = 0);
    token -1 when nothing is allowed. parts (chunks, 6) f32, rules (4,) int32, out (2,) f32."""
    count = parts.shape[0]
    none = np.float32(-math.inf)
    zero = np.float32(0.0)
    # each side: the largest chunk maximum, where it first occurs, log Σ exp over the side
    top_t = none
    arg_t = np.float32(-1.0)
    top_s = none
    arg_s = np.float32(-1.0)
    for c in range(count):
        if parts[c, 0] > top_t:
            top_t, arg_t = parts[c, 0], parts[c, 1]
        if parts[c, 3] > top_s:
            top_s, arg_s = parts[c, 3], parts[c, 4]
    sum_t = np.float32(0.0)
    sum_s = np.float32(0.0)
    for c in range(count):
        if parts[c, 2] > zero:
            sum_t += parts[c, 2] * np.float32(math.exp(parts[c, 0] - top_t))
        if parts[c, 5] > zero:
            sum_s += parts[c, 5] * np.float32(math.exp(parts[c, 3] - top_s))
    lse_t = top_t + np.float32(math.log(sum_t)) if sum_t > zero else none
    lse_s = top_s + np.float32(math.log(sum_s)) if sum_s > zero else none
    if rules[3] != 0 and lse_s > top_t:
        # rule 5: the text tokens are dropped, so the row is normalised over the timestamps
        out[0] = arg_s
        out[1] = top_s - lse_s
        return
    # text ids are below timestamp ids: a tie goes to the text side
    high = max(lse_t, lse_s)
    if high == none:
        out[0] = np.float32(-1.0)
        out[1] = none
        return
    lse = high + np.float32(math.log(np.float32(math.exp(lse_t - high)) + np.float32(math.exp(lse_s - high))))
    if top_s > top_t:
        out[0] = arg_s
        out[1] = top_s - lse
    else:
        out[0] = arg_t
        out[1] = top_t - lse


def pick(be, logits, mask, rules, ts_begin, out):
    """out = [token, log-probability] of the greedy choice from logits (1, V) f32 filtered by
    mask (1, V) f32 and rules (4,) int32 (this module's docstring), the first timestamp id
    ts_begin; out (2,) f32, on the device."""
    n = logits.shape[1]
    count = HOST_PARTS if be.on_host else DEVICE_PARTS
    parts = be.scratch("pick.parts", (count, 6))
    be.launch(pick_part, count, logits, mask, rules, parts, -(-n // count), ts_begin, work=2 * n)
    be.launch(pick_join, 1, parts, rules, out)
