"""Word timestamps from cross-attention: openai-whisper's timing.py on nwhisper's decoder.

The decoder is run once over `[sot sequence, <|notimestamps|>, text tokens…, <|endoftext|>]`
and the cross-attention probabilities of the checkpoint's alignment heads are kept (some heads
of some layers attend to the audio frame being spoken). Then, as openai does:

    weights (heads, tokens, frames)  ← the content frames only, softmax renormalised over them
    z-normalised along the token axis, median filter of width 7 along time, mean over heads
    DTW over −matrix (Numba): the monotonic token → frame path
    a word starts where the path first enters its first token; 50 frames per second

and the heuristics of `add_word_timestamps`: durations capped at twice the median word (≤ 0.7 s)
at sentence ends, punctuation merged onto its word, a first word after a pause clamped, the
segment's own timestamps preferred when a first/last word is more than 0.5 s off.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numba
import numpy as np

from .records import Word

TOKENS_PER_SECOND = 50          # encoder positions per second: 16000 / 160 / 2
MEDFILT_WIDTH = 7


@numba.njit(cache=True)
def _backtrace(trace):
    i = trace.shape[0] - 1
    j = trace.shape[1] - 1
    trace[0, :] = 2
    trace[:, 0] = 1
    out_i = []
    out_j = []
    while i > 0 or j > 0:
        out_i.append(i - 1)
        out_j.append(j - 1)
        t = trace[i, j]
        if t == 0:
            i -= 1
            j -= 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    n = len(out_i)
    res = np.empty((2, n), np.int64)
    for k in range(n):
        res[0, k] = out_i[n - 1 - k]
        res[1, k] = out_j[n - 1 - k]
    return res


@numba.njit(cache=True)
def dtw(x):
    """Minimum-cost monotonic path through cost matrix x (N, M) → (2, L) [text index, time
    index]; openai's dtw_cpu (float32 cost, ties prefer the diagonal only when strictly smaller)."""
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf, np.float32)
    trace = np.full((n + 1, m + 1), -1.0, np.float32)
    cost[0, 0] = 0
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0 = cost[i - 1, j - 1]
            c1 = cost[i - 1, j]
            c2 = cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t
    return _backtrace(trace)


def median_filter(x, width):
    """Median over a sliding window of `width` along the last axis, reflect-padded (torch's)."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    xp = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    win = np.lib.stride_tricks.sliding_window_view(xp, width, axis=-1)
    return np.sort(win, axis=-1)[..., pad]


def split_to_word_tokens(tok, tokens):
    """openai's split_tokens_on_spaces: tokens grouped into words (a word starts at a space,
    punctuation is its own word, special tokens are their own)."""
    full = tok.decode_with_timestamps(tokens)
    subwords, groups, cur, offset = [], [], [], 0
    for t in tokens:
        cur.append(t)
        dec = tok.decode_with_timestamps(cur) if t < tok.eot else "<|endoftext|>"
        if "\ufffd" not in dec or full[offset + dec.index("\ufffd")] == "\ufffd":
            subwords.append(dec)
            groups.append(cur)
            cur = []
            offset += len(dec)
    words, word_tokens = [], []
    for sw, st in zip(subwords, groups):
        special = st[0] >= tok.eot
        if special or sw.startswith(" ") or sw.strip() in string.punctuation or not words:
            words.append(sw)
            word_tokens.append(list(st))
        else:
            words[-1] += sw
            word_tokens[-1].extend(st)
    return words, word_tokens


class _Timing:
    __slots__ = ("word", "tokens", "start", "end", "probability")

    def __init__(self, word, tokens, start, end, probability):
        self.word, self.tokens, self.start, self.end, self.probability = word, tokens, start, end, probability


@dataclass(frozen=True)
class Aligner:
    """What word timing reads of a model: the network (model.Whisper), its tokenizer, and the
    alignment heads [(layer, head)] whose cross-attention follows the audio being spoken
    (alignment_heads.alignment_heads)."""
    model: object
    tok: object
    heads: tuple


def find_alignment(aligner, enc, lang, task, text_tokens, num_frames):
    """[_Timing] per word of `text_tokens` within one window (times from the window's start)."""
    tok, model, heads = aligner.tok, aligner.model, aligner.heads
    be = model.be
    if not text_tokens:
        return []
    sot_seq = tok.sot_sequence(language=lang if model.dims.is_multilingual else None, task=task)
    tokens = sot_seq + [tok.no_timestamps] + list(text_tokens) + [tok.eot]
    cw = {l: None for l, _ in heads}
    state = model.new_state(enc)
    logits = be.download(model.decode(state, np.asarray(tokens, np.int32), cross_weights=cw))
    sampled = logits[len(sot_seq):, :tok.eot].astype(np.float64)
    sampled = np.exp(sampled - sampled.max(-1, keepdims=True))
    sampled /= sampled.sum(-1, keepdims=True)
    text_probs = sampled[np.arange(len(text_tokens)), text_tokens]

    nf = max(1, num_frames // 2)
    w = np.stack([cw[l][h] for l, h in heads])[:, :, :nf].astype(np.float32)    # (heads, n, nf)
    w = w / w.sum(-1, keepdims=True)         # softmax over the content frames only, as openai
    mean = w.mean(-2, keepdims=True)
    std = w.std(-2, keepdims=True)
    w = (w - mean) / std
    w = median_filter(w, MEDFILT_WIDTH)
    matrix = w.mean(0)[len(sot_seq):-1]
    text_idx, time_idx = dtw(np.ascontiguousarray(-matrix.astype(np.float64)))

    words, word_tokens = split_to_word_tokens(tok, list(text_tokens) + [tok.eot])
    if len(word_tokens) <= 1:
        return []
    bounds = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_idx), (1, 0), constant_values=1).astype(bool)
    jump_times = time_idx[jumps] / TOKENS_PER_SECOND
    starts = jump_times[bounds[:-1]]
    ends = jump_times[bounds[1:]]
    probs = [float(np.mean(text_probs[i:j])) for i, j in zip(bounds[:-1], bounds[1:])]
    return [_Timing(w_, t_, float(a), float(b), p) for w_, t_, a, b, p in zip(words, word_tokens, starts, ends, probs)]


