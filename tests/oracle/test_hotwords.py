"""Hotwords (faster-whisper's): words to bias toward, given before every window's previous text.

Golden data: features-hotwords.json (fixtures/make_golden_features.py --only hotwords) —
faster-whisper 1.2.1 on the original CTranslate2 files, greedy, with timestamps, language "en",
with and without the hotwords, on the names clips (espeak-ng speaking made-up names) and the
63 s clip (four windows). On the long clip both systems take the long-form path, so every
window's tokens must be faster-whisper's, with the hotwords and without. Short clips are one
window in HF's convention here (the samples padded to 30 s) and in openai's in faster-whisper
(the log-mel padded), which decode differently with or without hotwords; there the test holds the
names: right with the hotwords and wrong without, as in faster-whisper.
"""

import re

import pytest
from fixture_audio import audio
from paths import golden

HOT = golden("features-hotwords.json")
# (model, clip) where the model misspells names that hotwords fix (in faster-whisper as here)
NAMES = [("tiny.en", "espeak/en-names.flac", ["zorblax", "quenteroth", "vintrella"]),
         ("base", "espeak/en-team.flac", ["siobhan", "okonkwo", "grevillea"])]
NUMBERS = {"10": "ten", "4": "four", "7": "seven", "5": "five"}


def words(text):
    return [NUMBERS.get(w, w) for w in re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()]


def runs(name, clip):
    return {r["hotwords"]: r for r in HOT["models"][name]["runs"] if r["clip"] == clip}


def transcribe(m, clip, sha=None, **kw):
    lang = {"language": "en"} if m.dims.is_multilingual else {}
    return list(m.transcribe(audio(clip, sha), **lang, **kw)[0])


@pytest.mark.parametrize("name", ["tiny.en", "base"])
def test_long_form_windows_are_faster_whispers(models, name):
    m = models(name)
    for hot, run in runs(name, "espeak/en-63s.flac").items():
        segments = transcribe(m, run["clip"], run["audio_sha256"], hotwords=hot, timestamps=True)
        assert [list(s.tokens) for s in segments] == [s["tokens"] for s in run["segments"]], hot
        assert "".join(s.text for s in segments) == run["text"]
    with_, without = runs(name, "espeak/en-63s.flac")["Zorblax, thermostat, Vintrella"], \
        runs(name, "espeak/en-63s.flac")[None]
    assert with_["segments"] != without["segments"], "the hotwords changed nothing: not a test"


@pytest.mark.parametrize("name, clip, names", NAMES)
def test_names_come_out_right_with_hotwords(models, name, clip, names):
    m = models(name)
    fw = runs(name, clip)
    hot = next(h for h in fw if h)
    with_ = words("".join(s.text for s in transcribe(m, clip, fw[hot]["audio_sha256"], hotwords=hot)))
    without = words("".join(s.text for s in transcribe(m, clip, fw[None]["audio_sha256"])))
    assert all(n in with_ for n in names), with_
    assert not any(n in without for n in names), without
    assert all(n in words(fw[hot]["text"]) for n in names)          # faster-whisper agrees
    assert not any(n in words(fw[None]["text"]) for n in names)


@pytest.mark.parametrize("clip", ["jfk.wav", "cards/001.wav", "cards/002.wav", "cards/005.wav",
                                  "forever.wav", "espeak/en-11s.flac",
                                  "librivox/sense_and_sensibility_01_austen_64kb-0880.flac"])
def test_unrelated_hotwords_leave_base_words_alone(models, clip):
    """base keeps its words on the other fixtures with names it never hears (tiny.en's style
    and near misses move with any prompt, as in faster-whisper: see the long clip above)."""
    m = models("base")
    plain = words("".join(s.text for s in transcribe(m, clip)))
    hot = words("".join(s.text for s in transcribe(m, clip, hotwords="Zorblax Quenteroth, Vintrella")))
    assert hot == plain


def test_hotwords_checked():
    from nwhisper.abilities import options

    with pytest.raises(ValueError, match="hotwords is a string"):
        options(hotwords=["Zorblax"])
    assert options(hotwords="Zorblax").hotwords == "Zorblax"
