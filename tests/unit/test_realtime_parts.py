"""The Realtime session's pure parts: G.711 decoding against libsndfile's, the session updates of
both dialects (hand cases and fuzzed: a RealtimeError or a valid Session, nothing else), the
append decoder, and how a session maps onto the native stream's settings."""

from __future__ import annotations

import base64
import io
import struct

import numpy as np
import pytest
import soundfile as sf
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nwhisper.io.g711 import ALAW, ULAW, alaw_decode, ulaw_decode
from nwhisper.stream.settings import StreamSettings
from nwhisper.server.realtime_events import (RealtimeError, Session, TurnDetection, apply_beta,
                                             apply_ga, decode_append)


def g711_wav(code, data):
    """A WAV of 8 kHz G.711 bytes (format 7 μ-law, 6 A-law) for libsndfile to decode."""
    fmt = struct.pack("<HHIIHH", code, 1, 8000, 8000, 1, 8)
    body = b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return io.BytesIO(b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body)


@pytest.mark.parametrize("code,table,decode", [(7, ULAW, ulaw_decode), (6, ALAW, alaw_decode)])
def test_g711_equals_libsndfile_for_every_byte(code, table, decode):
    every = bytes(range(256))
    truth = sf.read(g711_wav(code, every), dtype="int16")[0]
    np.testing.assert_array_equal(table, truth)
    np.testing.assert_array_equal(decode(every), truth.astype(np.float32) / 32768)


def test_ga_update_maps_onto_the_stream():
    s = apply_ga(Session(), {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 24000},
        "transcription": {"model": "gpt-4o-transcribe", "language": "EN", "prompt": "cards"},
        "turn_detection": {"type": "server_vad", "threshold": 0.6, "prefix_padding_ms": 200,
                           "silence_duration_ms": 700},
        "noise_reduction": {"type": "far_field"}}}})
    assert (s.model, s.language, s.prompt, s.noise_reduction) == ("gpt-4o-transcribe", "en", "cards", "far_field")
    st_ = s.stream_settings()
    assert (st_.rate, st_.pause_ms, st_.threshold, st_.lang, st_.partials) == (24000, 700, 0.6, "en", True)
    assert s.lead_ms() == 200 and not st_.endpointer_options().learning
    shown = s.ga("sess_x", "tiny.en")["audio"]["input"]
    assert shown["turn_detection"]["silence_duration_ms"] == 700
    # an update changes only what it names
    s2 = apply_ga(s, {"audio": {"input": {"turn_detection": {"silence_duration_ms": 300}}}})
    assert s2.turn_detection == TurnDetection(threshold=0.6, prefix_padding_ms=200, silence_duration_ms=300)
    assert s2.language == "en"
    manual = apply_ga(s2, {"audio": {"input": {"turn_detection": None, "format": {"type": "audio/pcmu"}}}})
    assert manual.turn_detection is None and manual.sample_rate == 8000 and manual.lead_ms() is None


def test_beta_update_and_semantic_vad():
    s = apply_beta(Session(), {"input_audio_format": "g711_alaw",
                               "input_audio_transcription": {"model": "whisper-1", "language": "fr"},
                               "turn_detection": {"type": "semantic_vad", "eagerness": "low"}})
    assert (s.format, s.sample_rate, s.language) == ("audio/pcma", 8000, "fr")
    st_ = s.stream_settings()
    assert st_.endpointer_options().learning and st_.max_pause_ms == 2000
    assert s.beta("sess_x", "base")["input_audio_format"] == "g711_alaw"
    assert s.beta("sess_x", "base")["input_audio_transcription"]["model"] == "whisper-1"
    assert Session().transcription("base")["model"] == "base"      # unnamed: the loaded model


@pytest.mark.parametrize("update,param", [
    ({"type": "realtime"}, "session.type"),
    ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 1000}}}}, "session.audio.input.format.rate"),
    ({"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 16000}}}}, "session.audio.input.format.rate"),
    ({"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 0}}}},
     "session.audio.input.turn_detection.threshold"),
    ({"audio": {"input": {"turn_detection": {"prefix_padding_ms": 5000}}}},
     "session.audio.input.turn_detection.prefix_padding_ms"),
    ({"audio": {"input": {"turn_detection": {"type": "push_to_talk"}}}},
     "session.audio.input.turn_detection.type"),
    ({"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}},
     "session.audio.input.turn_detection.eagerness"),
    ({"audio": {"input": {"transcription": {"languages": ["en"]}}}},
     "session.audio.input.transcription.languages"),
    ({"audio": {"input": {"colour": 1}}}, "session.audio.input.colour"),
    ({"include": ["item.input_audio_transcription.logprobs"]}, "session.include"),
    ({"audio": {"output": {}}}, "session.audio.output"),
])
def test_ga_refusals_name_the_field(update, param):
    before = Session()
    with pytest.raises(RealtimeError) as e:
        apply_ga(before, {"type": "transcription", **update} if "type" not in update else update)
    assert e.value.param == param, str(e.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12)
GA_KEYS = st.sampled_from(["type", "audio", "include", "input", "format", "transcription",
                           "turn_detection", "noise_reduction", "rate", "threshold", "language",
                           "silence_duration_ms", "prefix_padding_ms", "model", "prompt", "eagerness"])
shaped = st.recursive(json_values, lambda inner: st.dictionaries(GA_KEYS, inner, max_size=4), max_leaves=16)


@settings(max_examples=500, deadline=None)
@given(shaped, st.booleans())
@example({"turn_detection": {"eagerness": []}}, True)       # found by the fuzzer: a TypeError
@example({"input_audio_format": {}}, True)
def test_fuzzed_updates_refuse_or_give_a_valid_session(obj, beta):
    try:
        s = (apply_beta if beta else apply_ga)(Session(), obj)
    except RealtimeError as e:
        assert str(e) and e.code
        return
    settings_ = s.stream_settings()
    assert isinstance(settings_, StreamSettings)
    settings_.endpointer_options()            # the stream would take it
    (s.beta if beta else s.ga)("sess_x", "tiny.en")


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=600).map(lambda b: base64.b64encode(b).decode()),
                 st.text(max_size=40), json_values),
       st.sampled_from(["audio/pcm", "audio/pcmu", "audio/pcma"]))
def test_fuzzed_appends_decode_or_refuse(audio, fmt):
    try:
        x = decode_append(audio, Session(format=fmt))
    except RealtimeError as e:
        assert e.param == "audio"
        return
    assert x.dtype == np.float32 and np.isfinite(x).all() and np.abs(x).max(initial=0) <= 1
    raw = base64.b64decode(audio)
    assert len(x) == (len(raw) // 2 if fmt == "audio/pcm" else len(raw))
