"""From a recording to segments of text: 30 s windows and the two conventions.

The records it returns (Segment, Word, TranscriptionInfo) and its options are in records.py.

Whisper's encoder sees exactly 30 s (its positional embedding has 1500 rows), so a recording is
transcribed window by window. Two conventions, each chosen to match a reference exactly:

* Short-form (≤ 30 s), as Hugging Face transformers: the samples are zero-padded to 30 s, one
  window is decoded, with `<|notimestamps|>` unless timestamps were asked for.
* Long-form (> 30 s), as openai-whisper and faster-whisper: the log-mel of the whole recording,
  windows cut from it in the mel domain (the last one zero-padded in the normalised log-mel
  domain, not in samples), decoded WITH timestamp tokens, and the next window starts at the
  last complete timestamp — whether or not timestamps are printed. (A full window decoded with
  `<|notimestamps|>` can stop after one word; both peers avoid that this way.) The previous
  windows' tokens are given as the prompt (openai's condition_on_previous_text).
  `hallucination_silence_threshold` (openai's; with word timestamps) moves the next window's
  start past silences around text that looks made up, so it exists only in this loop: with it,
  a short recording is transcribed this way too.
"""

from __future__ import annotations

import collections
import dataclasses
import functools

import numpy as np

from . import mel as M
from .io.audio import Recording, SampleWindow
from .decoding import DecodingOptions, detect_language
from .records import Cancelled, Segment, TranscribeOptions, TranscriptionInfo
from .search import WindowDecoder
from .speech import Clock, on_recording_clock, speech_after
from .timing import add_word_timestamps
from .vad import regions

INPUT_STRIDE = 2                  # mel frames per encoder position (conv2 has stride 2)
TIME_PER_TOKEN = 0.02             # seconds per timestamp step: HOP · INPUT_STRIDE / SAMPLE_RATE
FRAME_SECONDS = M.HOP_LENGTH / M.SAMPLE_RATE   # 10 ms
FRAMES_PER_SECOND = M.SAMPLE_RATE // M.HOP_LENGTH   # 100 (seconds → frames as openai rounds them)
REST_S = 1.0   # s of a batched window's speech left after its last segment that is decoded again


@dataclasses.dataclass
class _Scan:
    """What the first pass over a recording finds: its length, its first 30 s (all of it when
    it is no longer), its log-mel's loudest frame and its energy detector's chunk probabilities."""
    n: int
    head: np.ndarray
    loudest: M.LoudestFrame
    energy: regions.ChunkProbs


def _scan(rec, n_mels):
    loudest, energy = M.LoudestFrame(n_mels), regions.ChunkProbs(regions.detector("energy"))
    head, n = [], 0
    for x in rec.pieces():
        if n <= M.N_SAMPLES:
            head.append(x[:M.N_SAMPLES + 1 - n])
        n += len(x)
        loudest.feed(x)
        energy.feed(x)
    return _Scan(n, np.concatenate(head), loudest, energy)


def _numbered(segments):
    """Segment ids count from 1 in the order they are returned (faster-whisper's convention)."""
    for i, s in enumerate(segments):
        s.id = i + 1
    return segments


