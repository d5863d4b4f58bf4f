"""Deepgram's speech-to-text API, for apps written against its SDK: `POST /v1/listen` (a
recording) and `GET /v1/listen` upgraded to a WebSocket (live audio).

    client = DeepgramClient(api_key=TOKEN, environment=DeepgramClientEnvironment(
        base="http://HOST:6543", production="ws://HOST:6543", agent="", agent_rest=""))
    r = client.listen.v1.media.transcribe_file(request=wav_bytes, punctuate=True, utterances=True)

The body is the audio itself, whatever its format (the SDK sends WAV and the rest as
application/octet-stream; the container is found from the bytes), or raw samples with
`encoding` and `sample_rate`; the query's parameters are read by deepgram_fields.py. The key
comes as `Authorization: Token KEY` (the server's --token). The answer is Deepgram's: metadata
(request_id, sha256 of the body, created, duration, channels, models, model_info) and
results.channels[].alternatives[] (transcript, confidence, words with start, end, confidence
— the token probabilities — and punctuated_word), results.utterances[] when asked. A `{"url": …}`
body is refused: this server fetches nothing. Errors are Deepgram's {err_code, err_msg,
request_id}, with the status it would give.

The request pipeline (the token, the size limit, a connection slot before the body is read, the
model's queue) is the other transcription routes' (transcription.TranscribeHandler).

Live, over the stream room's LiveStream (the endpointer, speculative finals, drafts), as the
other live dialects: binary frames of raw audio (`encoding` linear16/linear32/mulaw/alaw,
`sample_rate`, `channels` mixed) or of a container as it is written (no encoding, or opus: a
browser's MediaRecorder WebM, Ogg Opus; io/container_stream.py decodes it on a thread) in; out, `Results` — drafts with is_final false
(interim_results), each utterance's final with is_final and speech_final true, words with times
and confidences — `SpeechStarted` (vad_events), `UtteranceEnd` (utterance_end_ms of audio past
the last word). Client messages: `KeepAlive`; `Finalize` (the open utterance's final now, with
from_finalize true; the connection stays); `CloseStream` (every final, then `Metadata`, then a
1000 close); `Configure` {keyterms} (hotwords from the next utterance on). A bad frame or
message gets an `Error` {variant, description, message} and the stream goes on; bad query
parameters are refused at the handshake with a 400.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import uuid

from tornado import ioloop, routing, web

import nwhisper

from ..abilities import options
from ..io.audio import SAMPLE_RATE, AudioError, load_audio, load_channels, resample
from ..stream.door import Abandoned
from ..stream.settings import StreamSettings
from ..io.container_stream import ContainerStream
from .deepgram_fields import (RAW_ENCODINGS, DeepgramError, error_body, listen_params, live_metadata,
                              live_params, live_results, model_info, prerecorded, raw_channels)
from .handlers import UnknownModel
from .stream import StreamHandler
from .transcription import TranscribeHandler

log = logging.getLogger("nwhisper.server")

ERROR_CODES = {400: "Bad Request", 401: "INVALID_AUTH", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED",
               413: "PAYLOAD_TOO_LARGE", 500: "INTERNAL_SERVER_ERROR", 503: "SERVICE_UNAVAILABLE"}


@web.stream_request_body
class ListenHandler(TranscribeHandler):
    """POST /v1/listen: a recording in, Deepgram's pre-recorded response out."""

    def fail(self, status, message, param=None):
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        e = DeepgramError(message, status, ERROR_CODES.get(status, "Bad Request"))
        self.finish(json.dumps(error_body(e, self._request_id()), ensure_ascii=False))

    def _request_id(self):
        if not hasattr(self, "_rid"):
            self._rid = str(uuid.uuid4())
            self.set_header("dg-request-id", self._rid)
        return self._rid

    async def post(self):
        body = self.take_body()
        if body is None:
            return
        cfg = self.ctx.config
        try:
            ask = listen_params(self.request.query_arguments)
            _no_url(self.request, body)
            loop = ioloop.IOLoop.current()
            channels = await loop.run_in_executor(self.ctx.decoders, _channels, body, ask)
            if self._gone:
                return
            try:
                self._host = self.ctx.choose(ask.model, deepgram_name)
            except UnknownModel as e:
                raise DeepgramError(str(e)) from None
            opts = self._host.abilities.check(options(
                language=ask.language if ask.language is not None else cfg.language,
                max_tokens=cfg.max_tokens, timestamps=True, word_timestamps=True,
                hotwords=ask.hotwords, diarize=ask.diarize or None))
            self._job = self._host.submit(lambda m: [_transcribe(m, x, opts) for x in channels])
            results = await self._job
            if self._gone:
                return
        except DeepgramError as e:
            return self.fail(e.status, str(e))
        except AudioError as e:
            return self.fail(400, f"failed to process audio: {e}")
        except Abandoned:
            return
        except ValueError as e:            # the library's word on the options and the language
            return self.fail(400, str(e))
        except Exception as e:             # a bug or the device; the next request still runs
            log.exception("deepgram transcription failed")
            return self.fail(500, f"transcription failed: {type(e).__name__}: {e}")
        finally:
            self._job = None
        duration = len(channels[0]) / SAMPLE_RATE
        out = prerecorded(results, ask, body, duration, self._host.name, nwhisper.__version__,
                          self._request_id())
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(out, ensure_ascii=False))


