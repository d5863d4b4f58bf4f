"""From a recording to segments of text: the window loop, and its two conventions.

The records it returns (Segment, Word, TranscriptionInfo) and its options are in records.py; what
it reads — the recording, its speech joined, or its speech in chunks — is a sources.Source.

Whisper's encoder sees exactly 30 s (its positional embedding has 1500 rows), so a recording is
transcribed window by window. Two conventions, each chosen to match a reference exactly:

* Short-form (≤ 30 s), as Hugging Face transformers: the samples are zero-padded to 30 s, one
  window is decoded, with `<|notimestamps|>` unless timestamps were asked for. A batched
  source's chunks are short windows too, decoded batch_size at a time.
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
from .alignment_heads import alignment_heads
from .decoding import DecodingOptions, detect_language
from .hallucination import last_word_end, skip_hallucinations
from .io.audio import SampleWindow
from .mel import FRAME_SECONDS, FRAMES_PER_SECOND
from .records import Segment, TranscribeOptions, TranscriptionInfo, stop_if
from .search import WindowDecoder
from .sources import Source, requeue
from .timing import Aligner, add_word_timestamps
from .vad import regions

INPUT_STRIDE = 2                  # mel frames per encoder position (conv2 has stride 2)
TIME_PER_TOKEN = 0.02             # seconds per timestamp step: HOP · INPUT_STRIDE / SAMPLE_RATE


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


@dataclasses.dataclass
class _Run:
    """One transcription across its source's pieces: the options and hooks, the info (made once
    the first window is encoded and its language known) and how many segments went out."""
    source: Source
    opts: TranscribeOptions
    progress: object
    on_segments: object
    cancelled: object
    duration: float | None = None
    info: TranscriptionInfo | None = None
    n: int = 0

    def make_info(self, language, probability=1.0, probs=None):
        info = TranscriptionInfo(language, probability, self.duration, probs)
        if self.source.speech_regions is not None:
            info.speech_regions = self.source.speech_regions
            info.duration_after_vad = self.source.duration_after_vad
        return info

    def emit(self, segments, clock):
        """A piece's new segments, moved to the recording's clock and numbered from 1 in the
        order they go out (faster-whisper's convention); on_segments hears of them."""
        if clock is not None:
            clock.place(segments)
        for s in segments:
            self.n += 1
            s.id = self.n
        if self.on_segments and segments:
            self.on_segments(segments)
        return segments


class Transcriber:
    """Runs the window loop of one model: `transcribe(source, options)` → (segments, info)."""

    def __init__(self, model, tok, ck):
        self.model, self.tok = model, tok
        self.decoder = WindowDecoder(model, tok, ck)
        self.aligner = Aligner(model, tok, alignment_heads(ck, model.dims))
        self.n_frames = 2 * model.dims.n_audio_ctx

    def transcribe(self, source, options=None, progress=None, on_segments=None, cancelled=None):
        """source: a sources.Source → (an iterator of the segments as they are decoded, on the
        recording's clock, TranscriptionInfo). The info is ready when this returns (the first
        window is encoded and its language known); each window is decoded as the iterator is
        read. progress(done_s, total_s) is called after every long-form window and every batch of
        chunks; on_segments(new) with each window's new segments; cancelled() between the
        encoder's layers, after each pass and before each decoder step: True raises Cancelled
        (a stale speculative final stops within a step, not after a window of tokens)."""
        opts = options or TranscribeOptions()
        if source.chunked:          # printed or not, as the long form: see _decode_windows
            opts = dataclasses.replace(opts, timestamps=True)
        run = self._run(_Run(source, opts, progress, on_segments, cancelled, source.duration))
        return run, next(run)

    def _run(self, run):
        """The loop over the source's pieces: a generator of the TranscriptionInfo, then the
        segments. A piece longer than one window goes through the long form; short pieces are
        decoded as one window each, batch_size at a time. A chunk's rest rides in the window of
        a chunk of the next batch that has room for it (sources.requeue), so segments go out in
        the recording's order: each once no speech before it is still queued."""
        opts, told = run.opts, False
        queue = collections.deque(run.source.pieces)
        held = []                               # placed segments waiting for earlier speech
        while queue:
            piece = queue[0]
            scan = None
            if piece.samples is None:           # a file: its length and loudness first
                scan = _scan(piece.recording, self.model.dims.n_mels)
                run.duration = run.duration if run.duration is not None else scan.n / M.SAMPLE_RATE
            if not self._one_window(opts, scan.n if scan else len(piece.samples)):
                queue.popleft()
                for new in self._long_form(run, piece, scan or _scan(piece.recording, self.model.dims.n_mels)):
                    if not told and run.info is not None:
                        told = True
                        yield run.info
                    yield from run.emit(new, piece.clock)
                continue
            if scan is not None:
                queue[0] = dataclasses.replace(piece, samples=scan.head)
            group = [queue.popleft() for _ in range(min(opts.batch_size, len(queue)))]
            encs = self._encode_windows(run, group)
            if not told:
                told = True
                yield run.info
            for piece, new in self._decode_windows(run, group, encs):
                rest = piece.rest(new[-1].end) if new else None
                if rest is not None:
                    requeue(queue, rest, opts.batch_size)
                held += piece.clock.place(new) if piece.clock else new
            ahead = min((p.spans[0][0] for p in queue if p.spans), default=None)
            held.sort(key=lambda s: s.start)
            ready = len(held) if ahead is None else sum(s.start < ahead / M.SAMPLE_RATE for s in held)
            yield from run.emit(held[:ready], None)
            del held[:ready]
            if run.progress and run.source.chunked:
                at = ahead if ahead is not None else len(group[0].full)
                run.progress(round(at / M.SAMPLE_RATE, 3), run.duration)
        if not told:                # no speech, or no whole frame of audio: nothing was encoded
            yield run.make_info(opts.language or "en")

    def _one_window(self, opts, n):
        """Is a piece of n samples decoded as one window (short form)? audio_ctx is checked here."""
        if opts.audio_ctx is not None:
            ctx = self.model.dims.n_audio_ctx
            if not 1 <= opts.audio_ctx <= ctx:
                raise ValueError(f"audio_ctx must be in 1..{ctx}, not {opts.audio_ctx}")
            if n > opts.audio_ctx * INPUT_STRIDE * M.HOP_LENGTH or opts.hallucination_silence_threshold is not None:
                raise ValueError(f"audio_ctx {opts.audio_ctx} holds {opts.audio_ctx * TIME_PER_TOKEN:g} s: "
                                 f"too short for {n / M.SAMPLE_RATE:.2f} s of audio (a shorter context is for "
                                 f"one short window)")
            return True
        return n <= M.N_SAMPLES and opts.hallucination_silence_threshold is None

    def _language(self, run, enc):
        """The run's language: given, or detected from its first window (the info is made then)."""
        if run.info is None:
            language = run.opts.language
            if not self.model.dims.is_multilingual:
                run.info = run.make_info("en")
            elif language:
                self.tok.language_id(language)          # validates the code, naming it if unknown
                run.info = run.make_info(language)
            else:
                probs, best = detect_language(self.model, self.tok, enc)
                run.info = run.make_info(best, probs[best], probs)
        return run.info.language

    # ------------------------------------------------------------------ one window, with fallback
    def _decode(self, enc, opts, lang, timestamps, prompt=(), first=None, cancelled=None):
        """openai's decode_with_fallback: at each temperature, decode; fall back to the next when
        the text is too repetitive (compression ratio) or too improbable (avg log-prob) — unless
        the model says the window is silence. All failing, the last result is kept. first: the
        result at the first temperature, decoded already (a batch of windows, greedily).
        cancelled(): asked before every decoder step (True raises Cancelled)."""
        res = None
        for i, t in enumerate(opts.temperature):
            if i == 0 and first is not None:
                res = first
            else:
                res = self._decode_at(enc, opts, lang, timestamps, prompt, t, cancelled)
            too_repetitive = (opts.compression_ratio_threshold is not None
                              and res.compression_ratio > opts.compression_ratio_threshold)
            too_improbable = (opts.logprob_threshold is not None and res.avg_logprob < opts.logprob_threshold)
            silence = (self._no_speech_gate(opts) and res.no_speech_prob > opts.no_speech_threshold)
            if silence and too_improbable:
                break
            if not too_repetitive and not too_improbable:
                break
        return res

    def _decode_at(self, enc, opts, lang, timestamps, prompt, t, cancelled=None):
        return self.decoder.decode(enc, self._options(opts, lang, timestamps, prompt, t),
                                   cancelled=cancelled)

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

    def _prompt(self, opts, previous):
        """What follows <|startofprev|>: the hotwords (every window; faster-whisper's: ' ' + text,
        at most n_text_ctx // 2 - 1 tokens), then the previous text's last n_text_ctx // 2 - 1."""
        half = self.model.dims.n_text_ctx // 2
        hot = ()
        if opts.hotwords and opts.hotwords.strip():
            hot = tuple(self.tok.encode(" " + opts.hotwords.strip()))
            hot = hot[:half - 1] if len(hot) >= half else hot
        return hot + tuple(previous[-(half - 1):])

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

    # ------------------------------------------------------------------ short pieces: a window each
    def _encode_windows(self, run, group):
        """The encoder states of short pieces, each zero-padded to one window (audio_ctx's, when
        given); the run's language is known after the first."""
        n_frames = self._window_frames(run.opts)
        encs = [self._encode(piece.samples, n_frames, run.cancelled) for piece in group]
        self._language(run, encs[0])
        return encs

    def _window_frames(self, opts):
        return INPUT_STRIDE * opts.audio_ctx if opts.audio_ctx else self.n_frames

    def _decode_windows(self, run, group, encs):
        """(piece, its segments) for short pieces, each decoded as its own window with the initial
        prompt. A batched source's chunks are decoded together greedily
        (GreedyDecoder.decode_windows), with timestamp tokens whether or not they are printed (as
        the long form: a full window decoded with <|notimestamps|> can stop after a few words); a
        window whose greedy text fails the fallback thresholds is decoded again alone at the next
        temperatures, as it would be alone."""
        opts, lang = run.opts, run.info.language
        prompt, n_frames = self._prompt(opts, self._initial_prompt(opts)), self._window_frames(opts)
        firsts = [None] * len(group)
        if run.source.chunked:
            greedy = self._options(opts, lang, opts.timestamps, prompt, opts.temperature[0])
            firsts = self.decoder.decode_windows(encs, greedy, cancelled=run.cancelled)
        for piece, enc, first in zip(group, encs, firsts):
            res = self._decode(enc, opts, lang, opts.timestamps, prompt, first, run.cancelled)
            yield piece, self._window_segments(piece.samples, enc, res, opts, lang, n_frames)

    def _encode(self, audio, n_frames, cancelled=None):
        """The encoder states of samples `audio` zero-padded to n_frames of log-mel."""
        enc = self.model.encode(M.log_mel(audio, self.model.dims.n_mels, n_frames), cancelled)
        stop_if(cancelled)
        return enc

    def _window_segments(self, audio, enc, res, opts, lang, n_frames):
        """The segments of one short window `audio` decoded as `res` (none when it is silence),
        with word timings when asked for."""
        speech = functools.partial(regions.speech_regions, audio, regions.detector("energy"))
        if self._is_silence(res, opts, speech, (0, len(audio))):
            return []
        if opts.timestamps:
            segments = self._split(res, 0, 0.0, n_frames)[0]
        else:
            segments = [self._segment(0, 0.0, len(audio) / M.SAMPLE_RATE, res.tokens, res)]
        segments = [s for s in segments if s.text.strip()]
        if opts.word_timestamps and segments:
            n_content = min(n_frames, len(audio) // M.HOP_LENGTH)
            add_word_timestamps(self.aligner, segments, enc, lang, opts, n_content, 0.0, 0.0)
        return segments

    # ------------------------------------------------------------------ long pieces: the seek loop
    def _long_form(self, run, piece, scan):
        """A generator of each window's new segments (on the piece's clock), and [] first once the
        first window is encoded. The log-mel is the whole piece's (normalised by its loudest
        frame, which `scan` found), read window by window from a second pass over its recording;
        only the content frames count: the last window is zero-padded in the normalised log-mel
        domain (mel.pad_frames' rule), as both peers cut it — not filled with the log-mel of the
        silence after the audio (≈ −0.67 there), which the model reads differently."""
        opts = run.opts
        content, duration = scan.n // M.HOP_LENGTH, scan.n / M.SAMPLE_RATE
        mel = M.LogMelWindows(SampleWindow(piece.recording.pieces()), scan.n, scan.loudest.finish(content + 1),
                              self.model.dims.n_mels)
        speech = functools.lru_cache(maxsize=1)(lambda: regions.regions_from_probs(
            scan.energy.finish(), scan.n, regions.ENERGY))
        seek, history = 0, list(self._initial_prompt(opts))
        prompt_reset = 0
        last_speech = 0.0
        while seek < content:
            size = min(self.n_frames, content - seek)
            enc = self.model.encode(mel.window(seek, self.n_frames), run.cancelled)
            stop_if(run.cancelled)
            if run.info is None:
                self._language(run, enc)
                yield []
            lang = run.info.language
            prompt = self._prompt(opts, history[prompt_reset:])
            res = self._decode(enc, opts, lang, True, prompt, cancelled=run.cancelled)
            offset = seek * FRAME_SECONDS
            if self._is_silence(res, opts, speech, (seek * M.HOP_LENGTH, (seek + size) * M.HOP_LENGTH)):
                seek += size            # the model is sure this window holds no speech
                if run.progress:
                    run.progress(min(seek, content) * FRAME_SECONDS, duration)
                continue
            new, advance = self._split(res, seek, offset, size)
            next_seek = seek + advance
            if opts.word_timestamps:
                add_word_timestamps(self.aligner, new, enc, lang, opts, size, offset, last_speech)
                single_ending = (len(res.tokens) >= 2 and res.tokens[-1] >= self.tok.timestamp_begin
                                 and res.tokens[-2] < self.tok.timestamp_begin)
                end = last_word_end(new)
                if not single_ending and end is not None and end > offset:
                    next_seek = round(end * FRAMES_PER_SECOND)
                if opts.hallucination_silence_threshold is not None:
                    next_seek, new = skip_hallucinations(new, opts.hallucination_silence_threshold, seek, size,
                                                         self.n_frames, content, single_ending, next_seek,
                                                         last_speech)
                end = last_word_end(new) if new is not None else None
                if end is not None:
                    last_speech = end
            seek = max(next_seek, seek + 1)     # a window must move on, whatever the model wrote
            if run.progress:
                run.progress(min(seek, content) * FRAME_SECONDS, duration)
            if new is None:                     # the whole window was a hallucination in a silence
                continue
            new = [s for s in new if s.text.strip() and s.end > s.start]   # empty ones are dropped,
            for s in new:                                                  # and condition nothing
                history.extend(s.tokens)
            yield new
            if not opts.condition_on_previous_text or res.temperature > 0.5:
                prompt_reset = len(history)

    def _split(self, res, seek, offset, size):
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
                segs.append(self._segment(seek, start, end, piece, res))
                last = cut
            advance = size if single_ending else (toks[last - 1] - b) * INPUT_STRIDE
            if advance <= 0:        # a window must move on, whatever the model wrote
                advance = size
        else:
            end = offset + size * FRAME_SECONDS
            stamps = [t for t in toks if t >= b]
            if stamps and stamps[-1] != b:
                end = offset + (stamps[-1] - b) * TIME_PER_TOKEN
            segs.append(self._segment(seek, offset, end, toks, res))
            advance = size
        return segs, advance

    def _segment(self, seek, start, end, tokens, res):
        """A segment of `tokens`, numbered when it goes out (_Run.emit)."""
        text = self.tok.decode([t for t in tokens if t < self.tok.eot])
        return Segment(id=0, seek=seek, start=round(start, 3), end=round(end, 3), text=text,
                       tokens=list(tokens), avg_logprob=res.avg_logprob, no_speech_prob=res.no_speech_prob,
                       temperature=res.temperature, compression_ratio=res.compression_ratio)
