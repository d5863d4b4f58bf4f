"""Deepgram's speech-to-text API as its SDK speaks it: the query parameters of /v1/listen, what
each is checked for, and the response bodies. Pure functions, no I/O: the route (deepgram.py)
and the fuzz tests call them alike.

    ask = listen_params(request.query_arguments)     # DeepgramError (400) naming a bad one
    body = prerecorded(channels, ask, ...)           # {"metadata": …, "results": …}
    live = live_params(request.query_arguments)      # a live connection's

| parameter | here |
| --- | --- |
| language | the language (a region suffix is read: en-US is en); `multi` or none: detected on multilingual models |
| detect_language | detect it, and say so in `results.channels[].detected_language` |
| punctuate, smart_format | the transcript as Whisper writes it (cased, punctuated) and `punctuated_word`; without them, lower-case words as Deepgram gives |
| utterances, utt_split | `results.utterances[]`, a new one at a pause of utt_split s (0.8) |
| keywords, keyterm | hotwords for the model (`word:boost`'s boost is dropped) |
| multichannel | every channel transcribed on its own (`results.channels[i]`); else the channels are mixed |
| encoding, sample_rate, channels | for raw audio: linear16, linear32, mulaw, alaw; opus or none: a container (Ogg, WebM …), live too |
| model | one of the models this server holds answers; Deepgram's own names (nova-3 …) and none mean the default; reported back (`model_info.name`) |
| interim_results (live) | drafts as Results with is_final false |
| endpointing (live) | the closing pause in ms (at least 200); false or none: the pause learned from the speaker |
| utterance_end_ms, vad_events (live) | UtteranceEnd after that much audio past the last word; SpeechStarted |
| tag, extra, version, mip_opt_out, profanity_filter, numerals, filler_words, dictation, measurements, language_hint, tier | accepted (they change nothing here) |
| diarize | each word's `speaker` (0, 1 … by first appearance), each utterance's; live: each final's words, the speaker matched across the connection |
| redact, replace, search, summarize, topics, intents, sentiment, detect_entities, paragraphs, callback … | refused with a 400 naming them: they would change the answer, and this server does not do them |
"""

from __future__ import annotations

import datetime
import hashlib
import math
import re
import uuid
from dataclasses import dataclass

import numpy as np

from ..io.g711 import alaw_decode, ulaw_decode

REFUSED = ("redact", "replace", "search", "diarize_model", "summarize", "topics",
           "custom_topic", "custom_topic_mode", "intents", "custom_intent", "custom_intent_mode",
           "sentiment", "detect_entities", "paragraphs", "callback", "callback_method", "utt_split_ms")
ACCEPTED = ("tag", "extra", "version", "mip_opt_out", "profanity_filter", "numerals",
            "filler_words", "dictation", "measurements", "language_hint", "tier")
RAW_ENCODINGS = {"linear16": 2, "linear32": 4, "mulaw": 1, "alaw": 1}
CONTAINED = ("opus",)              # Opus comes in Ogg or WebM: the container says the rest
MAX_TERMS = 500
UTT_SPLIT_S = 0.8                  # Deepgram's default pause between utterances
MIN_ENDPOINTING_MS = 200           # a shorter pause is inside a word (Deepgram's default is 10)


class DeepgramError(ValueError):
    """A request Deepgram would refuse: its status and err_code."""

    def __init__(self, message, status=400, code="Bad Request"):
        super().__init__(message)
        self.status, self.code = status, code


@dataclass(frozen=True)
class ListenAsk:
    language: str | None = None       # None: detect (or the server's default)
    detect_language: bool = False
    punctuate: bool = False
    utterances: bool = False
    utt_split: float = UTT_SPLIT_S
    hotwords: str | None = None
    multichannel: bool = False
    model: str | None = None
    encoding: str | None = None       # raw audio bodies
    sample_rate: int | None = None
    channels: int = 1
    diarize: bool = False


def _one(args, name):
    values = args.get(name) or []
    return values[-1].decode("utf-8", "replace") if values else None


def _bool(args, name):
    v = _one(args, name)
    if v is None:
        return False
    if v.lower() in ("true", "1", "yes"):
        return True
    if v.lower() in ("false", "0", "no", ""):
        return False
    raise DeepgramError(f"{name} takes true or false, not {v[:40]!r}")


def _number(args, name, lo, hi, whole=False):
    v = _one(args, name)
    if v is None:
        return None
    try:
        x = float(v)
    except ValueError:
        raise DeepgramError(f"{name} takes a number, not {v[:40]!r}") from None
    if not (math.isfinite(x) and lo <= x <= hi) or (whole and x != int(x)):
        raise DeepgramError(f"{name} must be a{' whole' if whole else ''} number in {lo}..{hi}, not {v[:40]!r}")
    return int(x) if whole else x


