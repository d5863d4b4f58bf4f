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
    ({"search": ["dog"], "diarize": True}, 400, "does not do diarize, search"),
    ({"request_options": {"additional_query_parameters": {"encoding": "opus"}}}, 400, "encoding 'opus'"),
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
