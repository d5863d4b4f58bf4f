"""The server's pieces without a server: slots, the job queue, uploads, formats, tokens, TLS, --addr.

Truth for the language names: openai-whisper's LANGUAGES dict (whisper/tokenizer.py), which
OpenAI's API returns in verbose_json's `language`.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
import types

import click
import pytest
from tornado.httputil import HTTPHeaders, HTTPServerRequest, RequestStartLine

from nwhisper.abilities import Abilities, normalize_language
from nwhisper.cli.serve import parse_addr
from nwhisper.server import auth, formats, tls
from nwhisper.server.limits import Busy, Slots
from nwhisper.server.model_host import ModelHost
from nwhisper.server.transcription import _language
from nwhisper.server.upload import Reject, parse
from nwhisper.stream.door import DRAFT, FINAL, Abandoned

# -- limits.Slots -----------------------------------------------------------------------------


def test_slots_are_first_come_first_served_and_bounded():
    async def go():
        s = Slots(1, max_waiting=2)
        first = s.enter()
        assert first.done() and first.result() is True
        a, b = s.enter(), s.enter()
        with pytest.raises(Busy, match="1 requests in progress and 2 waiting"):
            s.enter()
        s.leave(a)                      # a's client went away while waiting
        assert a.result() is False and s.waiting == 1
        s.release()                     # first is done: the slot goes to b, not to a newcomer
        assert b.result() is True and s.active == 1
        c = s.enter()
        assert not c.done()
        s.leave(b)                      # b held the slot: leaving hands it to c
        assert c.result() is True
        s.leave(c)
        assert s.active == 0 and s.waiting == 0

    asyncio.run(go())


# -- inference.ModelHost, with a stand-in model ------------------------------------------------


class FakeModel:
    def __init__(self):
        self.dims = types.SimpleNamespace(
            n_mels=80, n_vocab=51864, n_audio_ctx=1500, n_audio_state=384, n_audio_head=6,
            n_audio_layer=4, n_text_ctx=448, n_text_state=384, n_text_head=6, n_text_layer=4,
            is_multilingual=False)
        self.tokenizer = types.SimpleNamespace(languages=[("en", 50259)])
        self.backend = types.SimpleNamespace(name="cpu")
        self.abilities = Abilities.of(self.tokenizer, self.dims, "fake")

    def transcribe(self, audio, language=None, vad=False):
        return [], None


class CompilingModel(FakeModel):
    """Its first transcription takes long, as one that compiles kernels with an empty cache."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def transcribe(self, audio, language=None, vad=False):
        self.calls += 1
        time.sleep(0.5 if self.calls == 1 else 0.0)
        return [], None


def test_warmup_times_a_warm_transcription():
    """The live streams size their tails by utterance_s (stream/live.py): the first transcription
    of a fresh cache (compiles, seconds) must not stand for a short utterance's time."""
    host = ModelHost("fake", loader=lambda name, device, compute_type: CompilingModel())
    host.load()
    assert host.utterance_s < 0.25
    host.close()


def test_jobs_run_one_at_a_time_finals_before_drafts_and_abandoned_ones_never():
    async def go():
        host = ModelHost("fake", loader=lambda name, device, compute_type: FakeModel())
        host.load(warmup=False)
        assert host.shape["n_text_layer"] == 4
        order, gate = [], asyncio.Event()
        loop = asyncio.get_running_loop()

        def job(tag, wait=False):
            def fn(model):
                if wait:
                    asyncio.run_coroutine_threadsafe(gate.wait(), loop).result()
                order.append(tag)
                return tag
            return fn

        first = host.submit(job("first", wait=True))
        await asyncio.sleep(0.05)       # first is in the worker; the rest queue behind it
        draft = host.submit(job("draft"), DRAFT)
        gone = host.submit(job("gone"))
        final = host.submit(job("final"), FINAL)
        host.abandon(gone)
        assert host.busy and host.queued == 2
        gate.set()
        assert [await first, await final, await draft] == ["first", "final", "draft"]
        with pytest.raises(Abandoned):
            await gone
        assert order == ["first", "final", "draft"] and not host.busy
        host.close()

    asyncio.run(go())


def test_idle_unload_waits_for_holds_and_the_next_job_reloads():
    async def go():
        host = ModelHost("fake", unload_after=0.01, loader=lambda name, device, compute_type: FakeModel())
        host.load(warmup=False)
        host.hold()                     # an open stream
        await asyncio.sleep(0.05)
        host._maybe_unload()
        assert host.loaded
        host.release()
        await asyncio.sleep(0.05)
        host._maybe_unload()
        assert not host.loaded and host.unloads == 1 and host.shape["n_mels"] == 80
        await host.submit(lambda m: None)
        assert host.loaded and host.loads == 2
        host.close()

    asyncio.run(go())


# -- upload.py --------------------------------------------------------------------------------


def _request(body, ctype, uri="/inference"):
    return HTTPServerRequest(start_line=RequestStartLine("POST", uri, "HTTP/1.1"),
                             headers=HTTPHeaders({"Content-Type": ctype, "Host": "x"}), body=body)


def _wav(n_bytes, declared):
    fmt = struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16)
    return (b"RIFF" + struct.pack("<I", 36 + n_bytes) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt +
            b"data" + struct.pack("<I", declared) + b"\0" * n_bytes)


