"""The transcription routes: whisper.cpp's POST /inference and OpenAI's /v1/audio/transcriptions
and /v1/audio/translations, on one request pipeline (TranscribeHandler): token check → size check
→ a connection slot (the body is read only once the request holds one) → parse (upload.py) →
decode on a small thread pool → one job on the model's worker thread → the response format
(formats.py); OpenAI's stream=true as server-sent events while the model decodes.
"""

from __future__ import annotations

import io
import json
import logging
import math
from dataclasses import dataclass

from tornado import ioloop, web

from ..abilities import Unsupported, options
from ..io.audio import AudioError, load_audio
from ..stream.door import Abandoned
from ..writers import needs_timestamps
from . import auth, formats
from .limits import Busy
from .upload import Reject, parse
from .handlers import OPENAI_CODES, JsonHandler, UnknownModel

log = logging.getLogger("nwhisper.server")

AUDIO_TOKENS_PER_S = 50          # a stream's usage counts the audio in encoder positions (20 ms)


@dataclass
class Ask:
    """One request's transcription options, resolved against the server's defaults."""

    fmt: str
    language: str | None
    task: str
    timestamps: bool
    vad: bool
    temperature: float
    prompt: str | None
    words: bool
    beam_size: int | None = None
    stream: bool = False             # OpenAI's stream=true: server-sent text deltas, then done
    model: str | None = None         # the model named (None: the server's default)
    diarize: bool = False            # who spoke (OpenAI's diarized_json)


def openai_name(name):
    """OpenAI's own transcription models: a client written for OpenAI names one of these."""
    return name == "whisper-1" or name.startswith("gpt-")


