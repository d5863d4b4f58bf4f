"""Live streaming end to end: a real `nwhisper serve` on loopback, real WebSocket clients.

Truth: a final's text must be what `transcribe` (the same model, in this process) makes of that
final's audio span — the samples the server decoded from the frames, cut at its t0..t1; the
transcribe path itself is checked against HF transformers in test_transcribe.py. Where the voice
is, is known by construction: the scenes are fixture clips placed in silence, so speech_t0..t1
must lie on a clip. Streams go at real-time pace and faster, pcm16 and float32, 16 and 48 kHz.

    main     tiny.en --token            the protocol, bad input, eight connections
    sleepy   tiny.en --unload-after 1   an open stream keeps the model; a disconnect leaves nothing
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from fixture_audio import audio
from server_process import Server

from nwhisper.io.audio import resample
from nwhisper.server.client import stream

TOKEN = "stream-token"
SR = 16000
ANSWERS = ["cards/001.wav", "cards/003.wav", "cards/002.wav", "cards/004.wav"]
# "start" events let the client stop once every utterance it saw start has its final; without
# them it can only wait out its linger (the test of a client with no config must)
EVENTS = {"events": True}
LEAD_S, GAP_S = 1.0, 1.6


def scene(clips=ANSWERS, lead=LEAD_S, gap=GAP_S, tail=1.5):
    """The clips one after another with `gap` s of silence between: (samples, [(start, end) s])."""
    parts, spans, t = [np.zeros(int(lead * SR), np.float32)], [], lead
    for c in clips:
        x = audio(c)
        parts += [x, np.zeros(int(gap * SR), np.float32)]
        spans.append((t, t + len(x) / SR))
        t += len(x) / SR + gap
    parts.append(np.zeros(int(tail * SR), np.float32))
    return np.concatenate(parts), spans


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("stream-servers"))
    s = {"main": Server(d, "main", "tiny.en", "--token", TOKEN),
         "sleepy": Server(d, "sleepy", "tiny.en", "--unload-after", "1")}
    try:
        for srv in s.values():
            srv.wait()
        yield s
    finally:
        for srv in s.values():
            srv.stop()


@pytest.fixture(scope="module")
def main(servers):
    return servers["main"]


@pytest.fixture(scope="module")
def model(models):
    return models("tiny.en")


def ws(server, path="/stream", token=TOKEN):
    url = server.url.replace("http", "ws", 1) + path
    return url + (f"?token={token}" if token else "")


def run(coro):
    return asyncio.run(coro)


def health(server):
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        return json.load(r)


def words(finals):
    """The finals' words, lower case, without punctuation."""
    return " ".join(re.sub(r"[^\w' ]", " ", " ".join(f["text"] for f in finals).lower()).split())


def heard(result, rate):
    """The 16 kHz audio the server's stream holds: the wire samples, resampled as it does."""
    return result.wire if rate == SR else resample(result.wire, rate)


def check_finals(result, model, rate, spans):
    """Each final = transcribe of its span; its voice on a clip; seg numbers rising."""
    x = heard(result, rate)
    finals = result.finals
    assert finals, result.messages
    segs = [f["seg"] for f in finals]
    assert segs == sorted(segs) and len(set(segs)) == len(segs)
    for f in finals:
        assert f["t0"] <= f["speech_t0"] < f["speech_t1"] <= f["t1"], f
        span = x[round(f["t0"] * SR):round(f["t1"] * SR)]
        segments, _ = model.transcribe(span)
        segments = list(segments)
        assert f["text"] == "".join(s.text for s in segments), f
        assert f["proc_ms"] >= 0
        mid = (f["speech_t0"] + f["speech_t1"]) / 2
        assert any(a - 0.3 <= mid <= b + 0.3 for a, b in spans), (f, spans)
    return finals


@pytest.mark.parametrize("fmt,rate,pace,partials", [
    ("pcm16", 16000, 4.0, False),
    ("float32", 48000, 1.0, True),     # real time: drafts come while the answers are spoken
    ("pcm16", 44100, 4.0, True),
    ("float32", 16000, 0, False),
])
def test_finals_equal_transcribe_of_their_span(main, model, fmt, rate, pace, partials):
    x, spans = scene()
    sent = x if rate == SR else resample(x, SR, rate)
    cfg = {"partials": partials, "events": True, "pause_ms": 400}
    r = run(stream(ws(main), sent, rate=rate, fmt=fmt, config=cfg, pace=pace, linger=20))
    assert r.config_answer["status"] == "ok" and r.config_answer["format"] == fmt
    assert r.config_answer["rate"] == rate and r.config_answer["pause_ms"] == 400
    assert not r.errors, r.errors
    finals = check_finals(r, model, rate, spans)
    said = words(finals)
    assert said.count(" of ") >= 2 and "queen" in said, said   # the answers, as tiny.en hears them
    starts = {m["seg"] for m in r.of("start")}
    assert {f["seg"] for f in finals} <= starts
    for p in r.of("partial"):
        assert p["text"].startswith(p["stable"]), p
        assert p["t0"] < p["t1"] and p["pause_ms"] == 400
    if partials and pace == 1.0:
        assert r.of("partial"), "real-time pace with partials on: drafts while the answers are spoken"
        drafted = {p["seg"] for p in r.of("partial")}
        assert drafted <= {f["seg"] for f in finals}, "every utterance with drafts ends in a final"


