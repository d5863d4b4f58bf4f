"""Output writers (openai-whisper's formats, whisper/utils.py) read back by real parsers: the
`srt` package and `webvtt-py`; times monotonic; TSV integer milliseconds; JSON complete."""

import json
import os

import pytest
from click.testing import CliRunner

from nwhisper import writers
from nwhisper.records import Segment, TranscriptionInfo, Word

srt = pytest.importorskip("srt")
webvtt = pytest.importorskip("webvtt")

from paths import FIXTURES as FIX


def _segments():
    texts = [(0.0, 2.5, " Hello there."), (2.5, 61.237, " A --> B, with\ta tab."),
             (61.237, 3725.5, " Over an hour in."), (3725.5, 3726.0, "  ")]
    return [Segment(id=i + 1, seek=0, start=a, end=b, text=t, tokens=[1, 2], avg_logprob=-0.25,
                    no_speech_prob=0.01, words=[Word(a, b, t.strip(), 0.9)])
            for i, (a, b, t) in enumerate(texts)]


def _sec(hms):
    h, m, s = str(hms).split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


INFO = TranscriptionInfo("en", 0.97, 3726.0)


def test_format_timestamp_as_openai():
    f = writers.format_timestamp
    assert f(0) == "00:00.000" and f(61.25) == "01:01.250"
    assert f(3725.5) == "01:02:05.500"
    assert f(1.5, True, ",") == "00:00:01,500"


def test_srt_parses_and_is_monotonic():
    subs = list(srt.parse(writers.render(_segments(), INFO, "srt")))
    assert [s.index for s in subs] == [1, 2, 3]           # the blank segment is left out
    assert subs[1].content == "A -> B, with\ta tab."        # '-->' cannot end a cue
    assert subs[2].start.total_seconds() == pytest.approx(61.237)
    assert subs[2].end.total_seconds() == pytest.approx(3725.5)
    times = [t for s in subs for t in (s.start, s.end)]
    assert times == sorted(times)


def test_vtt_parses_and_is_monotonic(tmp_path):
    p = tmp_path / "x.vtt"
    p.write_text(writers.render(_segments(), INFO, "vtt"), encoding="utf-8")
    cues = list(webvtt.read(str(p)))
    assert len(cues) == 3 and cues[0].text == "Hello there."
    secs = [_sec(t) for c in cues for t in (c.start, c.end)]
    assert secs == sorted(secs)
    assert cues[2].end == "01:02:05.500" and cues[0].start == "00:00:00.000"


def test_tsv_and_txt_and_json():
    tsv = writers.render(_segments(), INFO, "tsv").splitlines()
    assert tsv[0] == "start\tend\ttext"
    assert tsv[2].split("\t")[:2] == ["2500", "61237"] and tsv[2].count("\t") == 2
    assert writers.render(_segments(), INFO, "txt").splitlines() == ["Hello there.", "A --> B, with\ta tab.",
                                                                    "Over an hour in."]
    d = json.loads(writers.render(_segments(), INFO, "json"))
    assert d["language"] == "en" and d["language_probability"] == 0.97
    s = d["segments"][0]
    for key in ("start", "end", "text", "tokens", "avg_logprob", "no_speech_prob", "compression_ratio", "words"):
        assert key in s
    assert s["words"][0]["word"] == "Hello there."


def test_cli_writes_every_format(tmp_path):
    """`nwhisper transcribe tiny.en jfk.wav -f all -o DIR`: five files, SRT/VTT parse, times monotonic."""
    from nwhisper.cli.main import cli

    r = CliRunner().invoke(cli, ["transcribe", "tiny.en", os.path.join(FIX, "jfk.wav"), "-f", "all",
                                 "-o", str(tmp_path), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "\r" not in r.output                 # no progress bar when the output is not a terminal
    assert sorted(os.listdir(tmp_path)) == ["jfk.json", "jfk.srt", "jfk.tsv", "jfk.txt", "jfk.vtt"]
    subs = list(srt.parse((tmp_path / "jfk.srt").read_text(encoding="utf-8")))
    assert len(subs) >= 1 and "country" in subs[-1].content
    times = [t.total_seconds() for s in subs for t in (s.start, s.end)]
    assert times == sorted(times) and times[-1] <= 11.0
    cues = list(webvtt.read(str(tmp_path / "jfk.vtt")))
    assert [c.text for c in cues] == [s.content for s in subs]
    secs = [_sec(t) for c in cues for t in (c.start, c.end)]
    assert secs == sorted(secs) and secs == pytest.approx(times, abs=1e-3)
    d = json.loads((tmp_path / "jfk.json").read_text(encoding="utf-8"))
    assert d["language"] == "en" and d["segments"][0]["tokens"]


def test_unknown_format_is_named():
    with pytest.raises(ValueError, match="'doc'"):
        writers.render([], INFO, "doc")
