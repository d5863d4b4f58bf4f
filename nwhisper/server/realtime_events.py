"""OpenAI Realtime transcription sessions: the session a client configures, in both dialects the
official clients speak, and the checks on what it sends. Pure functions, no I/O: the WebSocket
(realtime.py) and the fuzz tests call them alike.

GA — `session.update`, answered by `session.updated`:

    {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 24000},       # or audio/pcmu, audio/pcma (8 kHz)
        "transcription": {"model": "whisper-1", "language": "en", "prompt": "…"},
        "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                           "silence_duration_ms": 500},        # or null: the client commits
        "noise_reduction": {"type": "near_field"}}}}}

beta — `transcription_session.update` (header `OpenAI-Beta: realtime=v1`), answered by
`transcription_session.updated`: the same settings as `input_audio_format` (pcm16 | g711_ulaw |
g711_alaw), `input_audio_transcription`, `turn_detection`, `input_audio_noise_reduction`.

An update changes only what it names; a bad one is refused whole (RealtimeError naming the
field as OpenAI does, e.g. `session.audio.input.turn_detection.threshold`) and nothing changes.
How the session maps onto the live stream (stream_settings):

| OpenAI | nwhisper's stream |
| --- | --- |
| server_vad threshold | threshold: p(speech) that opens an utterance (before the room raises it) |
| server_vad prefix_padding_ms | the audio kept before the voice (lead) |
| server_vad silence_duration_ms | pause_ms: the fixed closing pause |
| semantic_vad eagerness | the learned pause, at most 600 (high), 1000 (medium, auto), 2000 ms (low) |
| turn_detection null | no endpointer: `commit` transcribes what was appended |
| noise_reduction | recorded and echoed; the near-field gate already keeps quieter voices out |
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..io.g711 import alaw_decode, ulaw_decode
from ..stream.live import KEEP_S
from ..stream.settings import MAX_RATE, MIN_RATE, StreamSettings, json_kind
from .protocol import MAX_FRAME

MAX_LEAD_MS = int(KEEP_S * 1000)   # the stream keeps this much audio before an utterance opens
MAX_PROMPT = 2000            # characters: whisper reads at most 223 prompt tokens anyway
EAGER_MAX_PAUSE_MS = {"high": 600, "medium": 1000, "auto": 1000, "low": 2000}
BETA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}
NOISE_TYPES = ("near_field", "far_field")
MIN_COMMIT_MS = 100          # OpenAI refuses to commit less audio than this


class RealtimeError(ValueError):
    """A client event that cannot be applied: OpenAI's error code and the field at fault."""

    def __init__(self, message, code="invalid_value", param=None):
        super().__init__(message)
        self.code, self.param = code, param


@dataclass(frozen=True)
class TurnDetection:
    type: str = "server_vad"                 # or "semantic_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    eagerness: str = "auto"                  # semantic_vad only

    def as_dict(self):
        if self.type == "semantic_vad":
            return {"type": self.type, "eagerness": self.eagerness}
        return {"type": self.type, "threshold": self.threshold,
                "prefix_padding_ms": self.prefix_padding_ms,
                "silence_duration_ms": self.silence_duration_ms}


@dataclass(frozen=True)
class Session:
    format: str = "audio/pcm"                # audio/pcm (16-bit little-endian) | audio/pcmu | audio/pcma
    rate: int = 24000                        # audio/pcm's rate; G.711 is always 8 kHz
    model: str | None = None                 # as the client named it (None: the loaded model's name)
    language: str | None = None
    prompt: str | None = None
    turn_detection: TurnDetection | None = TurnDetection()
    noise_reduction: str | None = None

    @property
    def sample_rate(self):
        return self.rate if self.format == "audio/pcm" else 8000

    def stream_settings(self):
        """The native stream's settings for this session (server VAD; drafts feed the deltas)."""
        td = self.turn_detection or TurnDetection()
        common = dict(rate=self.sample_rate, lang=self.language, partials=True, events=True)
        if td.type == "semantic_vad":
            hi = EAGER_MAX_PAUSE_MS[td.eagerness]
            return StreamSettings(pause_ms=None, adaptive=True, max_pause_ms=hi, **common)
        return StreamSettings(pause_ms=max(td.silence_duration_ms, 1), threshold=td.threshold,
                              **common)

    def lead_ms(self):
        td = self.turn_detection
        return td.prefix_padding_ms if td is not None and td.type == "server_vad" else None

    # -- the session object as each dialect shows it -----------------------------------------

    def transcription(self, model_name):
        return {"model": self.model or model_name, "language": self.language, "prompt": self.prompt}

    def ga(self, sid, model_name):
        fmt = {"type": self.format}
        if self.format == "audio/pcm":
            fmt["rate"] = self.rate
        return {"type": "transcription", "object": "realtime.transcription_session", "id": sid,
                "audio": {"input": {
                    "format": fmt, "transcription": self.transcription(model_name),
                    "turn_detection": self.turn_detection and self.turn_detection.as_dict(),
                    "noise_reduction": self.noise_reduction and {"type": self.noise_reduction}}},
                "include": []}

    def beta(self, sid, model_name):
        fmt = {v: k for k, v in BETA_FORMATS.items()}[self.format]
        return {"id": sid, "object": "realtime.transcription_session", "modalities": ["text"],
                "input_audio_format": fmt,
                "input_audio_transcription": self.transcription(model_name),
                "turn_detection": self.turn_detection and self.turn_detection.as_dict(),
                "input_audio_noise_reduction": self.noise_reduction and {"type": self.noise_reduction},
                "include": [], "client_secret": None}


