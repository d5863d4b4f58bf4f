"""The HTTP surface: the routes, the small handlers, and the process that serves them (the JSON
handler they all derive from is handlers.py; the transcription routes, transcription.py).

    run(Config(models=("tiny.en",), host="127.0.0.1", port=6543))   # load, bind, serve until SIGTERM

Routes (token-protected unless marked open):

    GET  /                          the test page (open), from server/static/
    GET  /health                    {"status": "ok"|"idle", model shape, counters} (open)
    POST /inference                 whisper.cpp's server: multipart `file` + fields, or a raw body
    POST /v1/audio/transcriptions   OpenAI's API shape
    POST /v1/audio/translations     the same, task=translate
    GET  /v1/models                 the models this server holds, as OpenAI lists models
    POST /load                      whisper.cpp's: `model` = one of them becomes the default
    GET  / and /stream (WebSocket)  live audio in, utterances out (stream.py)
    GET  /v1/realtime (WebSocket)   OpenAI's Realtime transcription sessions (realtime.py)
    POST /v1/listen                 Deepgram's pre-recorded transcription (deepgram.py)

A transcription request's pipeline is in transcription.py. Every refusal is a 4xx (or 503 when
full) with {"error": "<what was wrong>"} — on the /v1/ routes OpenAI's error object (handlers.py);
nothing a client sends can stop the server serving the others.

A server may hold several models (`--model` repeated): each has its own ModelHost (worker thread,
queue, idle unload); the first is the default. A request picks one by name (OpenAI's `model`,
Deepgram's `model`, Wyoming's `name`); a vendor's own model names (whisper-1, nova-3 …) and no
name mean the default, and any other name is refused with the list (Context.choose).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tornado import httpserver, netutil, web

from ..io.registry import DEFAULT_MODEL
from ..records import TranscribeOptions
from . import auth, deepgram, realtime, stream, wyoming
from .model_host import ModelHost
from .limits import Slots
from .handlers import JsonHandler, NotFound, UnknownModel
from .transcription import InferenceHandler, OpenAIHandler

log = logging.getLogger("nwhisper.server")

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
MiB = 1 << 20


@dataclass
class Config:
    models: tuple = (DEFAULT_MODEL,)  # names or paths; the first is the default
    device: str = "auto"
    compute_type: str = "float32"
    host: str = "127.0.0.1"
    port: int = 6543
    language: str | None = None      # server default; a request's `language` overrides it
    vad: bool = False                # server default; a request's `vad` overrides it
    timestamps: bool = False         # server default; a request's `timestamps` overrides it
    max_tokens: int = TranscribeOptions.max_tokens
    tail_ms: int | None = None       # live streams' fixed tail; None: sized by the model's speed
    token: str | None = None
    ssl: object = None               # an ssl.SSLContext for https/wss, or None
    unload_after: float = 0.0        # seconds idle before the model is released; 0 = never
    connections: int = 8             # requests/streams served at once
    queue: int = 16                  # requests waiting for a slot before 503
    max_upload: int = 100 * MiB      # bytes per request body
    http: bool = True                # serve HTTP on host:port (off: Wyoming only)
    wyoming: str | None = None       # tcp://HOST:PORT or unix://PATH: Home Assistant's protocol
    wyoming_own_vad: bool = False    # tell Wyoming clients they need no VAD of their own
    zeroconf: str | None = None      # advertise the Wyoming service under this name (mDNS)
    offline: bool | None = None      # never download a model (None: HF_HUB_OFFLINE decides)

    @property
    def discard_limit(self):
        """Bodies up to this size are read and dropped before a 4xx (clients that are still
        sending would otherwise see a reset instead of the answer); larger ones are cut off."""
        return max(2 * self.max_upload, self.max_upload + 16 * MiB)


class Context:
    """What every handler shares: the config, the model hosts, the slots, the counters."""

    def __init__(self, config, hosts):
        self.config, self.hosts = config, dict(hosts)
        self.host = next(iter(self.hosts.values()))      # the default (POST /load changes it)
        self.slots = Slots(config.connections, config.queue)
        self.decoders = ThreadPoolExecutor(2, thread_name_prefix="nwhisper-decode")
        self.requests = self.failed = 0
        self.streams_open = self.streams_opened = 0
        self.started = time.monotonic()

    def choose(self, name, vendor=lambda name: False):
        """The ModelHost a request names: the default for no name or a `vendor` name (the
        dialect's own models), UnknownModel for a name this server does not hold."""
        if not name or (name not in self.hosts and vendor(name)):
            return self.host
        if name not in self.hosts:
            raise UnknownModel(name, self.hosts)
        return self.hosts[name]

    def stream_opened(self, host):
        """A live stream began on `host`: it keeps that model loaded until stream_closed()."""
        host.hold()
        self.streams_open += 1
        self.streams_opened += 1

    def stream_closed(self, host):
        host.release()
        self.streams_open -= 1

    def health(self):
        h = self.host
        return {
            "status": "ok" if h.loaded else "idle",
            "model": _shown(h),
            "models": [_shown(m) for m in self.hosts.values()],
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


def _memory(host):
    return "" if host.rss_mb is None else f", {host.rss_mb:.0f} MB of memory"


def _shown(h):
    return {"name": h.name, "loaded": h.loaded, "device": h.device_name, "compute_type": h.compute_type,
            "multilingual": h.abilities.multilingual, "rss_mb": h.rss_mb, **h.shape}


class HealthHandler(JsonHandler):
    def get(self):
        self.finish(self.ctx.health())


class ModelsHandler(JsonHandler):
    def get(self):
        if self.authorized():
            self.finish({"object": "list", "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "nwhisper"}
                for name in self.ctx.hosts]})


class LoadHandler(JsonHandler):
    """whisper.cpp's POST /load: its `model` field (form or multipart) names the model later
    requests that name none get. Only a model this server holds: a request never makes the
    server read a file or fetch a model (the operator chooses them with --model)."""

    def post(self):
        if not self.authorized():
            return
        name = self.get_argument("model", "").strip()
        if not name:
            return self.fail(400, "POST /load needs a `model` field: one of " + ", ".join(self.ctx.hosts))
        try:
            self.ctx.host = self.ctx.choose(name)
        except UnknownModel as e:
            return self.fail(400, str(e), "model")
        self.finish({"status": "ok", "model": name})


class PageHandler(web.StaticFileHandler):
    """The test page and its files, straight from the package."""

    def set_default_headers(self):
        self.set_header("Server", "nwhisper")
        self.set_header("Cache-Control", "no-cache")


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
        (r"/load", LoadHandler, k),
        *stream.routes(ctx),
        *realtime.routes(ctx),
        *deepgram.routes(ctx),
        (r"/static/(.+)", PageHandler, {"path": STATIC}),
    ]
    return web.Application(routes, default_handler_class=NotFound, default_handler_args=k,
                           log_function=_log_request)


