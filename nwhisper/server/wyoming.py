"""Home Assistant's voice devices: a Wyoming speech-to-text service on the server's model.

    nwhisper serve base --wyoming tcp://0.0.0.0:10300 [--zeroconf]

A connection (Home Assistant's Assist pipeline, a satellite, the `wyoming` package's client):

    → describe                       ← info {asr: [one program, its model, the model's languages]}
    → ping                           ← pong
    → transcribe {language, name, context, vad_sensitivity, transcript_names, transcript_terms}
    → audio-start {rate, width, channels}
    → audio-chunk {rate, width, channels} + PCM   … many, at any rate, width and channel count
    ← transcript-start {language}    ← transcript-chunk {text}   … the transcript so far, each
                                                                    replacing the one before
    ← transcript {text, language}    ← transcript-stop
    → audio-stop

The audio goes through the stream room's LiveStream: the endpointer cuts it at pauses (the pause
vad_sensitivity names, as Home Assistant's own VAD: default 0.7 s, relaxed 1.25, aggressive
0.25) and decodes each utterance while the person is still silent, so at audio-stop the
`transcript` (every final of the transcription, in order) is mostly decoded already. With
--wyoming-own-vad the service tells clients it needs no VAD of theirs (requires_external_vad
false) and sends the transcript the moment our endpointer closes the first utterance; Home
Assistant takes the first transcript, and the audio after it is ignored until the next
audio-start. A connection may carry any number of transcriptions. transcript_names and
transcript_terms reach the model as hotwords.

Limits are the HTTP side's: a transcription holds one of the server's connection slots from
audio-start to its transcript (an `error` "server-busy" when none is free). A frame that cannot be
parsed closes the connection (the next frame's start is unknown); an event that is wrong gets an
`error` {text, code} and the connection goes on; unknown events are ignored. `describe` and `ping`
are answered on the event loop while transcriptions run (Home Assistant allows describe 1 s).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time

import nwhisper

from ..abilities import Unsupported
from ..stream.live import LiveStream
from ..stream.settings import StreamSettings
from .handlers import UnknownModel
from .limits import Busy
from .wyoming_events import EventError, Frames, FrameError, audio_format, encode, samples, transcribe

log = logging.getLogger("nwhisper.server")

PAUSE_MS = {"default": 700, "relaxed": 1250, "aggressive": 250}   # Home Assistant's VadSensitivity
IDLE, AUDIO, SETTLING, ANSWERED = "idle", "audio", "settling", "answered"  # a connection's states
READ = 1 << 16                   # bytes read from the socket at a time
FRAME_TIMEOUT_S = 30.0           # a frame begun and not finished in this long: the peer is gone
LINGER_S = 2.0                   # after a fatal error, the peer's bytes are read and dropped this long
SERVICE_TYPE = "_wyoming._tcp.local."


def parse_uri(uri):
    """'tcp://HOST:PORT' → ("tcp", host, port); 'unix://PATH' → ("unix", path, None)."""
    scheme, sep, rest = uri.partition("://")
    if scheme == "unix" and sep and rest:
        return "unix", rest, None
    if scheme == "tcp" and sep:
        host, colon, port = rest.rpartition(":")
        if colon and port.isdigit() and int(port) <= 65535:
            return "tcp", host.strip("[]") or "0.0.0.0", int(port)
    raise ValueError(f"--wyoming {uri!r}: expected tcp://HOST:PORT or unix://PATH")


class WyomingService:
    """The listening socket and its connections; start() on the server's event loop."""

    def __init__(self, ctx, uri, own_vad=False):
        self.ctx, self.uri, self.own_vad = ctx, uri, own_vad
        self.kind, self.where, self.port = parse_uri(uri)
        self.server = None
        self.connections = set()

    async def start(self):
        if self.kind == "unix":
            if os.path.exists(self.where) and not os.path.isdir(self.where):
                os.unlink(self.where)            # a socket file left by an earlier run
            self.server = await asyncio.start_unix_server(self._connected, self.where)
        else:
            self.server = await asyncio.start_server(self._connected, self.where, self.port)
            self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def address(self):
        return f"unix://{self.where}" if self.kind == "unix" else f"tcp://{self.where}:{self.port}"

    async def stop(self):
        self.server.close()
        for c in list(self.connections):
            c.close()
        await self.server.wait_closed()

    async def _connected(self, reader, writer):
        c = Connection(self, reader, writer)
        self.connections.add(c)
        try:
            await c.run()
        finally:
            self.connections.discard(c)
            c.close()

    def info(self):
        """The `info` event's data: one ASR program with the models this server holds (the
        default first)."""
        attribution = {"name": "nwhisper", "url": "https://pypi.org/project/nwhisper/"}
        hosts = [self.ctx.host] + [h for h in self.ctx.hosts.values() if h is not self.ctx.host]
        models = [{"name": h.name, "attribution": {"name": "OpenAI", "url": "https://github.com/openai/whisper"},
                   "installed": True, "description": f"Whisper {h.name} ({h.compute_type})", "version": None,
                   "languages": list(h.abilities.languages) if h.abilities.multilingual else ["en"]}
                  for h in hosts]
        program = {"name": "nwhisper", "attribution": attribution, "installed": True,
                   "description": "Whisper on Numba kernels, streaming", "version": nwhisper.__version__,
                   "models": models, "supports_transcript_streaming": True,
                   "requires_external_vad": not self.own_vad,
                   "prefers_auto_gain_enabled": True, "prefers_noise_reduction_enabled": False}
        return {"asr": [program], "tts": [], "handle": [], "intent": [], "wake": [], "mic": [],
                "snd": []}


