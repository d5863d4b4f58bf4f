"""Output files: txt, srt, vtt, tsv, json — openai-whisper's formats (whisper/utils.py).

    write(segments, info, "clip.wav", "srt", "out/")   →  out/clip.srt
    write(segments, info, "clip.wav", "all", "out/")   →  out/clip.{txt,srt,vtt,tsv,json}

txt  one stripped segment text per line.
srt  numbered cues from 1, `HH:MM:SS,mmm --> HH:MM:SS,mmm` (hours always), a blank line after each.
vtt  `WEBVTT`, then cues `MM:SS.mmm --> MM:SS.mmm` (hours only when the recording has them).
tsv  `start<TAB>end<TAB>text`, integer milliseconds (locale-proof, cheap to parse); tabs in the
     text become spaces.
json the whole result: text, language and its probability, duration, and every segment with its
     tokens, avg_logprob, compression_ratio, no_speech_prob, temperature (and words, if any).

In subtitle text `-->` becomes `->`, so a cue cannot be cut in two by its own words.
"""

from __future__ import annotations

import dataclasses
import json
import os

FORMATS = ("txt", "srt", "vtt", "tsv", "json")


def format_timestamp(seconds, always_include_hours=False, decimal_marker="."):
    """openai-whisper's format_timestamp: [HH:]MM:SS<marker>mmm, rounded to the millisecond."""
    assert seconds >= 0, "non-negative timestamp expected"
    ms = int(round(seconds * 1000.0))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    hours = f"{h:02d}:" if always_include_hours or h > 0 else ""
    return f"{hours}{m:02d}:{s:02d}{decimal_marker}{ms:03d}"


def _cue_text(s):
    return s.text.strip().replace("-->", "->")


def _cues(segments):
    """(start, end, text) of the segments that have text, times never going backwards."""
    last = 0.0
    for s in segments:
        text = _cue_text(s)
        if not text:
            continue
        start = max(s.start, last)
        end = max(s.end, start)
        last = end
        yield start, end, text


def to_txt(segments, info):
    return "".join(s.text.strip() + "\n" for s in segments if s.text.strip())


def to_srt(segments, info):
    out = []
    for i, (a, b, text) in enumerate(_cues(segments), 1):
        out.append(f"{i}\n{format_timestamp(a, True, ',')} --> {format_timestamp(b, True, ',')}\n{text}\n\n")
    return "".join(out)


def to_vtt(segments, info):
    out = ["WEBVTT\n\n"]
    for a, b, text in _cues(segments):
        out.append(f"{format_timestamp(a)} --> {format_timestamp(b)}\n{text}\n\n")
    return "".join(out)


def to_tsv(segments, info):
    out = ["start\tend\ttext\n"]
    for a, b, text in _cues(segments):
        out.append(f"{int(round(a * 1000))}\t{int(round(b * 1000))}\t{text.replace(chr(9), ' ')}\n")
    return "".join(out)


def as_dict(segments, info):
    """The result as one JSON-able dict (openai-whisper's result, plus faster-whisper's info)."""
    d = {"text": "".join(s.text for s in segments),
         "language": info.language,
         "language_probability": info.language_probability,
         "duration": info.duration,
         "segments": [dataclasses.asdict(s) for s in segments]}
    if getattr(info, "duration_after_vad", None) is not None:
        d["duration_after_vad"] = info.duration_after_vad
        d["speech_regions"] = [list(r) for r in info.speech_regions]
    return d


def to_json(segments, info):
    return json.dumps(as_dict(segments, info), ensure_ascii=False, indent=1) + "\n"


_WRITERS = {"txt": to_txt, "srt": to_srt, "vtt": to_vtt, "tsv": to_tsv, "json": to_json}


def render(segments, info, fmt):
    """The text of one format."""
    if fmt not in _WRITERS:
        raise ValueError(f"output format {fmt!r} is not one of {', '.join(FORMATS)} (or 'all')")
    return _WRITERS[fmt](segments, info)


def write(segments, info, audio_path, fmt, out_dir="."):
    """Write `<out_dir>/<audio name without extension>.<fmt>` (every format for 'all');
    return the paths written."""
    fmts = FORMATS if fmt == "all" else (fmt,)
    segments = list(segments)
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(audio_path))[0]
    paths = []
    for f in fmts:
        path = os.path.join(out_dir, f"{stem}.{f}")
        text = render(segments, info, f)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        paths.append(path)
    return paths
