"""`nwhisper serve` end to end: real servers in subprocesses on loopback, real HTTP.

Truth: the transcript of fixtures/jfk.wav is the one tests/oracle/test_transcribe.py checks against HF
transformers' greedy output for tiny.en; here it only has to come back through every route and
format. The servers start once per module, in parallel (each on a free port the server picks
itself: `--addr 127.0.0.1:0`, its URL read from its first line):

    main     tiny.en, --max-upload-mb 1.5             formats, routes, bad input, OpenAI client
    secure   tiny.en, --tls (minted) --token          https with the cert trusted, 401s
    narrow   tiny.en, --connections 1 --queue 1       503 when full, and still serving after;
             --unload-after 1                         /health across an unload and a reload
    polyglot base, --model tiny.en, --wyoming tcp://  translation, language detection; two models,
                                                      each request answered by the one it names
"""

from __future__ import annotations

import json
import math
import os
import ssl
import threading
import time
import urllib.error
import urllib.request

import pytest

from paths import FIXTURES as FIX, ROOT, golden
from server_process import JFK, JFK_WORDS, Server, http, inference, multipart, start_servers, wav

TOKEN = "s3cret-token"
TRANSLATE = golden("features-translate.json")   # fixtures/make_golden_features.py --only translate


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("servers")
    servers = start_servers(str(d), {
        "main": (("tiny.en", "--max-upload-mb", "1.5"), {}),
        "secure": (("tiny.en", "--tls", "--tls-dir", str(d / "tls")), {"env": {"NWHISPER_TOKEN": TOKEN}}),
        "narrow": (("tiny.en", "--connections", "1", "--queue", "1", "--unload-after", "1"), {}),
        "polyglot": (("base", "--model", "tiny.en", "--wyoming", "tcp://127.0.0.1:0"), {}),
    })
    servers["tls_dir"] = str(d / "tls")
    yield servers
    for s in servers.values():
        if isinstance(s, Server):
            s.stop()
            assert s.proc.returncode == 0, s.output()       # a clean exit on SIGTERM


@pytest.fixture(scope="module")
def main(servers):
    return servers["main"].url


def error_of(status, headers, body):
    assert headers["Content-Type"].startswith("application/json"), (status, body)
    return json.loads(body)["error"]


def assert_serves(url, **kw):
    """A good request right after: the server still transcribes."""
    status, _, body = inference(url, **kw)
    assert status == 200, body
    assert JFK_WORDS in json.loads(body)["text"]


# -- whisper.cpp's /inference -----------------------------------------------------------------


def test_health_before_any_request(main):
    status, headers, body = http(main + "/health")
    h = json.loads(body)
    assert status == 200 and h["status"] == "ok"
    assert h["model"]["name"] == "tiny.en" and h["model"]["n_audio_layer"] == 4
    assert h["model"]["n_vocab"] == 51864 and h["model"]["multilingual"] is False
    assert h["loads"] == 1 and h["unloads"] == 0 and h["last_load_ms"] > 0
    assert h["connections"]["max"] == 8


def test_multipart_json(main):
    status, headers, body = inference(main, [("response_format", "json"), ("temperature", "0.0")])
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    text = json.loads(body)["text"]
    assert text.startswith("And so my fellow Americans") and JFK_WORDS in text


def test_raw_wav_body(main):
    status, headers, body = http(main + "/inference?response_format=text", wav(),
                                 {"Content-Type": "audio/wav"})
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert JFK_WORDS in body.decode()


