"""OpenAI's Realtime API, transcription sessions: `GET /v1/realtime?intent=transcription`.

Voice apps written for OpenAI's cloud point their official client at this server instead; the
audio goes through the stream room's LiveStream (the endpointer, speculative finals, drafts; with
turn detection off, its commit mode) and its messages come back as OpenAI's events:

    ← session.created                          (transcription_session.created for beta clients)
    → session.update {session: {type: "transcription", audio: {input: {format, transcription,
                      turn_detection, noise_reduction}}}}    | transcription_session.update (beta)
    ← session.updated                          (transcription_session.updated)
    → input_audio_buffer.append {audio: base64}          … many
    ← input_audio_buffer.speech_started {audio_start_ms, item_id}        an utterance opens
    ← conversation.item.input_audio_transcription.delta {item_id, delta} the drafts' stable words
    ← input_audio_buffer.speech_stopped {audio_end_ms, item_id}          the pause closed it
    ← input_audio_buffer.committed {item_id, previous_item_id}
    ← conversation.item.input_audio_transcription.completed {item_id, transcript, usage}
    → input_audio_buffer.commit | .clear       ← .committed | .cleared
    ← error {error: {type, code, message, param, event_id}}   the session goes on

Deltas are the growth of the drafts' stable prefix (the words two drafts agree on), so they
concatenate to a text that only grows; `completed` carries the final, the authoritative text,
whether or not deltas came. With `turn_detection: null` nothing is cut: `commit` transcribes what
was appended since the last one. Audio starts after the first session update (an append before
it is refused), as PCM16 at 24 kHz (any rate 8–192 kHz may be named) or G.711 at 8 kHz, all
resampled to 16 kHz by the stream. The session's `model` may name anything: this
server holds one model and uses it under whatever name the client gives.
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets

from .realtime_events import (MIN_COMMIT_MS, RealtimeError, Session, apply_beta, apply_ga,
                              decode_append)
from .stream import StreamHandler
from .transcription import openai_name

log = logging.getLogger("nwhisper.server")

CONVERSATION_EVENTS = ("response.", "conversation.item.create", "conversation.item.delete",
                       "conversation.item.truncate", "conversation.item.retrieve",
                       "output_audio_buffer.")


class RealtimeHandler(StreamHandler):
    vendor = staticmethod(openai_name)

    def initialize(self, ctx):
        super().initialize(ctx)
        self.beta = False
        self.session = None          # the client's, from its first update on
        self.sid = "sess_" + secrets.token_hex(12)
        self._events = itertools.count(1)
        self._items = itertools.count(1)
        self.items = {}              # the stream's seg → item id, open or awaiting its transcript
        self.previous_item = None
        self._said = {}              # item id → the delta text sent so far

    # -- the handshake ------------------------------------------------------------------------

    async def get(self, *args, **kwargs):
        intent = self.get_query_argument("intent", "transcription")
        if intent != "transcription":
            return self.refuse(400, f"this server runs transcription sessions only: connect with "
                                    f"?intent=transcription, not {intent!r}", "intent")
        self.beta = "realtime=v1" in self.request.headers.get("OpenAI-Beta", "")
        await super().get(*args, **kwargs)

    def refuse(self, status, message, param=None):
        self.set_status(status)
        if status == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="nwhisper"')
        self.set_header("Content-Type", "application/json")
        code = {401: "invalid_api_key", 503: "server_busy"}.get(status, "invalid_request")
        self.finish(json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                          "param": param, "code": code}}))

    def select_subprotocol(self, subprotocols):
        return "realtime" if "realtime" in subprotocols else None

    def started(self):
        model = self.get_query_argument("model", None)
        kind = "transcription_session.created" if self.beta else "session.created"
        self._event(kind, session=self._shown(Session(model=model), self.beta))

    # -- events in ----------------------------------------------------------------------------

    def on_message(self, message):
        if isinstance(message, bytes):
            return self._error(RealtimeError("binary frames are not events: send audio as "
                                             "input_audio_buffer.append with base64 audio",
                                             "invalid_event"))
        try:
            msg = json.loads(message)
        except ValueError as e:
            return self._error(RealtimeError(f"an event must be a JSON object: {e}", "invalid_json"))
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            return self._error(RealtimeError("an event is a JSON object with a string 'type'",
                                             "invalid_event", "type"))
        kind = msg["type"]
        handler = {"session.update": self._update, "transcription_session.update": self._update,
                   "input_audio_buffer.append": self._append,
                   "input_audio_buffer.commit": self._commit,
                   "input_audio_buffer.clear": self._clear}.get(kind)
        try:
            if handler is None:
                if kind.startswith(CONVERSATION_EVENTS):
                    raise RealtimeError(f"{kind} belongs to conversation sessions; this server "
                                        f"runs transcription sessions only", "invalid_event", "type")
                raise RealtimeError(f"unknown event type {kind!r:.80}; a transcription session "
                                    f"takes session.update (or transcription_session.update), "
                                    f"input_audio_buffer.append, .commit and .clear",
                                    "invalid_event", "type")
            handler(msg)
        except RealtimeError as e:
            self._error(e, msg.get("event_id"))

    def _update(self, msg):
        beta = msg["type"] == "transcription_session.update"
        if "session" not in msg:
            raise RealtimeError(f"{msg['type']} needs a 'session' object",
                                "missing_required_parameter", "session")
        new = (apply_beta if beta else apply_ga)(self.session or Session(), msg["session"])

        def refused(message):
            return RealtimeError(message, "invalid_value", "session.audio.input.transcription.language"
                                 if not beta else "session.input_audio_transcription.language")
        self.check_language(new.language, refused)
        self._apply(new)
        kind = "transcription_session.updated" if beta else "session.updated"
        self._event(kind, session=self._shown(new, beta))

    def _apply(self, new):
        old, self.session = self.session, new
        turns = new.turn_detection is not None
        if old is not None and (old.turn_detection is not None) != turns:
            self._drop_audio()                 # the other mode: uncommitted audio is dropped
        settings = new.stream_settings()
        if self.live is None:
            self.live = self.live_stream(settings, send=self._from_stream, report_closes=True,
                                         turns=turns)
        self.live.configure(settings, lead_ms=new.lead_ms(), prompt=new.prompt)

    def _drop_audio(self):
        if self.live is not None:
            self.live.close()
            self.live = None
        self.items.clear()

    def _append(self, msg):
        if self.session is None:
            raise RealtimeError("send session.update (or transcription_session.update) before "
                                "audio: the format and turn detection are not set yet",
                                "session_not_configured", "type")
        if "audio" not in msg:
            raise RealtimeError("input_audio_buffer.append needs 'audio' (base64)",
                                "missing_required_parameter", "audio")
        samples = decode_append(msg["audio"], self.session)
        if len(samples):
            self.live.feed(samples)

    def _commit(self, msg):
        if self.session is None:
            raise RealtimeError("nothing to commit: no session.update and no audio yet",
                                "input_audio_buffer_commit_empty")
        if self.live.turns:
            if self.live.open_seg is None:
                raise RealtimeError("nothing to commit: no speech is open (server VAD commits "
                                    "each utterance itself)", "input_audio_buffer_commit_empty")
        elif self.live.pending_ms < MIN_COMMIT_MS:
            raise RealtimeError(f"buffer too small: a commit needs at least {MIN_COMMIT_MS} ms of "
                                f"audio, the buffer holds {self.live.pending_ms:.2f} ms",
                                "input_audio_buffer_commit_empty")
        self.live.end()                        # the close and the transcript follow as events

    def _clear(self, msg):
        if self.live is not None:
            self.items.pop(self.live.reset(), None)
        self._event("input_audio_buffer.cleared")

    # -- the stream's messages out, as OpenAI's events -------------------------------------------

    def _from_stream(self, m):
        kind = m.get("type")
        if kind == "start":
            item = self.items[m["seg"]] = self._new_item()
            self._event("input_audio_buffer.speech_started",
                        audio_start_ms=round(m["t0"] * 1000), item_id=item)
        elif kind == "partial":
            item = self.items.get(m["seg"])
            if item is not None:
                self._delta(item, m["stable"].lstrip())
        elif kind == "close":
            item = self.items.get(m["seg"]) or self.items.setdefault(m["seg"], self._new_item())
            if self.live.turns:
                self._event("input_audio_buffer.speech_stopped",
                            audio_end_ms=round(m["t1"] * 1000), item_id=item)
            self._committed(item)
        elif kind == "final":
            item = self.items.pop(m["seg"], None)
            if item is not None:
                self._completed(item, m["text"], m["t1"] - m["t0"])
        elif "error" in m:
            item = self.items.pop(m.get("seg"), None)
            if item is not None:
                self._failed(item, m["error"])
            else:
                self._error(RealtimeError(m["error"], "server_error"))

    def _delta(self, item, stable):
        said = self._said.get(item, "")
        if len(stable) > len(said) and stable.startswith(said):
            self._said[item] = stable
            self._event("conversation.item.input_audio_transcription.delta", item_id=item,
                        content_index=0, delta=stable[len(said):])

    def _committed(self, item):
        self._event("input_audio_buffer.committed", item_id=item, previous_item_id=self.previous_item)
        self.previous_item = item

    def _completed(self, item, text, seconds):
        self._said.pop(item, None)
        self._event("conversation.item.input_audio_transcription.completed", item_id=item,
                    content_index=0, transcript=text.strip(),
                    usage={"type": "duration", "seconds": round(max(seconds, 0.0), 3)})

    def _failed(self, item, message):
        self._said.pop(item, None)
        self._event("conversation.item.input_audio_transcription.failed", item_id=item,
                    content_index=0, error={"type": "server_error", "code": "transcription_failed",
                                            "message": message, "param": None})

    def _error(self, e, event_id=None):
        self._event("error", error={"type": "invalid_request_error", "code": e.code,
                                    "message": str(e), "param": e.param, "event_id": event_id})

    def _event(self, kind, **fields):
        self._send({"type": kind, "event_id": f"event_{next(self._events):06d}", **fields})

    def _new_item(self):
        return f"item_{self.sid[5:13]}{next(self._items):05d}"

    def _shown(self, session, beta):
        name = self.host.name
        return session.beta(self.sid, name) if beta else session.ga(self.sid, name)


def routes(ctx):
    return [(r"/v1/realtime", RealtimeHandler, {"ctx": ctx})]

