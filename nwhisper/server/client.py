"""A client of the live stream, as a microphone would be: a recording sent at a pace, frame by frame.

    result = asyncio.run(stream("ws://127.0.0.1:6543/stream", samples, rate=16000,
                                config={"partials": True}, pace=1.0))
    for r in result.messages:                 # every message, with its arrival time
        print(r.at, r.msg)
    result.wire                               # the samples as the server decoded them

`pace` 1.0 sends in real time (each frame when its audio would have been spoken), 2.0 twice as
fast, 0 as fast as the socket takes it. Times are seconds since the first frame left, so the
moment sample i was sent is i / rate / pace. After the last frame the client says
{"cmd": "end"} and waits until every utterance it saw start (events or partials on) has its
final, or until `linger` seconds pass with nothing new. `nwhisper stream` runs it from the command line; the tests and
bench/stream_latency.py drive the server with it. `realtime()` does the same through OpenAI's own
client on the Realtime route.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Received:
    at: float                 # seconds since the first frame was sent
    msg: dict


@dataclass
class StreamResult:
    config_answer: dict | None
    messages: list = field(default_factory=list)
    wire: np.ndarray | None = None      # what was sent, as the server decodes it (at `rate`)
    closed: tuple | None = None         # (code, reason) if the server closed the stream

    def of(self, kind):
        return [r.msg for r in self.messages if r.msg.get("type") == kind]

    @property
    def finals(self):
        return self.of("final")

    @property
    def errors(self):
        return [r.msg["error"] for r in self.messages if "error" in r.msg]


def encode(samples, fmt):
    """float32 samples → (frame bytes, the samples the server will decode from them)."""
    x = np.asarray(samples, np.float32)
    if fmt == "pcm16":
        q = np.clip(np.round(x * 32768.0), -32768, 32767).astype("<i2")
        return q.tobytes(), q.astype(np.float32) / np.float32(32768.0)
    if fmt == "float32":
        return x.astype("<f4").tobytes(), x.copy()
    raise ValueError(f"format {fmt!r}: expected 'pcm16' or 'float32'")


async def stream(url, samples, rate=16000, fmt="pcm16", config=None, pace=1.0, frame_ms=40,
                 token=None, end=True, linger=3.0, timeout=600.0, on_message=None):
    """Stream `samples` (float32 at `rate`) to the server at `url`; see the module's docstring.
    on_message(Received), if given, sees each message as it arrives."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    ws = await websocket_connect(HTTPRequest(url, headers=headers, validate_cert=False),
                                 max_message_size=16 << 20)
    cfg = dict(config or {})
    if fmt != "pcm16":
        cfg.setdefault("format", fmt)
    if rate != 16000:
        cfg.setdefault("rate", rate)
    answer = None
    if cfg:
        await ws.write_message(json.dumps(cfg))
        answer = json.loads(await ws.read_message())
    data, wire = encode(samples, fmt)
    result = StreamResult(answer, wire=wire)
    width = 2 if fmt == "pcm16" else 4
    frame = max(1, int(rate * frame_ms / 1000)) * width
    t0 = time.monotonic()
    started, finished = set(), set()
    quiet_since = [time.monotonic()]

    async def read():
        while True:
            raw = await ws.read_message()
            if raw is None:
                result.closed = (ws.close_code, ws.close_reason)
                return
            msg = json.loads(raw)
            result.messages.append(Received(round(time.monotonic() - t0, 4), msg))
            if on_message is not None:
                on_message(result.messages[-1])
            quiet_since[0] = time.monotonic()
            if msg.get("type") in ("start", "partial"):
                started.add(msg["seg"])
            elif msg.get("type") == "final":
                finished.add(msg["seg"])

    reader = asyncio.ensure_future(read())
    try:
        for i in range(0, len(data), frame):
            if pace:
                delay = t0 + (i + frame) / width / rate / pace - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            if reader.done():
                break
            await ws.write_message(data[i:i + frame], binary=True)
        if end and not reader.done():
            await ws.write_message(json.dumps({"cmd": "end"}))
        deadline = time.monotonic() + timeout
        while not reader.done() and time.monotonic() < deadline:
            quiet = time.monotonic() - quiet_since[0]
            if quiet > linger or (started and started <= finished and quiet > 0.3):
                break
            await asyncio.sleep(0.05)
    finally:
        ws.close()
        try:
            await asyncio.wait_for(reader, 5)
        except (asyncio.TimeoutError, Exception):
            reader.cancel()
    return result


async def realtime(url, frames, frame_s, session, beta=False, token=None, pace=1.0, linger=3.0,
                   timeout=600.0, model="whisper-1"):
    """OpenAI's own client (`openai[realtime]`) in a Realtime transcription session at `url`
    (http://host:port): `session` sent as session.update (beta: transcription_session.update),
    then `frames` — audio bytes in the session's format, `frame_s` seconds each — at `pace`.
    Returns [(seconds since the first frame was sent, event dict)] once every utterance that
    started has its transcript and `linger` s passed with nothing new."""
    import base64

    from openai import AsyncOpenAI

    base = url.rstrip("/") + "/v1"
    # the beta client always dials wss:// unless told where the WebSocket is
    client = AsyncOpenAI(base_url=base, api_key=token or "none",
                         websocket_base_url=base.replace("http", "ws", 1))
    rt = client.beta.realtime if beta else client.realtime
    events, open_items = [], set()
    async with rt.connect(model=model, extra_query={"intent": "transcription"}) as conn:
        if beta:
            await conn.transcription_session.update(session=session)
        else:
            await conn.session.update(session=session)
        t0 = time.monotonic()
        quiet_since = [t0]

        async def read():
            async for ev in conn:
                e = ev.to_dict()
                events.append((round(time.monotonic() - t0, 4), e))
                quiet_since[0] = time.monotonic()
                if e["type"] == "input_audio_buffer.speech_started":
                    open_items.add(e["item_id"])
                elif e["type"].endswith(("transcription.completed", "transcription.failed")):
                    open_items.discard(e["item_id"])

        reader = asyncio.ensure_future(read())
        try:
            for i, f in enumerate(frames):
                if pace:
                    await asyncio.sleep(max(0.0, t0 + (i + 1) * frame_s / pace - time.monotonic()))
                await conn.input_audio_buffer.append(audio=base64.b64encode(f).decode())
            deadline = time.monotonic() + timeout
            while not reader.done() and time.monotonic() < deadline:
                quiet = time.monotonic() - quiet_since[0]
                if quiet > linger or (not open_items and quiet > 0.3):
                    break
                await asyncio.sleep(0.05)
        finally:
            reader.cancel()
    return events
