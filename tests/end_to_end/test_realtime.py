"""OpenAI Realtime transcription sessions end to end: a real `nwhisper serve` on loopback, driven
by OpenAI's own Python client (`openai[realtime]`, GA and beta dialects) and, for what that
client will not send (broken JSON, binary frames, the browser's subprotocol token), by the
`websockets` library.

Truth: the native stream (test_stream.py checks its finals against `transcribe`) given the same
audio and settings; each completed transcript must be the native final of the same utterance,
and `transcribe` of the span between its speech_started and speech_stopped times.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil

import numpy as np
import openai
import pytest
import websockets
from fixture_audio import audio
from server_process import Server

from nwhisper.io.audio import resample
from nwhisper.server.client import encode, realtime, stream


TOKEN = "realtime-token"
CLIPS = ["cards/001.wav", "cards/005.wav"]        # 005 is 3.5 s: deltas before it ends
GA_SESSION = {"type": "transcription", "audio": {"input": {
    "format": {"type": "audio/pcm", "rate": 24000},
    "transcription": {"model": "whisper-1", "language": "en"},
    "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                       "silence_duration_ms": 1000}}}}
# a pause long enough that the stream's tail never shortens (tail_ms: the pause leaves time to
# transcribe after 200 ms), so both routes cut the same spans whatever the machine's speed
NATIVE = {"partials": True, "events": True, "pause_ms": 1000, "threshold": 0.5, "lang": "en"}


def scene(rate):
    """The clips with 1.6 s of silence between, at `rate`, quantized to 16 bits as sent."""
    parts = [np.zeros(16000, np.float32)]
    for c in CLIPS:
        parts += [audio(c), np.zeros(25600, np.float32)]
    x = np.concatenate(parts + [np.zeros(24000, np.float32)])
    return encode(resample(x, 16000, rate) if rate != 16000 else x, "pcm16")[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(str(tmp_path_factory.mktemp("realtime")), "realtime", "tiny.en", "--token", TOKEN)
    try:
        yield s.wait()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def model(models):
    return models("tiny.en")


def client(server):
    base = server.url + "/v1"
    return openai.AsyncOpenAI(base_url=base, api_key=TOKEN,
                              websocket_base_url=base.replace("http", "ws", 1))


def native_url(server):
    return server.url.replace("http", "ws", 1) + "/stream"


def b64(data):
    return base64.b64encode(data).decode()


def kinds(events, kind):
    return [e for _, e in events if e["type"] == kind]


def check_session(events, native, model, x16):
    """Completed transcripts = the native finals, = transcribe of the started..stopped span;
    deltas grow a prefix and come before speech_stopped on the long utterance."""
    started = {e["item_id"]: e["audio_start_ms"] for e in kinds(events, "input_audio_buffer.speech_started")}
    stopped = {e["item_id"]: e["audio_end_ms"] for e in kinds(events, "input_audio_buffer.speech_stopped")}
    committed = kinds(events, "input_audio_buffer.committed")
    completed = kinds(events, "conversation.item.input_audio_transcription.completed")
    assert [c["item_id"] for c in committed] == [c["item_id"] for c in completed]
    assert [c["previous_item_id"] for c in committed] == [None] + [c["item_id"] for c in committed[:-1]]
    said = [c["transcript"] for c in completed if c["transcript"]]
    assert said == [f["text"].strip() for f in native.finals if f["text"].strip()]
    assert len(said) == len(CLIPS), said
    for c in completed:
        a, b = started[c["item_id"]], stopped[c["item_id"]]
        segments, _ = model.transcribe(x16[a * 16:b * 16], language="en")
        segments = list(segments)
        assert c["transcript"] == "".join(s.text for s in segments).strip(), c
    long_item = max(completed, key=lambda c: stopped[c["item_id"]] - started[c["item_id"]])["item_id"]
    assert stopped[long_item] - started[long_item] > 2000
    stop_at = next(t for t, e in events if e["type"] == "input_audio_buffer.speech_stopped"
                   and e["item_id"] == long_item)
    deltas = [(t, e["delta"]) for t, e in events
              if e["type"] == "conversation.item.input_audio_transcription.delta" and e["item_id"] == long_item]
    assert deltas and deltas[0][0] < stop_at, "no delta while the long utterance was spoken"
    said = "".join(d for _, d in deltas)
    assert all(d for _, d in deltas) and said.strip(), deltas
    assert not kinds(events, "error"), kinds(events, "error")


def test_ga_session_matches_the_native_stream(server, model):
    x = scene(24000)
    pcm = encode(x, "pcm16")[0]
    chunks = [pcm[i:i + 1920] for i in range(0, len(pcm), 1920)]      # 40 ms frames

    events = asyncio.run(realtime(server.url, chunks, 0.04, GA_SESSION, token=TOKEN))
    native = asyncio.run(stream(native_url(server), x, rate=24000, config=NATIVE, token=TOKEN, pace=0))
    assert events[0][1]["type"] == "session.created"
    updated = kinds(events, "session.updated")[0]["session"]
    assert updated["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 1000
    assert updated["audio"]["input"]["transcription"]["model"] == "whisper-1"
    check_session(events, native, model, resample(x, 24000, 16000))


@pytest.mark.skipif(shutil.which("sox") is None, reason="needs sox, an independent G.711 encoder (apt-get install sox; .ci/run installs it)")
def test_beta_session_g711_matches_the_native_stream(server, model):
    """The beta dialect (transcription_session.update, OpenAI-Beta: realtime=v1) with telephony's
    μ-law at 8 kHz; the native stream gets the same samples as float32 at 8 kHz."""
    import soundfile as sf

    x8 = scene(8000)
    ulaw = _ulaw_bytes(x8)
    wire = sf.read(_ulaw_wav(ulaw), dtype="float32")[0]   # libsndfile's decoding: the truth
    chunks = [ulaw[i:i + 320] for i in range(0, len(ulaw), 320)]      # 40 ms frames
    update = {"input_audio_format": "g711_ulaw",
              "input_audio_transcription": {"model": "whisper-1", "language": "en"},
              "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                                 "silence_duration_ms": 1000}}

    events = asyncio.run(realtime(server.url, chunks, 0.04, update, beta=True, token=TOKEN))
    native = asyncio.run(stream(native_url(server), wire, rate=8000, fmt="float32", config=NATIVE,
                                token=TOKEN, pace=0))
    assert events[0][1]["type"] == "transcription_session.created"
    assert kinds(events, "transcription_session.updated")[0]["session"]["input_audio_format"] == "g711_ulaw"
    check_session(events, native, model, resample(wire, 8000, 16000))


def _ulaw_bytes(x):
    """μ-law bytes of x, encoded by sox (an encoder that is not ours)."""
    import subprocess
    import tempfile

    import soundfile as sf
    with tempfile.TemporaryDirectory() as d:
        sf.write(f"{d}/in.wav", x, 8000, subtype="FLOAT")
        subprocess.run(["sox", f"{d}/in.wav", "-t", "raw", "-e", "u-law", "-b", "8", f"{d}/out.ul"],
                       check=True)
        with open(f"{d}/out.ul", "rb") as f:
            return f.read()


def _ulaw_wav(data):
    import io
    import struct
    fmt = struct.pack("<HHIIHH", 7, 1, 8000, 8000, 1, 8)
    body = b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return io.BytesIO(b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body)


def test_manual_commit_and_clear(server, model):
    """turn_detection null: commit transcribes what was appended since the last commit; clear
    drops it; a commit of nothing is refused and the session goes on."""
    clip = audio("cards/003.wav")
    x24 = encode(resample(clip, 16000, 24000), "pcm16")
    session_update = {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None,
        "transcription": {"language": "en"}}}}

    async def go():
        async with client(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await conn.session.update(session=session_update)
            await conn.input_audio_buffer.append(audio=b64(x24[0]))
            await conn.input_audio_buffer.clear()
            await conn.input_audio_buffer.commit()                      # nothing left: refused
            await conn.input_audio_buffer.append(audio=b64(x24[0]))
            await conn.input_audio_buffer.commit()
            events = []
            async for ev in conn:
                events.append(ev.to_dict())
                if ev.type.endswith("transcription.completed"):
                    return events

    events = asyncio.run(go())
    types = [e["type"] for e in events]
    assert types[:3] == ["session.created", "session.updated", "input_audio_buffer.cleared"]
    assert events[3]["type"] == "error"
    assert events[3]["error"]["code"] == "input_audio_buffer_commit_empty"
    assert "speech_started" not in " ".join(types)
    committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
    done = events[-1]
    assert len(committed) == 1 and committed[0]["item_id"] == done["item_id"]
    segments, _ = model.transcribe(resample(x24[1], 24000, 16000), language="en")
    segments = list(segments)
    assert done["transcript"] == "".join(s.text for s in segments).strip()
    assert done["usage"] == {"type": "duration", "seconds": round(len(x24[1]) / 24000, 3)}


BAD = [
    ({"type": "input_audio_buffer.append", "audio": b64(b"\0\0")}, "session_not_configured", "type"),
    ({"type": "no.such.event"}, "invalid_event", "type"),
    ({"type": "response.create"}, "invalid_event", "type"),
    ({"type": "session.update", "session": {"type": "realtime"}}, "invalid_value", "session.type"),
    ({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/opus"}}}}}, "invalid_value", "session.audio.input.format.type"),
    ({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
        "turn_detection": {"type": "server_vad", "threshold": 2}}}}},
     "invalid_value", "session.audio.input.turn_detection.threshold"),
    ({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
        "turn_detection": {"type": "server_vad", "silence_duration_ms": -5}}}}},
     "invalid_value", "session.audio.input.turn_detection.silence_duration_ms"),
    ({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
        "transcription": {"language": "de"}}}}},
     "invalid_value", "session.audio.input.transcription.language"),
    ({"type": "transcription_session.update", "session": {"input_audio_format": "mp3"}},
     "invalid_value", "session.input_audio_format"),
    ({"type": "session.update", "session": {"type": "transcription"}}, None, None),   # fine now
    ({"type": "input_audio_buffer.append", "audio": "not base64!"}, "invalid_value", "audio"),
    ({"type": "input_audio_buffer.append", "audio": b64(b"\0\0\0")}, "invalid_value", "audio"),
    ({"type": "input_audio_buffer.append"}, "missing_required_parameter", "audio"),
]


def test_bad_events_get_openai_errors_and_the_session_goes_on(server):
    async def go():
        out = []
        async with client(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
            assert (await conn.recv()).type == "session.created"
            for i, (event, code, param) in enumerate(BAD):
                await conn.send({**event, "event_id": f"evt_{i}"})
                out.append((await conn.recv()).to_dict())
        return out

    answers = asyncio.run(go())
    for i, ((event, code, param), got) in enumerate(zip(BAD, answers)):
        if code is None:
            assert got["type"] == "session.updated", got
            continue
        assert got["type"] == "error", (event, got)
        err = got["error"]
        assert (err["code"], err["param"]) == (code, param), (event, err)
        assert err["type"] == "invalid_request_error" and err["message"]
        assert err["event_id"] == f"evt_{i}"


def test_raw_frames_tokens_and_handshake(server):
    """What the official client never sends: broken JSON and binary frames (errors, the session
    goes on); the browser's subprotocol token; refusals before the upgrade as OpenAI's errors."""
    url = server.url.replace("http", "ws", 1) + "/v1/realtime?intent=transcription"

    async def go():
        async with websockets.connect(
                url, subprotocols=["realtime", f"openai-insecure-api-key.{TOKEN}"]) as ws:
            assert ws.subprotocol == "realtime"
            created = json.loads(await ws.recv())
            await ws.send("{not json")
            broken = json.loads(await ws.recv())
            await ws.send(b"\x00\x01")
            binary = json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription"}}))
            updated = json.loads(await ws.recv())
        refusals = []
        for u, headers in ((url, {}), (url, {"Authorization": "Bearer wrong"}),
                           (url.replace("transcription", "translation"), {"Authorization": f"Bearer {TOKEN}"})):
            with pytest.raises(websockets.exceptions.InvalidStatus) as e:
                async with websockets.connect(u, additional_headers=headers):
                    pass
            r = e.value.response
            refusals.append((r.status_code, json.loads(r.body)["error"]))
        return created, broken, binary, updated, refusals

    created, broken, binary, updated, refusals = asyncio.run(go())
    assert created["type"] == "session.created"
    assert broken["type"] == "error" and broken["error"]["code"] == "invalid_json"
    assert binary["type"] == "error" and "append" in binary["error"]["message"]
    assert updated["type"] == "session.updated"
    assert [s for s, _ in refusals] == [401, 401, 400]
    assert refusals[0][1]["code"] == "invalid_api_key" and "missing token" in refusals[0][1]["message"]
    assert refusals[2][1]["param"] == "intent"


def test_the_prompt_spells_names_through_openais_routes(server):
    """OpenAI's `prompt` (POST /v1/audio/transcriptions) and the session's transcription prompt
    reach the model as openai's initial_prompt — for one window the same tokens as hotwords
    (tests/oracle/test_hotwords.py): the made-up names of en-names.flac come out right."""
    import os

    from paths import FIXTURES

    names = "Zorblax Quenteroth, Vintrella"
    path = os.path.join(FIXTURES, "espeak", "en-names.flac")
    rest = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN)
    with open(path, "rb") as f:
        told = rest.audio.transcriptions.create(model="whisper-1", file=f, prompt=names).text
    with open(path, "rb") as f:
        plain = rest.audio.transcriptions.create(model="whisper-1", file=f).text
    assert "Zorblax Quenteroth" in told and "Zorblax" not in plain, (told, plain)
    x = np.concatenate([np.zeros(16000, np.float32), audio("espeak/en-names.flac"),
                        np.zeros(40000, np.float32)])
    pcm = encode(resample(x, 16000, 24000), "pcm16")[0]
    session = json.loads(json.dumps(GA_SESSION))
    session["audio"]["input"]["transcription"]["prompt"] = names
    events = asyncio.run(realtime(server.url, [pcm[i:i + 1920] for i in range(0, len(pcm), 1920)],
                                  0.04, session, token=TOKEN, pace=0))
    said = " ".join(c["transcript"] for c in kinds(events, "conversation.item.input_audio_transcription.completed"))
    assert "Zorblax Quenteroth" in said, said