class Connection:
    def __init__(self, service, reader, writer):
        self.service, self.ctx = service, service.ctx
        self.reader, self.writer = reader, writer
        self.request = transcribe({})    # the last `transcribe`; the next audio-start uses it
        self.state = IDLE
        self.live = None                 # the transcription's stream (audio-start → transcript)
        self.texts = []                  # its finals so far
        self.language = None             # the language they were heard in
        self.started = False             # its transcript-start was sent
        self.said = {}                   # seg → its stable draft so far
        self.drafted = ""                # the last transcript-chunk's text
        self._slot = None
        self._held = None                # the ModelHost a transcription holds
        self.closed = False

    # -- the socket ---------------------------------------------------------------------------

    async def run(self):
        frames = Frames()
        begun = None                      # when the unfinished frame's first byte came
        while not self.closed:
            timeout = None if begun is None else FRAME_TIMEOUT_S - (time.monotonic() - begun)
            try:
                piece = await asyncio.wait_for(self.reader.read(READ), timeout)
            except asyncio.TimeoutError:
                self.send("error", {"text": f"a frame unfinished after {FRAME_TIMEOUT_S:.0f} s; "
                                            f"closing", "code": "frame-timeout"})
                return await self._linger()
            except ConnectionError:
                return
            if not piece:
                return
            try:
                events = frames.feed(piece)
            except FrameError as e:
                self.send("error", {"text": f"not a Wyoming frame: {e}; closing", "code": "bad-frame"})
                return await self._linger()
            for event in events:
                try:
                    self.on_event(event)
                except EventError as e:
                    self.send("error", {"text": str(e), "code": e.code})
            if not frames.midframe:
                begun = None
            elif begun is None or events:
                begun = time.monotonic()
            await self._drain()

    async def _linger(self):
        """After a fatal error: let the peer read it (closing with its bytes unread would reset
        the connection and lose the error), reading and dropping what it still sends."""
        try:
            await self._drain()
            if self.writer.can_write_eof():
                self.writer.write_eof()
            deadline = time.monotonic() + LINGER_S
            while (left := deadline - time.monotonic()) > 0:
                if not await asyncio.wait_for(self.reader.read(READ), left):
                    return
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass

    async def _drain(self):
        try:
            await self.writer.drain()
        except ConnectionError:
            self.close()

    def send(self, kind, data=None):
        if not self.closed and not self.writer.is_closing():
            self.writer.write(encode(kind, data))

    def close(self):
        if self.closed:
            return
        self.closed = True
        self._finish()
        self.writer.close()

    # -- events in ----------------------------------------------------------------------------

    def on_event(self, e):
        if e.type == "describe":
            self.send("info", self.service.info())
        elif e.type == "ping":
            self.send("pong", {"text": e.data.get("text")})
        elif e.type == "transcribe":
            request = transcribe(e.data)
            try:
                self.ctx.choose(request.name).abilities.language(request.language)
            except UnknownModel as err:
                raise EventError(str(err), "unknown-model") from None
            except Unsupported as err:
                raise EventError(str(err), "unsupported-language") from None
            self.request = request
        elif e.type == "audio-start":
            self._start(audio_format(e.data, "audio-start"))
        elif e.type == "audio-chunk":
            self._chunk(e)
        elif e.type == "audio-stop":
            self._stop()

    def _start(self, fmt):
        self._finish()                    # a transcription left open is dropped
        self.state = ANSWERED             # refused: its audio is dropped without more errors
        try:
            self._slot = self.ctx.slots.enter_now()
        except Busy as err:
            raise EventError(str(err), "server-busy") from None
        self._held = self.ctx.choose(self.request.name)      # the model; checked at `transcribe`
        self.ctx.stream_opened(self._held)
        r = self.request
        settings = StreamSettings(rate=fmt.rate, lang=r.language, partials=True,
                                  pause_ms=PAUSE_MS[r.vad_sensitivity or "default"],
                                  hotwords=", ".join(r.terms) or None)
        self.live = LiveStream(self._held, settings, self._from_stream,
                               language=self.ctx.config.language,
                               max_tokens=self.ctx.config.max_tokens,
                               tail_ms=self.ctx.config.tail_ms)
        self.state, self.texts, self.started, self.said, self.drafted = AUDIO, [], False, {}, ""
        self.language = None

    def _chunk(self, e):
        if self.state == ANSWERED:
            return                        # the transcript went out: the rest is not needed
        if self.state != AUDIO:
            raise EventError("audio-chunk outside audio-start … audio-stop", "no-audio-start")
        fmt = audio_format(e.data, "audio-chunk")
        x = samples(e.payload, fmt)
        if fmt.rate != self.live.settings.rate:
            self.live.configure(dataclasses.replace(self.live.settings, rate=fmt.rate))
        if len(x):
            self.live.feed(x)

    def _stop(self):
        if self.state == ANSWERED:
            self.state = IDLE
            return
        if self.state != AUDIO:
            raise EventError("audio-stop without audio-start", "no-audio-start")
        self.state = SETTLING
        self.live.end()
        asyncio.ensure_future(self._answer_when_settled(self.live))

    async def _answer_when_settled(self, live):
        """audio-stop: the transcript is every final of the transcription (most are decoded
        already, during the pauses)."""
        await live.settled()
        if live is self.live and self.state == SETTLING:
            self._answer("".join(self.texts), self.language)
            self.state = IDLE

    # -- the stream's messages out ----------------------------------------------------------

    def _from_stream(self, m):
        kind = m.get("type")
        if self.state not in (AUDIO, SETTLING):
            return
        if kind == "partial":
            said, stable = self.said.get(m["seg"], ""), m["stable"]
            if len(stable) > len(said) and stable.startswith(said):
                self.said[m["seg"]] = stable
                self._draft("".join(self.texts) + stable)
        elif kind == "final" and m["text"].strip():
            self.texts.append(m["text"])
            self.language = self.language or m.get("language")
            self._draft("".join(self.texts))        # the utterance's own words replace its draft
            if self.service.own_vad and self.state == AUDIO:
                self._answer(m["text"], m.get("language"))     # our endpointer ends the command
                self.state = ANSWERED
        elif "error" in m:
            self.send("error", {"text": m["error"], "code": "transcription-failed"})
        self._flush()

    def _draft(self, text):
        """A transcript-chunk: the transcript so far, which replaces the chunk before it (what
        wyoming 1.11 made a chunk mean), sent when it changed."""
        if text.strip() and text != self.drafted:
            self._transcript_start(None)
            self.send("transcript-chunk", {"text": text})
            self.drafted = text

    def _transcript_start(self, language):
        if not self.started:
            self.started = True
            self.send("transcript-start", {"language": language or self.request.language})

    def _answer(self, text, language):
        language = language or self.request.language
        self._transcript_start(language)
        data = {"text": text.strip(), "language": language}
        if self.request.context is not None:
            data["context"] = self.request.context
        self.send("transcript", data)
        self.send("transcript-stop")
        self._finish()
        self._flush()

    def _flush(self):
        if not self.closed:
            asyncio.ensure_future(self._drain())

    def _finish(self):
        """The transcription is over (answered, replaced or the connection went): its jobs
        are dropped, its slot and its hold on the model given back."""
        if self.live is not None:
            self.live.close()
            self.live = None
        if self._held is not None:
            self.ctx.stream_closed(self._held)
            self._held = None
        if self._slot is not None:
            self.ctx.slots.leave(self._slot)
            self._slot = None


# -- discovery ------------------------------------------------------------------------------------


def lan_address():
    """The address other machines reach this one at (the route toward the mDNS group; a UDP
    connect sends nothing)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("224.0.0.251", 5353))
        return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        s.close()


def service_info(name, port, address):
    """The mDNS record Home Assistant discovers a Wyoming service by."""
    from zeroconf import ServiceInfo

    return ServiceInfo(SERVICE_TYPE, f"{name}.{SERVICE_TYPE}",
                       addresses=[socket.inet_aton(address)], port=port,
                       server=f"{socket.gethostname().split('.')[0]}.local.")


async def advertise(name, port, address):
    """Announce the service on the LAN; returns the AsyncZeroconf to close at exit."""
    from zeroconf.asyncio import AsyncZeroconf

    zc = AsyncZeroconf()
    await zc.async_register_service(service_info(name, port, address))
    return zc
