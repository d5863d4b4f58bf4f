"""Decoding a window by many candidates at once: beam search (Hugging Face's rules) and best-of
sampling at a temperature, each candidate a row of ONE batched decoder call per step (each row
with its own KV cache, reordered as beams are kept and dropped: `Whisper.decode_batch`). Both
read whole rows of logits on the host, filtered as the greedy decoder's mask filters them
(decoding.HostFilters).

    WindowDecoder(model, tok, ck).decode(enc, DecodingOptions(beam_size=5))
"""

from __future__ import annotations

import numpy as np

from .decoding import GreedyDecoder, HostFilters, log_softmax, start_window
from .records import DecodingResult, stop_if


class WindowDecoder(GreedyDecoder):
    """A window's decoder as the window loop uses it: best-of sampling at T > 0, beam search
    when beam_size > 1, else greedy."""

    def search(self, enc, options, prompt, cancelled=None):
        if options.temperature > 0:
            return sample_best_of(self, enc, options, prompt, cancelled)
        if options.beam_size and options.beam_size > 1:
            return beam_search(self, enc, options, prompt, cancelled)
        return super().search(enc, options, prompt, cancelled)


def beam_search(decoder, enc, options, prompt, cancelled=None):
    """Beam search as Hugging Face transformers runs it (generate(num_beams=N), whose text is
    the reference here), the N beams as N rows of one batched decoder call per step:

      * log-probabilities are log_softmax of the raw logits, THEN filtered (suppressed
        tokens get −inf; the rest are not renormalised);
      * each step the best 2N continuations over all beams; a continuation ending in EOT is
        a finished hypothesis only if it ranks in the top N, scored sum / generated length
        (EOT counted; length_penalty 1); the best N non-finished continue;
      * the N best finished are kept; the search stops when the best running beam, scored
        the same way, cannot beat the worst of N finished (early_stopping=False), or at the
        token limit, where every candidate counts as finished.
    openai-whisper's beam search (N+1 candidates per beam, ranked by sum / length without
    EOT) differs from it in those details and can pick another hypothesis."""
    tok, model, be = decoder.tok, decoder.model, decoder.be
    n = options.beam_size
    filters = HostFilters(decoder, options)
    single, last, nsp = start_window(model, tok, enc, prompt)
    limit = decoder.limit(options, prompt)
    rows = be.download(last)
    running, scores = [[]], [0.0]
    finished = []                     # (score / length, sum, tokens without EOT)
    open_ = True
    batch = None
    for step in range(limit):
        stop_if(cancelled)
        rows = rows[:len(running)]
        m = rows.max(-1, keepdims=True)
        lp = rows - (m + np.log(np.exp(rows - m).sum(-1, keepdims=True)))     # (beams, V) f32
        for b, seq in enumerate(running):
            filters(lp[b], seq)
        tot = (lp + np.asarray(scores, np.float32)[:, None]).ravel()
        top = np.argpartition(-tot, 2 * n)[:2 * n]
        top = top[np.argsort(-tot[top], kind="stable")]
        V = rows.shape[1]
        cands = [(float(tot[i]), int(i // V), int(i % V)) for i in top]
        at_limit = step == limit - 1
        nxt = []
        for rank, (sc, b, t) in enumerate(cands):
            if t == tok.eot or at_limit:
                if rank < n and open_:
                    seq = running[b] + ([] if t == tok.eot else [t])
                    finished.append((sc / (step + 1), sc, seq))
            elif len(nxt) < n:
                nxt.append((sc, b, t))
        finished = sorted(finished, key=lambda f: -f[0])[:n]
        if len(finished) == n and nxt and nxt[0][0] / (step + 1) <= finished[-1][0]:
            open_ = False
        if at_limit or not open_ or not nxt:
            break
        while len(nxt) < n:
            nxt.append(nxt[0])
        if batch is None:
            batch = model.new_batch(single, n)
        else:
            batch.reorder([b for _, b, _ in nxt])
        running = [running[b] + [t] for _, b, t in nxt]
        scores = [sc for sc, _, _ in nxt]
        rows = be.download(model.decode_batch(batch, np.asarray([t for _, _, t in nxt], np.int32)))
    if not finished:
        return DecodingResult(tokens=[], no_speech_prob=nsp, prompt=list(prompt))
    _, total, best = finished[0]
    return DecodingResult(tokens=best, sum_logprob=total, no_speech_prob=nsp, prompt=list(prompt))

def sample_best_of(decoder, enc, options, prompt, cancelled=None):
    """best_of samples at temperature T as rows of one batched call per step; the one with
    the highest sum log-prob / length is kept (openai's ranker)."""
    tok, model, be = decoder.tok, decoder.model, decoder.be
    n = max(1, options.best_of or 1)
    filters = HostFilters(decoder, options)
    single, last, nsp = start_window(model, tok, enc, prompt)
    limit = decoder.limit(options, prompt)
    rng = decoder.rng
    seqs = [[] for _ in range(n)]
    sums = [0.0] * n
    done = [False] * n
    rows = np.repeat(be.download(last), n, axis=0)
    batch = model.new_batch(single, n) if limit > 0 else None
    for _ in range(limit):
        stop_if(cancelled)
        nxt = []
        for b in range(n):
            if done[b]:
                nxt.append(tok.eot)
                continue
            row = filters(rows[b].copy(), seqs[b])
            lp = log_softmax(row)
            z = row.astype(np.float64) / options.temperature
            p = np.exp(z - z.max())
            p /= p.sum()
            t = int(rng.choice(len(p), p=p))
            sums[b] += float(lp[t])
            if t == tok.eot:
                done[b] = True
            else:
                seqs[b].append(t)
            nxt.append(t)
        if all(done):
            break
        rows = be.download(model.decode_batch(batch, np.asarray(nxt, np.int32)))
    best = max(range(n), key=lambda b: sums[b] / (len(seqs[b]) + 1))
    return DecodingResult(tokens=seqs[best], sum_logprob=sums[best], no_speech_prob=nsp,
                          prompt=list(prompt))
