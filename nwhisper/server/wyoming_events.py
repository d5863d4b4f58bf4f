"""The Wyoming protocol's frames and events, as the `wyoming` package writes and reads them, and
what each is checked for. Pure functions, no I/O: the server (wyoming.py) and the fuzz tests call
them alike.

A frame is a JSON header on one line, then two optional blocks whose sizes the header gives:

    {"type": "audio-chunk", "version": "1.11.0", "data_length": 49, "payload_length": 2048}\\n
    {"rate": 16000, "width": 2, "channels": 1, "timestamp": 0}      ← data_length bytes of JSON
    …2048 bytes of audio…                                            ← payload_length bytes

The data block's fields are merged over any `data` object inside the header (older writers put
it there). `Frames` parses a byte stream that arrives in any pieces; a frame it cannot trust (a
header that is not a JSON object with a string type, a header line or block past its limit, a
length that is not a whole number) is a FrameError, after which the connection is closed: the
next frame's start is unknown. An event whose fields are wrong (EventError) is answered with an
`error` event and the connection goes on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..stream.settings import MAX_RATE, MIN_RATE

PROTOCOL_VERSION = "1.11.0"      # the wyoming release whose framing this matches
MAX_HEADER = 64 << 10            # bytes in a header line
MAX_DATA = 1 << 20               # bytes in a data block (a transcribe with many names fits)
MAX_PAYLOAD = 2 << 20            # bytes of audio in one chunk (65 s of 16 kHz 16-bit mono)
MAX_CHANNELS = 32
MAX_TERMS = 1000                 # transcript_names + transcript_terms
SENSITIVITIES = ("default", "relaxed", "aggressive")


class FrameError(ValueError):
    """The byte stream is not Wyoming frames: say so and close the connection."""


class EventError(ValueError):
    """An event that cannot be applied; answered with an `error` event, the connection goes on."""

    def __init__(self, message, code="bad-event"):
        super().__init__(message)
        self.code = code


@dataclass
class Event:
    type: str
    data: dict = field(default_factory=dict)
    payload: bytes | None = None


def encode(kind, data=None, payload=None):
    """One frame's bytes, as wyoming's `async_write_event` writes them."""
    header = {"type": kind, "version": PROTOCOL_VERSION}
    body = json.dumps(data, ensure_ascii=False).encode() if data else b""
    if body:
        header["data_length"] = len(body)
    if payload:
        header["payload_length"] = len(payload)
    return json.dumps(header, ensure_ascii=False).encode() + b"\n" + body + (payload or b"")


class Frames:
    """Frames from a byte stream fed in pieces of any size:

        frames = Frames()
        for event in frames.feed(piece): …        # FrameError: close the connection
    """

    def __init__(self):
        self._buf = bytearray()
        self._header = None          # the parsed header while its blocks arrive
        self._need = 0               # bytes of data + payload the header announced

    @property
    def midframe(self):
        """Bytes of an unfinished frame are waiting (the peer stopped mid-frame)."""
        return bool(self._buf) or self._header is not None

    def feed(self, piece):
        self._buf += piece
        out = []
        while True:
            if self._header is None:
                end = self._buf.find(b"\n")
                if end < 0:
                    if len(self._buf) > MAX_HEADER:
                        raise FrameError(f"a header line longer than {MAX_HEADER} bytes")
                    return out
                if end > MAX_HEADER:
                    raise FrameError(f"a header line of {end} bytes, more than {MAX_HEADER}")
                line = bytes(self._buf[:end])
                del self._buf[:end + 1]
                if not line.strip():
                    continue                     # a blank line between frames carries nothing
                self._header = _header(line)
                self._need = self._header["_data"] + self._header["_payload"]
            if len(self._buf) < self._need:
                return out
            h, self._header = self._header, None
            block = bytes(self._buf[:self._need])
            del self._buf[:self._need]
            out.append(_event(h, block))


def _length(header, name, limit):
    n = header.get(name)
    if n is None:
        return 0
    if isinstance(n, bool) or not isinstance(n, int):
        raise FrameError(f"{name} must be a whole number of bytes, not {n!r:.40}")
    if n < 0 or n > limit:
        raise FrameError(f"{name} {n} is outside 0..{limit}")
    return n


def _header(line):
    try:
        h = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        raise FrameError(f"a header line that is not JSON: {e}") from None
    if not isinstance(h, dict) or not isinstance(h.get("type"), str) or not h["type"]:
        raise FrameError("a header must be a JSON object with a string \"type\"")
    if "data" in h and not isinstance(h["data"], dict):
        raise FrameError("a header's \"data\" must be a JSON object")
    h["_data"] = _length(h, "data_length", MAX_DATA)
    h["_payload"] = _length(h, "payload_length", MAX_PAYLOAD)
    return h


def _event(h, block):
    data = dict(h.get("data") or {})
    if h["_data"]:
        try:
            more = json.loads(block[:h["_data"]])
        except (ValueError, UnicodeDecodeError) as e:
            raise FrameError(f"a data block that is not JSON: {e}") from None
        if not isinstance(more, dict):
            raise FrameError("a data block must be a JSON object")
        data.update(more)
    payload = block[h["_data"]:] or None
    return Event(h["type"], data, payload)


# -- the events a speech-to-text server reads ----------------------------------------------------


@dataclass(frozen=True)
class AudioFormat:
    rate: int
    width: int
    channels: int


@dataclass(frozen=True)
class Transcribe:
    language: str | None = None
    name: str | None = None
    context: dict | None = None
    vad_sensitivity: str | None = None
    terms: tuple = ()                # transcript_names then transcript_terms: words to bias toward


def audio_format(data, where):
    """rate/width/channels of an audio-start or audio-chunk; EventError naming the bad one."""
    def whole(name, lo, hi):
        v = data.get(name)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise EventError(f"{where}: {name} must be a whole number in {lo}..{hi}, not {v!r:.40}",
                             "bad-audio-format")
        return v
    return AudioFormat(whole("rate", MIN_RATE, MAX_RATE), whole("width", 1, 4),
                       whole("channels", 1, MAX_CHANNELS))


def samples(payload, fmt):
    """An audio-chunk's payload → float32 mono samples at fmt.rate (channels averaged). Widths
    as wyoming's converter reads them: unsigned 8-bit (as in WAV), signed little-endian 16, 24
    and 32-bit."""
    payload = payload or b""
    frame = fmt.width * fmt.channels
    if len(payload) % frame:
        raise EventError(f"audio-chunk: {len(payload)} bytes is not a whole number of "
                         f"{fmt.width}-byte samples × {fmt.channels} channels", "bad-audio")
    if fmt.width == 3:
        b = np.frombuffer(payload, np.uint8).reshape(-1, 3).astype(np.int32)
        x = (b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8 >> 8
    elif fmt.width == 1:
        x = np.frombuffer(payload, np.uint8).astype(np.int16) - 128
    else:
        x = np.frombuffer(payload, {2: "<i2", 4: "<i4"}[fmt.width])
    x = x.astype(np.float32) / np.float32(2.0 ** (8 * fmt.width - 1))
    return x.reshape(-1, fmt.channels).mean(axis=1, dtype=np.float32) if fmt.channels > 1 else x


def transcribe(data):
    """A `transcribe` event's fields, checked."""
    def text(name, limit=200):
        v = data.get(name)
        if v is not None and (not isinstance(v, str) or len(v) > limit):
            raise EventError(f"transcribe: {name} must be a string of at most {limit} "
                             f"characters, not {v!r:.40}")
        return v or None
    sensitivity = text("vad_sensitivity")
    if sensitivity is not None and sensitivity not in SENSITIVITIES:
        raise EventError(f"transcribe: vad_sensitivity takes {', '.join(SENSITIVITIES)}, not "
                         f"{sensitivity!r:.40}")
    context = data.get("context")
    if context is not None and not isinstance(context, dict):
        raise EventError("transcribe: context must be a JSON object")
    terms = []
    for name in ("transcript_names", "transcript_terms"):
        v = data.get(name) or []
        if not isinstance(v, list) or not all(isinstance(t, str) and len(t) <= 200 for t in v):
            raise EventError(f"transcribe: {name} must be a list of strings")
        terms += [t.strip() for t in v if t.strip()]
    if len(terms) > MAX_TERMS:
        raise EventError(f"transcribe: {len(terms)} names and terms, more than {MAX_TERMS}")
    lang = text("language", 16)
    return Transcribe(lang.strip().lower() if lang else None, text("name"), context, sensitivity,
                      tuple(dict.fromkeys(terms)))

