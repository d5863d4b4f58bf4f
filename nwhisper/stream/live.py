"""One live stream: audio in, utterances out — the endpointer's events turned into model jobs.

    live = LiveStream(door, settings, send, language=None, max_tokens=…, tail_ms=None)
    live.configure(settings, lead_ms=None, prompt=None)   # new settings, any time
    live.feed(samples)          # float32 at settings.rate, any length (on the event loop)
    live.end()                  # the client says the utterance is over: transcribe it now
    live.reset()                # forget the open utterance (returns its seg, or None)
    await live.settled()        # every utterance closed so far has had its final sent
    live.close()                # the connection went: nothing it queued runs

`door` is the model's (door.py: submit, abandon). `send(message)` gets the stream's messages as
dicts: final, partial, start, level, error. With `report_closes` (a dialect whose every
utterance needs a commit and a transcript) it also gets {"type": "close", seg, t0, t1} the moment
an utterance closes, and a final for every closed utterance, an empty or dropped one included.
Each dialect (the seed WebSocket, OpenAI Realtime, Wyoming) translates these; none reaches past
this interface.

With `turns=False` nothing is cut (OpenAI's turn_detection null): the audio accumulates, and
`end()` commits what was fed since the last commit as one utterance (`pending_ms` says how much).

How an utterance becomes an answer (turns on):
* The endpointer's Stop (the voice has been silent for its tail): the utterance as End would
  cut it now is transcribed at once, with the full 30 s context, as a FINAL job — while the
  closing pause runs. More voice makes it stale: if it has not started it is dropped; if it has,
  it stops before the encoder's next layer or the decoder's next step (transcribe's
  `cancelled`: a stale span cut mid-word can loop on its last word for a window of tokens,
  a second of the model's time the utterance's real final would wait behind), and its result
  is not used. The tail (the audio after the voice that an utterance includes) is
  200 ms where the pause leaves time to transcribe after it, and shortened, to 64 ms at least,
  where the model would otherwise still be busy when the pause closes: the tail is then
  pause − (a short utterance's transcription time, as measured) − a chunk. A server's
  `tail_ms` fixes it instead (serve --tail-ms): the same words on every machine, the final
  later where the model is slow.
* End (the pause closed, max_utt_ms, or the client's end): if the speculative job has the same
  span, its result is the final (proc_ms, the wait after the close, ≈ 0); else a FINAL job now.
  Finals go out in utterance order. An utterance whose text comes back empty (the model's
  no-speech gate) is said only when it had drafts: every utterance with drafts ends in a final.
* Partial: a DRAFT job over the utterance so far, encoded with a short context (the audio + 5 s,
  at least 10 s: whisper.cpp's audio_ctx). A stream keeps at most one draft waiting; a newer one
  replaces it, and one whose utterance has closed is skipped. Drafts queue behind every final
  (the door's priorities), so under load they are late or dropped, finals never.
  `stable` is the words the last two drafts agree on, from the start.

Everything here runs on the event loop (asyncio), except the job functions, which run on the
model's thread and read only the snapshot (seg, span, audio) they were handed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time

import numpy as np

from ..abilities import options
from ..io.audio import SAMPLE_RATE, StreamResampler
from ..records import TranscribeOptions
from ..vad.endpointer import CHUNK_MS, End
from ..vad.stream import VadStream, detector
from .door import DRAFT, FINAL, Abandoned, final_job, mean_logprob, seen, text_of

log = logging.getLogger("nwhisper.stream")

DRAFT_MARGIN_S = 5.0         # a draft encodes its audio plus this much ...
DRAFT_MIN_S = 10.0           # ... and at least this much
KEEP_S = 2.0                 # audio kept before an utterance opens (lead-in and onset search)
POSITIONS_PER_S = 50         # encoder positions per second of audio (20 ms each)
MIN_TAIL_MS = 64             # at least two chunks after the voice: a shorter dip is inside a word


def draft_ctx(seconds, n_audio_ctx):
    """Encoder positions for a draft of `seconds` of audio."""
    want = max(seconds + DRAFT_MARGIN_S, DRAFT_MIN_S)
    return min(n_audio_ctx, math.ceil(want * POSITIONS_PER_S))


def stable_prefix(previous, current):
    """The words two drafts agree on from the start, as a prefix of `current`."""
    a, b = previous.split(), current.split()
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    if n == 0:
        return ""
    # the prefix of current's own text through its n-th word (its spacing kept)
    i, seen = 0, 0
    while seen < n:
        while current[i].isspace():
            i += 1
        while i < len(current) and not current[i].isspace():
            i += 1
        seen += 1
    return current[:i]


class _Utterance:
    """What the stream knows of one utterance while its final is being made."""

    __slots__ = ("seg", "drafted", "last_draft", "spec", "spec_span", "spec_voice_end", "spec_stale",
                 "job")

    def __init__(self, seg):
        self.seg = seg
        self.drafted = False         # a partial was sent
        self.last_draft = ""
        self.spec = None             # the speculative final's Future
        self.spec_span = None        # (t0, t1) it transcribes
        self.spec_voice_end = None   # where the voice had stopped (s): more voice makes it stale
        self.spec_stale = False
        self.job = None              # the final's Future, once the utterance has closed


class LiveStream:
    def __init__(self, door, settings, send, language=None, max_tokens=TranscribeOptions.max_tokens,
                 report_closes=False, turns=True, words=False, tail_ms=None):
        self.door, self.send, self.words = door, send, words
        self.tail_ms = tail_ms                  # a fixed tail; None: sized by the model's speed
        self.default_language, self.max_tokens = language, max_tokens
        self.report_closes, self.turns = report_closes, turns
        self.settings = None
        self.lead_ms = self.prompt = None
        self.vad = None
        self._resampler = None
        self._audio = np.zeros(0, np.float32)   # the stream's 16 kHz audio from sample _base on
        self._base = 0
        self._utt = {}                          # seg → _Utterance, open or awaiting its final
        self._draft_job = None                  # the stream's one draft job, queued or running
        self._draft_want = None                 # (seg, t0, t1, audio) the next draft is of
        self._last_final = None                 # the previous final's delivery (order)
        self._commits = 0                       # utterances committed (turns off)
        self._pending_in = 0                    # samples fed since the last commit, at settings.rate
        self._speakers = None                   # with diarize: the session's speakers so far
        self.closed = False
        self.configure(settings)

    # -- settings ---------------------------------------------------------------------------

    def configure(self, settings, lead_ms=None, prompt=None):
        """Apply validated StreamSettings (and, for dialects that set them, the audio kept before
        the voice and a prompt for the model); what the room taught the endpointer is kept."""
        old, self.settings = self.settings, settings
        self.lead_ms, self.prompt = lead_ms, prompt
        if old is None or old.rate != settings.rate:
            self._resampler = StreamResampler(settings.rate) if settings.rate != SAMPLE_RATE else None
        opts = settings.endpointer_options()
        if lead_ms is not None:
            opts = dataclasses.replace(opts, lead_ms=lead_ms)
        if self.tail_ms is not None:
            opts = dataclasses.replace(opts, tail_ms=self.tail_ms)
        if not self.turns:
            return
        if self.vad is None:
            self.vad = VadStream(opts, vad=settings.vad)
        else:
            if old.vad != settings.vad:
                self.vad.detector = detector(settings.vad)
            self.vad.endpointer.reconfigure(opts)

    def effective(self):
        """The settings in force, as the config answer reports them."""
        s, ep = self.settings, self.vad.endpointer
        return {"format": s.format, "rate": s.rate, "lang": self.language() or "auto",
                "partials": s.partials, "partial_ms": s.partial_ms, "pause_ms": int(ep.pause_ms),
                "adaptive": ep.o.learning, "min_pause_ms": s.min_pause_ms,
                "max_pause_ms": s.max_pause_ms, "threshold": s.threshold, "near_db": s.near_db,
                "max_utt_ms": s.max_utt_ms, "events": s.events, "levels": s.levels,
                "vad": getattr(self.vad.detector, "name", s.vad), "hotwords": s.hotwords}

    def language(self):
        lang = self.settings.lang if self.settings.lang is not None else self.default_language
        return None if lang in (None, "auto") else lang

    @property
    def open_seg(self):
        """The open utterance's number, or None (with turns off: never open)."""
        ep = self.vad.endpointer if self.turns else None
        return ep.seg if ep is not None and ep.open else None

    @property
    def pending_ms(self):
        """With turns off: the audio fed since the last commit, in ms."""
        return 1000 * self._pending_in / self.settings.rate

    # -- audio in ---------------------------------------------------------------------------

    def feed(self, samples):
        """Samples at settings.rate: into the ring, through the endpointer, events acted on."""
        x = self._resampler.feed(samples) if self._resampler else np.asarray(samples, np.float32)
        self._audio = np.concatenate([self._audio, x])
        if not self.turns:
            self._pending_in += len(samples)
            return
        self._act(self.vad.feed(x))
        self._trim()

    def end(self):
        """Close the open utterance now (turns off: commit what was fed since the last commit)."""
        if not self.turns:
            return self._commit()
        self._act(self.vad.end())

    def reset(self):
        """Forget the open utterance (turns off: the audio since the last commit); its seg."""
        if not self.turns:
            self._forget_audio()
            return None
        seg = self.open_seg
        if seg is not None:
            u = self._utt.pop(seg, None)
            if u is not None and u.spec is not None:
                self.door.abandon(u.spec)
            if self._draft_want is not None and self._draft_want[0] == seg:
                self._draft_want = None
        self.vad.reset()
        return seg

    async def settled(self):
        """Wait until every utterance closed so far has had its final sent."""
        while self._last_final is not None and not self._last_final.done():
            await asyncio.shield(self._last_final)

    def close(self):
        """Nothing this stream queued runs; a running job's result is not sent."""
        self.closed = True
        for u in self._utt.values():
            for job in (u.spec, u.job):
                if job is not None:
                    self.door.abandon(job)
        if self._draft_job is not None:
            self.door.abandon(self._draft_job)
        self._utt.clear()

    def _commit(self):
        """Turns off: what was fed since the last commit, as an utterance of its own."""
        t0 = self._base / SAMPLE_RATE
        t1 = (self._base + len(self._audio)) / SAMPLE_RATE
        self._commits += 1
        self._on_end(End(self._commits, t0, t1, t0, t1, "commit", t1))
        self._forget_audio()

    def _forget_audio(self):
        self._base += len(self._audio)
        self._audio = np.zeros(0, np.float32)
        self._pending_in = 0

    def _span(self, t0, t1):
        a = round(t0 * SAMPLE_RATE) - self._base
        b = round(t1 * SAMPLE_RATE) - self._base
        return self._audio[max(a, 0):max(b, 0)].copy()

    def _trim(self):
        ep = self.vad.endpointer
        now = self._base + len(self._audio)
        keep = now - int(KEEP_S * SAMPLE_RATE)
        if ep.open:
            keep = min(keep, ep.t0 * CHUNK_MS * SAMPLE_RATE // 1000)
        if keep > self._base:
            self._audio = self._audio[keep - self._base:]
            self._base = keep

    # -- events -----------------------------------------------------------------------------

    def _act(self, events):
        for e in events:
            getattr(self, "_on_" + e.kind)(e)
        self._drop_stale_speculation()
        ep = self.vad.endpointer
        if self.tail_ms is None and ep.open and ep.n == ep.speech_end:   # voice now: no Stop yet
            ep.tail_ms = self._tail_ms(ep)

    def _tail_ms(self, ep):
        """The longest tail (≤ the endpointer's option) after which the final is still ready
        when the pause closes."""
        busy_ms = 1000 * (self.door.utterance_s or 0.0)
        fits = int(ep.pause_ms - busy_ms) - CHUNK_MS
        return max(MIN_TAIL_MS, min(ep.o.tail_ms, fits // CHUNK_MS * CHUNK_MS))

    def _on_start(self, e):
        self._utt[e.seg] = _Utterance(e.seg)
        if self.settings.events:
            self.send({"type": "start", "seg": e.seg, "t0": e.t0, "speech_t0": e.speech_t0})

    def _on_level(self, e):
        if self.settings.levels:
            self.send({"type": "level", "noise_db": e.noise_db, "speech_db": e.speech_db,
                       "snr_db": e.snr_db, "p_noise": e.p_noise, "pause_ms": e.pause_ms,
                       "threshold": e.threshold})

    def _on_stop(self, e):
        u = self._utt.get(e.seg)
        if u is None:
            return
        if u.spec is not None:
            self.door.abandon(u.spec)
        audio = self._span(e.t0, e.t1)
        u.spec_span, u.spec_voice_end, u.spec_stale = (e.t0, e.t1), e.speech_t1, False
        u.spec = self.door.submit(self._final_job(audio, u), FINAL)
        u.spec.add_done_callback(seen)      # a stale one is dropped with nobody waiting

    def _drop_stale_speculation(self):
        """The voice came back after a Stop: its speculative job is no longer the answer."""
        ep = self.vad.endpointer
        if not ep.open:
            return
        u = self._utt.get(ep.seg)
        if (u is not None and u.spec is not None and not u.spec_stale
                and round(ep.speech_end * CHUNK_MS / 1000, 3) > u.spec_voice_end):
            u.spec_stale = True
            self.door.abandon(u.spec)

    def _on_drop(self, e):
        """The open utterance was someone else's: nothing it started is used; if it had drafts,
        an empty final closes it (every utterance with drafts ends in a final)."""
        u = self._utt.pop(e.seg, None)
        if u is None:
            return
        if u.spec is not None:
            self.door.abandon(u.spec)
        if self._draft_want is not None and self._draft_want[0] == e.seg:
            self._draft_want = None
        if self.report_closes:
            self.send({"type": "close", "seg": e.seg, "t0": e.at, "t1": e.at})
        if u.drafted or self.report_closes:
            closed = End(e.seg, e.at, e.at, e.at, e.at, "drop", e.at)
            self._last_final = asyncio.ensure_future(
                self._deliver(closed, u, None, self._last_final, time.perf_counter()))

    def _on_partial(self, e):
        if e.seg not in self._utt:
            return
        self._draft_want = (e.seg, e.t0, e.t1, self._span(e.t0, e.t1))
        if self._draft_job is None:
            self._submit_draft()

    def _on_end(self, e):
        u = self._utt.get(e.seg) or _Utterance(e.seg)
        self._utt[e.seg] = u
        closed_at = time.perf_counter()
        if self.report_closes:
            self.send({"type": "close", "seg": e.seg, "t0": e.t0, "t1": e.t1})
        if self._draft_job is not None and self._draft_want and self._draft_want[0] == e.seg:
            self._draft_want = None          # its utterance has closed: no more drafts of it
        if u.spec is not None and not u.spec_stale and u.spec_span == (e.t0, e.t1):
            job = u.spec
        else:
            if u.spec is not None:
                self.door.abandon(u.spec)
            job = self.door.submit(self._final_job(self._span(e.t0, e.t1)), FINAL)
        u.job = job
        self._last_final = asyncio.ensure_future(self._deliver(e, u, job, self._last_final, closed_at))

    async def _deliver(self, e, u, job, previous, closed_at):
        """Send utterance e's final once its job is done, after the previous final."""
        text = "" if job is None else None       # a dropped utterance's final is empty
        error = language = heard = None
        try:
            if job is not None:
                heard = await job
                if heard is None:            # cancelled within the encoder: the stream closed
                    raise Abandoned
                text, language, seconds = heard.text, heard.language, heard.seconds
                h = self.door
                h.utterance_s = seconds if h.utterance_s is None else 0.8 * h.utterance_s + 0.2 * seconds
        except Abandoned:
            pass
        except Exception as exc:        # a bug or the device: say so; the stream goes on
            log.exception("final failed")
            error = f"transcription of utterance {e.seg} failed: {type(exc).__name__}: {exc}"
        ready = time.perf_counter()
        if previous is not None:
            await previous
        self._utt.pop(e.seg, None)
        if self.closed:
            return
        if error:
            self.send({"error": error, "seg": e.seg} if self.report_closes else {"error": error})
        elif text is not None and (text.strip() or u.drafted or self.report_closes):
            final = {"type": "final", "seg": e.seg, "text": text, "t0": e.t0, "t1": e.t1,
                     "speech_t0": e.speech_t0, "speech_t1": e.speech_t1,
                     "proc_ms": max(0, round((ready - closed_at) * 1000)),
                     "language": language or self.language(), "reason": e.reason}
            if self.words:
                final["words"] = [(round(e.t0 + a, 3), round(e.t0 + b, 3), w, p)
                                  for a, b, w, p in (heard.words if heard else ())]
                final["logprob"] = heard.logprob if heard else 0.0
            if self.settings.diarize:
                final["speaker"] = self._speaker(heard)
            self.send(final)

    def _speaker(self, heard):
        """The session's name for the speaker of a final (SPEAKER_00 …), or None."""
        from ..speakers.diarize import speaker_name
        from ..speakers.online import SessionSpeakers

        if self._speakers is None:
            self._speakers = SessionSpeakers()
        k = self._speakers.who(heard.embedding if heard else None)
        return None if k is None else speaker_name(k)

    # -- jobs -------------------------------------------------------------------------------

    def _final_job(self, audio, spec=None):
        """The job of a final; of a speculative one (`spec`: its _Utterance) that stops within
        the encoder when more speech made it stale meanwhile."""
        cancelled = None if spec is None else (lambda: spec.spec_stale or self.closed)
        return final_job(audio, self._model_options(), cancelled, embed=self.settings.diarize)

    def _model_options(self):
        return options(language=self.language(), max_tokens=self.max_tokens, initial_prompt=self.prompt,
                       hotwords=self.settings.hotwords, word_timestamps=self.words,
                       timestamps=self.words or None)

    def _submit_draft(self):
        opts = self._model_options()

        def run(model):             # on the model's worker thread
            want = self._draft_want
            if want is None or self.closed:
                return None
            seg, t0, t1, audio = want
            ctx = draft_ctx(len(audio) / SAMPLE_RATE, model.dims.n_audio_ctx)
            segments, _ = model.transcribe(audio, dataclasses.replace(opts, audio_ctx=ctx,
                                                                      word_timestamps=False))
            segments = list(segments)
            return want, text_of(segments), mean_logprob(segments)

        self._draft_job = self.door.submit(run, DRAFT)
        self._draft_job.add_done_callback(self._draft_done)

    def _draft_done(self, f):
        self._draft_job = None
        seen(f)
        if self.closed:
            return
        try:
            result = f.result()
        except Abandoned:
            result = None
        except Exception as e:          # a bug or the device: say so; the stream goes on
            log.exception("draft failed")
            self.send({"error": f"draft failed: {type(e).__name__}: {e}"})
            result = None
        if result is not None:
            (seg, t0, t1, _), text, logprob = result
            u = self._utt.get(seg)
            ep = self.vad.endpointer
            if u is not None and ep.open and ep.seg == seg:
                stable = stable_prefix(u.last_draft, text) if u.drafted else ""
                u.drafted, u.last_draft = True, text
                self.send({"type": "partial", "seg": seg, "text": text, "stable": stable,
                           "t0": t0, "t1": t1, "pause_ms": int(ep.pause_ms), "logprob": logprob})
            if self._draft_want is not None and self._draft_want[:3] == (seg, t0, t1):
                self._draft_want = None
        if self._draft_want is not None:    # a newer draft came while this one ran
            self._submit_draft()