def test_text_srt_vtt_verbose_json(main):
    import srt
    import webvtt

    _, h, body = inference(main, [("response_format", "text"), ("timestamps", "true")])
    lines = body.decode().splitlines()
    assert h["Content-Type"].startswith("text/plain") and len(lines) == 2    # a line a segment
    assert lines[0].startswith("And so my fellow Americans")

    _, h, body = inference(main, [("response_format", "srt")])
    cues = list(srt.parse(body.decode()))
    assert h["Content-Type"].startswith("application/x-subrip") and len(cues) >= 1
    assert cues[0].start.total_seconds() == 0 and cues[-1].end.total_seconds() <= 11.0
    assert JFK_WORDS.split()[-1] in " ".join(c.content for c in cues)

    _, h, body = inference(main, [("response_format", "vtt")])
    assert h["Content-Type"].startswith("text/vtt") and body.startswith(b"WEBVTT\n")
    cues = list(webvtt.from_string(body.decode()))
    assert len(cues) >= 1 and cues[0].start == "00:00:00.000"

    _, h, body = inference(main, [("response_format", "verbose_json"), ("vad", "true")])
    v = json.loads(body)
    assert v["task"] == "transcribe" and v["language"] == "english" and v["duration"] == 11.0
    assert [s["id"] for s in v["segments"]] == list(range(len(v["segments"])))
    assert all(0 <= s["start"] < s["end"] <= 11.0 for s in v["segments"])
    assert {"tokens", "avg_logprob", "compression_ratio", "no_speech_prob", "seek"} <= set(v["segments"][0])
    assert "notes" not in v


def test_per_request_timestamps_override(main):
    """timestamps=false on srt: one cue for the whole clip; true on json: same text either way."""
    _, _, body = inference(main, [("response_format", "verbose_json"), ("timestamps", "false")])
    segs = json.loads(body)["segments"]
    assert len(segs) == 1 and segs[0]["start"] == 0.0 and segs[0]["end"] == 11.0
    assert segs[0]["tokens"][0] < 50257                   # no timestamp tokens


def test_cors_preflight_and_404(main):
    status, headers, _ = http(main + "/inference", method="OPTIONS")
    assert status == 204 and headers["Access-Control-Allow-Origin"] == "*"
    assert "authorization" in headers["Access-Control-Allow-Headers"]
    status, headers, body = http(main + "/nope")
    assert status == 404 and "/nope" in error_of(status, headers, body)