def listen_params(args):
    """The query of a /v1/listen request (`args`: name → [bytes], as Tornado parses it)."""
    refused = sorted(n for n in args if n in REFUSED)
    if refused:
        raise DeepgramError(f"this server does not do {', '.join(refused)}: these would change "
                            f"the answer and are not implemented here; send the request without them")
    language = _one(args, "language")
    if language is not None:
        language = language.strip().lower() or None
        if language in ("multi", "auto"):
            language = None
        elif language is not None and not re.fullmatch(r"[a-z]{2,3}([-_][a-z0-9]{2,8})*", language):
            raise DeepgramError(f"language takes a code such as en or en-US, not {language[:40]!r}")
    terms = []
    for name in ("keywords", "keyterm"):
        for raw in args.get(name) or []:
            t = raw.decode("utf-8", "replace").strip()
            if name == "keywords":
                t = re.sub(r":-?[0-9.]+$", "", t).strip()      # word:boost → word
            if t:
                terms.append(t)
    if len(terms) > MAX_TERMS:
        raise DeepgramError(f"{len(terms)} keywords and keyterms, more than {MAX_TERMS}")
    encoding = _one(args, "encoding")
    if encoding is not None and encoding not in RAW_ENCODINGS and encoding not in CONTAINED:
        raise DeepgramError(f"encoding {encoding[:40]!r} is not one this server reads: raw "
                            f"{', '.join(RAW_ENCODINGS)}, or opus (in Ogg or WebM); a file with a "
                            f"header (WAV, FLAC, MP3, M4A, WebM, Ogg …) needs no encoding")
    rate = _number(args, "sample_rate", 8000, 192000, whole=True)
    if encoding in RAW_ENCODINGS and rate is None:
        raise DeepgramError(f"encoding={encoding} is raw audio: give its sample_rate too")
    return ListenAsk(
        language=language, detect_language=_bool(args, "detect_language"),
        punctuate=_bool(args, "punctuate") or _bool(args, "smart_format"),
        utterances=_bool(args, "utterances"),
        utt_split=_number(args, "utt_split", 0.0, 60.0) or UTT_SPLIT_S,
        hotwords=", ".join(dict.fromkeys(terms)) or None, multichannel=_bool(args, "multichannel"),
        model=_one(args, "model"), encoding=encoding, sample_rate=rate,
        channels=_number(args, "channels", 1, 32, whole=True) or 1, diarize=_bool(args, "diarize"))


@dataclass(frozen=True)
class LiveAsk:
    listen: ListenAsk
    interim: bool = False
    pause_ms: int | None = None           # endpointing: a fixed pause; None: the learned one
    utterance_end_ms: int | None = None
    vad_events: bool = False


def live_params(args):
    """The query of a live /v1/listen connection: the pre-recorded parameters (raw audio with
    its encoding and sample_rate, or without an encoding a container: WebM, Ogg) and the live
    ones."""
    if _bool(args, "multichannel"):
        raise DeepgramError("multichannel is pre-recorded only here: a live stream's channels are mixed")
    ask = listen_params(args)
    ep = _one(args, "endpointing")
    pause = None
    if ep is not None and ep.lower() != "false":
        pause = max(MIN_ENDPOINTING_MS, _number(args, "endpointing", 0, 10000, whole=True))
    return LiveAsk(ask, interim=_bool(args, "interim_results"), pause_ms=pause,
                   utterance_end_ms=_number(args, "utterance_end_ms", 100, 60000, whole=True),
                   vad_events=_bool(args, "vad_events"))


def raw_channels(body, ask):
    """A raw-audio body (ask.encoding) → float32 arrays, one per channel, at ask.sample_rate."""
    width = RAW_ENCODINGS[ask.encoding]
    frame = width * ask.channels
    if not body or len(body) % frame:
        raise DeepgramError(f"{len(body)} bytes of {ask.encoding} is not a whole number of "
                            f"{ask.channels}-channel samples")
    if ask.encoding == "mulaw":
        x = ulaw_decode(body)
    elif ask.encoding == "alaw":
        x = alaw_decode(body)
    else:
        kind = "<i2" if width == 2 else "<i4"
        x = np.frombuffer(body, kind).astype(np.float32) / np.float32(2.0 ** (8 * width - 1))
    x = np.asarray(x, np.float32).reshape(-1, ask.channels)
    return [np.ascontiguousarray(x[:, c]) for c in range(ask.channels)]


# -- the response ---------------------------------------------------------------------------------


def plain(word):
    """Deepgram's `word`: lower case, without the punctuation around it."""
    return re.sub(r"^[^\w']+|[^\w']+$", "", word.strip().lower())