@web.stream_request_body
class TranscribeHandler(JsonHandler):
    """The request pipeline both APIs share; subclasses read their own fields (`ask`)."""

    task = "transcribe"

    def ask(self, up):
        raise NotImplementedError

    def extra(self, ask, info):
        """Route-specific fields merged into verbose_json."""
        return {}

    async def prepare(self):
        self._ticket = self._job = self._refuse = None
        self._host = self.ctx.host
        self._chunks, self._size, self._gone = [], 0, False
        if self.request.method == "OPTIONS":
            return
        cfg = self.ctx.config
        why = auth.problem(self.request, cfg.token)
        if why:
            self.set_header("WWW-Authenticate", 'Bearer realm="nwhisper"')
            self._refuse = (401, why)
            return
        length = self.request.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > cfg.max_upload:
            self._refuse = (413, self._too_big(int(length)))
            if int(length) > cfg.discard_limit:
                self.fail(*self._refuse)            # too much to read through: answer, close
            return
        try:
            self._ticket = self.ctx.slots.enter()
        except Busy as e:
            self.set_header("Retry-After", "1")
            self._refuse = (503, str(e))
            return
        if not await self._ticket:
            self._gone = True

    def _too_big(self, n):
        return (f"upload too large: {n} bytes; this server takes at most "
                f"{self.ctx.config.max_upload} bytes per request (--max-upload-mb)")

    def data_received(self, chunk):
        self._size += len(chunk)
        if self._refuse is not None or self._gone:
            return                                   # read through and dropped
        if self._size > self.ctx.config.max_upload:
            self._refuse, self._chunks = (413, self._too_big(self._size)), []
            return
        self._chunks.append(chunk)

    def take_body(self):
        """The request's body, once it may be answered; None when the client went away or the
        request was refused (answered here)."""
        if self._gone:
            return None
        if self._refuse is not None:
            self.fail(*self._refuse)
            return None
        body, self._chunks = b"".join(self._chunks), None
        return body

    async def post(self):
        body = self.take_body()
        if body is None:
            return
        try:
            up = parse(self.request, body)
            ask = self.ask(up)
            try:
                self._host = self.ctx.choose(ask.model, openai_name)
            except UnknownModel as e:
                raise Reject(400, str(e), "model") from None
            opts = self._options(ask)
            audio = io.BytesIO(up.data)
            audio.name = up.filename
            samples = await ioloop.IOLoop.current().run_in_executor(self.ctx.decoders, load_audio, audio)
            if self._gone:
                return
            on_segments = self._start_events() if ask.stream else None
            self._job = self._host.submit(lambda m: _transcribe(m, samples, opts, ask.vad, on_segments))
            segments, info = await self._job
            if self._gone:              # it was already running when the client went away
                return
        except Reject as e:
            return self._error(e.status, e.message, e.param)
        except AudioError as e:
            return self._error(400, f"not audio: {e}" if "cannot decode" in str(e) else str(e), "file")
        except Abandoned:
            return
        except ValueError as e:         # the library's word on language, task and options
            return self._error(400, str(e))
        except Exception as e:          # a bug or the device; the next request still runs
            log.exception("transcription failed")
            return self._error(500, f"transcription failed: {type(e).__name__}: {e}")
        finally:
            self._job = None
        if ask.stream:
            return self._done(segments, info)
        text, ctype = formats.render(ask.fmt, segments, info, task=ask.task, extra=self.extra(ask, info))
        self.set_header("Content-Type", ctype)
        self.finish(text)

    # -- stream=true: OpenAI's server-sent events ----------------------------------------------

    def _start_events(self):
        """Send the event stream's headers now; returns the on_segments hook (called on the model's
        thread) that sends each window's new text as a transcript.text.delta."""
        self._streaming = True
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-cache")
        self.flush()
        loop = ioloop.IOLoop.current()
        raw, sent = [""], [0]

        def on_segments(new):
            # what is sent is always a prefix of the done event's text (formats.transcript: outer
            # spaces stripped), so spaces at the end wait for the text that follows them
            raw[0] += "".join(seg.text for seg in new)
            shown = raw[0].strip()
            if len(shown) > sent[0]:
                loop.add_callback(self._event, {"type": "transcript.text.delta", "delta": shown[sent[0]:]})
                sent[0] = len(shown)
        return on_segments

    def _event(self, data):
        if not self._gone and not self._finished:
            self.write(f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n")
            self.flush()

    def _done(self, segments, info):
        out = sum(len(seg.tokens) for seg in segments)
        audio = math.ceil(info.duration * AUDIO_TOKENS_PER_S)
        self._event({"type": "transcript.text.done", "text": formats.transcript(segments),
                     "usage": {"type": "tokens", "input_tokens": audio,
                               "input_token_details": {"audio_tokens": audio, "text_tokens": 0},
                               "output_tokens": out, "total_tokens": audio + out}})
        self.finish()

    def _error(self, status, message, param=None):
        """fail(), or once the event stream has begun, an error event that ends it."""
        if not getattr(self, "_streaming", False):
            return self.fail(status, message, param)
        self._event({"type": "error", "error": {"message": message, "type": "server_error" if status >= 500
                                                else "invalid_request_error", "param": param,
                                                "code": OPENAI_CODES.get(status)}})
        self.finish()

    def _options(self, ask):
        """The TranscribeOptions of `ask`; Reject for what this model cannot do."""
        try:
            return self._host.abilities.check(options(
                ask.vad, language=ask.language, task=ask.task, max_tokens=self.ctx.config.max_tokens,
                timestamps=ask.timestamps, temperature=ask.temperature, initial_prompt=ask.prompt,
                word_timestamps=ask.words, beam_size=ask.beam_size, diarize=ask.diarize or None))
        except Unsupported as e:
            raise Reject(400, str(e), e.param)

    def on_finish(self):
        self._let_go()
        if self.request.method == "POST" and not self._gone:
            self.ctx.requests += 1
            self.ctx.failed += self.get_status() >= 400

    def on_connection_close(self):
        self._gone = True
        if not self._finished:      # what the access log says of it (nobody reads the answer)
            self.set_status(499, "Client Closed Request")
        if self._job is not None:
            self._host.abandon(self._job)
        self._let_go()

    def _let_go(self):
        if getattr(self, "_ticket", None) is not None:
            self.ctx.slots.leave(self._ticket)
            self._ticket = None


def _transcribe(model, samples, opts, vad, on_segments):          # in the model's worker thread
    segments, info = model.transcribe(samples, opts, vad=vad, on_segments=on_segments)
    return list(segments), info


def _language(value, default):
    """A request's language, as asked ('auto', '' and a region suffix are abilities' to read);
    the server's when the request names none."""
    return default if value is None else value


def _timestamps(cfg, fmt):
    """Segments with times: the server's default, or a response_format that shows them."""
    return cfg.timestamps or needs_timestamps([formats.AS_WRITTEN[fmt]])


def _format(value, default="json"):
    fmt = (value or default).strip().lower()
    if fmt not in formats.FORMATS:
        raise Reject(400, f"response_format {fmt!r} is not one of {', '.join(formats.FORMATS)}",
                     "response_format")
    return fmt


def _beam(up):
    """whisper.cpp's beam_size: beam search when > 1 (its default -1 and 1 mean greedy)."""
    n = up.number("beam_size", -1, 64)
    return int(n) if n is not None and n > 1 else None


class InferenceHandler(TranscribeHandler):
    """whisper.cpp's POST /inference: `file`, `language`, `response_format`, `temperature`,
    `translate`, `no_timestamps`, `beam_size`, `prompt`, `token_timestamps`, `diarize` (here by
    speaker embeddings, on any recording), plus nwhisper's `timestamps` and `vad`. Other whisper.cpp fields (best_of, thresholds, offsets …) are
    accepted and ignored."""

    def ask(self, up):
        cfg = self.ctx.config
        fmt = _format(up.text("response_format"))
        timestamps = up.flag("timestamps")
        if timestamps is None and up.has("no_timestamps"):
            timestamps = not up.flag("no_timestamps")
        if timestamps is None:      # subtitles and verbose_json are about times
            timestamps = _timestamps(cfg, fmt)
        words = up.flag("token_timestamps")
        if words is None:           # whisper.cpp's default: words in a timestamped verbose_json
            words = fmt == "verbose_json" and timestamps
        return Ask(fmt=fmt, language=_language(up.text("language"), cfg.language),
                   task="translate" if up.flag("translate", False) else "transcribe",
                   timestamps=timestamps, vad=up.flag("vad", cfg.vad),
                   temperature=up.number("temperature", 0.0, 1.0, 0.0),
                   prompt=up.text("prompt") or None, words=words, beam_size=_beam(up),
                   diarize=up.flag("diarize", False) or fmt == "diarized_json")

    def extra(self, ask, info):
        probs = getattr(info, "all_language_probs", None) or {}
        return {"detected_language": formats.LANGUAGE_NAMES.get(info.language, info.language),
                "detected_language_probability": info.language_probability,
                "language_probabilities": {k: v for k, v in probs.items() if v > 0.001}}


class OpenAIHandler(TranscribeHandler):
    """OpenAI's POST /v1/audio/{transcriptions,translations}: `file`, `model` (one this server
    holds; OpenAI's own names and none mean the default), `language`, `prompt`, `response_format`, `temperature`,
    `timestamp_granularities[]`, `stream` (server-sent transcript.text.delta events, a window's
    new text each as it is decoded, then transcript.text.done with the whole text and usage)."""

    def initialize(self, ctx, task):
        super().initialize(ctx)
        self.task = task

    def ask(self, up):
        cfg = self.ctx.config
        fmt = _format(up.text("response_format"))
        stream = up.flag("stream", False)
        if stream and fmt not in ("json", "text"):
            raise Reject(400, f"stream=true sends the text as it is decoded; response_format must "
                              f"be json or text, not {fmt}", "stream")
        grains = set(up.texts("timestamp_granularities[]") + up.texts("timestamp_granularities"))
        unknown = grains - {"word", "segment"}
        if unknown:
            raise Reject(400, f"timestamp_granularities[] takes 'word' and 'segment', not "
                              f"{', '.join(sorted(unknown))}", "timestamp_granularities[]")
        timestamps = up.flag("timestamps")
        if timestamps is None:
            timestamps = _timestamps(cfg, fmt)
        language = None if self.task == "translate" else _language(up.text("language"), cfg.language)
        return Ask(fmt=fmt, language=language, task=self.task, timestamps=timestamps,
                   vad=up.flag("vad", cfg.vad), temperature=up.number("temperature", 0.0, 1.0, 0.0),
                   prompt=up.text("prompt") or None, words="word" in grains, stream=stream,
                   model=up.text("model") or None, diarize=fmt == "diarized_json")
