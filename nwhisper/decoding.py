"""Choosing tokens: the prompt, the logit filters, greedy decoding of one 30 s window.

One window is decoded from a prompt built from the model's OWN special-token ids (they move
between Whisper versions: English-only, multilingual, large-v3), e.g. for a multilingual model

    <|startoftranscript|> <|en|> <|transcribe|> <|notimestamps|>

and then one token per decoder step, each the argmax of the logits after the filters:

  * suppressed tokens — the non-speech symbols and the control tokens Whisper never emits as
    text (the model's own `suppress_ids`, as Hugging Face's generation config lists them);
  * suppress-at-begin — a blank or end-of-text as the very first token (`suppress_ids_begin`);
  * with timestamps, OpenAI's timestamp rules (see `TimestampRules`).

The filters are an additive mask on the device, and the timestamp rules reduce to four int32s a
step (`TimestampRules.ranges`): kernels/pick.py applies both, takes the argmax and its
log-probability on the device, and two floats come back per step, never the row of logits.

Beam search and sampling, which look at whole rows of logits, are search.py's; the result of a
window (DecodingResult, with its compression ratio, the fallback signal) is records.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import kernels as K
from .records import DecodingResult, TranscribeOptions, stop_if

NEG_INF = np.float32(-np.inf)


@dataclass(frozen=True)
class DecodingOptions:
    task: str = "transcribe"            # or "translate" (multilingual models)
    language: str | None = None         # None: English on .en models, else detected beforehand
    max_tokens: int = TranscribeOptions.max_tokens   # per window (openai's sample_len: n_text_ctx // 2)
    timestamps: bool = False            # decode Whisper's timestamp tokens
    max_initial_timestamp: float = 1.0  # the first timestamp may not exceed this (seconds)
    prompt: tuple = ()                  # previous text tokens (conditioning), without <|startofprev|>
    temperature: float = 0.0            # 0: argmax (or beam search); > 0: sampling
    beam_size: int | None = None        # None or 1: greedy; N: beam search with N beams (T = 0)
    best_of: int | None = None          # samples drawn at T > 0, the most probable kept
    patience: float = 1.0               # beam search stops after round(N · patience) finished


def build_prompt(tok, options: DecodingOptions, multilingual: bool):
    """[<|startofprev|> prev…] <|startoftranscript|> [<|lang|> <|task|>] [<|notimestamps|>]."""
    prompt = []
    if options.prompt:
        prompt = [tok.sot_prev] + list(options.prompt)
    if multilingual:
        prompt += tok.sot_sequence(language=options.language or "en", task=options.task)
    else:
        prompt += [tok.sot]
    if not options.timestamps:
        prompt.append(tok.no_timestamps)
    return prompt


def suppress_lists(ck, tok):
    """(always, at_begin) token ids. The checkpoint's lists when it has them (HF generation
    config, CT2 config.json); otherwise openai-whisper's: the non-speech symbols plus the
    control tokens, and at the first step a blank and end-of-text."""
    always = ck.suppress_ids
    if always is None:
        always = list(tok.non_speech_tokens()) + [tok.transcribe, tok.translate, tok.sot,
                                                  tok.sot_prev, tok.sot_lm, tok.no_speech]
    begin = ck.suppress_ids_begin
    if begin is None:
        begin = list(tok.encode(" ")) + [tok.eot]
    return sorted(set(int(i) for i in always if i >= 0)), sorted(set(int(i) for i in begin))


def log_normalizer(x):
    """log Σ exp(x) of a float32 row, -inf when every entry is -inf. The exponentials in float32
    (NumPy vectorises them; float64's are many times slower on some value ranges), summed in
    float64, which keeps it within 2e-9 of the all-float64 value."""
    m = float(x.max())
    if m == -np.inf:
        return m
    return m + float(np.log(np.exp(x - np.float32(m)).sum(dtype=np.float64)))


def log_softmax(x):
    """float64 log-probabilities of a float32 row of logits."""
    return x.astype(np.float64) - log_normalizer(x)


class TimestampRules:
    """OpenAI's constrained decoding of timestamp tokens (whisper/decoding.py ApplyTimestampRules).

    1. `<|notimestamps|>` is never sampled.
    2. Timestamps come in pairs: after a lone timestamp the next token is a timestamp or EOT;
       after a pair (or at the start) it is text or EOT... except the very first token, rule 4.
    3. Timestamps never go back in time, and a new segment's start is after the last end.
    4. The first token is a timestamp no later than `max_initial_timestamp`.
    5. When the timestamps' summed probability beats every single text token, sample a timestamp.
    """

    def __init__(self, tok, n_vocab, max_initial_timestamp):
        self.tok = tok
        self.ts_begin = tok.timestamp_begin
        self.eot = tok.eot
        self.n_vocab = n_vocab
        self.max_initial = None if max_initial_timestamp is None else int(round(max_initial_timestamp / 0.02))

    def ranges(self, sampled):
        """Rules 2-4 for the next token, given the tokens sampled so far, as what they leave:
        (text_lo, ts_lo, ts_hi) -- text tokens from text_lo up to the first timestamp,
        timestamps from ts_lo up to ts_hi (kernels/pick.py takes these, with rule 5 on)."""
        b, n = self.ts_begin, self.n_vocab
        text_lo, ts_lo, ts_hi = 0, b, n
        last_ts = len(sampled) >= 1 and sampled[-1] >= b
        penult_ts = len(sampled) < 2 or sampled[-2] >= b
        if last_ts:
            if penult_ts:
                ts_lo = n                     # a pair just closed: text (or EOT) must follow
            else:
                text_lo = self.eot            # a segment is open: a timestamp (or EOT) must follow
        stamp = next((t for t in reversed(sampled) if t >= b), None)
        if stamp is not None:
            # the closing timestamp may repeat the last one; a new segment must move forward
            ts_lo = max(ts_lo, stamp if (last_ts and not penult_ts) else stamp + 1)
        if not sampled:
            text_lo = b
            if self.max_initial is not None:
                ts_hi = min(n, b + self.max_initial + 1)
        return text_lo, ts_lo, ts_hi

    def apply(self, logits, sampled):
        """Mask `logits` (host float32 (n_vocab,)) in place, given the tokens sampled so far."""
        b = self.ts_begin
        text_lo, ts_lo, ts_hi = self.ranges(sampled)
        logits[self.tok.no_timestamps] = NEG_INF
        logits[:text_lo] = NEG_INF
        logits[b:ts_lo] = NEG_INF
        logits[ts_hi:] = NEG_INF
        # log P(any timestamp) > max log P(text token): both sides share the normaliser, so
        # compare the timestamps' log-sum-exp with the largest text logit directly
        if log_normalizer(logits[b:]) > logits[:b].max():
            logits[:b] = NEG_INF


class HostFilters:
    """The logit filters on the host, for decoders that look at whole rows (beam, sampling):
    the suppressed tokens, suppress-at-begin, and the timestamp rules when enabled."""

    def __init__(self, decoder, options):
        self.always, self.begin = decoder.always, decoder.begin
        self.rules = (TimestampRules(decoder.tok, decoder.n_vocab, options.max_initial_timestamp)
                      if options.timestamps else None)

    def __call__(self, row, sampled):
        row[self.always] = NEG_INF
        if not sampled:
            row[self.begin] = NEG_INF
        if self.rules is not None:
            self.rules.apply(row, sampled)
        return row


def start_window(model, tok, enc, prompt):
    """Decode the prompt on a fresh one-row state; (state, device logits of the last position,
    no-speech probability read at <|startoftranscript|>)."""
    be = model.be
    state = model.new_state(enc)
    logits = model.decode(state, np.asarray(prompt, np.int32),
                          logits_for=(prompt.index(tok.sot), len(prompt) - 1))
    nsp = float("nan")
    if tok.no_speech is not None:
        nsp = float(np.exp(log_softmax(be.download(logits[0:1])[0])[tok.no_speech]))
    return state, logits[1:2], nsp


class GreedyDecoder:
    """Greedy decoding of one window on a `Whisper` model: the filters, the device's argmax."""

    def __init__(self, model, tok, ck):
        self.model, self.tok, self.be = model, tok, model.be
        self.n_vocab = model.dims.n_vocab
        always, begin = suppress_lists(ck, tok)
        self.always, self.begin = always, begin
        self._masks = {}
        self.rules = self.be.empty((4,), np.int32)
        self.choice = self.be.empty((2,), np.float32)
        self.rng = np.random.default_rng(0)     # sampling is reproducible run to run

    def mask(self, first, timestamps):
        """The suppressed tokens as an additive (1, n_vocab) mask on the device: `always`, and
        at the first step `begin`; with timestamps also <|notimestamps|> (rule 1)."""
        key = (first, timestamps)
        if key not in self._masks:
            mask = np.zeros((1, self.n_vocab), np.float32)
            mask[0, self.always] = NEG_INF
            if first:
                mask[0, self.begin] = NEG_INF
            if timestamps:
                mask[0, self.tok.no_timestamps] = NEG_INF
            self._masks[key] = self.be.upload(mask)
        return self._masks[key]

    def decode(self, enc, options: DecodingOptions, prompt=None, cancelled=None):
        """Decode one window whose encoder states are `enc` (on the device), greedily;
        cancelled() is asked before each step (True raises records.Cancelled)."""
        if prompt is None:
            prompt = build_prompt(self.tok, options, self.model.dims.is_multilingual)
        res = self.search(enc, options, prompt, cancelled)
        res.temperature = options.temperature
        res.text = self.tok.decode([t for t in res.tokens if t < self.tok.eot])
        return res

    def search(self, enc, options, prompt, cancelled=None):
        """The tokens of one window from its prompt: here the argmax at every step (search.py's
        WindowDecoder adds beam search and sampling)."""
        return self._greedy(enc, options, prompt, cancelled)

    def limit(self, options, prompt):
        """How many tokens a window may add after `prompt`."""
        return max(0, min(options.max_tokens, self.model.dims.n_text_ctx - len(prompt)))

    def _greedy(self, enc, options, prompt, cancelled):
        model = self.model
        limit = self.limit(options, prompt)
        rules = self._rules(options)
        state, last, nsp = start_window(model, self.tok, enc, prompt)
        result = DecodingResult(tokens=[], prompt=list(prompt), no_speech_prob=nsp)
        while len(result.tokens) < limit:
            stop_if(cancelled)
            t = self._pick(last, result, rules)
            if t is None:
                break
            last = model.decode(state, np.asarray([t], np.int32))
        return result

    def decode_windows(self, encs, options: DecodingOptions, prompt=None, cancelled=None):
        """Greedy decoding of several windows at once (transcribe's batch_size): for each, the
        result decode(enc, options) gives — its own prompt state, filters and rules — with
        every step's products run on all the windows' rows together (Whisper.decode_batch,
        the weights read once a step for all). A window that has ended rides along on
        end-of-text until the last one ends, its attentions skipped."""
        if options.temperature != 0 or (options.beam_size or 1) > 1:
            raise ValueError("decode_windows decodes greedily: temperature 0, no beams")
        tok, model = self.tok, self.model
        if prompt is None:
            prompt = build_prompt(tok, options, model.dims.is_multilingual)
        limit = self.limit(options, prompt)
        rules = self._rules(options)
        states, results, ids, open_ = [], [], [], []
        for enc in encs:     # each window's first token before the next prompt reuses the logits
            state, last, nsp = start_window(model, tok, enc, prompt)
            res = DecodingResult(tokens=[], prompt=list(prompt), no_speech_prob=nsp)
            t = self._pick(last, res, rules) if limit > 0 else None
            states.append(state)
            results.append(res)
            ids.append(tok.eot if t is None else t)
            open_.append(t is not None and len(res.tokens) < limit)
        batch = None
        while any(open_):
            stop_if(cancelled)
            batch = batch or model.new_window_batch(states)
            logits = model.decode_batch(batch, np.asarray(ids, np.int32), open_)
            for b, res in enumerate(results):
                t = self._pick(logits[b:b + 1], res, rules) if open_[b] else None
                open_[b] = t is not None and len(res.tokens) < limit
                ids[b] = tok.eot if t is None else t
        for res in results:
            res.temperature = options.temperature
            res.text = tok.decode([t for t in res.tokens if t < tok.eot])
        return results

    def _rules(self, options):
        return TimestampRules(self.tok, self.n_vocab, options.max_initial_timestamp) if options.timestamps else None

    def _pick(self, last, result, rules):
        """The next token of `result` from device logits `last` (1, n_vocab): the filters and
        the rules on the device, one (token, log-probability) back — the log-probability feeds
        avg_logprob (the no-speech skip, the fallback). Appended and returned; None at
        end-of-text (not appended)."""
        be, tok = self.be, self.tok
        whole = (0, tok.timestamp_begin, self.n_vocab, 0)    # no timestamps: any token, no rule 5
        allowed = whole if rules is None else rules.ranges(result.tokens) + (1,)
        be.write(self.rules, np.asarray(allowed, np.int32))
        K.pick(be, last, self.mask(not result.tokens, rules is not None), self.rules,
               tok.timestamp_begin, self.choice)
        t, logprob = be.download(self.choice).tolist()
        t = int(t)
        result.sum_logprob += logprob
        # t < 0: the filters left nothing (never on finite logits); its log-probability, -inf,
        # makes avg_logprob -inf, so the window falls back to a higher temperature
        if t == tok.eot or t < 0:
            return None
        result.tokens.append(t)
        return t


def detect_language(model, tok, enc):
    """({code: probability}, best code) from one decoder step on <|startoftranscript|>, the
    logits restricted to the language tokens (openai-whisper's detect_language)."""
    state = model.new_state(enc)
    row = model.be.download(model.decode(state, np.asarray([tok.sot], np.int32)))[0]
    codes, ids = zip(*tok.languages)
    lp = log_softmax(row[list(ids)])
    probs = {c: float(p) for c, p in zip(codes, np.exp(lp))}
    return probs, codes[int(np.argmax(lp))]