class Transcriber:
    """Runs the window loop of one model; `transcribe(audio)` → (segments, TranscriptionInfo)."""

    def __init__(self, model, tok, ck):
        self.model, self.tok, self.ck = model, tok, ck
        self.decoder = WindowDecoder(model, tok, ck)
        self.n_frames = 2 * model.dims.n_audio_ctx

    def _language(self, enc, language):
        if not self.model.dims.is_multilingual:
            return "en", 1.0, None
        if language:
            self.tok.language_id(language)          # validates the code, naming it if unknown
            return language, 1.0, None
        probs, best = detect_language(self.model, self.tok, enc)
        return best, probs[best], probs

    def transcribe(self, audio, options: TranscribeOptions | None = None, progress=None,
                   on_segments=None, cancelled=None, **kw):
        """audio: 16 kHz float32 samples, or an io.audio.Recording (a file read in passes, never
        held whole) → (an iterator of the segments as they are decoded, TranscriptionInfo).
        options (or the same names as keywords). The info is ready when this returns (the
        first window is encoded and its language known); each later window is decoded as the
        iterator is read. progress(done_s, total_s) is called after every long-form window;
        on_segments(new) with each window's new segments (their times on this audio's clock);
        cancelled() between the encoder's layers and after each pass: True raises Cancelled
        (no decoding follows)."""
        opts = options or TranscribeOptions()
        if kw:
            opts = dataclasses.replace(opts, **kw)      # checked again by __post_init__
        if opts.batch_size > 1:         # the speech is held, as with vad
            samples = (np.concatenate(list(audio.pieces())) if isinstance(audio, Recording)
                       else np.asarray(audio, np.float32))
            chunks = self._batched(samples, opts, progress, on_segments, cancelled)
            return chunks, next(chunks)
        if isinstance(audio, Recording):
            scan = _scan(audio, self.model.dims.n_mels)
            samples = scan.head if scan.n <= M.N_SAMPLES else None
        else:
            samples, scan = np.asarray(audio, np.float32), None
        n = scan.n if scan else len(samples)     # the long form reads a Recording a second time
        duration = n / M.SAMPLE_RATE
        if opts.audio_ctx is not None:
            ctx = self.model.dims.n_audio_ctx
            if not 1 <= opts.audio_ctx <= ctx:
                raise ValueError(f"audio_ctx must be in 1..{ctx}, not {opts.audio_ctx}")
            if n > opts.audio_ctx * INPUT_STRIDE * M.HOP_LENGTH or opts.hallucination_silence_threshold is not None:
                raise ValueError(f"audio_ctx {opts.audio_ctx} holds {opts.audio_ctx * TIME_PER_TOKEN:g} s: "
                                 f"too short for {duration:.2f} s of audio (a shorter context is for one short window)")
        if opts.audio_ctx is not None or (n <= M.N_SAMPLES and opts.hallucination_silence_threshold is None):
            segments, info = self._short_form(samples, duration, opts, on_segments, cancelled)
            return iter(segments), info
        rec = audio if isinstance(audio, Recording) else Recording(samples)
        windows = self._long_form(rec, scan or _scan(rec, self.model.dims.n_mels), opts, progress, on_segments,
                                  cancelled)
        return windows, next(windows)

    @staticmethod
    def _check(cancelled):
        if cancelled is not None and cancelled():
            raise Cancelled()

    # ------------------------------------------------------------------ one window, with fallback
    def _decode(self, enc, opts, lang, timestamps, prompt=(), first=None):
        """openai's decode_with_fallback: at each temperature, decode; fall back to the next when
        the text is too repetitive (compression ratio) or too improbable (avg log-prob) — unless
        the model says the window is silence. All failing, the last result is kept. first: the
        result at the first temperature, decoded already (a batch of windows, greedily)."""
        res = None
        for i, t in enumerate(opts.temperature):
            if i == 0 and first is not None:
                res = first
            else:
                res = self._decode_at(enc, opts, lang, timestamps, prompt, t)
            too_repetitive = (opts.compression_ratio_threshold is not None
                              and res.compression_ratio > opts.compression_ratio_threshold)
            too_improbable = (opts.logprob_threshold is not None and res.avg_logprob < opts.logprob_threshold)
            silence = (self._no_speech_gate(opts) and res.no_speech_prob > opts.no_speech_threshold)
            if silence and too_improbable:
                break
            if not too_repetitive and not too_improbable:
                break
        return res

    def _decode_at(self, enc, opts, lang, timestamps, prompt, t):
        return self.decoder.decode(enc, self._options(opts, lang, timestamps, prompt, t))

    @staticmethod
    def _options(opts, lang, timestamps, prompt, t):
        """The DecodingOptions of a window decoded at temperature t."""
        return DecodingOptions(task=opts.task, language=lang, max_tokens=opts.max_tokens,
                               timestamps=timestamps, prompt=tuple(prompt), temperature=t,
                               beam_size=opts.beam_size if t == 0 else None,
                               best_of=opts.best_of if t > 0 else None, patience=opts.patience)

    def _initial_prompt(self, opts):
        """openai's initial_prompt: the tokens of ' ' + text, as if the audio before had said it."""
        if not opts.initial_prompt or not opts.initial_prompt.strip():
            return ()
        return tuple(self.tok.encode(" " + opts.initial_prompt.strip()))[-(self.model.dims.n_text_ctx // 2 - 1):]

    @staticmethod
    def _no_speech_gate(opts):
        return opts.no_speech_threshold is not None and opts.no_speech_threshold < 1

    def _is_silence(self, res, opts, speech=None, span=None):
        """Skip this window? The model is at least `no_speech_threshold` sure it holds no speech,
        and that is confirmed: by the text it wrote anyway being improbable (openai's rule: a
        confident transcript survives a high no-speech probability), or by the signal — no
        speech region of the energy detector (speech(): the recording's) within the window's
        samples `span`. The second is what keeps "Thank you." out of a silence: the model
        writes it there with an average log-probability well above −1."""
        if not self._no_speech_gate(opts) or not (res.no_speech_prob >= opts.no_speech_threshold):
            return False
        if opts.logprob_threshold is None or res.avg_logprob < opts.logprob_threshold:
            return True
        if speech is None:
            return False
        a, b = span
        return not any(r0 < b and r1 > a for r0, r1 in speech())

    # ------------------------------------------------------------------ the two conventions
    def _short_form(self, audio, duration, opts, on_segments=None, cancelled=None):
        n_frames = INPUT_STRIDE * opts.audio_ctx if opts.audio_ctx else self.n_frames
        enc = self._encode(audio, n_frames, cancelled)
        lang, lang_p, probs = self._language(enc, opts.language)
        info = TranscriptionInfo(lang, lang_p, duration, probs)
        res = self._decode(enc, opts, lang, opts.timestamps, self._initial_prompt(opts))
        segments = _numbered(self._window_segments(audio, duration, enc, res, opts, lang, n_frames))
        if on_segments and segments:
            on_segments(segments)
        return segments, info

    def _encode(self, audio, n_frames, cancelled=None):
        """The encoder states of samples `audio` zero-padded to n_frames of log-mel."""
        enc = self.model.encode(M.log_mel(audio, self.model.dims.n_mels, n_frames), cancelled)
        self._check(cancelled)
        return enc

    def _window_segments(self, audio, duration, enc, res, opts, lang, n_frames):
        """The segments of one short window `audio` of `duration` s decoded as `res` (none
        when it is silence), with word timings when asked for; ids not yet numbered."""
        speech = functools.partial(regions.speech_regions, audio, regions.detector("energy"))
        if self._is_silence(res, opts, speech, (0, len(audio))):
            return []
        if opts.timestamps:
            segments = self._split(res, 0, 0.0, n_frames, 0)[0]
        else:
            segments = [self._segment(0, 0, 0.0, duration, res.tokens, res)]
        segments = [s for s in segments if s.text.strip()]
        if opts.word_timestamps and segments:
            n_content = min(n_frames, len(audio) // M.HOP_LENGTH)
            add_word_timestamps(self, segments, enc, lang, opts, n_content, 0.0, 0.0)
        return segments

    def _batched(self, samples, opts, progress=None, on_segments=None, cancelled=None):
        """batch_size > 1: the speech (Silero) packed into chunks of at most 30 s
        (regions.speech_chunks), each chunk's regions joined and decoded as its own short
        window (no previous text), batch_size windows at a time (GreedyDecoder.decode_windows),
        with timestamp tokens whether or not they are printed (as the long form: a full window
        decoded with <|notimestamps|> can stop after a few words); a window whose greedy text
        fails the fallback thresholds is decoded again alone at the next temperatures, as it
        would be alone. Where a window's last segment ends more than REST_S before its speech
        does (the model ended early: a chunk joins unrelated answers), the rest of its speech
        is queued as a window of its own, as the long form would seek on. Segment and word
        times are on the recording's clock, in order; progress(done_s, total_s) after each
        batch. Yields the TranscriptionInfo (the language of the first window, unless given),
        then the segments."""
        sr, n_frames = M.SAMPLE_RATE, self.n_frames
        opts = dataclasses.replace(opts, timestamps=True)   # printed or not, as the long form
        chunks = regions.speech_chunks(samples, regions.detector("silero"))
        pad_s = regions.SILERO.speech_pad_ms / 1000
        info = TranscriptionInfo(opts.language or "en", 1.0, len(samples) / sr)
        info.speech_regions = [(round(a / sr, 3), round(b / sr, 3)) for c in chunks for a, b in c]
        info.duration_after_vad = sum(b - a for c in chunks for a, b in c) / sr
        queue = collections.deque(((i,), c) for i, c in enumerate(chunks))
        waiting, done = {key for key, _ in queue}, {}   # windows not yet decoded; decoded ones
        lang, prompt, n = None, self._initial_prompt(opts), 0
        while queue:
            group = [queue.popleft() for _ in range(min(opts.batch_size, len(queue)))]
            windows = [(np.concatenate([samples[a:b] for a, b in c]), Clock(c, sr, pad_s)) for _, c in group]
            encs = [self._encode(x, n_frames, cancelled) for x, _ in windows]
            if lang is None:
                lang, lang_p, probs = self._language(encs[0], opts.language)
                info.language, info.language_probability, info.all_language_probs = lang, lang_p, probs
                yield info
            greedy = self._options(opts, lang, opts.timestamps, prompt, opts.temperature[0])
            results = self.decoder.decode_windows(encs, greedy)
            rests = []
            for (key, spans), (x, clock), enc, res in zip(group, windows, encs, results):
                res = self._decode(enc, opts, lang, opts.timestamps, prompt, first=res)
                segments = self._window_segments(x, len(x) / sr, enc, res, opts, lang, n_frames)
                if segments and len(x) / sr - segments[-1].end > REST_S:
                    rest = speech_after(spans, clock, segments[-1].end)
                    if sum(b - a for a, b in rest) > REST_S * sr:
                        rests.append((key + (1,), rest))
                        waiting.add(key + (1,))
                done[key] = list(on_recording_clock(segments, clock))
                waiting.discard(key)
            queue.extendleft(reversed(rests))
            for key in sorted(k for k in done if not waiting or k < min(waiting)):
                segments = done.pop(key)
                for s in segments:
                    n += 1
                    s.id = n
                if on_segments and segments:
                    on_segments(segments)
                yield from segments
            if progress:
                ahead = min((c[0][0] for k, c in queue), default=len(samples))
                progress(round(ahead / sr, 3), len(samples) / sr)
        if lang is None:
            yield info

    def _long_form(self, rec, scan, opts, progress=None, on_segments=None, cancelled=None):
        """A generator: first the TranscriptionInfo (once the first window is encoded), then
        each window's segments as they are decoded. The log-mel is the whole recording's
        (normalised by its loudest frame, which `scan` found), read window by window from a
        second pass over `rec`; only the content frames count: the last window is zero-padded
        in the normalised log-mel domain (mel.pad_frames' rule), as both peers cut it — not
        filled with the log-mel of the silence after the audio (≈ −0.67 there), which the
        model reads differently."""
        content, duration = scan.n // M.HOP_LENGTH, scan.n / M.SAMPLE_RATE
        mel = M.LogMelWindows(SampleWindow(rec.pieces()), scan.n, scan.loudest.finish(content + 1),
                              self.model.dims.n_mels)
        speech = functools.lru_cache(maxsize=1)(lambda: regions.regions_from_probs(
            scan.energy.finish(), scan.n, regions.ENERGY))
        seek, n_out, history = 0, 0, list(self._initial_prompt(opts))
        prompt_reset = 0
        lang = None
        last_speech = 0.0
        while seek < content:
            size = min(self.n_frames, content - seek)
            enc = self.model.encode(mel.window(seek, self.n_frames), cancelled)
            self._check(cancelled)
            if lang is None:
                lang, lang_p, probs = self._language(enc, opts.language)
                yield TranscriptionInfo(lang, lang_p, duration, probs)
            ctx = history[prompt_reset:]
            prompt = tuple(ctx[-(self.model.dims.n_text_ctx // 2 - 1):]) if ctx else ()
            res = self._decode(enc, opts, lang, True, prompt)
            offset = seek * FRAME_SECONDS
            if self._is_silence(res, opts, speech, (seek * M.HOP_LENGTH, (seek + size) * M.HOP_LENGTH)):
                seek += size            # the model is sure this window holds no speech
                if progress:
                    progress(min(seek, content) * FRAME_SECONDS, duration)
                continue
            new, advance = self._split(res, seek, offset, size, n_out)
            next_seek = seek + advance
            if opts.word_timestamps:
                add_word_timestamps(self, new, enc, lang, opts, size, offset, last_speech)
                single_ending = (len(res.tokens) >= 2 and res.tokens[-1] >= self.tok.timestamp_begin
                                 and res.tokens[-2] < self.tok.timestamp_begin)
                end = _last_word_end(new)
                if not single_ending and end is not None and end > offset:
                    next_seek = round(end * FRAMES_PER_SECOND)
                if opts.hallucination_silence_threshold is not None:
                    next_seek, new = _skip_hallucinations(new, opts.hallucination_silence_threshold, seek, size,
                                                          self.n_frames, content, single_ending, next_seek,
                                                          last_speech)
                end = _last_word_end(new) if new is not None else None
                if end is not None:
                    last_speech = end
            seek = max(next_seek, seek + 1)     # a window must move on, whatever the model wrote
            if progress:
                progress(min(seek, content) * FRAME_SECONDS, duration)
            if new is None:                     # the whole window was a hallucination in a silence
                continue
            new = [s for s in new if s.text.strip() and s.end > s.start]   # empty ones are dropped,
            for s in new:                                                  # and condition nothing
                history.extend(s.tokens)
                n_out += 1
                s.id = n_out
            if on_segments and new:
                on_segments(new)
            yield from new
            if not opts.condition_on_previous_text or res.temperature > 0.5:
                prompt_reset = len(history)
        if lang is None:            # no whole frame of audio: nothing was encoded
            yield TranscriptionInfo(opts.language or "en", 1.0, duration)

    def _split(self, res, seek, offset, size, n0):
        """Cut a window's tokens into segments at consecutive timestamp pairs; return them and
        how many mel frames the next window advances (openai-whisper's rules)."""
        b = self.tok.timestamp_begin
        toks = res.tokens
        is_ts = [t >= b for t in toks]
        single_ending = len(toks) >= 2 and not is_ts[-2] and is_ts[-1]
        pairs = [i + 1 for i in range(len(toks) - 1) if is_ts[i] and is_ts[i + 1]]
        segs = []
        if pairs:
            cuts = pairs + ([len(toks)] if single_ending else [])
            last = 0
            for cut in cuts:
                piece = toks[last:cut]
                start = offset + (piece[0] - b) * TIME_PER_TOKEN
                end = offset + (piece[-1] - b) * TIME_PER_TOKEN
                segs.append(self._segment(n0 + len(segs), seek, start, end, piece, res))
                last = cut
            advance = size if single_ending else (toks[last - 1] - b) * INPUT_STRIDE
            if advance <= 0:        # a window must move on, whatever the model wrote
                advance = size
        else:
            end = offset + size * FRAME_SECONDS
            stamps = [t for t in toks if t >= b]
            if stamps and stamps[-1] != b:
                end = offset + (stamps[-1] - b) * TIME_PER_TOKEN
            segs.append(self._segment(n0, seek, offset, end, toks, res))
            advance = size
        return segs, advance

    def _segment(self, i, seek, start, end, tokens, res):
        text = self.tok.decode([t for t in tokens if t < self.tok.eot])
        return Segment(id=i, seek=seek, start=round(start, 3), end=round(end, 3), text=text,
                       tokens=list(tokens), avg_logprob=res.avg_logprob, no_speech_prob=res.no_speech_prob,
                       temperature=res.temperature, compression_ratio=res.compression_ratio)


# ---------------------------------------------------------------------------------------------
# hallucination_silence_threshold: openai-whisper's rules (its transcribe.py, learnt from it), on
# the word timings of one window. Times are on the recording's clock; seeks are in mel frames.

PUNCTUATION = TranscribeOptions.prepend_punctuations + TranscribeOptions.append_punctuations


def _last_word_end(segments):
    """The end of the last word of the window, or of its last segment if it has no words
    (openai's get_end); None for no segments."""
    ends = [w.end for s in segments for w in (s.words or [])]
    if ends:
        return ends[-1]
    return segments[-1].end if segments else None


def _word_anomaly(w):
    """How unlike a spoken word `w` is: improbable (p < 0.15), far too short (< 0.133 s) or too
    long (> 2 s) — the marks of text the model made up."""
    score = 1.0 if w.probability < 0.15 else 0.0
    d = w.end - w.start
    if d < 0.133:
        score += (0.133 - d) * 15
    if d > 2.0:
        score += d - 2.0
    return score


def _is_anomaly(seg):
    """A segment whose first 8 words (punctuation aside) are mostly anomalous: score ≥ 3, or
    about one per word. (A word counts as punctuation when it is a substring of PUNCTUATION:
    openai's test, kept as it is.)"""
    if seg is None or not seg.words:
        return False
    words = [w for w in seg.words if w.word not in PUNCTUATION][:8]
    score = sum(_word_anomaly(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def _skip_hallucinations(segs, threshold, seek, size, n_frames, content, single_ending, next_seek, last_speech):
    """openai's hallucination_silence_threshold for one decoded window (segments with words):
    (next seek, segments to keep — None to drop the whole window).

    * After a window that ends in speech, the next starts at the last word when more than
      `threshold` s of the 30 s window follow it, else at the window's end.
    * A first segment that looks made up, after more than `threshold` s of silence: the window
      is dropped and decoding restarts at that segment (the silence before it is skipped).
    * Any segment that looks made up and has silence (> threshold, or the recording's or
      window's edge) or other made-up text on both sides: it and what follows are dropped, and
      the next window starts at it (at least 1 s on); if the recording ends within `threshold`
      after it, decoding stops."""
    offset = seek * FRAME_SECONDS
    window_end = (seek + n_frames) * FRAME_SECONDS
    if not single_ending:
        end = _last_word_end(segs)
        if end is not None and end > offset:
            next_seek = round(end * FRAMES_PER_SECOND) if window_end - end > threshold else seek + size
    worded = [s for s in segs if s.words]
    if worded and _is_anomaly(worded[0]):
        gap = worded[0].start - offset
        if gap > threshold:
            return seek + round(gap * FRAMES_PER_SECOND), None
    last_end = last_speech
    for i, s in enumerate(segs):
        if not s.words:
            continue
        if _is_anomaly(s):
            following = next((t for t in segs[i + 1:] if t.words), None)
            next_start = following.words[0].start if following else offset + size * FRAME_SECONDS
            silence_before = s.start - last_end > threshold or s.start < threshold or s.start - offset < 2.0
            silence_after = (next_start - s.end > threshold or _is_anomaly(following)
                             or window_end - s.end < 2.0)
            if silence_before and silence_after:
                next_seek = round(max(offset + 1, s.start) * FRAMES_PER_SECOND)
                if content * FRAME_SECONDS - s.end < threshold:
                    next_seek = content
                return next_seek, segs[:i]
        last_end = s.end
    return next_seek, segs