def test_page_is_served(main):
    status, headers, body = http(main + "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert b'id="file"' in body and b'id="transcript"' in body


# -- bad input: a 4xx that names the problem, then the server still serves ---------------------


def _broken_multipart():
    body, ctype = multipart([("response_format", "json")], [("file", "jfk.wav", wav())])
    return body[:-30], ctype                  # the final boundary never arrives


BAD = {
    "empty body": (lambda: (b"", "audio/wav"), 400, "empty audio"),
    "not audio": (lambda: multipart(files=[("file", "notes.txt", b"hello, this is text\n" * 50)]),
                  400, "notes.txt: cannot decode audio"),
    "truncated WAV": (lambda: multipart(files=[("file", "cut.wav", wav()[:100_000])]),
                      400, "truncated WAV"),
    "broken multipart": (_broken_multipart, 400, "broken multipart/form-data"),
    "no file field": (lambda: multipart([("response_format", "json")]), 400, "no 'file' field"),
    "oversized upload": (lambda: multipart(files=[("file", "big.wav", wav() * 6)]), 413,
                         "upload too large"),
    "unknown language": (lambda: multipart([("language", "xx")], [("file", "a.wav", wav())]), 400,
                         "unknown language code 'xx'"),
    "unknown format": (lambda: multipart([("response_format", "docx")], [("file", "a.wav", wav())]),
                       400, "response_format 'docx'"),
    "bad boolean": (lambda: multipart([("timestamps", "maybe")], [("file", "a.wav", wav())]), 400,
                    "field 'timestamps' must be true or false"),
    "bad temperature": (lambda: multipart([("temperature", "hot")], [("file", "a.wav", wav())]), 400,
                        "field 'temperature' must be a number"),
}


def test_bad_input_gets_named_4xx_and_the_server_keeps_serving(main):
    for what, (make, want_status, want_text) in BAD.items():
        body, ctype = make()
        status, headers, answer = http(main + "/inference", body, {"Content-Type": ctype})
        assert status == want_status, (what, status, answer)
        assert want_text in error_of(status, headers, answer), (what, answer)
    assert_serves(main)
    h = json.loads(http(main + "/health")[2])
    assert h["status"] == "ok" and h["connections"]["active"] == 0 and not h["busy"]


def test_oversized_by_content_length_alone(main):
    """A client announcing far more than the limit is answered 413 without sending it."""
    import http.client

    host, port = main.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.putrequest("POST", "/inference")
    c.putheader("Content-Type", "audio/wav")
    c.putheader("Content-Length", str(10 << 30))
    c.endheaders()
    r = c.getresponse()
    assert r.status == 413 and "upload too large" in json.loads(r.read())["error"]
    c.close()
    assert_serves(main)


def test_oversized_chunked_upload(main):
    """No Content-Length to judge by: counted as it arrives, dropped past the limit, then 413."""
    import http.client

    host, port = main.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    c.request("POST", "/inference", body=iter([wav()] * 6), headers={"Content-Type": "audio/wav"},
              encode_chunked=True)
    r = c.getresponse()
    assert r.status == 413 and "upload too large" in json.loads(r.read())["error"]
    c.close()


# -- OpenAI's routes, through the official client ---------------------------------------------


def test_openai_client_transcriptions(main):
    from openai import OpenAI

    with OpenAI(base_url=main + "/v1", api_key="unused", max_retries=0) as client:
        with open(JFK, "rb") as f:
            r = client.audio.transcriptions.create(model="whisper-1", file=f)
        assert JFK_WORDS in r.text
        with open(JFK, "rb") as f:
            v = client.audio.transcriptions.create(model="whisper-1", file=f, language="en",
                                                   response_format="verbose_json",
                                                   timestamp_granularities=["segment"])
        assert v.language == "english" and v.duration == 11.0 and JFK_WORDS in v.text
        assert v.segments and v.segments[0].start == 0.0
        with open(JFK, "rb") as f:
            s = client.audio.transcriptions.create(model="whisper-1", file=f, response_format="srt")
        assert s.startswith("1\n00:00:00,000 --> ")
        assert [m.id for m in client.models.list()] == ["tiny.en"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")     # the client marks translations so
def test_openai_client_errors(main):
    import openai
    from openai import OpenAI

    with OpenAI(base_url=main + "/v1", api_key="unused", max_retries=0) as client:
        with open(JFK, "rb") as f, pytest.raises(openai.BadRequestError) as e:
            client.audio.translations.create(model="whisper-1", file=f)     # tiny.en: no
        # OpenAI's error object, so the client's message is ours (not a bare "Error code: 400")
        assert "English-only" in e.value.message and e.value.param == "model"
        assert e.value.type == "invalid_request_error"
        with pytest.raises(openai.BadRequestError) as e:
            client.audio.transcriptions.create(model="whisper-1", file=("x.wav", b"RIFF...."))
        assert "cannot decode audio" in e.value.message and e.value.param == "file"
        with open(JFK, "rb") as f, pytest.raises(openai.BadRequestError) as e:
            client.audio.transcriptions.create(model="whisper-1", file=f, response_format="mp3")
        assert e.value.param == "response_format" and "is not one of" in e.value.message
        with open(JFK, "rb") as f, pytest.raises(openai.BadRequestError) as e:
            client.audio.transcriptions.create(model="whisper-1", file=f, stream=True,
                                               response_format="srt")
        assert e.value.param == "stream"
    status, _, body = http(main + "/inference", body=b"", method="POST")   # whisper.cpp's own shape
    assert status == 400 and isinstance(json.loads(body)["error"], str)


def test_openai_client_streams_the_text_as_it_is_decoded(main):
    """stream=True on a 63 s recording (three windows): the deltas come window by window, their
    concatenation is the done event's text, and that is the unstreamed transcript."""
    from openai import OpenAI

    clip = os.path.join(ROOT, "fixtures", "espeak", "en-63s.flac")
    with OpenAI(base_url=main + "/v1", api_key="unused", max_retries=0) as client:
        with open(clip, "rb") as f:
            whole = client.audio.transcriptions.create(model="whisper-1", file=f).text
        with open(clip, "rb") as f:
            events = list(client.audio.transcriptions.create(model="whisper-1", file=f, stream=True))
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}
    assert len(kinds) >= 3, kinds
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == whole
    import soundfile as sf

    seconds = sf.info(clip).duration                      # usage: audio in 20 ms encoder positions
    assert events[-1].usage.output_tokens > 0 and events[-1].usage.input_tokens == math.ceil(seconds * 50)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_translation_and_detection_on_a_multilingual_model(servers):
    from openai import OpenAI

    url = servers["polyglot"].url
    dutch = TRANSLATE["clips"]["fillets/nl-vit-v-automat.ogg"]   # HF generate(task="translate")
    with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
        with open(os.path.join(FIX, "fillets/nl-vit-v-automat.ogg"), "rb") as f:
            r = client.audio.translations.create(model="whisper-1", file=f)
        assert r.text.strip() == dutch["text"].strip()
    status, _, body = inference(url, [("response_format", "verbose_json")])
    v = json.loads(body)
    assert status == 200 and v["language"] == "english"
    assert v["detected_language_probability"] > 0.5 and v["language_probabilities"]["en"] > 0.5


def test_a_client_that_hangs_up_while_queued_is_not_transcribed(servers):
    """Its job leaves the queue unrun (health's `abandoned`); everyone else is still served. Each
    step waits for the state /health reports (the long clip running, the other queued behind
    it), not for a time."""
    import io
    import socket

    import numpy as np
    import soundfile

    url = servers["main"].url
    x, sr = soundfile.read(JFK, dtype="float32")
    long_clip = io.BytesIO()
    # 88 s, 3+ windows, under --max-upload-mb as 8 kHz (the speech at half speed)
    soundfile.write(long_clip, np.tile(x, 4), sr // 2, format="WAV", subtype="PCM_16")
    before = _health(url)
    busy = threading.Thread(target=inference, args=(url,), kwargs={"data": long_clip.getvalue()})
    busy.start()
    wait_for(url, lambda h: h["busy"])
    body, ctype = multipart(files=[("file", "jfk.wav", wav())])
    host, port = url.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(f"POST /inference HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    wait_for(url, lambda h: h["queued"] == 1 and h["busy"])
    s.close()                                       # hangs up while queued behind the long clip
    busy.join(120)
    h = _health(url)
    assert h["abandoned"] == before["abandoned"] + 1, h
    assert h["requests"] == before["requests"] + 1   # the long clip; the hung-up one never answered
    assert "499 POST /inference" in servers["main"].output()
    assert h["connections"]["active"] == 0 and h["queued"] == 0 and not h["busy"]


def wait_for(url, ready, timeout=60):
    """Poll /health until ready(health) holds."""
    t0 = time.monotonic()
    while not ready(h := _health(url)):
        assert time.monotonic() - t0 < timeout, h
        time.sleep(0.01)
    return h


# -- tokens and TLS ---------------------------------------------------------------------------


def test_tls_with_the_minted_certificate_and_tokens(servers):
    url = servers["secure"].url
    assert url.startswith("https://")
    cert = os.path.join(servers["tls_dir"], "cert.pem")
    trusted = ssl.create_default_context(cafile=cert)     # the client trusts this one cert
    with pytest.raises(urllib.error.URLError):           # and without it, verification fails
        http(url + "/health", context=ssl.create_default_context())

    status, _, body = http(url + "/health", context=trusted)      # open without a token
    assert status == 200 and json.loads(body)["status"] == "ok"
    assert http(url + "/", context=trusted)[0] == 200

    status, headers, body = inference(url, context=trusted)
    assert status == 401 and "missing token" in error_of(status, headers, body)
    assert headers["WWW-Authenticate"].startswith("Bearer")
    status, headers, body = inference(url, headers={"Authorization": "Bearer wrong"}, context=trusted)
    assert status == 401 and error_of(status, headers, body) == "wrong token"
    status, headers, body = http(url + "/v1/models", context=trusted)
    assert status == 401
    status, headers, body = inference(url, path="/inference?token=nope", context=trusted)
    assert status == 401 and error_of(status, headers, body) == "wrong token"

    assert_serves(url, headers={"Authorization": f"Bearer {TOKEN}"}, context=trusted)
    assert_serves(url, path=f"/inference?token={TOKEN}", context=trusted)
    log = servers["secure"].output()
    assert "self-signed TLS minted" in log and TOKEN not in log     # ?token= is blanked in the log


def test_minted_certificate_is_ecdsa_p256_for_loopback(servers):
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    with open(os.path.join(servers["tls_dir"], "cert.pem"), "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert oct(os.stat(os.path.join(servers["tls_dir"], "key.pem")).st_mode & 0o777) == "0o600"


def test_openai_client_with_token(servers):
    import openai
    from openai import DefaultHttpxClient, OpenAI

    url = servers["secure"].url
    trusted = ssl.create_default_context(cafile=os.path.join(servers["tls_dir"], "cert.pem"))
    for key, ok in (("wrong", False), (TOKEN, True)):
        with OpenAI(base_url=url + "/v1", api_key=key, max_retries=0,
                    http_client=DefaultHttpxClient(verify=trusted)) as client:
            with open(JFK, "rb") as f:
                if ok:
                    assert JFK_WORDS in client.audio.transcriptions.create(model="whisper-1", file=f).text
                else:
                    with pytest.raises(openai.AuthenticationError):
                        client.audio.transcriptions.create(model="whisper-1", file=f)


# -- idle unload, and a full server ----------------------------------------------------------


def _health(url):
    return json.loads(http(url + "/health")[2])


def test_health_across_unload_and_reload(servers):
    url = servers["narrow"].url
    assert_serves(url)                 # loaded now (reloaded, if it had gone idle since startup)
    h = _health(url)
    assert h["status"] == "ok" and h["unload_after"] == 1.0
    loads, unloads, requests = h["loads"], h["unloads"], h["requests"]
    t0 = time.monotonic()
    while _health(url)["status"] != "idle":
        assert time.monotonic() - t0 < 10, "the model was not unloaded after 1 s idle"
        time.sleep(0.2)
    h = _health(url)
    assert h["unloads"] == unloads + 1 and h["loads"] == loads and h["idle_s"] >= 1.0
    assert h["model"]["n_text_layer"] == 4                  # the shape is known while idle
    assert_serves(url)                                       # reloads, then answers
    h = _health(url)
    assert h["status"] == "ok" and h["loads"] == loads + 1 and h["last_load_ms"] > 0
    assert h["requests"] == requests + 1


def test_full_server_answers_503_and_keeps_serving(servers):
    """One connection and a queue of one: a long request is served, one waits for it, two more
    are refused with 503 — each sent once /health shows the one before in its place."""
    import io

    import numpy as np
    import soundfile

    url = servers["narrow"].url
    x, sr = soundfile.read(JFK, dtype="float32")
    long_clip = io.BytesIO()
    soundfile.write(long_clip, np.tile(x, 3), sr, format="WAV", subtype="PCM_16")   # 33 s
    results = []

    def one(data=None):
        status, headers, body = inference(url, data=data)
        results.append((status, json.loads(body)))

    threads = [threading.Thread(target=one, args=(long_clip.getvalue(),))]
    threads[0].start()
    wait_for(url, lambda h: h["busy"])
    threads.append(threading.Thread(target=one))
    threads[1].start()
    wait_for(url, lambda h: h["connections"]["waiting"] == 1)
    for _ in range(2):
        threads.append(threading.Thread(target=one))
        threads[-1].start()
        threads[-1].join(120)
    for t in threads:
        t.join(120)
    statuses = sorted(s for s, _ in results)
    assert statuses == [200, 200, 503, 503], results
    for status, body in results:
        if status == 503:
            assert "server busy" in body["error"]
        else:
            assert status == 200 and JFK_WORDS in body["text"]
    assert_serves(url)
    h = _health(url)
    assert h["connections"] == {"active": 0, "waiting": 0, "max": 1} and not h["busy"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_two_models_each_request_answered_by_the_one_it_names(servers):
    """base (the default) and tiny.en in one server: English-only tiny.en refuses Dutch, base
    transcribes it, so which model answered shows in the status of every route."""
    import asyncio

    import openai
    from openai import OpenAI
    from wyoming.client import AsyncTcpClient
    from wyoming.event import Event
    from wyoming.info import Describe, Info

    srv = servers["polyglot"]
    url, dutch = srv.url, os.path.join(FIX, "fillets/nl-vit-v-automat.ogg")
    with open(dutch, "rb") as f:
        nl = f.read()
    with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
        assert [m.id for m in client.models.list()] == ["base", "tiny.en"]
        for name in ("base", "whisper-1", "gpt-4o-transcribe", None):    # OpenAI's names: the default
            kw = {"model": name} if name else {"model": ""}
            assert client.audio.transcriptions.create(file=("nl.ogg", nl), language="nl", **kw).text.strip()
        with pytest.raises(openai.BadRequestError) as e:
            client.audio.transcriptions.create(model="tiny.en", file=("nl.ogg", nl), language="nl")
        assert "English-only" in e.value.message
        with pytest.raises(openai.BadRequestError) as e:
            client.audio.transcriptions.create(model="large-v9", file=("nl.ogg", nl))
        assert e.value.param == "model" and "this server holds: base, tiny.en" in e.value.message

    def whisper_cpp():
        return inference(url, [("language", "nl")], data=nl)[0]
    status, _, body = http(url + "/load", body=b"model=tiny.en", method="POST")
    assert status == 200 and json.loads(body)["model"] == "tiny.en"
    assert whisper_cpp() == 400 and _health(url)["model"]["name"] == "tiny.en"
    status, _, body = http(url + "/load", body=b"model=nope", method="POST")
    assert status == 400 and "this server holds: base, tiny.en" in json.loads(body)["error"]
    assert http(url + "/load", body=b"model=base", method="POST")[0] == 200 and whisper_cpp() == 200

    def deepgram(model):
        return http(url + f"/v1/listen?language=nl&model={model}", body=nl, method="POST",
                    headers={"Content-Type": "application/octet-stream"})[0]
    assert [deepgram(m) for m in ("base", "nova-3", "tiny.en", "nope")] == [200, 200, 400, 400]

    async def wyoming():
        async with AsyncTcpClient("127.0.0.1", int(srv.wyoming().rpartition(":")[2])) as c:
            await c.write_event(Describe().event())
            info = Info.from_event(await c.read_event())
            await c.write_event(Event("transcribe", {"name": "nope"}))
            refused = await asyncio.wait_for(c.read_event(), 10)
            return info, refused
    info, refused = asyncio.run(wyoming())
    assert [m.name for m in info.asr[0].models] == ["base", "tiny.en"]
    assert refused.type == "error" and refused.data["code"] == "unknown-model", refused

    h = _health(url)
    assert [m["name"] for m in h["models"]] == ["base", "tiny.en"]
    assert all(m["loaded"] and m["rss_mb"] > 10 for m in h["models"]), h["models"]
    assert srv.output().count("MB of memory") == 2