# -- updates ---------------------------------------------------------------------------------

def _object(value, param):
    if not isinstance(value, dict):
        raise RealtimeError(f"{param} must be an object, not {json_kind(value)}", "invalid_type", param)
    return value


def _known(obj, fields, param):
    unknown = sorted(set(obj) - set(fields))
    if unknown:
        raise RealtimeError(f"unknown parameter {param}.{unknown[0]}; {param} takes: "
                            f"{', '.join(sorted(fields))}", "unknown_parameter", f"{param}.{unknown[0]}")


def _string(value, param, limit=64, empty=False):
    if not isinstance(value, str) or len(value) > limit or (not empty and not value.strip()):
        raise RealtimeError(f"{param} must be a string of at most {limit} characters, not "
                            f"{json_kind(value)} {value!r:.80}", "invalid_type", param)
    return value


def _int(value, param, lo, hi):
    whole = (isinstance(value, (int, float)) and not isinstance(value, bool)
             and math.isfinite(value) and value == int(value))
    if not whole or not lo <= value <= hi:
        raise RealtimeError(f"{param} must be a whole number in {lo}..{hi}, got {value!r:.80}",
                            "invalid_value", param)
    return int(value)


def _transcription(session, obj, param):
    if obj is None:
        return session
    obj = _object(obj, param)
    _known(obj, ("model", "language", "prompt", "keywords", "languages", "delay"), param)
    changes = {}
    if obj.get("model") is not None:
        changes["model"] = _string(obj["model"], f"{param}.model", 128)
    if "language" in obj:
        lang = obj["language"]
        changes["language"] = None if lang in (None, "", "auto") else _string(
            lang, f"{param}.language", 16).strip().lower()
    if "prompt" in obj:
        changes["prompt"] = (None if obj["prompt"] in (None, "")
                             else _string(obj["prompt"], f"{param}.prompt", MAX_PROMPT))
    for name in ("keywords", "languages", "delay"):
        if obj.get(name) is not None:
            raise RealtimeError(f"{param}.{name} is not offered by this server (Whisper takes a "
                                f"language and a prompt)", "unsupported_parameter", f"{param}.{name}")
    return dataclasses.replace(session, **changes)


