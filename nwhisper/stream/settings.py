"""A live stream's settings: what a client may set, their defaults, and what each is checked for.

    s = StreamSettings()                              # what a client that sends nothing gets
    s = s.updated({"rate": 48000, "partials": True})  # ConfigError naming the field if bad
    s.endpointer_options()                            # the endpointer they ask for

Every dialect builds these: the seed WebSocket from its config message (any subset of the
fields below, at any time, changing only what it names; a bad one is refused whole and the
settings stay as they were), OpenAI Realtime from its session, Wyoming from `transcribe`. Pure
functions, no I/O: the adapters and the fuzz tests call them alike.

| field | type | default | meaning |
| --- | --- | --- | --- |
| format | "pcm16" or "float32" | pcm16 | binary frames: little-endian s16 or f32 samples, mono |
| rate | int 8000..192000 | 16000 | the frames' sample rate (resampled to 16 kHz here) |
| lang | a code, "auto" or null | the server's --lang | the language; "auto" detects it |
| partials | bool | false | drafts while the utterance is spoken |
| partial_ms | int 100..10000 | 300 | a draft per this much new speech |
| pause_ms | int 1..10000 or null | null (learned) | a fixed closing pause (learning off unless adaptive) |
| adaptive | bool or null | null | learn the pause from the speaker's gaps |
| min_pause_ms, max_pause_ms | int 0..10000 | 300, 1000 | the learned pause's range |
| threshold | number in (0, 1) | 0.5 | p(speech) that opens an utterance |
| near_db | number 0..60 | 10 | a voice this far below the speaker's is someone else; 0 = off |
| max_utt_ms | int 1..28000 | 28000 | close at the best gap past this (whisper's window is 30 s) |
| events | bool | false | {"type": "start"} when speech begins |
| levels | bool | false | {"type": "level"} once a second |
| vad | "silero" or "energy" | silero | the detector |
| hotwords | a string or null | null | words to bias toward (names, terms): transcribe's hotwords |
| diarize | bool | false | each final names its speaker (SPEAKER_00 …), matched across the session |
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..vad.endpointer import EndpointerOptions

MIN_RATE, MAX_RATE = 8000, 192000
MAX_HOTWORDS = 1000          # characters (the model reads at most 223 tokens of them)
_E = EndpointerOptions       # the endpointer's defaults are the stream's: one place for each


class ConfigError(ValueError):
    """Settings that cannot be applied; the message names the field."""


@dataclass(frozen=True)
class StreamSettings:
    format: str = "pcm16"
    rate: int = 16000
    lang: str | None = None          # None: the server's default; "auto": detect
    partials: bool = _E.partials
    partial_ms: int = _E.partial_ms
    pause_ms: int | None = _E.pause_ms
    adaptive: bool | None = _E.adaptive
    min_pause_ms: int = _E.min_pause_ms
    max_pause_ms: int = _E.max_pause_ms
    threshold: float = _E.threshold
    near_db: float = _E.near_db
    max_utt_ms: int = _E.max_utt_ms
    events: bool = False
    levels: bool = False
    vad: str = "silero"
    hotwords: str | None = None
    diarize: bool = False

    def updated(self, message):
        """These settings with a config message's fields applied; ConfigError if any is bad."""
        if not isinstance(message, dict):
            raise ConfigError(f"a config message is a JSON object, not {json_kind(message)}")
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(message) - known)
        if unknown:
            raise ConfigError(f"unknown config field {unknown[0]!r}; the fields are: "
                              f"{', '.join(sorted(known))} (and commands are {{\"cmd\": \"end\"|\"reset\"}})")
        changes = {name: _check(name, value) for name, value in message.items()}
        new = dataclasses.replace(self, **changes)
        try:
            new.endpointer_options()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return new

    def endpointer_options(self):
        """The endpointer these settings ask for (it checks how the pause fields combine)."""
        return EndpointerOptions(
            threshold=self.threshold, near_db=self.near_db, pause_ms=self.pause_ms,
            adaptive=self.adaptive, min_pause_ms=self.min_pause_ms, max_pause_ms=self.max_pause_ms,
            max_utt_ms=self.max_utt_ms, partials=self.partials, partial_ms=self.partial_ms,
            level_ms=_E.level_ms if self.levels else 0, stops=True)


def json_kind(value):
    """How a JSON value is named in an error: "an object", "a string", "null" …"""
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null", int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _int(name, value, lo, hi):
    whole = (isinstance(value, (int, float)) and not isinstance(value, bool)
             and math.isfinite(value) and value == int(value))
    if not whole:
        raise ConfigError(f"{name} takes a whole number in {lo}..{hi}, not {json_kind(value)} {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"{name} must be in {lo}..{hi}, got {value!r}")
    return int(value)


def _number(name, value, lo, hi, open_range=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} takes a number, not {json_kind(value)} {value!r}")
    inside = lo < value < hi if open_range else lo <= value <= hi
    if not inside:
        span = f"({lo}, {hi})" if open_range else f"{lo}..{hi}"
        raise ConfigError(f"{name} must be in {span}, got {value!r}")
    return float(value)


def _bool(name, value):
    if not isinstance(value, bool):
        raise ConfigError(f"{name} takes true or false, not {json_kind(value)} {value!r}")
    return value


def _choice(name, value, choices):
    if value not in choices or not isinstance(value, str):
        raise ConfigError(f"{name} takes {' or '.join(repr(c) for c in choices)}, not {value!r}")
    return value


def _check(name, value):
    """One field's value, checked and converted; ConfigError naming it if it is wrong."""
    if name == "format":
        return _choice(name, value, ("pcm16", "float32"))
    if name == "vad":
        return _choice(name, value, ("silero", "energy"))
    if name == "rate":
        return _int(name, value, MIN_RATE, MAX_RATE)
    if name == "hotwords":
        if value is not None and (not isinstance(value, str) or len(value) > MAX_HOTWORDS):
            raise ConfigError(f"hotwords takes a string of at most {MAX_HOTWORDS} characters or "
                              f"null, not {json_kind(value)}")
        return (value.strip() or None) if value is not None else None
    if name == "lang":
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip() or len(value) > 16:
            raise ConfigError(f"lang takes a language code such as \"en\" (or \"auto\"), not {value!r}")
        return value.strip().lower()
    if name in ("partials", "events", "levels", "diarize"):
        return _bool(name, value)
    if name == "adaptive":
        return None if value is None else _bool(name, value)
    if name == "pause_ms":
        return None if value is None else _int(name, value, 1, 10_000)
    if name in ("min_pause_ms", "max_pause_ms"):
        return _int(name, value, 0, 10_000)
    if name == "partial_ms":
        return _int(name, value, 100, 10_000)
    if name == "max_utt_ms":
        return _int(name, value, 1, 28_000)
    if name == "threshold":
        return _number(name, value, 0.0, 1.0, open_range=True)
    if name == "near_db":
        return _number(name, value, 0.0, 60.0)
    raise AssertionError(name)