def _no_url(request, body):
    """Deepgram's `{"url": …}` form asks the server to fetch the audio: this one fetches nothing."""
    ctype = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if ctype == "application/json" or body[:1] == b"{":
        try:
            doc = json.loads(body)
        except ValueError:
            if ctype == "application/json":
                raise DeepgramError("the body is application/json but not JSON") from None
            return
        if isinstance(doc, dict) and "url" in doc:
            raise DeepgramError("this server fetches nothing: send the audio itself as the "
                                "request body (transcribe_file), not a URL")
        raise DeepgramError("a JSON body must be {\"url\": …}, and this server fetches nothing: "
                            "send the audio itself as the body")


def _channels(body, ask):
    """The body's audio at 16 kHz: one array per channel with multichannel, else mixed."""
    if not body:
        raise DeepgramError("the request has no body: send the audio as the body")
    if ask.encoding in RAW_ENCODINGS:
        xs = raw_channels(body, ask)
        if not ask.multichannel and len(xs) > 1:
            xs = [sum(xs) / len(xs)]
        return [resample(x, ask.sample_rate) if ask.sample_rate != SAMPLE_RATE else x for x in xs]
    return load_channels(body) if ask.multichannel else [load_audio(body)]


def _transcribe(model, samples, opts):          # on the model's worker thread
    segments, info = model.transcribe(samples, opts)
    return list(segments), info


def deepgram_name(name):
    """Deepgram's own models (nova-3, nova-2-general, enhanced, base, whisper-large …): a client
    written for Deepgram names one of these."""
    return name.split("-")[0] in ("nova", "enhanced", "base", "whisper", "flux", "general")