def _turn_detection(current, value, param):
    if value is None:
        return None
    obj = _object(value, param)
    kind = obj.get("type", current.type if current else "server_vad")
    if kind not in ("server_vad", "semantic_vad"):
        raise RealtimeError(f"{param}.type must be 'server_vad', 'semantic_vad' or the whole "
                            f"turn_detection null, not {kind!r:.80}", "invalid_value", f"{param}.type")
    base = current if current is not None and current.type == kind else TurnDetection(type=kind)
    # response-shaping fields belong to conversation sessions; a transcription session has none
    _known(obj, ("type", "threshold", "prefix_padding_ms", "silence_duration_ms", "eagerness",
                 "create_response", "interrupt_response", "idle_timeout_ms"), param)
    changes = {}
    if obj.get("threshold") is not None:
        t = obj["threshold"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < 1:
            raise RealtimeError(f"{param}.threshold must be a number between 0 and 1 (exclusive), "
                                f"got {t!r:.80}", "invalid_value", f"{param}.threshold")
        changes["threshold"] = float(t)
    if obj.get("prefix_padding_ms") is not None:
        changes["prefix_padding_ms"] = _int(obj["prefix_padding_ms"], f"{param}.prefix_padding_ms",
                                            0, MAX_LEAD_MS)
    if obj.get("silence_duration_ms") is not None:
        changes["silence_duration_ms"] = _int(obj["silence_duration_ms"],
                                              f"{param}.silence_duration_ms", 1, 10_000)
    if obj.get("eagerness") is not None:
        e = obj["eagerness"]
        if not isinstance(e, str) or e not in EAGER_MAX_PAUSE_MS:     # a list is no key
            raise RealtimeError(f"{param}.eagerness must be low, medium, high or auto, not "
                                f"{e!r:.80}", "invalid_value", f"{param}.eagerness")
        changes["eagerness"] = e
    return dataclasses.replace(base, **changes)


def _noise(value, param):
    if value is None:
        return None
    obj = _object(value, param)
    _known(obj, ("type", "strength"), param)
    kind = obj.get("type", "near_field")
    if kind not in NOISE_TYPES:
        raise RealtimeError(f"{param}.type must be near_field or far_field, not {kind!r:.80}",
                            "invalid_value", f"{param}.type")
    return kind


def _format(value, param):
    """(format, rate) from a GA format object."""
    obj = _object(value, param)
    _known(obj, ("type", "rate"), param)
    kind = obj.get("type", "audio/pcm")
    if kind not in ("audio/pcm", "audio/pcmu", "audio/pcma"):
        raise RealtimeError(f"{param}.type must be audio/pcm, audio/pcmu or audio/pcma, not "
                            f"{kind!r:.80}", "invalid_value", f"{param}.type")
    if kind != "audio/pcm":
        if obj.get("rate") not in (None, 8000):
            raise RealtimeError(f"{kind} is 8000 Hz, not {obj['rate']!r:.80}", "invalid_value",
                                f"{param}.rate")
        return kind, None
    return kind, _int(obj.get("rate", 24000), f"{param}.rate", MIN_RATE, MAX_RATE)


def apply_ga(session, obj):
    """`session.update`'s session object applied to `session`."""
    p = "session"
    obj = _object(obj, p)
    _known(obj, ("type", "audio", "include", "object", "id"), p)
    if obj.get("type", "transcription") != "transcription":
        raise RealtimeError(f"session.type must be 'transcription': this server runs "
                            f"transcription sessions, not {obj['type']!r:.80}", "invalid_value",
                            "session.type")
    _include(obj.get("include"), "session.include")
    audio = _object(obj.get("audio") or {}, "session.audio")
    _known(audio, ("input",), "session.audio")
    inp = _object(audio.get("input") or {}, "session.audio.input")
    p = "session.audio.input"
    _known(inp, ("format", "transcription", "turn_detection", "noise_reduction"), p)
    s = session
    if inp.get("format") is not None:
        fmt, rate = _format(inp["format"], f"{p}.format")
        s = dataclasses.replace(s, format=fmt, rate=rate or s.rate)
    s = _transcription(s, inp.get("transcription"), f"{p}.transcription")
    if "turn_detection" in inp:
        s = dataclasses.replace(s, turn_detection=_turn_detection(
            s.turn_detection, inp["turn_detection"], f"{p}.turn_detection"))
    if "noise_reduction" in inp:
        s = dataclasses.replace(s, noise_reduction=_noise(inp["noise_reduction"], f"{p}.noise_reduction"))
    return s


def apply_beta(session, obj):
    """`transcription_session.update`'s session object applied to `session`."""
    p = "session"
    obj = _object(obj, p)
    _known(obj, ("input_audio_format", "input_audio_transcription", "turn_detection",
                 "input_audio_noise_reduction", "include", "modalities", "client_secret"), p)
    _include(obj.get("include"), "session.include")
    s = session
    if obj.get("input_audio_format") is not None:
        fmt = obj["input_audio_format"]
        if not isinstance(fmt, str) or fmt not in BETA_FORMATS:
            raise RealtimeError(f"session.input_audio_format must be pcm16, g711_ulaw or "
                                f"g711_alaw, not {fmt!r:.80}", "invalid_value",
                                "session.input_audio_format")
        s = dataclasses.replace(s, format=BETA_FORMATS[fmt], rate=24000)   # pcm16 is 24 kHz
    s = _transcription(s, obj.get("input_audio_transcription"), "session.input_audio_transcription")
    if "turn_detection" in obj:
        s = dataclasses.replace(s, turn_detection=_turn_detection(
            s.turn_detection, obj["turn_detection"], "session.turn_detection"))
    if "input_audio_noise_reduction" in obj:
        s = dataclasses.replace(s, noise_reduction=_noise(obj["input_audio_noise_reduction"],
                                                          "session.input_audio_noise_reduction"))
    return s


def _include(value, param):
    if value in (None, []):
        return
    raise RealtimeError(f"{param}: this server adds nothing to its events (no logprobs)",
                        "unsupported_parameter", param)


# -- audio -----------------------------------------------------------------------------------

def decode_append(audio, session):
    """`input_audio_buffer.append`'s base64 audio → float32 samples at session.sample_rate."""
    param = "audio"
    if not isinstance(audio, str):
        raise RealtimeError(f"audio must be a base64 string, not {json_kind(audio)}", "invalid_type", param)
    if len(audio) > MAX_FRAME * 4 // 3 + 4:
        raise RealtimeError(f"an append of {len(audio)} base64 characters is more than this server "
                            f"takes ({MAX_FRAME} bytes of audio); append a second or less at a "
                            f"time", "invalid_value", param)
    try:
        data = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError) as e:
        raise RealtimeError(f"audio is not valid base64: {e}", "invalid_value", param) from None
    if session.format == "audio/pcmu":
        return ulaw_decode(data)
    if session.format == "audio/pcma":
        return alaw_decode(data)
    if len(data) % 2:
        raise RealtimeError(f"audio/pcm is 16-bit samples: {len(data)} bytes is not a whole "
                            f"number of them", "invalid_value", param)
    return np.frombuffer(data, "<i2").astype(np.float32) / np.float32(32768.0)