def test_a_client_that_sends_no_config_gets_finals(main, model):
    x = audio("jfk.wav")
    x = np.concatenate([np.zeros(SR // 2, np.float32), x, np.zeros(SR, np.float32)])
    r = run(stream(ws(main), x, pace=0, linger=8))   # no events: it waits out its linger
    assert r.config_answer is None and not r.errors
    assert not r.of("partial") and not r.of("start") and not r.of("level")
    finals = check_finals(r, model, SR, [(0.5, 11.5)])
    assert "ask not what your country can do for you" in words(finals)


def test_hotwords_in_the_config_spell_names_right(main):
    """The config's hotwords reach the model (tests/oracle/test_hotwords.py holds them to
    faster-whisper): the made-up names come out right with them, wrong without."""
    x, _ = scene(["espeak/en-names.flac"])
    said = {}
    for hot in ("Zorblax Quenteroth, Vintrella", None):
        r = run(stream(ws(main), x, config={"hotwords": hot, **EVENTS}, pace=0, linger=8))
        assert r.config_answer["hotwords"] == hot and not r.errors
        said[hot] = " ".join(f["text"] for f in r.of("final"))
    assert "Zorblax Quenteroth" in said["Zorblax Quenteroth, Vintrella"], said
    assert "Zorblax" not in said[None], said


def test_levels_once_a_second(main):
    x, _ = scene(ANSWERS[:1])
    r = run(stream(ws(main), x, config={"levels": True, **EVENTS}, pace=0, linger=5))
    levels = r.of("level")
    assert len(levels) == len(x) // 512 // (1000 // 32), len(levels)   # a level per 31 chunks
    assert set(levels[0]) == {"type", "noise_db", "speech_db", "snr_db", "p_noise", "pause_ms", "threshold"}
    assert levels[-1]["speech_db"] is not None and levels[-1]["snr_db"] > 10


def test_end_finishes_the_open_utterance_at_once(main):
    x = np.concatenate([np.zeros(SR // 2, np.float32), audio("jfk.wav")[:int(2.4 * SR)]])
    r = run(stream(ws(main), x, config={"events": True}, pace=0, linger=10))
    finals = r.finals
    assert len(finals) == 1, r.messages
    assert finals[0]["t1"] <= len(x) / SR + 1e-6
    assert "fellow" in finals[0]["text"].lower()


def test_reset_drops_the_open_utterance(main):
    first = np.concatenate([np.zeros(SR // 2, np.float32), audio("cards/001.wav")[:int(0.8 * SR)]])

    async def go():
        from tornado.websocket import websocket_connect

        from nwhisper.server.client import encode

        c = await websocket_connect(ws(main))
        await c.write_message(json.dumps({"events": True, "pause_ms": 300}))
        json.loads(await c.read_message())
        await c.write_message(encode(first, "pcm16")[0], binary=True)
        start = json.loads(await c.read_message())
        assert start["type"] == "start" and start["seg"] == 1
        await c.write_message(json.dumps({"cmd": "reset"}))
        x, _ = scene(ANSWERS[1:2], lead=0.5)
        await c.write_message(encode(x, "pcm16")[0], binary=True)
        got = []
        while not any(m.get("type") == "final" for m in got):
            got.append(json.loads(await asyncio.wait_for(c.read_message(), 30)))
        c.close()
        return got

    got = run(go())
    finals = [m for m in got if m.get("type") == "final"]
    assert [f["seg"] for f in finals] == [2], got
    assert "7" in finals[0]["text"]             # cards/003: "seven of clubs", as tiny.en writes it


def test_config_answer_and_language_checks(main):
    async def go():
        from tornado.websocket import websocket_connect

        c = await websocket_connect(ws(main))
        out = []
        for m in ({"lang": "EN", "threshold": 0.6, "near_db": 0, "vad": "energy", "adaptive": True,
                   "min_pause_ms": 350, "max_pause_ms": 900},
                  {"lang": "fi"}, {"lang": "xx"}, {"format": "float32"}):
            await c.write_message(json.dumps(m))
            out.append(json.loads(await c.read_message()))
        c.close()
        return out

    ok, fi, xx, fl = run(go())
    assert ok["status"] == "ok" and ok["lang"] == "en" and ok["vad"] == "energy"
    assert ok["threshold"] == 0.6 and ok["near_db"] == 0 and ok["adaptive"] is True
    assert 350 <= ok["pause_ms"] <= 900
    assert "English-only" in fi["error"] and "'xx'" in xx["error"]
    assert fl["status"] == "ok" and fl["format"] == "float32" and fl["vad"] == "energy"


BAD = [
    ("{not json", "must be JSON"),
    ('[1, 2]', "JSON object, not an array"),
    ('{"colour": "blue"}', "unknown config field 'colour'"),
    ('{"partials": "yes"}', "partials takes true or false"),
    ('{"pause_ms": -5}', "pause_ms must be in 1..10000"),
    ('{"threshold": 2}', "threshold must be in (0.0, 1.0)"),
    ('{"max_utt_ms": 60000}', "max_utt_ms must be in 1..28000"),
    ('{"rate": "fast"}', "rate takes a whole number"),
    ('{"format": "mp3"}', "format takes 'pcm16' or 'float32'"),
    ('{"min_pause_ms": 900, "max_pause_ms": 500}', "min_pause_ms 900 must be <= max_pause_ms 500"),
    ('{"cmd": "rewind"}', "unknown command 'rewind'"),
    ('{"cmd": "end", "now": true}', "takes only \"cmd\""),
    (b"\x01\x02\x03", "pcm16 frame of 3 bytes"),
    (b"\x00" * (10 << 20), "binary frame of 10485760 bytes"),
]


def test_bad_input_is_named_and_the_stream_goes_on(main, model):
    async def go():
        from tornado.websocket import websocket_connect

        c = await websocket_connect(ws(main), max_message_size=16 << 20)
        answers = []
        for msg, _ in BAD:
            await c.write_message(msg, binary=isinstance(msg, bytes))
            answers.append(json.loads(await asyncio.wait_for(c.read_message(), 30)))
        await c.write_message(json.dumps({"format": "float32"}))
        answers.append(json.loads(await c.read_message()))
        bad = np.array([0.1, np.nan, np.inf, 0.2], "<f4").tobytes()
        await c.write_message(bad, binary=True)
        answers.append(json.loads(await c.read_message()))
        await c.write_message(b"\x00" * 6, binary=True)
        answers.append(json.loads(await c.read_message()))
        c.close()
        return answers

    answers = run(go())
    for (msg, want), got in zip(BAD, answers):
        assert want in got.get("error", ""), (msg[:40], got)
    assert answers[len(BAD)]["status"] == "ok"
    assert "2 non-finite samples" in answers[len(BAD) + 1]["error"]
    assert "float32 frame of 6 bytes" in answers[len(BAD) + 2]["error"]
    # the server went on serving, and a stream after all that transcribes as before
    assert health(main)["status"] == "ok"
    x = np.concatenate([np.zeros(SR // 2, np.float32), audio("jfk.wav"), np.zeros(SR, np.float32)])
    r = run(stream(ws(main), x, config=EVENTS, pace=0, linger=20))
    assert "ask not what your country can do for you" in words(r.finals)


def test_a_frame_past_the_websocket_limit_closes_with_1009(main):
    """A frame header that declares 17 MiB (over the 16 MiB limit) is answered with a close
    frame, code 1009, before any of it is read. Raw socket: a client still writing the payload
    may never read the close frame."""
    import base64
    import socket
    import struct

    host, port = main.url.split("//")[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall((f"GET /stream?token={TOKEN} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 101"), head
        sock.sendall(struct.pack("!BBQ", 0x82, 0x80 | 127, 17 << 20) + b"\0\0\0\0")
        reply = b""
        while len(reply) < 4:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    assert reply[0] == 0x88 and struct.unpack("!H", reply[2:4])[0] == 1009, reply
    assert health(main)["status"] == "ok"


@pytest.mark.parametrize("token,status,why", [(None, 401, "missing token"), ("nope", 401, "wrong token")])
def test_the_token_guards_the_stream(main, token, status, why):
    from tornado.httpclient import HTTPClientError
    from tornado.websocket import websocket_connect

    async def go():
        return await websocket_connect(ws(main, token=token))

    with pytest.raises(HTTPClientError) as e:
        run(go())
    assert e.value.code == status
    assert why in e.value.response.body.decode()


def test_the_token_as_a_header_and_the_root_route(main):
    x = np.concatenate([np.zeros(SR // 2, np.float32), audio("cards/001.wav"), np.zeros(SR, np.float32)])
    r = run(stream(ws(main, "/", token=None), x, token=TOKEN, config=EVENTS, pace=0, linger=20))
    assert "10 of" in words(r.finals)         # cards/001: "ten of clubs", as tiny.en writes it
    with urllib.request.urlopen(main.url + "/", timeout=10) as page:    # a plain GET: the page
        assert b"<title>nwhisper</title>" in page.read()


def test_eight_connections_then_503(main):
    async def go():
        from tornado.httpclient import HTTPClientError
        from tornado.websocket import websocket_connect

        open_ = [await websocket_connect(ws(main)) for _ in range(8)]
        h = health(main)
        try:
            await websocket_connect(ws(main))
            refused = None
        except HTTPClientError as e:
            refused = (e.code, e.response.body.decode())
        open_.pop().close()
        await asyncio.sleep(0.5)
        again = await websocket_connect(ws(main))
        again.close()
        for c in open_:
            c.close()
        return h, refused

    h, refused = run(go())
    assert h["streams"]["open"] == 8 and h["connections"]["active"] == 8
    assert refused is not None and refused[0] == 503 and "all 8 connections" in refused[1]
    time.sleep(0.5)
    assert health(main)["streams"]["open"] == 0


def test_an_open_stream_keeps_the_model_and_a_disconnect_leaves_nothing(servers):
    sleepy = servers["sleepy"]
    x = np.concatenate([np.zeros(SR // 2, np.float32), audio("jfk.wav")[:int(4 * SR)]])

    async def go():
        from tornado.websocket import websocket_connect

        from nwhisper.server.client import encode

        before = health(sleepy)
        c = await websocket_connect(ws(sleepy, token=None))
        await c.write_message(json.dumps({"partials": True, "partial_ms": 100}))
        await c.read_message()
        await asyncio.sleep(2.5)                       # past --unload-after, stream open
        held = health(sleepy)
        held["unloads"] -= before["unloads"]
        data = encode(x, "pcm16")[0]
        for i in range(0, len(data), 8000):            # 0.25 s frames, 4x real time
            await c.write_message(data[i:i + 8000], binary=True)
            await asyncio.sleep(0.06)
        c.close()                                      # mid-utterance: drafts and a final pending
        return held

    held = run(go())
    assert held["status"] == "ok" and held["unloads"] == 0, held   # (re)loaded when it opened
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30:
        h = health(sleepy)
        if not h["busy"] and h["streams"]["open"] == 0 and h["status"] == "idle":
            break
        time.sleep(0.2)
    assert h["streams"]["open"] == 0 and not h["busy"] and h["queued"] == 0, h
    assert h["status"] == "idle" and h["unloads"] >= 1, h     # nothing kept it loaded after


def test_cli_streams_a_file_and_prints_the_finals(main, tmp_path):
    import subprocess
    import sys

    wav = tmp_path / "answer.wav"
    import soundfile as sf
    x, _ = scene(ANSWERS[:1], lead=0.5, tail=1.0)
    sf.write(wav, x, SR, subtype="PCM_16")
    run_ = subprocess.run([sys.executable, "-m", "nwhisper", "stream", ws(main, token=None), str(wav),
                           "--pace", "0", "--pause", "300", "--token", TOKEN],
                          capture_output=True, text=True, timeout=120)
    assert run_.returncode == 0, run_.stderr
    assert "10 of" in run_.stdout and "ms after the pause" in run_.stdout, run_.stdout
    bad = subprocess.run([sys.executable, "-m", "nwhisper", "stream", ws(main, token=None), str(wav)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "NWHISPER_TOKEN": ""})
    assert bad.returncode == 2 and "401" in bad.stderr and "missing token" in bad.stderr, bad.stderr


def test_wss_under_tls(tmp_path):
    """--tls: the same stream over wss:// (the minted certificate, not verified by this client)."""
    server = Server(str(tmp_path), "tls", "tiny.en", "--tls", "--tls-dir", str(tmp_path / "tls")).wait()
    try:
        assert server.url.startswith("https://")
        x, _ = scene(ANSWERS[:1], lead=0.5, tail=1.0)
        r = run(stream(server.url.replace("https", "wss", 1) + "/stream", x, config=EVENTS, pace=0,
                       linger=20))
    finally:
        server.stop()
    assert "10 of" in words(r.finals), r.messages
