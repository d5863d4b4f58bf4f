"""The live stream's pure parts: the config and frame checks (fuzzed), the drafts' stable prefix and
context, the endpointer's Stop, and the streaming resampler against the whole-signal one.

Truth: the settings' table (nwhisper/stream/settings.py, README) for the checks; for the
resampler, `resample` of the whole signal (itself checked against scipy in test_audio.py); for
Stop, the End that follows it when no more voice comes (the same span, by definition); for the
tail a live utterance keeps, the endpointer's 32 ms chunks and the two bounds stream/live.py names.
"""

from __future__ import annotations

import asyncio
import json
import types

import numpy as np
import pytest
from hypothesis import given, settings
from fixture_audio import audio
from hypothesis import strategies as st

from nwhisper.io.audio import StreamResampler, resample
from nwhisper.server.protocol import MAX_FRAME, FrameError, decode_frame
from nwhisper.stream.live import LiveStream, draft_ctx, stable_prefix
from nwhisper.stream.settings import ConfigError, StreamSettings
from nwhisper.vad.endpointer import Endpointer, EndpointerOptions

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12)
FIELDS = [f for f in StreamSettings.__dataclass_fields__]


@settings(max_examples=400, deadline=None)
@given(st.one_of(json_values, st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=5)))
def test_any_config_is_applied_or_refused_by_name(message):
    s = StreamSettings()
    try:
        new = s.updated(message)
    except ConfigError as e:
        assert str(e)
        return
    assert isinstance(message, dict) and set(message) <= set(FIELDS)
    new.endpointer_options()                                    # a consistent endpointer
    for k, v in message.items():
        assert getattr(new, k) == (v.strip().lower() if isinstance(v, str) and k == "lang" else v)


def test_config_fields_round_trip():
    s = StreamSettings().updated({"format": "float32", "rate": 48000, "partials": True,
                                  "pause_ms": 300, "threshold": 0.4, "lang": " FI "})
    assert (s.format, s.rate, s.partials, s.pause_ms, s.threshold, s.lang) == ("float32", 48000, True, 300, 0.4, "fi")
    o = s.endpointer_options()
    assert o.pause_ms == 300 and o.partials and o.stops and not o.learning
    assert StreamSettings().endpointer_options().level_ms == 0          # levels off: no Level events
    for bad, why in [({"rate": 7999}, "rate must be in 8000..192000"), ({"rate": True}, "whole number"),
                     ({"near_db": float("nan")}, "near_db takes a number"), ({"lang": ""}, "language code"),
                     ({"partial_ms": 50}, "partial_ms must be in 100..10000"), ({"vad": "webrtc"}, "'silero' or 'energy'")]:
        with pytest.raises(ConfigError, match=why.replace("(", r"\(").replace(")", r"\)")):
            StreamSettings().updated(bad)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096), st.sampled_from(["pcm16", "float32"]))
def test_any_frame_decodes_or_is_refused_by_name(frame, fmt):
    s = StreamSettings(format=fmt)
    try:
        x = decode_frame(frame, s)
    except FrameError as e:
        assert "frame" in str(e)
        return
    assert x.dtype == np.float32 and len(x) == len(frame) // (2 if fmt == "pcm16" else 4)
    assert np.isfinite(x).all() and (fmt != "pcm16" or np.abs(x).max(initial=0) <= 1)


def test_frames_decode_as_little_endian_and_big_frames_are_refused():
    x = decode_frame(np.array([-32768, 0, 16384], "<i2").tobytes(), StreamSettings())
    assert x.tolist() == [-1.0, 0.0, 0.5]
    y = decode_frame(np.array([0.25, -1.5], "<f4").tobytes(), StreamSettings(format="float32"))
    assert y.tolist() == [0.25, -1.5]
    with pytest.raises(FrameError, match="more than this server takes"):
        decode_frame(b"\0" * (MAX_FRAME + 2), StreamSettings())


@pytest.mark.parametrize("previous,current,stable", [
    ("", " And so", ""),
    (" And so", " And so am I", " And so"),
    (" And so my fellow", " And so my fellow Americans", " And so my fellow"),
    (" What your country", " Like your country.", ""),
    (" ask what you can", " ask what you can do", " ask what you can"),
    (" ten of", " 10 of clubs", ""),
])
def test_stable_is_the_words_two_drafts_agree_on(previous, current, stable):
    got = stable_prefix(previous, current)
    assert got == stable and current.startswith(got)


def test_a_draft_encodes_its_audio_plus_five_seconds_at_least_ten():
    assert draft_ctx(1.0, 1500) == 500              # 10 s
    assert draft_ctx(11.0, 1500) == 800             # 16 s
    assert draft_ctx(27.0, 1500) == 1500            # never past the model's 30 s


def _drive(ep, pattern):
    """pattern: a string, one char per 32 ms chunk: 'v' voice (p 0.9, -20 dB), '.' silence."""
    events = []
    for c in pattern:
        events += ep.step(0.9 if c == "v" else 0.01, -20.0 if c == "v" else -70.0)
    return events


