"""Deepgram's speech-to-text API, for apps written against its SDK: `POST /v1/listen`.

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
"""

from __future__ import annotations

import json
import logging
import uuid

from tornado import ioloop, web

import nwhisper

from ..abilities import Unsupported, options
from ..io.audio import SAMPLE_RATE, AudioError, load_audio, load_channels, resample
from ..stream.door import Abandoned
from .deepgram_fields import DeepgramError, error_body, listen_params, prerecorded, raw_channels
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
        if self._gone:
            return
        if self._refuse is not None:
            return self.fail(*self._refuse)
        body, self._chunks = b"".join(self._chunks), None
        cfg = self.ctx.config
        try:
            ask = listen_params(self.request.query_arguments)
            _no_url(self.request, body)
            loop = ioloop.IOLoop.current()
            channels = await loop.run_in_executor(self.ctx.decoders, _channels, body, ask)
            if self._gone:
                return
            opts = self.ctx.host.abilities.check(options(
                language=ask.language if ask.language is not None else cfg.language,
                max_tokens=cfg.max_tokens, timestamps=True, word_timestamps=True,
                hotwords=ask.hotwords))
            self._job = self.ctx.host.submit(lambda m: [_transcribe(m, x, opts) for x in channels])
            results = await self._job
            if self._gone:
                return
        except DeepgramError as e:
            return self.fail(e.status, str(e))
        except AudioError as e:
            return self.fail(400, f"failed to process audio: {e}")
        except Unsupported as e:
            return self.fail(400, str(e))
        except Abandoned:
            return
        except ValueError as e:            # the library's word on the options
            return self.fail(400, str(e))
        except Exception as e:             # a bug or the device; the next request still runs
            log.exception("deepgram transcription failed")
            return self.fail(500, f"transcription failed: {type(e).__name__}: {e}")
        finally:
            self._job = None
        duration = len(channels[0]) / SAMPLE_RATE
        out = prerecorded(results, ask, body, duration, self.ctx.host.name, nwhisper.__version__,
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
    if ask.encoding is not None:
        xs = raw_channels(body, ask)
        if not ask.multichannel and len(xs) > 1:
            xs = [sum(xs) / len(xs)]
        return [resample(x, ask.sample_rate) if ask.sample_rate != SAMPLE_RATE else x for x in xs]
    return load_channels(body) if ask.multichannel else [load_audio(body)]


def _transcribe(model, samples, opts):          # on the model's worker thread
    segments, info = model.transcribe(samples, opts)
    return list(segments), info


def routes(ctx):
    return [(r"/v1/listen", ListenHandler, {"ctx": ctx})]
