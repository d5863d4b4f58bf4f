"""Deepgram's API end to end: a real `nwhisper serve` on loopback and the official `deepgram-sdk`
(7.x), unchanged but for its base URL.

Truth: a channel's transcript and words must be what `nwhisper transcribe --word-timestamps` (the
same model, in this process) makes of that channel's audio — the path test_transcribe.py and
test_timing.py hold to HF transformers and openai-whisper; word times within 0.1 s of it. The
response must pass the SDK's own model strictly (pydantic validation, not its lenient fallback).
"""

from __future__ import annotations

import json
import os
import re
import socket

import numpy as np
import pytest
import soundfile as sf
from fixture_audio import audio
from paths import FIXTURES
from server_process import Server, http

TOKEN = "dg-token"
SR = 16000
CLIPS = ["jfk.wav", "containers/speech.m4a", "containers/speech.webm"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(str(tmp_path_factory.mktemp("deepgram")), "main", "tiny.en", "--token", TOKEN,
               "--max-upload-mb", "5")
    try:
        yield s.wait()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(server):
    from deepgram import DeepgramClient, DeepgramClientEnvironment

    ws = server.url.replace("http", "ws", 1)
    env = DeepgramClientEnvironment(base=server.url, production=ws, agent=ws, agent_rest=server.url)
    return DeepgramClient(api_key=TOKEN, environment=env)


@pytest.fixture(scope="module")
def model(models):
    return models("tiny.en")


def ours(model, x, **kw):
    """`nwhisper transcribe --word-timestamps` of x, in this process."""
    segments, info = model.transcribe(x, timestamps=True, word_timestamps=True, **kw)
    return list(segments), info


def strict(response):
    """The response as the SDK's model validates it (a missing required field fails here)."""
    from deepgram.types.listen_v1response import ListenV1Response

    return ListenV1Response.model_validate(response.model_dump())


def plain(word):
    return re.sub(r"^[^\w']+|[^\w']+$", "", word.strip().lower())


@pytest.mark.parametrize("clip", CLIPS)
def test_transcribe_file_is_transcribe(client, model, clip):
    data = open(os.path.join(FIXTURES, clip), "rb").read()
    r = strict(client.listen.v1.media.transcribe_file(request=data, model="nova-3", punctuate=True))
    segments, _ = ours(model, audio(clip))
    (ch,) = r.results.channels
    alt = ch.alternatives[0]
    assert alt.transcript == "".join(s.text for s in segments).strip()
    want = [w for s in segments for w in s.words if plain(w.word)]
    assert [w.word for w in alt.words] == [plain(w.word) for w in want]
    assert [w.punctuated_word for w in alt.words] == [w.word.strip() for w in want]
    for got, w in zip(alt.words, want):
        assert abs(got.start - w.start) <= 0.1 and abs(got.end - w.end) <= 0.1
        assert abs(got.confidence - w.probability) < 1e-3
    assert 0 < alt.confidence <= 1
    m = r.metadata
    assert m.channels == 1 and abs(m.duration - len(audio(clip)) / SR) < 0.01
    assert m.model_info[m.models[0]]["name"] == "nova-3" and len(m.sha256) == 64


def test_without_punctuate_the_words_are_plain(client, model):
    data = open(os.path.join(FIXTURES, "jfk.wav"), "rb").read()
    alt = strict(client.listen.v1.media.transcribe_file(request=data)).results.channels[0].alternatives[0]
    segments, _ = ours(model, audio("jfk.wav"))
    assert alt.transcript == " ".join(plain(w.word) for s in segments for w in s.words if plain(w.word))
    assert getattr(alt.words[0], "punctuated_word", None) is None


def test_utterances_at_the_pauses(client, model, tmp_path):
    gap = np.zeros(2 * SR, np.float32)
    x = np.concatenate([audio("cards/001.wav"), gap, audio("forever.wav")])
    path = tmp_path / "two.wav"
    sf.write(path, x, SR, subtype="PCM_16")
    r = strict(client.listen.v1.media.transcribe_file(request=path.read_bytes(), utterances=True,
                                                      punctuate=True))
    utts = r.results.utterances
    assert len(utts) == 2 and [u.channel for u in utts] == [0, 0]
    assert utts[0].end < 1.5 < 3.0 < utts[1].start
    assert "forever" in utts[1].transcript.lower() and utts[0].words[0].start == utts[0].start


def test_multichannel_transcribes_each_channel(client, model, tmp_path):
    a, b = audio("cards/005.wav"), audio("forever.wav")
    n = max(len(a), len(b))
    x = np.stack([np.pad(a, (0, n - len(a))), np.pad(b, (0, n - len(b)))], axis=1)
    path = tmp_path / "two-channels.wav"
    sf.write(path, x, SR, subtype="PCM_16")
    data = path.read_bytes()
    r = strict(client.listen.v1.media.transcribe_file(request=data, multichannel=True, punctuate=True))
    assert r.metadata.channels == 2
    for ch, clip in zip(r.results.channels, (a, b)):
        want = "".join(s.text for s in ours(model, np.pad(clip, (0, n - len(clip))))[0]).strip()
        assert ch.alternatives[0].transcript == want
    mixed = strict(client.listen.v1.media.transcribe_file(request=data)).results.channels
    assert len(mixed) == 1                                # without it the channels are mixed


def test_keyterms_spell_names_right(client):
    data = open(os.path.join(FIXTURES, "espeak/en-names.flac"), "rb").read()
    hot = client.listen.v1.media.transcribe_file(request=data, punctuate=True,
                                                 keyterm=["Zorblax Quenteroth"], keywords=["Vintrella:2"])
    cold = client.listen.v1.media.transcribe_file(request=data, punctuate=True)
    assert "Zorblax Quenteroth" in hot.results.channels[0].alternatives[0].transcript
    assert "Zorblax" not in cold.results.channels[0].alternatives[0].transcript


def test_raw_linear16_with_its_rate(client, model):
    x = audio("forever.wav")
    raw = (np.clip(x, -1, 1 - 2 ** -15) * 32768).astype("<i2").tobytes()
    r = client.listen.v1.media.transcribe_file(
        request=raw, punctuate=True, request_options={"additional_query_parameters": {
            "encoding": "linear16", "sample_rate": "16000"}})
    want = "".join(s.text for s in ours(model, x)[0]).strip()
    assert r.results.channels[0].alternatives[0].transcript == want


def test_detect_language_is_reported(client):
    data = open(os.path.join(FIXTURES, "jfk.wav"), "rb").read()
    ch = strict(client.listen.v1.media.transcribe_file(request=data, detect_language=True)).results.channels[0]
    assert ch.detected_language == "en"


@pytest.mark.parametrize("kw, status, says", [
    ({"redact": "pci"}, 400, "does not do redact"),
    ({"search": ["dog"], "redact": "pci"}, 400, "does not do redact, search"),
    ({"request_options": {"additional_query_parameters": {"encoding": "speex"}}}, 400, "encoding 'speex'"),
    ({"request_options": {"additional_query_parameters": {"encoding": "linear16"}}}, 400, "sample_rate"),
    ({"language": "english please"}, 400, "language takes a code"),
    ({"language": "xx"}, 400, "unknown language"),
    ({"utterances": "sometimes"}, 400, "utterances takes true or false"),
])
def test_bad_requests_get_deepgrams_errors(client, kw, status, says):
    from deepgram.core.api_error import ApiError

    data = open(os.path.join(FIXTURES, "cards/001.wav"), "rb").read()
    with pytest.raises(ApiError) as e:
        client.listen.v1.media.transcribe_file(request=data, **kw)
    assert e.value.status_code == status
    assert set(e.value.body) == {"err_code", "err_msg", "request_id"} and says in e.value.body["err_msg"]


def test_a_url_is_refused_and_not_fetched(client):
    from deepgram.core.api_error import ApiError

    with pytest.raises(ApiError) as e:
        client.listen.v1.media.transcribe_url(url="http://127.0.0.1:9/never.wav")
    assert e.value.status_code == 400 and "fetches nothing" in e.value.body["err_msg"]


def test_not_audio_wrong_key_and_huge_bodies(server, client):
    from deepgram import DeepgramClient, DeepgramClientEnvironment
    from deepgram.core.api_error import ApiError

    with pytest.raises(ApiError) as e:
        client.listen.v1.media.transcribe_file(request=b"this is not audio at all" * 100)
    assert e.value.status_code == 400 and e.value.body["err_msg"].startswith("failed to process audio")
    env = DeepgramClientEnvironment(base=server.url, production="ws://x", agent="ws://x", agent_rest="http://x")
    with pytest.raises(ApiError) as e:
        DeepgramClient(api_key="wrong", environment=env).listen.v1.media.transcribe_file(request=b"x")
    assert e.value.status_code == 401 and e.value.body["err_code"] == "INVALID_AUTH"
    # a body of a gigabyte announced: refused from its header, nothing read
    host, port = server.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"POST /v1/listen HTTP/1.1\r\nHost: x\r\nAuthorization: Token {TOKEN}\r\n"
                  f"Content-Length: {1 << 30}\r\n\r\n".encode())
        head = s.recv(65536).decode("latin-1")
    assert head.startswith("HTTP/1.1 413") and "PAYLOAD_TOO_LARGE" in head
    status, _, body = http(server.url + "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


# -- live: WS /v1/listen --------------------------------------------------------------------------


def scene(clips, gap_s=2.0, lead_s=0.5, tail_s=0.0):
    parts = [np.zeros(int(lead_s * SR), np.float32)]
    for c in clips:
        parts += [audio(c), np.zeros(int(gap_s * SR), np.float32)]
    parts[-1] = np.zeros(int(tail_s * SR), np.float32)
    return np.concatenate(parts)


def pcm16(x):
    return (np.clip(x, -1, 1 - 2 ** -15) * 32768).astype("<i2").tobytes()


def live(client, x, pace=2.0, then=("CloseStream",), **params):
    """The SDK's live client: x streamed as linear16 in 100 ms frames at `pace` × real time, then
    the control messages `then`; every message until the server closes, as dicts."""
    import threading
    import time

    from deepgram.core.events import EventType

    got = []
    params = {"model": "nova-3", "encoding": "linear16", "sample_rate": SR, "channels": 1,
              "punctuate": True, **params}
    with client.listen.v1.connect(**params) as conn:
        conn.on(EventType.MESSAGE, lambda m: got.append(m.model_dump() if hasattr(m, "model_dump") else m))
        listener = threading.Thread(target=conn.start_listening, daemon=True)
        listener.start()
        t0, raw = time.monotonic(), pcm16(x)
        for i, at in enumerate(range(0, len(raw), 3200)):
            conn.send_media(raw[at:at + 3200])
            time.sleep(max(0.0, t0 + (i + 1) * 0.1 / pace - time.monotonic()))
        for message in then:
            getattr(conn, {"Finalize": "send_finalize", "CloseStream": "send_close_stream",
                           "KeepAlive": "send_keep_alive"}[message])()
        listener.join(60)
        assert not listener.is_alive(), "the server did not close after CloseStream"
    return got


def check_finals(model, x, got):
    """Each final Results = `nwhisper transcribe --word-timestamps` of its span, words on the
    recording's clock."""
    finals = [m for m in got if m["type"] == "Results" and m["is_final"]]
    for m in finals:
        a, b = round(m["start"] * SR), round((m["start"] + m["duration"]) * SR)
        segments, _ = ours(model, x[a:b])
        alt = m["channel"]["alternatives"][0]
        assert alt["transcript"] == "".join(s.text for s in segments).strip(), m
        want = [w for s in segments for w in s.words if plain(w.word)]
        assert [w["word"] for w in alt["words"]] == [plain(w.word) for w in want]
        for got_w, w in zip(alt["words"], want):
            assert abs(got_w["start"] - (m["start"] + w.start)) <= 0.1
    return finals


def test_live_keyterms_spell_names_right(client):
    x = scene(["espeak/en-names.flac"], tail_s=1.5)
    told = live(client, x, pace=4.0, keyterm=["Zorblax Quenteroth", "Vintrella"])
    plain = live(client, x, pace=4.0)
    said = [" ".join(m["channel"]["alternatives"][0]["transcript"] for m in got
                     if m["type"] == "Results" and m["is_final"]) for got in (told, plain)]
    assert "Zorblax Quenteroth" in said[0] and "Zorblax" not in said[1], said


def test_live_finals_are_transcribe_of_their_spans(client, model):
    x = scene(["cards/005.wav", "forever.wav"], tail_s=1.5)
    got = live(client, x, pace=1.0, interim_results=True, endpointing=500, utterance_end_ms=1000,
               vad_events=True)
    from deepgram.listen.v1.types import ListenV1Results

    kinds = [m["type"] for m in got]
    finals = check_finals(model, x, got)
    assert len(finals) == 2 and all(m["speech_final"] and not m["from_finalize"] for m in finals)
    assert "forever" in finals[1]["channel"]["alternatives"][0]["transcript"].lower()
    first_final = kinds.index("Results") + [m.get("is_final") for m in got if m["type"] == "Results"].index(True)
    assert any(m["type"] == "Results" and not m["is_final"] for m in got[:first_final + 1]), \
        "no interim result while the first answer was spoken"
    assert kinds.count("SpeechStarted") == 2 and kinds.count("UtteranceEnd") == 2
    ends = [m for m in got if m["type"] == "UtteranceEnd"]
    assert ends[-1]["last_word_end"] == finals[-1]["channel"]["alternatives"][0]["words"][-1]["end"]
    assert kinds[-1] == "Metadata" and abs(got[-1]["duration"] - len(x) / SR) < 0.01
    for m in got:
        if m["type"] == "Results":
            ListenV1Results.model_validate(m)                    # strictly, as the SDK's model


def voice_only(x):
    """x cut 0.1 s after its voice ends (as the endpointer hears it), so no pause can close it."""
    from nwhisper.stream.settings import StreamSettings
    from nwhisper.vad.stream import VadStream

    stops = [e for e in VadStream(StreamSettings().endpointer_options()).feed(x) if e.kind == "stop"]
    return x[:int((stops[-1].speech_t1 + 0.1) * SR)]


def test_finalize_and_closestream_flush_the_last_words(client, model):
    """No silence after the voice: Finalize answers the open utterance (from_finalize) and the
    connection stays; CloseStream after more speech flushes it too, before Metadata."""
    x = voice_only(scene(["cards/005.wav"], tail_s=0.0))
    y = voice_only(scene(["forever.wav"], lead_s=0.3, tail_s=0.0))
    import threading
    import time

    from deepgram.core.events import EventType

    got = []
    with client.listen.v1.connect(model="nova-3", encoding="linear16", sample_rate=SR, punctuate=True) as conn:
        conn.on(EventType.MESSAGE, lambda m: got.append(m.model_dump()))
        t = threading.Thread(target=conn.start_listening, daemon=True)
        t.start()
        conn.send_media(pcm16(x))
        conn.send_finalize()
        for _ in range(300):
            if any(m["type"] == "Results" for m in got):
                break
            time.sleep(0.1)
        conn.send_keep_alive()
        conn.send_media(pcm16(y))
        conn.send_close_stream()
        t.join(60)
    results = [m for m in got if m["type"] == "Results"]
    assert [m["from_finalize"] for m in results] == [True, False], results
    assert got[-1]["type"] == "Metadata" and got.index(results[-1]) < len(got) - 1
    whole = np.concatenate([x, y])
    check_finals(model, whole, got)
    assert "forever" in results[1]["channel"]["alternatives"][0]["transcript"].lower()


def test_live_webm_opus_as_a_browser_records_it(client, model):
    """No encoding: the frames are a container as MediaRecorder writes it (WebM with Opus),
    decoded as they come; the finals are transcribe of their spans of the file's own samples."""
    import threading
    import time

    from deepgram.core.events import EventType

    data = open(os.path.join(FIXTURES, "containers/speech.webm"), "rb").read()
    got = []
    with client.listen.v1.connect(model="nova-3", punctuate=True, interim_results=True) as conn:
        conn.on(EventType.MESSAGE, lambda m: got.append(m.model_dump()))
        t = threading.Thread(target=conn.start_listening, daemon=True)
        t.start()
        for at in range(0, len(data), 2000):          # MediaRecorder's timeslice pieces, fast
            conn.send_media(data[at:at + 2000])
            time.sleep(0.02)
        conn.send_close_stream()
        t.join(60)
    finals = check_finals(model, audio("containers/speech.webm"), got)
    assert finals and "spades" in " ".join(m["channel"]["alternatives"][0]["transcript"].lower()
                                            for m in finals)
    assert got[-1]["type"] == "Metadata" and abs(got[-1]["duration"] - 3.5025) < 0.01


def test_live_bad_input_is_named_and_the_stream_goes_on(server, model):
    """Raw websockets: a text frame that is not JSON and an odd-length linear16 frame get Error
    messages; bad parameters are refused at the handshake with Deepgram's 400; the browser's
    `token, KEY` subprotocol is accepted and chosen."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = server.url.replace("http", "ws", 1) + "/v1/listen"
    with connect(url + "?encoding=linear16&sample_rate=16000", subprotocols=["token", TOKEN]) as ws:
        assert ws.subprotocol == "token"
        ws.send("not json")
        e1 = json.loads(ws.recv(10))
        ws.send(b"\x00\x01\x02")
        e2 = json.loads(ws.recv(10))
        ws.send(pcm16(scene(["cards/001.wav"], tail_s=1.5)))
        ws.send(json.dumps({"type": "CloseStream"}))
        rest = [json.loads(m) for m in ws]
    assert e1["type"] == "Error" and "must be JSON" in e1["description"]
    assert e2["type"] == "Error" and "whole number" in e2["description"]
    assert [m["type"] for m in rest] == ["Results", "Metadata"]
    for query, says in [("?encoding=flac", "encoding 'flac'"), ("?encoding=linear16", "sample_rate"),
                        ("?encoding=linear16&sample_rate=16000&redact=pci", "redact"),
                        ("?encoding=linear16&sample_rate=16000&language=xx", "unknown language")]:
        with pytest.raises(InvalidStatus) as e:
            connect(url + query, additional_headers={"Authorization": f"Token {TOKEN}"})
        r = e.value.response
        assert r.status_code == 400 and says in json.loads(r.body)["err_msg"], r.body
    with pytest.raises(InvalidStatus) as e:
        connect(url + "?encoding=linear16&sample_rate=16000")
    assert e.value.response.status_code == 401