def test_stop_names_the_span_that_end_then_closes():
    ep = Endpointer(EndpointerOptions(pause_ms=480, stops=True, room=False))
    events = _drive(ep, "." * 20 + "v" * 30 + "." * 20)
    kinds = [e.kind for e in events]
    assert kinds.count("stop") == 1 and kinds.index("stop") < kinds.index("end")
    stop = next(e for e in events if e.kind == "stop")
    end = next(e for e in events if e.kind == "end")
    assert (stop.seg, stop.t0, stop.t1, stop.speech_t0, stop.speech_t1) == \
        (end.seg, end.t0, end.t1, end.speech_t0, end.speech_t1)
    assert stop.at < end.at and end.reason == "pause"


def test_voice_after_stop_moves_the_end():
    ep = Endpointer(EndpointerOptions(pause_ms=480, stops=True, room=False))
    events = _drive(ep, "." * 20 + "v" * 30 + "." * 8 + "v" * 20 + "." * 20)
    stops = [e for e in events if e.kind == "stop"]
    ends = [e for e in events if e.kind == "end"]
    assert len(stops) == 2 and len(ends) == 1
    assert (stops[0].t1 != ends[0].t1) and (stops[1].t1 == ends[0].t1)
    assert not [e for e in _drive(Endpointer(EndpointerOptions(pause_ms=480, room=False)),
                                  "." * 20 + "v" * 30 + "." * 20) if e.kind == "stop"]   # off by default


def test_reconfigure_keeps_the_room_and_applies_the_pause():
    ep = Endpointer(EndpointerOptions(stops=True))
    _drive(ep, "." * 40 + "v" * 30 + "." * 40)
    floor = ep.noise_db
    ep.reconfigure(EndpointerOptions(pause_ms=320, stops=True))
    assert ep.pause_ms == 320 and ep.noise_db == floor
    ep.reconfigure(EndpointerOptions(min_pause_ms=600, max_pause_ms=900, stops=True))
    assert 600 <= ep.pause_ms <= 900


@pytest.mark.parametrize("rate", [48000, 44100, 24000, 22050, 8000, 16000])
def test_stream_resampler_is_resample_of_the_whole(rate):
    rng = np.random.default_rng(rate)
    x = rng.standard_normal(rate * 2 + 37).astype(np.float32)
    r, out, i = StreamResampler(rate), [], 0
    while i < len(x):
        n = int(rng.integers(1, 3000))
        out.append(r.feed(x[i:i + n]))
        i += n
    out.append(r.flush())
    y = np.concatenate(out)
    ref = resample(x, rate)
    assert len(y) == len(ref)
    assert np.abs(y - ref).max() <= 1e-6


def test_stream_resampler_refuses_absurd_rates():
    with pytest.raises(ValueError, match="sample rate"):
        StreamResampler(10**9)


def test_protocol_table_lists_every_field():
    """The module's table (which the README's mirrors) names every config field."""
    import nwhisper.stream.settings as P

    for name in FIELDS:
        assert f"| {name}" in P.__doc__ or f", {name} |" in P.__doc__, name
    json.dumps(StreamSettings().__dict__)


class _Door:
    """The model's door, run at once: each FINAL job's audio length is noted."""

    def __init__(self, utterance_s):
        self.utterance_s, self.finals = utterance_s, []

    def submit(self, fn, priority):
        f = asyncio.get_running_loop().create_future()
        f.set_result(fn(self))
        return f

    def abandon(self, future):
        pass

    def transcribe(self, audio, options, cancelled=None):      # the model, as the jobs call it
        self.finals.append(len(audio))
        return [types.SimpleNamespace(text=" a card", words=None, avg_logprob=-0.1)], \
            types.SimpleNamespace(language="en")


def _final_samples(utterance_s, tail_ms=None):
    """The samples of the last final job of a card sent to a LiveStream, then a second of silence."""
    async def go():
        door = _Door(utterance_s)
        live = LiveStream(door, StreamSettings(pause_ms=400), lambda m: None, tail_ms=tail_ms)
        x = np.concatenate([audio("cards/002.wav"), np.zeros(16000, np.float32)])
        for i in range(0, len(x), 512):                    # as a client sends it: 32 ms frames
            live.feed(x[i:i + 512])
        await live.settled()
        return door.finals[-1]
    return asyncio.run(go())


def test_the_tail_shortens_on_a_slow_model_unless_the_server_fixes_it():
    """pause 400 ms: a model answering in 50 ms leaves the whole 200 ms tail (192, in chunks);
    one taking 500 ms would still be busy at the pause, so the utterance keeps the least (64 ms);
    serve --tail-ms keeps its tail whatever the model's speed (the same words on any machine)."""
    fast, slow = _final_samples(0.05), _final_samples(0.5)
    assert fast - slow == (192 - 64) * 16
    assert _final_samples(0.5, tail_ms=200) == fast
    assert _final_samples(0.05, tail_ms=96) == slow + 32 * 16
