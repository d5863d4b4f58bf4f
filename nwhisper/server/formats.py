"""Response bodies: the `response_format`s both HTTP APIs speak.

    body, content_type = render("srt", segments, info, task="transcribe")

json          {"text": "…"} — the transcript, segment texts joined, outer spaces stripped
              (OpenAI's shape; whisper.cpp's clients read the same field).
text          one stripped segment text per line.
srt, vtt      subtitles, from nwhisper.writers (openai-whisper's layout: srt cues numbered
              from 1 with hours always; vtt with hours only when the recording has them).
verbose_json  OpenAI's TranscriptionVerbose: task, language (the full English name, as OpenAI
              returns it), duration, text, segments [{id (from 0), seek, start, end, text, tokens,
              temperature, avg_logprob, compression_ratio, no_speech_prob}], and `words`
              [{word, start, end, probability}] (in each segment and, as OpenAI has them, once
              at the top level) when word timestamps were asked for and the model made them.
              whisper.cpp's extra fields (detected_language, detected_language_probability,
              language_probabilities) are added by the /inference route.
diarized_json OpenAI's TranscriptionDiarized: task, duration, text, segments [{type:
              "transcript.text.segment", id ("seg_0" …), start, end, text, speaker ("A", "B" …
              by first appearance)}], usage (the audio's seconds). Asking for it diarizes.
"""

from __future__ import annotations

import json

from ..records import compression_ratio
from ..tokenizer import LANGUAGE_CODES

FORMATS = ("json", "text", "srt", "vtt", "verbose_json", "diarized_json")
# the file format (nwhisper.writers) each one shows as much as: json and text are only the text
AS_WRITTEN = {"json": "txt", "text": "txt", "srt": "srt", "vtt": "vtt", "verbose_json": "json",
              "diarized_json": "json"}

CONTENT_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "diarized_json": "application/json",
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}

# openai-whisper's LANGUAGES (whisper/tokenizer.py), in the same order as LANGUAGE_CODES.
LANGUAGE_NAMES = dict(zip(LANGUAGE_CODES, (
    "english chinese german spanish russian korean french japanese portuguese turkish polish "
    "catalan dutch arabic swedish italian indonesian hindi finnish vietnamese hebrew ukrainian "
    "greek malay czech romanian danish hungarian tamil norwegian thai urdu croatian bulgarian "
    "lithuanian latin maori malayalam welsh slovak telugu persian latvian bengali serbian "
    "azerbaijani slovenian kannada estonian macedonian breton basque icelandic armenian nepali "
    "mongolian bosnian kazakh albanian swahili galician marathi punjabi sinhala khmer shona "
    "yoruba somali afrikaans occitan georgian belarusian tajik sindhi gujarati amharic yiddish "
    "lao uzbek faroese haitian_creole pashto turkmen nynorsk maltese sanskrit luxembourgish "
    "myanmar tibetan tagalog malagasy assamese tatar hawaiian lingala hausa bashkir javanese "
    "sundanese cantonese").split()))
LANGUAGE_NAMES = {code: name.replace("_", " ") for code, name in LANGUAGE_NAMES.items()}


def transcript(segments):
    return "".join(s.text for s in segments).strip()


def verbose(segments, info, task, temperature=0.0):
    """OpenAI's verbose_json as a dict."""
    out = []
    for i, s in enumerate(segments):
        out.append({
            "id": i,
            "seek": getattr(s, "seek", 0),
            "start": s.start,
            "end": s.end,
            "text": s.text,
            "tokens": list(s.tokens),
            "temperature": getattr(s, "temperature", temperature),
            "avg_logprob": s.avg_logprob,
            "compression_ratio": getattr(s, "compression_ratio", None) or compression_ratio(s.text),
            "no_speech_prob": s.no_speech_prob,
        })
        if getattr(s, "speaker", None):
            out[-1]["speaker"] = s.speaker
        if getattr(s, "words", None):
            out[-1]["words"] = [_word(w) for w in s.words]
    d = {"task": task, "language": LANGUAGE_NAMES.get(info.language, info.language),
         "duration": info.duration, "text": transcript(segments), "segments": out}
    if any("words" in s for s in out):         # OpenAI lists the words once, at the top level
        d["words"] = [w for s in out for w in s.get("words", ())]
    return d


def speaker_letter(name):
    """SPEAKER_00 → "A", SPEAKER_01 → "B" … (OpenAI's labels); past Z, "S27" and on."""
    k = int(name.rsplit("_", 1)[1])
    return chr(ord("A") + k) if k < 26 else f"S{k + 1}"


def diarized(segments, info):
    """OpenAI's diarized_json as a dict."""
    out = [{"type": "transcript.text.segment", "id": f"seg_{i}", "start": s.start, "end": s.end,
            "text": s.text.strip(), "speaker": speaker_letter(s.speaker)}
           for i, s in enumerate(x for x in segments if x.text.strip() and x.speaker)]
    return {"task": "transcribe", "duration": info.duration, "text": transcript(segments),
            "segments": out, "usage": {"type": "duration", "seconds": info.duration}}


def _word(w):
    return {"word": w.word, "start": w.start, "end": w.end,
            "probability": getattr(w, "probability", None)}


def render(fmt, segments, info, task="transcribe", extra=None):
    """(body as str, content type) of one response_format; `extra` is merged into verbose_json."""
    if fmt == "json":
        body = json.dumps({"text": transcript(segments)}, ensure_ascii=False)
    elif fmt == "verbose_json":
        d = verbose(segments, info, task)
        d.update(extra or {})
        body = json.dumps(d, ensure_ascii=False)
    elif fmt == "diarized_json":
        body = json.dumps(diarized(segments, info), ensure_ascii=False)
    elif fmt in ("text", "srt", "vtt"):
        from .. import writers      # the CLI's writers, so files and responses agree

        body = writers.render(segments, info, AS_WRITTEN[fmt])
    else:
        raise ValueError(f"response_format {fmt!r} is not one of {', '.join(FORMATS)}")
    return body, CONTENT_TYPES[fmt]