def url(cfg, port):
    host = cfg.host if ":" not in cfg.host else f"[{cfg.host}]"
    return f"{'https' if cfg.ssl else 'http'}://{host}:{port}"


def startup_notes(cfg, hosts):
    """What to tell the operator once the models are loaded; ValueError for a --lang one lacks."""
    for host in hosts:
        host.abilities.language(cfg.language)
    notes = []
    if not cfg.token and not auth.is_loopback(cfg.host):
        notes.append(f"nwhisper: WARNING: listening on {cfg.host or 'every address'} without a "
                     f"token — anyone who can reach this port can use it (set --token or "
                     f"NWHISPER_TOKEN)")
    return notes


def _say(message):
    print(message, flush=True)


def run(cfg, say=_say, warmup=True):
    """Load the models, then open the port and serve until SIGINT/SIGTERM."""
    from ..api import load

    hosts = {}
    for name in dict.fromkeys(cfg.models):
        host = ModelHost(name, cfg.device, cfg.unload_after, compute_type=cfg.compute_type,
                         loader=functools.partial(load, offline=cfg.offline))
        say(f"nwhisper: loading {name} ({cfg.device}) …")
        t0 = time.perf_counter()
        host.load(warmup=warmup)
        say(f"nwhisper: {name} ready on {host.device_name} in "
            f"{(time.perf_counter() - t0) * 1000:.0f} ms (load {host.last_load_ms:.0f} ms, then a "
            f"warm-up transcription){_memory(host)}")
        hosts[name] = host
    for line in startup_notes(cfg, hosts.values()):
        say(line)
    asyncio.run(_serve(cfg, hosts, say))


async def _serve(cfg, hosts, say):
    ctx = Context(cfg, hosts)
    server = service = zc = None
    if cfg.http:
        server = httpserver.HTTPServer(make_app(ctx), ssl_options=cfg.ssl,
                                       max_body_size=cfg.discard_limit, idle_connection_timeout=60,
                                       body_timeout=300)
        sockets = netutil.bind_sockets(cfg.port, address=cfg.host or None)
        server.add_sockets(sockets)
        port = sockets[0].getsockname()[1]
    if cfg.wyoming:
        service = await wyoming.WyomingService(ctx, cfg.wyoming, cfg.wyoming_own_vad).start()
    for host in hosts.values():
        host.last_active = time.monotonic()     # idle counts from the moment the port opens
        host.start_idle_timer()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if server is not None:
        say(f"nwhisper serving on {url(cfg, port)} (test page at /, POST /inference, "
            f"POST /v1/audio/transcriptions, GET /health, WebSocket at / and /stream: live audio, "
            f"at /v1/realtime: OpenAI Realtime)")
    if service is not None:
        say(f"nwhisper Wyoming speech-to-text on {service.address} (Home Assistant: add the "
            f"Wyoming Protocol integration with this host and port)")
        if cfg.zeroconf and service.kind == "tcp":
            address = wyoming.lan_address() if service.where in ("0.0.0.0", "") else service.where
            zc = await wyoming.advertise(cfg.zeroconf, service.port, address)
            say(f"nwhisper: advertised as {cfg.zeroconf}.{wyoming.SERVICE_TYPE} at "
                f"{address}:{service.port}")
    await stop.wait()
    say("nwhisper: stopping")
    if zc is not None:
        await zc.async_close()
    if service is not None:
        await service.stop()
    if server is not None:
        server.stop()
    for host in hosts.values():
        host.close()
    ctx.decoders.shutdown(wait=False)