def merge_punctuations(alignment, prepended, appended):
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        prev, foll = alignment[i], alignment[j]
        if prev.word.startswith(" ") and prev.word.strip() in prepended:
            foll.word = prev.word + foll.word
            foll.tokens = prev.tokens + foll.tokens
            prev.word, prev.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        prev, foll = alignment[i], alignment[j]
        if not prev.word.endswith(" ") and foll.word in appended:
            prev.word = prev.word + foll.word
            prev.tokens = prev.tokens + foll.tokens
            foll.word, foll.tokens = "", []
        else:
            i = j
        j += 1


def add_word_timestamps(aligner, segments, enc, lang, opts, num_frames, time_offset, last_speech):
    """Fill `segment.words` for one window's segments (openai's add_word_timestamps); segment
    start/end may move to their words'. `last_speech`: where speech last ended before this
    window (the long-form loop keeps it, as openai's last_speech_timestamp)."""

    eot = aligner.tok.eot
    per_seg = [[t for t in s.tokens if t < eot] for s in segments]
    text = [t for ts in per_seg for t in ts]
    alignment = find_alignment(aligner, enc, lang, opts.task, text, num_frames)
    durations = np.array([t.end - t.start for t in alignment])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    max_d = median * 2
    if len(durations):
        marks = ".。!！?？"
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > max_d:
                if alignment[i].word in marks:
                    alignment[i].end = alignment[i].start + max_d
                elif alignment[i - 1].word in marks:
                    alignment[i].start = alignment[i].end - max_d
    merge_punctuations(alignment, opts.prepend_punctuations, opts.append_punctuations)
    wi = 0
    for seg, toks in zip(segments, per_seg):
        saved, words = 0, []
        while wi < len(alignment) and saved < len(toks):
            t = alignment[wi]
            if t.word:
                words.append(Word(start=round(time_offset + t.start, 2), end=round(time_offset + t.end, 2),
                                  word=t.word, probability=t.probability))
            saved += len(t.tokens)
            wi += 1
        if words:
            w0 = words[0]
            if w0.end - last_speech > median * 4 and (
                    w0.end - w0.start > max_d or (len(words) > 1 and words[1].end - w0.start > max_d * 2)):
                if len(words) > 1 and words[1].end - words[1].start > max_d:
                    boundary = max(words[1].end / 2, words[1].end - max_d)
                    w0.end = words[1].start = boundary
                w0.start = max(0, w0.end - max_d)
            if seg.start < w0.end and seg.start - 0.5 > w0.start:
                w0.start = max(0, min(w0.end - median, seg.start))
            else:
                seg.start = w0.start
            wl = words[-1]
            if seg.end > wl.start and seg.end + 0.5 < wl.end:
                wl.end = max(wl.start + median, seg.end)
            else:
                seg.end = wl.end
            last_speech = seg.end
        seg.words = words
