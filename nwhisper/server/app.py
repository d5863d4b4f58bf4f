"""The HTTP surface: routes, handlers, and the process that serves them.

    run(Config(model="tiny.en", host="127.0.0.1", port=6543))   # load, bind, serve until SIGTERM

Routes (token-protected unless marked open):

    GET  /                          the test page (open), from server/static/
    GET  /health                    {"status": "ok"|"idle", model shape, counters} (open)
    POST /inference                 whisper.cpp's server: multipart `file` + fields, or a raw body
    POST /v1/audio/transcriptions   OpenAI's API shape
    POST /v1/audio/translations     the same, task=translate
    GET  /v1/models                 the one model this server holds, as OpenAI lists models
    GET  / and /stream (WebSocket)  live audio in, utterances out (stream.py)
    GET  /v1/realtime (WebSocket)   OpenAI's Realtime transcription sessions (realtime.py)

A transcription request goes: token check → size check → a connection slot (limits.Slots; the body
is read only once the request holds one) → parse (upload.py) → decode on a small thread pool →
one job on the model's worker thread (inference.ModelHost) → the response format (formats.py).
Every refusal is a 4xx (or 503 when full) with {"error": "<what was wrong>"} — on the /v1/ routes
OpenAI's error object, {"error": {"message", "type", "param", "code"}}, which its clients show;
nothing a client sends can stop the server serving the others.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tornado import httpserver, ioloop, netutil, web

from ..io.audio import AudioError, load_audio
from ..io.registry import DEFAULT_MODEL
from ..records import TranscribeOptions
from . import auth, formats, realtime, stream
from .inference import Abandoned, ModelHost
from .limits import Busy, Slots
from .upload import Reject, parse

log = logging.getLogger("nwhisper.server")

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
OPENAI_CODES = {401: "invalid_api_key", 404: "unknown_url", 413: "file_too_large", 503: "server_busy"}
AUDIO_TOKENS_PER_S = 50          # a stream's usage counts the audio in encoder positions (20 ms)
MiB = 1 << 20


@dataclass
class Config:
    model: str = DEFAULT_MODEL
    device: str = "auto"
    compute_type: str = "float32"
    host: str = "127.0.0.1"
    port: int = 6543
    language: str | None = None      # server default; a request's `language` overrides it
    vad: bool = False                # server default; a request's `vad` overrides it
    timestamps: bool = False         # server default; a request's `timestamps` overrides it
    max_tokens: int = TranscribeOptions.max_tokens
    token: str | None = None
    ssl: object = None               # an ssl.SSLContext for https/wss, or None
    unload_after: float = 0.0        # seconds idle before the model is released; 0 = never
    connections: int = 8             # requests/streams served at once
    queue: int = 16                  # requests waiting for a slot before 503
    max_upload: int = 100 * MiB      # bytes per request body

    @property
    def discard_limit(self):
        """Bodies up to this size are read and dropped before a 4xx (clients that are still
        sending would otherwise see a reset instead of the answer); larger ones are cut off."""
        return max(2 * self.max_upload, self.max_upload + 16 * MiB)


class Context:
    """What every handler shares: the config, the model host, the slots, the counters."""

    def __init__(self, config, host):
        self.config, self.host = config, host
        self.slots = Slots(config.connections, config.queue)
        self.decoders = ThreadPoolExecutor(2, thread_name_prefix="nwhisper-decode")
        self.requests = self.failed = 0
        self.streams_open = self.streams_opened = 0
        self.started = time.monotonic()

    def health(self):
        h = self.host
        return {
            "status": "ok" if h.loaded else "idle",
            "model": {"name": h.name, "device": h.device_name, "compute_type": h.compute_type, "multilingual": h.multilingual,
                      **h.shape},
            "requests": self.requests,
            "failed": self.failed,
            "loads": h.loads,
            "unloads": h.unloads,
            "last_load_ms": h.last_load_ms,
            "idle_s": h.idle_s(),
            "unload_after": self.config.unload_after,
            "busy": h.busy,
            "queued": h.queued,
            "abandoned": h.abandoned,
            "queue_wait_ms": h.wait_stats(),
            "utterance_ms": None if h.utterance_s is None else round(h.utterance_s * 1000, 1),
            "connections": {"active": self.slots.active, "waiting": self.slots.waiting,
                            "max": self.slots.size},
            "streams": {"open": self.streams_open, "opened": self.streams_opened},
            "uptime_s": round(time.monotonic() - self.started, 1),
        }


# -- handlers ---------------------------------------------------------------------------------


class JsonHandler(web.RequestHandler):
    """CORS headers as whisper.cpp sends them, OPTIONS preflight, errors as JSON sentences."""

    def initialize(self, ctx):
        self.ctx = ctx

    def set_default_headers(self):
        self.set_header("Server", "nwhisper")
        self.set_header("Access-Control-Allow-Origin", "*")
        self.set_header("Access-Control-Allow-Headers", "content-type, authorization")
        self.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")

    def options(self, *args):
        self.set_status(204)

    def fail(self, status, message, param=None):
        """Answer with an error: whisper.cpp's {"error": message}, or on the /v1/ routes
        OpenAI's error object, which its clients show ({"error": {"message", "type", "param",
        "code"}})."""
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        if self.request.path.startswith("/v1/"):
            body = {"error": {"message": message,
                              "type": "server_error" if status >= 500 else "invalid_request_error",
                              "param": param, "code": OPENAI_CODES.get(status)}}
        else:
            body = {"error": message}
        self.finish(json.dumps(body, ensure_ascii=False))

    def write_error(self, status, **kwargs):
        e = kwargs.get("exc_info", (None, None))[1]
        if status == 405:
            message = f"{self.request.method} is not allowed on {self.request.path}"
        elif status == 404:
            message = (f"no such route: {self.request.method} {self.request.path} (try GET /, "
                       f"GET /health, POST /inference, POST /v1/audio/transcriptions)")
        elif isinstance(e, web.HTTPError) and e.log_message:
            message = e.log_message
        else:
            message = self._reason
        self.clear_header("Content-Type")
        self.fail(status, message)

    def authorized(self):
        why = auth.problem(self.request, self.ctx.config.token)
        if why:
            self.set_header("WWW-Authenticate", 'Bearer realm="nwhisper"')
            self.fail(401, why)
        return why is None


class NotFound(JsonHandler):
    def prepare(self):
        raise web.HTTPError(404)


class HealthHandler(JsonHandler):
    def get(self):
        self.finish(self.ctx.health())


class ModelsHandler(JsonHandler):
    def get(self):
        if self.authorized():
            self.finish({"object": "list", "data": [
                {"id": self.ctx.host.name, "object": "model", "created": 0, "owned_by": "nwhisper"}]})


class PageHandler(web.StaticFileHandler):
    """The test page and its files, straight from the package."""

    def set_default_headers(self):
        self.set_header("Server", "nwhisper")
        self.set_header("Cache-Control", "no-cache")


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

    async def post(self):
        if self._gone:
            return
        if self._refuse is not None:
            return self.fail(*self._refuse)
        body, self._chunks = b"".join(self._chunks), None
        try:
            up = parse(self.request, body)
            ask = self.ask(up)
            kwargs, notes = self._call_args(ask)
            audio = io.BytesIO(up.data)
            audio.name = up.filename
            samples = await ioloop.IOLoop.current().run_in_executor(self.ctx.decoders, load_audio, audio)
            if self._gone:
                return
            if ask.stream:
                kwargs["on_segments"] = self._start_events()
            self._job = self.ctx.host.submit(lambda m: _transcribe(m, samples, kwargs))
            segments, info = await self._job.future
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
        extra = self.extra(ask, info)
        if notes:
            extra["notes"] = notes
        text, ctype = formats.render(ask.fmt, segments, info, task=ask.task, extra=extra)
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

    def _call_args(self, ask):
        """model.transcribe's keyword arguments for `ask`, and notes on what this build ignores."""
        host, cfg = self.ctx.host, self.ctx.config
        if ask.language is not None and host.languages and ask.language not in host.languages:
            raise Reject(400, f"unknown language code '{ask.language}'; this model knows: "
                              f"{', '.join(host.languages)}", "language")
        if ask.task == "translate" and not host.multilingual:
            raise Reject(400, f"this model ({host.name}) is English-only: it cannot translate", "model")
        kw = dict(language=ask.language, task=ask.task, max_tokens=cfg.max_tokens,
                  timestamps=ask.timestamps)
        notes = {}
        for name, value, wanted, missing in (
                ("vad", ask.vad, ask.vad, "this build's transcribe() has no VAD option yet; "
                                          "the audio was transcribed whole"),
                ("temperature", ask.temperature, ask.temperature > 0,
                 "this build decodes greedily (temperature 0)"),
                ("initial_prompt", ask.prompt, bool(ask.prompt), "prompts are not supported yet; "
                                                                "ignored"),
                ("word_timestamps", ask.words, ask.words, "word timestamps are not available in "
                                                          "this build; segments only"),
                ("beam_size", ask.beam_size, bool(ask.beam_size), "beam search is not available in "
                                                                  "this build; decoded greedily")):
            if name in host.accepts:
                if wanted:
                    kw[name] = value
            elif wanted:
                notes[name] = missing
        return kw, notes

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
            self.ctx.host.abandon(self._job)
        self._let_go()

    def _let_go(self):
        if getattr(self, "_ticket", None) is not None:
            self.ctx.slots.leave(self._ticket)
            self._ticket = None