def test_raw_body_takes_its_options_from_the_query():
    up = parse(_request(_wav(10, 10), "audio/wav", "/inference?response_format=srt&vad=yes&token=x"), _wav(10, 10))
    assert up.filename == "request body" and up.text("response_format") == "srt"
    assert up.flag("vad") is True and not up.has("token")
    with pytest.raises(Reject, match="field 'vad' must be true or false"):
        parse(_request(b"x", "audio/wav", "/inference?vad=perhaps"), b"x").flag("vad")
    with pytest.raises(Reject, match="between 0.0 and 1.0"):
        parse(_request(b"x", "audio/wav", "/inference?temperature=3"), b"x").number("temperature", 0.0, 1.0)


def test_language_field():
    """A request's language field, read as the routes read it: the server's default where the
    field is absent, then abilities' normalisation."""
    def read(value, default):
        return normalize_language(_language(value, default))
    assert read(None, "fi") == "fi"
    assert read("auto", "fi") is None and read("", None) is None
    assert read(" EN ", None) == "en" and read("en-US", None) == "en"
    assert read("pt_BR", None) == "pt" and read("haw", None) == "haw"


# -- formats.py -------------------------------------------------------------------------------


def test_language_names_are_openai_whispers():
    from nwhisper.tokenizer import LANGUAGE_CODES

    assert set(formats.LANGUAGE_NAMES) == set(LANGUAGE_CODES) and len(LANGUAGE_CODES) == 100
    names = formats.LANGUAGE_NAMES
    assert (names["en"], names["fi"], names["ht"], names["yue"], names["jw"], names["my"]) == \
        ("english", "finnish", "haitian creole", "cantonese", "javanese", "myanmar")


def test_verbose_json_shape():
    from nwhisper.records import Segment, TranscriptionInfo

    segs = [Segment(1, 0, 0.0, 2.5, " Hello there.", [50363, 15496, 50488], -0.2, 0.01),
            Segment(2, 0, 2.5, 4.0, " Bye.", [50488, 47843, 50563], -0.3, 0.01)]
    info = TranscriptionInfo("en", 0.99, 4.0)
    v = formats.verbose(segs, info, "transcribe")
    assert v["text"] == "Hello there. Bye." and v["language"] == "english" and "words" not in v
    assert [s["id"] for s in v["segments"]] == [0, 1] and v["segments"][1]["start"] == 2.5
    assert v["segments"][0]["compression_ratio"] > 0
    body, ctype = formats.render("json", segs, info)
    assert body == '{"text": "Hello there. Bye."}' and ctype == "application/json"


# -- auth, tls, --addr ------------------------------------------------------------------------


def test_token_sources_and_loopback():
    def req(uri="/x", **headers):
        return HTTPServerRequest(start_line=RequestStartLine("GET", uri, "HTTP/1.1"),
                                 headers=HTTPHeaders({"Host": "x", **headers}))

    assert auth.problem(req(), None) is None
    assert auth.problem(req(), "t").startswith("missing token")
    assert auth.problem(req(Authorization="Bearer t"), "t") is None
    assert auth.problem(req(Authorization="bearer t"), "t") is None
    assert auth.problem(req(Authorization="Basic t"), "t").startswith("missing token")
    assert auth.problem(req("/x?token=t"), "t") is None
    assert auth.problem(req("/x?token=tt"), "t") == "wrong token"
    assert auth.problem(req(Authorization="Token t"), "t") is None          # Deepgram's SDK
    assert auth.problem(req(**{"Sec-WebSocket-Protocol": "token, t"}), "t") is None   # its browsers
    assert auth.problem(req(**{"Sec-WebSocket-Protocol": "openai-insecure-api-key.t"}), "t") is None
    assert auth.problem(req(**{"Sec-WebSocket-Protocol": "token"}), "t").startswith("missing token")
    assert auth.is_loopback("127.0.0.1") and auth.is_loopback("::1") and auth.is_loopback("localhost")
    assert not auth.is_loopback("0.0.0.0") and not auth.is_loopback("192.168.1.5")


def test_minted_certificate_is_reused_while_it_covers_the_names(tmp_path):
    names = tls.names_for("127.0.0.1")
    cert, key, minted = tls.self_signed(str(tmp_path), names)
    assert minted and os.path.exists(cert)
    assert tls.self_signed(str(tmp_path), names)[2] is False
    assert tls.self_signed(str(tmp_path), names + ["10.1.2.3"])[2] is True    # a new name: anew
    tls.context(cert, key)
    assert tls.fingerprint(cert).startswith("SHA256 ")
    with pytest.raises(ValueError, match="cannot use certificate"):
        tls.context(cert, cert)


def test_addr():
    assert parse_addr("0.0.0.0:6543") == ("0.0.0.0", 6543)
    assert parse_addr(":80") == ("0.0.0.0", 80)
    assert parse_addr("8080") == ("127.0.0.1", 8080)
    assert parse_addr("[::1]:0") == ("::1", 0)
    with pytest.raises(click.BadParameter, match="HOST:PORT"):
        parse_addr("localhost:http")


def test_startup_notes():
    from nwhisper.abilities import Abilities
    from nwhisper.server.app import Config, startup_notes

    host = types.SimpleNamespace(abilities=Abilities("this model (m)", True, ("en", "fi")))
    assert startup_notes(Config(host="127.0.0.1"), [host]) == []
    notes = startup_notes(Config(host="0.0.0.0", vad=True), [host])
    assert len(notes) == 1 and "WARNING: listening on 0.0.0.0 without a token" in notes[0]
    assert startup_notes(Config(host="0.0.0.0", token="t"), [host]) == []
    with pytest.raises(ValueError, match="unknown language code 'xx'"):
        startup_notes(Config(language="xx"), [host])
