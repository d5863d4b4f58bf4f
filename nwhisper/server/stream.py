"""Live audio over a WebSocket on the server's port: `/` (a GET with Upgrade: websocket; plain
GETs get the test page) and `/stream`.

    → {"format": "pcm16", "rate": 48000, "partials": true}     optional config, any time
    ← {"status": "ok", "format": "pcm16", "vad": "silero", "pause_ms": 400, …}
    → binary frames of audio
    ← {"type": "final", "seg": 1, "text": " Hello.", "t0": 1.27, "t1": 2.73,
       "speech_t0": 1.66, "speech_t1": 2.53, "proc_ms": 0}
    → {"cmd": "end"} | {"cmd": "reset"}
    ← {"error": "…"}                                           failures are named

protocol.py checks the frames, stream/settings.py the config; the stream room's LiveStream turns
the audio into utterances and jobs (this handler only translates). The handshake
is refused with an HTTP error, as JSON, before any upgrade: 401 for a missing or wrong token, 503
when every connection slot is taken (a stream holds one for as long as it is open). After it,
nothing a client sends closes the stream except a frame over the WebSocket's own limit (Tornado
closes with 1009): a bad config, command or frame is answered with an error and the stream goes on.
"""

from __future__ import annotations

import json
import logging
import os

from tornado import websocket

from ..abilities import Unsupported
from ..stream.live import LiveStream
from ..stream.settings import ConfigError, StreamSettings
from . import auth
from .handlers import UnknownModel
from .limits import Busy
from .protocol import FrameError, decode_frame

log = logging.getLogger("nwhisper.server")

MAX_MESSAGE = 16 << 20       # Tornado closes the connection past this (frames past MAX_FRAME
                             # are refused with an error and the stream goes on)
PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static", "index.html")


class StreamHandler(websocket.WebSocketHandler):
    vendor = staticmethod(lambda name: False)   # the dialect's own model names: the default

    def initialize(self, ctx):
        self.ctx = ctx
        self.host = None             # the model this stream uses (its `model`; get() picks it)
        self.live = None
        self._slot = None
        self._held = False           # open() took the model and a stream count

    def check_origin(self, origin):
        return True                  # the token is the guard; pages on the LAN are welcome

    async def get(self, *args, **kwargs):
        cfg = self.ctx.config
        why = auth.problem(self.request, cfg.token)
        if why:
            return self.refuse(401, why)
        if self.request.headers.get("Upgrade", "").lower() != "websocket":
            return self.refuse(400, "this route is a WebSocket: connect with Upgrade: websocket")
        try:
            self.host or self.pick(self.get_query_argument("model", None))
        except UnknownModel as e:
            return self.refuse(400, str(e))
        try:
            self._slot = self.ctx.slots.enter_now()
        except Busy as e:
            return self.refuse(503, str(e))
        await super().get(*args, **kwargs)
        if self.ws_connection is None:        # the upgrade failed: give the slot back
            self._let_go()

    def pick(self, name):
        """The model `name` names (None: the default); UnknownModel for one not held here."""
        self.host = self.ctx.choose(name, self.vendor)
        return self.host

    def refuse(self, status, message):
        self.set_status(status)
        if status == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="nwhisper"')
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))

    def get_compression_options(self):
        return None

    @property
    def max_message_size(self):
        return MAX_MESSAGE

    def open(self, *args, **kwargs):
        self.ctx.stream_opened(self.host)
        self._held = True
        self.started()

    def started(self):
        """The upgrade is done: the native stream starts with the defaults."""
        self.live = self.live_stream(StreamSettings())

    def live_stream(self, settings, send=None, **kw):
        cfg = self.ctx.config
        return LiveStream(self.host, settings, send or self._send, language=cfg.language,
                          max_tokens=cfg.max_tokens, tail_ms=cfg.tail_ms, **kw)

    def on_message(self, message):
        live = self.live
        if live is None or live.closed:
            return
        if isinstance(message, bytes):
            try:
                samples = decode_frame(message, live.settings)
            except FrameError as e:
                return self._send({"error": str(e)})
            if len(samples):
                live.feed(samples)
            return
        try:
            msg = json.loads(message)
        except ValueError as e:
            return self._send({"error": f"a text message must be JSON (a config object or a "
                                        f"command): {e}"})
        if isinstance(msg, dict) and "cmd" in msg:
            return self._command(msg)
        try:
            settings = live.settings.updated(msg)
            self.check_language(settings.lang, ConfigError)
        except ConfigError as e:
            return self._send({"error": f"config refused, nothing changed: {e}"})
        live.configure(settings)
        self._send({"status": "ok", **live.effective()})

    def _command(self, msg):
        cmd, extra = msg.get("cmd"), sorted(set(msg) - {"cmd"})
        if extra:
            return self._send({"error": f"a command message takes only \"cmd\", not "
                                        f"{', '.join(repr(k) for k in extra)}"})
        if cmd == "end":
            self.live.end()
        elif cmd == "reset":
            self.live.reset()
        else:
            self._send({"error": f"unknown command {cmd!r}: the commands are \"end\" and \"reset\""})

    def check_language(self, lang, error):
        """Raise error(message) unless the model knows `lang` (None and "auto": detect)."""
        try:
            self.host.abilities.language(lang)
        except Unsupported as e:
            raise error(str(e)) from None

    def _send(self, message):
        if self.ws_connection is None or self.ws_connection.is_closing():
            return
        try:
            self.write_message(json.dumps(message, ensure_ascii=False))
        except websocket.WebSocketClosedError:
            pass

    def on_close(self):
        if self._held:
            self.stopped()
            self._held = False
            self.ctx.stream_closed(self.host)
        self._let_go()

    def stopped(self):
        """The connection went: nothing the stream queued runs."""
        if self.live is not None:
            self.live.close()
            self.live = None

    def on_connection_close(self):
        super().on_connection_close()
        self._let_go()

    def _let_go(self):
        if self._slot is not None:
            self.ctx.slots.leave(self._slot)
            self._slot = None


class RootHandler(StreamHandler):
    """`/`: the test page for a browser, a stream for a WebSocket client."""

    async def get(self, *args, **kwargs):
        if self.request.headers.get("Upgrade", "").lower() == "websocket":
            return await super().get(*args, **kwargs)
        self.set_header("Server", "nwhisper")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        with open(PAGE, "rb") as f:
            self.finish(f.read())


def routes(ctx):
    k = {"ctx": ctx}
    return [(r"/", RootHandler, k), (r"/stream", StreamHandler, k)]