def words_of(segments, ask):
    out = []
    for s in segments:
        for w in s.words or []:
            bare = plain(w.word)
            if not bare:
                continue                           # a lone mark: no word of its own
            d = {"word": bare, "start": round(w.start, 3), "end": round(w.end, 3),
                 "confidence": round(float(w.probability), 4)}
            if ask.diarize and w.speaker is not None:
                d["speaker"] = int(w.speaker.rsplit("_", 1)[1])
            if ask.punctuate:
                d["punctuated_word"] = w.word.strip()
            out.append(d)
    return out


def _text(words, punctuate):
    return " ".join(w["punctuated_word" if punctuate else "word"] for w in words)


def _confidence(words):
    return round(float(np.mean([w["confidence"] for w in words])), 4) if words else 0.0


def alternative(segments, ask):
    words = words_of(segments, ask)
    transcript = "".join(s.text for s in segments).strip() if ask.punctuate else _text(words, False)
    return {"transcript": transcript, "confidence": _confidence(words), "words": words}


def utterances(words, channel, ask):
    """The words cut at pauses of ask.utt_split s or more, and where the speaker changes."""
    groups, out = [], []
    for w in words:
        if (groups and w["start"] - groups[-1][-1]["end"] < ask.utt_split
                and w.get("speaker") == groups[-1][-1].get("speaker")):
            groups[-1].append(w)
        else:
            groups.append([w])
    for g in groups:
        out.append({"start": g[0]["start"], "end": g[-1]["end"], "confidence": _confidence(g),
                    "channel": channel, "transcript": _text(g, ask.punctuate), "words": g,
                    "id": str(uuid.uuid4())})
        if "speaker" in g[0]:
            out[-1]["speaker"] = g[0]["speaker"]
    return out


def model_info(ask, host_name, version):
    """(the model's uuid, model_info entry): a uuid fixed by the model's name."""
    uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"nwhisper/{host_name}"))
    return uid, {"name": ask.model or host_name, "version": version or "nwhisper",
                 "arch": f"whisper-{host_name}"}


def prerecorded(results, ask, body, duration, host_name, version, request_id):
    """The response to a pre-recorded request: `results` is [(segments, info)] per channel."""
    uid, info = model_info(ask, host_name, version)
    channels, utts = [], []
    for i, (segments, tinfo) in enumerate(results):
        alt = alternative(segments, ask)
        ch = {"alternatives": [alt]}
        if ask.detect_language or ask.language is None:
            ch["detected_language"] = tinfo.language
            ch["language_confidence"] = round(float(tinfo.language_probability), 4)
        channels.append(ch)
        if ask.utterances:
            utts += utterances(alt["words"], i, ask)
    out = {"metadata": {"transaction_key": "deprecated", "request_id": request_id,
                        "sha256": hashlib.sha256(body).hexdigest(),
                        "created": _now(),
                        "duration": round(duration, 3), "channels": len(results),
                        "models": [uid], "model_info": {uid: info}},
           "results": {"channels": channels}}
    if ask.utterances:
        out["results"]["utterances"] = sorted(utts, key=lambda u: (u["start"], u["channel"]))
    return out


def live_results(m, ask, request_id, model, final, speech_final=False, from_finalize=False):
    """A live Results message from the stream's final or partial `m`; `model` is model_info's
    (uuid, entry)."""
    if final:
        words = []
        for a, b, w, p in m.get("words") or ():
            if plain(w):
                d = {"word": plain(w), "start": a, "end": b, "confidence": round(float(p), 4)}
                if ask.diarize and m.get("speaker"):
                    d["speaker"] = int(m["speaker"].rsplit("_", 1)[1])
                if ask.punctuate:
                    d["punctuated_word"] = w.strip()
                words.append(d)
        transcript = m["text"].strip() if ask.punctuate else _text(words, False)
        confidence = _confidence(words)
    else:
        words = []
        transcript = m["text"].strip() if ask.punctuate else " ".join(
            filter(None, (plain(w) for w in m["text"].split())))
        confidence = round(math.exp(min(0.0, m.get("logprob", 0.0))), 4)
    uid, info = model
    return {"type": "Results", "channel_index": [0, 1], "duration": round(m["t1"] - m["t0"], 3),
            "start": round(m["t0"], 3), "is_final": final, "speech_final": speech_final,
            "from_finalize": from_finalize,
            "channel": {"alternatives": [{"transcript": transcript, "confidence": confidence,
                                          "words": words}]},
            "metadata": {"request_id": request_id, "model_info": info, "model_uuid": uid}}


def live_metadata(request_id, sha256, duration, model):
    uid, info = model
    return {"type": "Metadata", "transaction_key": "deprecated", "request_id": request_id,
            "sha256": sha256, "created": _now(), "duration": round(duration, 3), "channels": 1,
            "models": [uid], "model_info": {uid: info}}


def _now():
    return (datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"))


def error_body(e, request_id):
    return {"err_code": e.code, "err_msg": str(e), "request_id": request_id}