class LiveHandler(StreamHandler):
    """GET /v1/listen as a WebSocket: Deepgram's live transcription."""

    vendor = staticmethod(deepgram_name)

    async def get(self, *args, **kwargs):
        self.rid = str(uuid.uuid4())
        self.set_header("dg-request-id", self.rid)
        try:
            self.ask = live_params(self.request.query_arguments)
            self.pick(self.ask.listen.model)
            self.check_language(self.ask.listen.language, DeepgramError)
        except (DeepgramError, UnknownModel) as e:
            return self.refuse(400, str(e))
        await super().get(*args, **kwargs)

    def refuse(self, status, message):
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        e = DeepgramError(message, status, ERROR_CODES.get(status, "Bad Request"))
        self.finish(json.dumps(error_body(e, getattr(self, "rid", "")), ensure_ascii=False))

    def select_subprotocol(self, subprotocols):
        return "token" if "token" in subprotocols else None    # the browser form of the key

    def started(self):
        a, listen = self.ask, self.ask.listen
        self.model = model_info(listen, self.host.name, nwhisper.__version__)
        self.fed = 0                              # samples received, at the stream's rate
        self.digest = hashlib.sha256()
        self.finalizing = set()                   # segs closed by Finalize
        self.last_word_end = None                 # an UtteranceEnd may be owed after this word
        self.last_start = None                    # where the latest utterance began (s)
        self.closing = False
        self.decoder = None
        if listen.encoding not in RAW_ENCODINGS:     # a container: its decoder says the rate
            loop = asyncio.get_running_loop()
            self.decoder = ContainerStream(
                lambda x, rate: loop.call_soon_threadsafe(self._decoded, x, rate),
                lambda why: loop.call_soon_threadsafe(self._error, "INVALID_AUDIO", why))
        settings = StreamSettings(rate=listen.sample_rate or 48000, lang=listen.language,
                                  partials=a.interim, pause_ms=a.pause_ms, events=True,
                                  hotwords=listen.hotwords, diarize=listen.diarize)
        self.live = self.live_stream(settings, send=self._from_stream, words=True)

    # -- in -----------------------------------------------------------------------------------

    def on_message(self, message):
        if self.live is None or self.live.closed or self.closing:
            return
        if isinstance(message, bytes):
            return self._audio(message)
        try:
            msg = json.loads(message)
            kind = msg.get("type") if isinstance(msg, dict) else None
        except ValueError:
            kind = None
        if kind == "KeepAlive":
            return
        if kind == "Finalize":
            if self.live.open_seg is not None:
                self.finalizing.add(self.live.open_seg)
            return self.live.end()
        if kind == "CloseStream":
            self.closing = True
            return asyncio.ensure_future(self._close_stream())
        if kind == "Configure":
            return self._configure(msg)
        self._error("INVALID_MESSAGE", f"a text message must be JSON with a type: KeepAlive, "
                                       f"Finalize, CloseStream or Configure, not {message[:80]!r}")

    def _audio(self, frame):
        if self.decoder is not None:
            self.digest.update(frame)
            return self.decoder.feed(frame)
        try:
            xs = raw_channels(frame, self.ask.listen)
        except DeepgramError as e:
            return self._error("INVALID_AUDIO", str(e))
        self.digest.update(frame)
        self._decoded(xs[0] if len(xs) == 1 else sum(xs) / len(xs), self.live.settings.rate)

    def _decoded(self, x, rate):
        """Samples at `rate`, from the frame or the container's decoder."""
        live = self.live
        if live is None or live.closed:
            return
        if rate != live.settings.rate:
            live.configure(dataclasses.replace(live.settings, rate=rate))
        self.fed += len(x)
        live.feed(x)
        self._utterance_end()

    def _configure(self, msg):
        terms = msg.get("keyterms", [])
        if not isinstance(terms, list) or not all(isinstance(t, str) for t in terms):
            return self._send({"type": "ConfigureFailure", "request_id": self.rid,
                               "code": "INVALID_CONFIGURE", "description": "keyterms must be a list of strings"})
        hot = ", ".join(dict.fromkeys(t.strip() for t in terms if t.strip())) or None
        live = self.live
        live.configure(dataclasses.replace(live.settings, hotwords=hot))
        self._send({"type": "ConfigureSuccess", "request_id": self.rid, "keyterms": terms})

    async def _close_stream(self):
        """Every utterance's final, then the Metadata, then the close."""
        if self.decoder is not None:            # what the container still holds, decoded first
            self.decoder.close()
            await asyncio.get_running_loop().run_in_executor(None, self.decoder.join, 30)
            await asyncio.sleep(0)
        self.live.end()
        await self.live.settled()
        self._send(live_metadata(self.rid, self.digest.hexdigest(),
                                 self.fed / self.live.settings.rate, self.model))
        self.close(1000)

    def stopped(self):
        if getattr(self, "decoder", None) is not None:
            self.decoder.close()
        super().stopped()

    # -- out ----------------------------------------------------------------------------------

    def _from_stream(self, m):
        kind = m.get("type")
        listen = self.ask.listen
        if kind == "start":
            self.last_start = m["speech_t0"]           # the voice itself, not the lead kept before it
            if self.ask.vad_events:
                self._send({"type": "SpeechStarted", "channel": [0, 1],
                            "timestamp": round(m["speech_t0"], 3)})
            self._utterance_end(self.last_start)
        elif kind == "partial":
            self._send(live_results(m, listen, self.rid, self.model, final=False))
        elif kind == "final":
            finalize = m["seg"] in self.finalizing
            self.finalizing.discard(m["seg"])
            self._send(live_results(m, listen, self.rid, self.model, final=True,
                                    speech_final=m.get("reason") == "pause", from_finalize=finalize))
            if m.get("words"):
                self.last_word_end = m["words"][-1][1]
                if self.last_start is not None and self.last_start > self.last_word_end:
                    self._utterance_end(self.last_start)     # the next voice began already
        elif "error" in m:
            self._error("TRANSCRIPTION_FAILED", m["error"])

    def _utterance_end(self, voice_at=None):
        """UtteranceEnd when utterance_end_ms of audio passed the last word before the next voice
        (`voice_at`: where it began; None: none yet, the audio so far counts)."""
        ms = self.ask.utterance_end_ms
        if ms is None or self.last_word_end is None:
            return
        until = self.fed / self.live.settings.rate if voice_at is None else voice_at
        if until >= self.last_word_end + ms / 1000:
            self._send({"type": "UtteranceEnd", "channel": [0, 1], "last_word_end": self.last_word_end})
            self.last_word_end = None
        elif voice_at is not None:
            self.last_word_end = None             # the voice came back sooner: no end here

    def _error(self, variant, message):
        self._send({"type": "Error", "variant": variant, "description": message, "message": message})


class _Method(routing.PathMatches):
    """A path for some methods only: /v1/listen is a WebSocket for GET, a recording for POST."""

    def __init__(self, path, methods):
        super().__init__(path)
        self.methods = methods

    def match(self, request):
        return super().match(request) if request.method in self.methods else None


def routes(ctx):
    k = {"ctx": ctx}
    return [routing.Rule(_Method(r"/v1/listen", {"GET"}), LiveHandler, k),
            (r"/v1/listen", ListenHandler, k)]