def _transcribe(model, samples, kwargs):          # in the model's worker thread
    segments, info = model.transcribe(samples, **kwargs)
    return list(segments), info


def _language(value, default):
    """A request's language: None (detect) for '', 'auto'; 'EN', 'en-US', 'en_GB' → 'en'."""
    if value is None:
        return default
    value = value.strip().lower().replace("_", "-")
    if value in ("", "auto"):
        return None
    base = value.split("-")[0]
    return base if "-" in value and len(base) in (2, 3) else value


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
    `translate`, `no_timestamps`, `beam_size`, `prompt`, `token_timestamps`, plus nwhisper's
    `timestamps` and `vad`. Other whisper.cpp fields (best_of, thresholds, offsets …) are
    accepted and ignored."""

    def ask(self, up):
        cfg = self.ctx.config
        fmt = _format(up.text("response_format"))
        timestamps = up.flag("timestamps")
        if timestamps is None and up.has("no_timestamps"):
            timestamps = not up.flag("no_timestamps")
        if timestamps is None:      # subtitles and verbose_json are about times
            timestamps = cfg.timestamps or fmt in ("srt", "vtt", "verbose_json")
        words = up.flag("token_timestamps")
        if words is None:           # whisper.cpp's default: words in a timestamped verbose_json
            words = (fmt == "verbose_json" and timestamps
                     and "word_timestamps" in self.ctx.host.accepts)
        return Ask(fmt=fmt, language=_language(up.text("language"), cfg.language),
                   task="translate" if up.flag("translate", False) else "transcribe",
                   timestamps=timestamps, vad=up.flag("vad", cfg.vad),
                   temperature=up.number("temperature", 0.0, 1.0, 0.0),
                   prompt=up.text("prompt") or None, words=words, beam_size=_beam(up))

    def extra(self, ask, info):
        probs = getattr(info, "all_language_probs", None) or {}
        return {"detected_language": formats.LANGUAGE_NAMES.get(info.language, info.language),
                "detected_language_probability": info.language_probability,
                "language_probabilities": {k: v for k, v in probs.items() if v > 0.001}}


class OpenAIHandler(TranscribeHandler):
    """OpenAI's POST /v1/audio/{transcriptions,translations}: `file`, `model` (any name; this
    server holds one model), `language`, `prompt`, `response_format`, `temperature`,
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
            timestamps = cfg.timestamps or fmt in ("srt", "vtt", "verbose_json")
        language = None if self.task == "translate" else _language(up.text("language"), cfg.language)
        return Ask(fmt=fmt, language=language, task=self.task, timestamps=timestamps,
                   vad=up.flag("vad", cfg.vad), temperature=up.number("temperature", 0.0, 1.0, 0.0),
                   prompt=up.text("prompt") or None, words="word" in grains, stream=stream)


