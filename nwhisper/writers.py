"""Output files: txt, srt, vtt, tsv, json — openai-whisper's formats (whisper/utils.py) — and
rttm, the speaker turns of a diarized transcription.

    write(segments, info, "clip.wav", "srt", "out/")   →  out/clip.srt
    write(segments, info, "clip.wav", "all", "out/")   →  out/clip.{txt,srt,vtt,tsv,json}

`segments` may be the transcriber's iterator: each cue is written as its segment arrives.

txt  one stripped segment text per line.
srt  numbered cues from 1, `HH:MM:SS,mmm --> HH:MM:SS,mmm` (hours always), a blank line after each.
vtt  `WEBVTT`, then cues `MM:SS.mmm --> MM:SS.mmm` (hours only when the recording has them).
tsv  `start<TAB>end<TAB>text`, integer milliseconds (locale-proof, cheap to parse); tabs in the
     text become spaces.
json the whole result: text, language and its probability, duration, and every segment with its
     tokens, avg_logprob, compression_ratio, no_speech_prob, temperature (and words, if any).
rttm NIST's `SPEAKER <file> 1 <start> <duration> <NA> <NA> <speaker> <NA> <NA>` per speaker turn
     (what pyannote and DER scorers read); only with diarize.

In subtitle text `-->` becomes `->`, so a cue cannot be cut in two by its own words. A diarized
segment's cue names its speaker: `[SPEAKER_00]: text` in txt and srt, a WebVTT voice span
`<v SPEAKER_00>text` in vtt, a `speaker` field in json (its words' too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os

FORMATS = ("txt", "srt", "vtt", "tsv", "json", "rttm")
ALL = FORMATS[:5]            # "all": openai-whisper's five (and rttm when diarized)


def needs_timestamps(formats):
    """Do any of these formats ("all" among them) show times? Then the windows are decoded with
    timestamp tokens, whether or not a terminal shows them: every format but txt does."""
    return any(f != "txt" for f in formats)


def format_timestamp(seconds, always_include_hours=False, decimal_marker="."):
    """openai-whisper's format_timestamp: [HH:]MM:SS<marker>mmm, rounded to the millisecond."""
    assert seconds >= 0, "non-negative timestamp expected"
    ms = int(round(seconds * 1000.0))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    hours = f"{h:02d}:" if always_include_hours or h > 0 else ""
    return f"{hours}{m:02d}:{s:02d}{decimal_marker}{ms:03d}"


_HEADS = {"vtt": "WEBVTT\n\n", "tsv": "start\tend\ttext\n"}


def _cue(fmt, n, start, end, text, speaker=None):
    """The text cue number n (from 1) adds to format fmt."""
    if speaker is not None and fmt in ("txt", "srt"):
        text = f"[{speaker}]: {text}"
    elif speaker is not None and fmt == "vtt":
        text = f"<v {speaker}>{text}"
    if fmt == "txt":
        return text + "\n"
    if fmt == "srt":
        return f"{n}\n{format_timestamp(start, True, ',')} --> {format_timestamp(end, True, ',')}\n{text}\n\n"
    if fmt == "vtt":
        return f"{format_timestamp(start)} --> {format_timestamp(end)}\n{text}\n\n"
    return f"{int(round(start * 1000))}\t{int(round(end * 1000))}\t{text.replace(chr(9), ' ')}\n"


class Outputs:
    """The formats' texts built segment by segment, as the transcriber yields them: each add()
    writes the cue it makes to every format's sink (a text file object) at once; finish(info)
    writes the JSON, which needs them all, and the RTTM (file id `name`). Segments without text
    make no cue; cue times never go backwards."""

    def __init__(self, sinks, name="audio"):
        unknown = [f for f in sinks if f not in FORMATS]
        if unknown:
            raise ValueError(f"output format {unknown[0]!r} is not one of {', '.join(FORMATS)} (or 'all')")
        self.sinks, self.name, self._n, self._last = sinks, name, 0, 0.0
        self._segments = [] if "json" in sinks else None
        for f, sink in sinks.items():
            sink.write(_HEADS.get(f, ""))

    def add(self, s):
        if self._segments is not None:
            self._segments.append(s)
        text = s.text.strip()
        if not text:
            return
        start = max(s.start, self._last)
        end = self._last = max(s.end, start)
        self._n += 1
        for f, sink in self.sinks.items():
            if f not in ("json", "rttm"):
                # in subtitle text `-->` would end the cue's time line early
                sink.write(_cue(f, self._n, start, end, text if f == "txt" else text.replace("-->", "->"),
                                s.speaker))

    def finish(self, info):
        if self._segments is not None:
            self.sinks["json"].write(json.dumps(as_dict(self._segments, info), ensure_ascii=False, indent=1) + "\n")
        if "rttm" in self.sinks:
            name = "".join("_" if c.isspace() else c for c in self.name) or "audio"
            for start, end, speaker in info.speaker_turns:
                self.sinks["rttm"].write(f"SPEAKER {name} 1 {start:.3f} {end - start:.3f} <NA> <NA> "
                                         f"{speaker} <NA> <NA>\n")


def as_dict(segments, info):
    """The result as one JSON-able dict (openai-whisper's result, plus faster-whisper's info)."""
    d = {"text": "".join(s.text for s in segments),
         "language": info.language,
         "language_probability": info.language_probability,
         "duration": info.duration,
         "segments": [_without_speaker(dataclasses.asdict(s)) for s in segments]}
    if getattr(info, "duration_after_vad", None) is not None:
        d["duration_after_vad"] = info.duration_after_vad
        d["speech_regions"] = [list(r) for r in info.speech_regions]
    if info.speaker_turns:
        d["speaker_turns"] = [list(t) for t in info.speaker_turns]
    return d


def _without_speaker(d):
    """A segment's dict with its (and its words') speaker only where there is one."""
    if d.get("speaker") is None:
        d.pop("speaker", None)
    for w in d.get("words") or ():
        if w.get("speaker") is None:
            w.pop("speaker", None)
    return d


def render(segments, info, fmt, name="audio"):
    """The text of one format (`name`: the RTTM's file id)."""
    sink = io.StringIO()
    out = Outputs({fmt: sink}, name)
    for s in segments:
        out.add(s)
    out.finish(info)
    return sink.getvalue()


def write(segments, info, audio_path, fmt, out_dir="."):
    """Write `<out_dir>/<audio name without extension>.<fmt>` (every format for 'all') as the
    segments come — each file under a temporary name, renamed when the last segment is in, so
    a transcription that fails midway leaves no file that looks finished; return the paths."""
    fmts = (ALL + (("rttm",) if info.speaker_turns else ())) if fmt == "all" else (fmt,)
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(audio_path))[0]
    paths = {f: os.path.join(out_dir, f"{stem}.{f}") for f in fmts}
    with contextlib.ExitStack() as stack:
        sinks = {f: stack.enter_context(open(p + ".partial", "w", encoding="utf-8")) for f, p in paths.items()}
        try:
            out = Outputs(sinks, stem)
            for s in segments:
                out.add(s)
            out.finish(info)
        except BaseException:
            stack.close()
            for p in paths.values():
                os.remove(p + ".partial")
            raise
    for p in paths.values():
        os.replace(p + ".partial", p)
    return list(paths.values())
