"""The Wyoming protocol's parts without a model: frames, events, audio, the mDNS record.

Truth: the `wyoming` package (1.11) itself — its writer makes the frames our parser must read,
its reader must read what our encoder writes, its audioop (AudioChunkConverter) is the reference
for widths and channels, its Info/Transcribe classes parse our fields. The parser is fuzzed: any
bytes give events or a FrameError, never another exception, and any split of a valid stream gives
the same events.
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wyoming.asr import Transcribe
from wyoming.audio import AudioChunk, AudioChunkConverter
from wyoming.event import Event as WEvent
from wyoming.event import async_read_event, read_event, write_event

from nwhisper.server import wyoming as W
from nwhisper.server.wyoming_events import (MAX_HEADER, MAX_PAYLOAD, AudioFormat, EventError,
                                            FrameError, Frames, audio_format, encode, samples,
                                            transcribe)


def wyoming_bytes(events):
    out = io.BytesIO()
    for e in events:
        write_event(e, out)
    return out.getvalue()


SAMPLE = [WEvent("describe"),
          Transcribe(language="en", name="tiny.en", transcript_names=["Zorblax"]).event(),
          AudioChunk(rate=16000, width=2, channels=1, audio=bytes(range(256)) * 8).event(),
          WEvent("ping", {"text": "é ✓"}),
          WEvent("audio-stop", {"timestamp": 1234})]


def test_reads_what_wyoming_writes_in_any_pieces():
    data = wyoming_bytes(SAMPLE)
    whole = Frames().feed(data)
    assert [(e.type, e.data, e.payload) for e in whole] == \
        [(e.type, e.data, e.payload) for e in SAMPLE]
    f, byte_by_byte = Frames(), []
    for i in range(len(data)):
        byte_by_byte += f.feed(data[i:i + 1])
    assert [(e.type, e.data, e.payload) for e in byte_by_byte] == [(e.type, e.data, e.payload) for e in whole]
    assert not f.midframe


def test_wyoming_reads_what_we_write_byte_for_byte():
    for e in SAMPLE:
        ours = encode(e.type, e.data, e.payload)
        assert ours == wyoming_bytes([e])             # the same header, order and blocks
        back = read_event(io.BytesIO(ours))
        assert (back.type, back.data, back.payload) == (e.type, e.data, e.payload)


def test_inline_data_is_merged_under_the_data_block():
    head = {"type": "transcribe", "data": {"language": "de", "name": "x"}, "data_length": 17}
    (e,) = Frames().feed(json.dumps(head).encode() + b"\n" + b'{"language":"en"}')
    assert e.data == {"language": "en", "name": "x"}


@pytest.mark.parametrize("frame, why", [
    (b"not json\n", "not JSON"),
    (b"[1, 2]\n", "string \"type\""),
    (b'{"type": 3}\n', "string \"type\""),
    (b'{"type": "x", "data": 5}\n', "\"data\""),
    (b'{"type": "x", "data_length": -1}\n', "outside"),
    (b'{"type": "x", "payload_length": 1e9}\n', "whole number"),
    (b'{"type": "x", "payload_length": %d}\n' % (MAX_PAYLOAD + 1), "outside"),
    (b'{"type": "x", "data_length": 3}\nabc', "data block that is not JSON"),
    (b'{"type": "x", "data_length": 2}\n[]', "JSON object"),
    (b"x" * (MAX_HEADER + 1), "longer than"),
    (b"x" * (MAX_HEADER + 1) + b"\n", "more than"),
])
def test_frames_that_cannot_be_trusted(frame, why):
    with pytest.raises(FrameError, match=why):
        Frames().feed(frame)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_any_bytes_give_events_or_frame_error(data):
    try:
        Frames().feed(data)
    except FrameError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 60), max_size=40))
def test_fuzz_any_split_gives_the_same_events(cuts):
    data = wyoming_bytes(SAMPLE)
    f, got, at = Frames(), [], 0
    for c in cuts + [len(data)]:
        got += f.feed(data[at:at + c])
        at += c
    got += f.feed(data[at:])
    assert [(e.type, e.data, e.payload) for e in got] == [(e.type, e.data, e.payload) for e in SAMPLE]


@pytest.mark.parametrize("width, channels", [(1, 1), (2, 1), (2, 2), (3, 1), (4, 2), (2, 6)])
def test_samples_as_wyomings_audioop_converts_them(width, channels):
    rng = np.random.default_rng(width * 10 + channels)
    raw = rng.integers(0, 256, size=480 * width * channels, dtype=np.uint8).tobytes()
    ours = samples(raw, AudioFormat(16000, width, channels))
    wide = AudioChunkConverter(width=4).convert(
        AudioChunk(rate=16000, width=width, channels=channels, audio=raw))
    ref = (np.frombuffer(wide.audio, "<i4") / 2.0 ** 31).reshape(-1, channels).mean(axis=1)
    assert len(ours) == 480 and np.abs(ours - ref).max() <= 1e-6


@pytest.mark.parametrize("data, why", [
    ({"rate": 0, "width": 2, "channels": 1}, "rate"),
    ({"rate": 16000, "width": 5, "channels": 1}, "width"),
    ({"rate": 16000, "width": 2, "channels": 0}, "channels"),
    ({"rate": "16000", "width": 2, "channels": 1}, "rate"),
    ({"rate": True, "width": 2, "channels": 1}, "rate"),
    ({"width": 2, "channels": 1}, "rate"),
])
def test_audio_formats_refused(data, why):
    with pytest.raises(EventError, match=why):
        audio_format(data, "audio-start")


def test_a_payload_that_is_not_whole_samples():
    with pytest.raises(EventError, match="whole number"):
        samples(b"\0" * 7, AudioFormat(16000, 2, 2))


def test_transcribe_fields():
    t = transcribe(Transcribe(language="EN", name="base", context={"conversation_id": "1"},
                              vad_sensitivity="relaxed", transcript_names=["Zorblax", " "],
                              transcript_terms=["kitchen", "Zorblax"]).event().data)
    assert (t.language, t.name, t.context, t.vad_sensitivity) == ("en", "base", {"conversation_id": "1"}, "relaxed")
    assert t.terms == ("Zorblax", "kitchen")
    for bad, why in [({"vad_sensitivity": "sleepy"}, "vad_sensitivity"),
                     ({"language": 3}, "language"), ({"context": []}, "context"),
                     ({"transcript_names": "Bob"}, "list of strings"),
                     ({"transcript_terms": ["x"] * 1001}, "more than")]:
        with pytest.raises(EventError, match=why):
            transcribe(bad)


def test_uris():
    assert W.parse_uri("tcp://0.0.0.0:10300") == ("tcp", "0.0.0.0", 10300)
    assert W.parse_uri("tcp://[::1]:0") == ("tcp", "::1", 0)
    assert W.parse_uri("unix:///run/nwhisper.sock") == ("unix", "/run/nwhisper.sock", None)
    for bad in ("10300", "http://x:1", "tcp://host", "tcp://h:99999", "unix://"):
        with pytest.raises(ValueError, match="tcp://HOST:PORT"):
            W.parse_uri(bad)


def test_the_service_record_home_assistant_discovers():
    """Built and read back, never announced (no multicast leaves this machine)."""
    info = W.service_info("kitchen", 10300, "192.168.1.20")
    assert info.type == "_wyoming._tcp.local."
    assert info.name == "kitchen._wyoming._tcp.local."
    assert info.port == 10300
    assert [socket.inet_ntoa(a) for a in info.addresses] == ["192.168.1.20"]
    assert info.server.endswith(".local.")


def test_a_frame_sent_a_byte_at_a_time_is_cut_off(monkeypatch):
    """A peer that trickles a frame is closed with an error when the frame's time is up, and
    the service answers another connection meanwhile."""
    monkeypatch.setattr(W, "FRAME_TIMEOUT_S", 0.6)
    ctx = types.SimpleNamespace(host=None, slots=None, config=None)

    async def go():
        service = await W.WyomingService(ctx, "tcp://127.0.0.1:0").start()
        try:
            r, w = await asyncio.open_connection("127.0.0.1", service.port)
            r2, w2 = await asyncio.open_connection("127.0.0.1", service.port)
            got = []

            async def listen():                               # what the trickler is told
                try:
                    while piece := await r.read(1 << 16):
                        got.append(piece)
                except ConnectionError:
                    pass
            heard = asyncio.ensure_future(listen())
            try:
                for b in b'{"type": "ping", "data": {}}' * 4:
                    if heard.done():
                        break
                    w.write(bytes([b]))
                    await w.drain()
                    w2.write(encode("ping", {"text": "still here"}))
                    pong = await asyncio.wait_for(async_read_event(r2), 5)
                    assert (pong.type, pong.data) == ("pong", {"text": "still here"})
                    await asyncio.sleep(0.1)
            except ConnectionError:
                pass                                          # the server closed it: the point
            await asyncio.wait_for(heard, 5)                  # the error, then the close
            err = read_event(io.BytesIO(b"".join(got)))
            assert (err.type, err.data["code"]) == ("error", "frame-timeout")
            w.close()
            w2.close()
        finally:
            await service.stop()

    asyncio.run(go())


@pytest.mark.parametrize("args, why", [
    (["--no-http"], "--no-http serves nothing without --wyoming"),
    (["--zeroconf"], "go with --wyoming"),
    (["--wyoming-own-vad"], "go with --wyoming"),
    (["--wyoming", "unix:///tmp/x.sock", "--zeroconf"], "not a unix socket"),
    (["--wyoming", "10300"], "tcp://HOST:PORT"),
])
def test_serve_refuses_wyoming_options_that_do_not_fit(args, why):
    """Refused before any model is loaded."""
    from click.testing import CliRunner

    from nwhisper.cli.serve import command

    out = CliRunner().invoke(command, ["tiny.en", *args])
    assert out.exit_code == 2 and why in out.output, out.output