# -- the application --------------------------------------------------------------------------


def _log_request(handler):
    """Tornado's access log, with any ?token=… blanked out."""
    status = handler.get_status()
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    uri = re.sub(r"(token=)[^&]*", r"\1…", handler.request.uri)
    logging.getLogger("tornado.access").log(
        level, "%d %s %s (%s) %.1fms", status, handler.request.method, uri,
        handler.request.remote_ip, 1000.0 * handler.request.request_time())


def make_app(ctx):
    k = {"ctx": ctx}
    routes = [
        (r"/health", HealthHandler, k),
        (r"/inference", InferenceHandler, k),
        (r"/v1/audio/transcriptions", OpenAIHandler, {"ctx": ctx, "task": "transcribe"}),
        (r"/v1/audio/translations", OpenAIHandler, {"ctx": ctx, "task": "translate"}),
        (r"/v1/models", ModelsHandler, k),
        *stream.routes(ctx),
        *realtime.routes(ctx),
        (r"/static/(.+)", PageHandler, {"path": STATIC}),
    ]
    return web.Application(routes, default_handler_class=NotFound, default_handler_args=k,
                           log_function=_log_request)


def url(cfg, port):
    host = cfg.host if ":" not in cfg.host else f"[{cfg.host}]"
    return f"{'https' if cfg.ssl else 'http'}://{host}:{port}"


def startup_notes(cfg, host):
    """What to tell the operator once the model is loaded; ValueError for a --lang it lacks."""
    if cfg.language is not None and host.languages and cfg.language not in host.languages:
        raise ValueError(f"unknown language code '{cfg.language}'; this model knows: "
                         f"{', '.join(host.languages)}")
    notes = []
    if cfg.vad and "vad" not in host.accepts:
        notes.append("nwhisper: note: this build's transcribe() has no VAD option yet; --vad (and "
                     "a request's vad field) is accepted, reported in verbose_json's notes, and ignored")
    if not cfg.token and not auth.is_loopback(cfg.host):
        notes.append(f"nwhisper: WARNING: listening on {cfg.host or 'every address'} without a "
                     f"token — anyone who can reach this port can use it (set --token or "
                     f"NWHISPER_TOKEN)")
    return notes


def _say(message):
    print(message, flush=True)


def run(cfg, say=_say, warmup=True):
    """Load the model, then open the port and serve until SIGINT/SIGTERM."""
    host = ModelHost(cfg.model, cfg.device, cfg.unload_after, compute_type=cfg.compute_type)
    say(f"nwhisper: loading {cfg.model} ({cfg.device}) …")
    t0 = time.perf_counter()
    host.load(warmup=warmup)
    say(f"nwhisper: {cfg.model} ready on {host.device_name} in "
        f"{(time.perf_counter() - t0) * 1000:.0f} ms (load {host.last_load_ms:.0f} ms, then a "
        f"warm-up transcription)")
    for line in startup_notes(cfg, host):
        say(line)
    asyncio.run(_serve(cfg, host, say))


async def _serve(cfg, host, say):
    ctx = Context(cfg, host)
    server = httpserver.HTTPServer(make_app(ctx), ssl_options=cfg.ssl,
                                   max_body_size=cfg.discard_limit, idle_connection_timeout=60,
                                   body_timeout=300)
    sockets = netutil.bind_sockets(cfg.port, address=cfg.host or None)
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    host.last_active = time.monotonic()     # idle counts from the moment the port opens
    host.start_idle_timer()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    say(f"nwhisper serving on {url(cfg, port)} (test page at /, POST /inference, "
        f"POST /v1/audio/transcriptions, GET /health, WebSocket at / and /stream: live audio, at "
        f"/v1/realtime: OpenAI Realtime)")
    await stop.wait()
    say("nwhisper: stopping")
    server.stop()
    host.close()
    ctx.decoders.shutdown(wait=False)
