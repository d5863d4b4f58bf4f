"""The transcription features against their oracles, for tiny.en and base.

Where the truth came from (all on the same 16 kHz samples, sha256-checked):
  * model-greedy.json (fixtures/make_golden_models.py) — HF transformers 5.24 greedy with
    return_timestamps=True: HF's own segments (start, end, tokens);
  * model-fw.json — faster-whisper 1.2.1 `detect_language` with base on every clip;
  * features-beam.json (fixtures/make_golden_features.py) — HF `generate(num_beams=5)`;
  * features-openai.json — openai-whisper 20250625 `transcribe(temperature=0.0, greedy)` on a
    .pt of the same weights: word timestamps on every clip ≤ 30 s, segments of the 63 s clip;
  * the 5-minute recording with long silences is built by make_golden_features.silences()
    (fixture clips at known places in faint noise), so its speech times are known exactly.
"""

import json
import os
import sys
import time

import pytest

import nwhisper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_audio import audio  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
sys.path.insert(0, FIX)
import make_golden_features as MGF  # noqa: E402

GREEDY = json.load(open(os.path.join(FIX, "golden", "model-greedy.json"), encoding="utf-8"))
FW = json.load(open(os.path.join(FIX, "golden", "model-fw.json"), encoding="utf-8"))
BEAM = json.load(open(os.path.join(FIX, "golden", "features-beam.json"), encoding="utf-8"))
OPENAI = json.load(open(os.path.join(FIX, "golden", "features-openai.json"), encoding="utf-8"))
MODELS = ["tiny.en", "base"]
# base is ~3x tiny.en's cost: by default its per-clip tests run on these eight clips (English
# read and spoken digits, Dutch, Czech, synthetic); NWHISPER_ALL_CLIPS=1 runs every clip
# (all pass: see the module's commit message and the issue report).
BASE_SUBSET = {"jfk.wav", "librivox/sense_and_sensibility_01_austen_64kb-0870.flac", "cards/002.wav",
               "librivox/sense_and_sensibility_01_austen_64kb-0880.flac",
               "librivox/sense_and_sensibility_01_austen_64kb-0890.flac",
               "fillets/nl-vit-v-automat.ogg", "fillets/cs-vit-v-automat.ogg", "espeak/en-11s.flac"}
ALL_CLIPS = os.environ.get("NWHISPER_ALL_CLIPS") == "1"


def clips(name, table):
    """(clip, golden) pairs of a golden table that this run checks for model `name`."""
    return [(c, g) for c, g in table.items() if name != "base" or ALL_CLIPS or c in BASE_SUBSET]

_loaded = {}


def load(name):
    if name not in _loaded:
        _loaded[name] = nwhisper.load(name, device="cpu")
    return _loaded[name]


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return load(request.param), request.param




def lang_arg(m, lang):
    return lang if m.dims.is_multilingual else None


# ------------------------------------------------------------------------------ timestamps

def test_timestamp_segments_match_hf_times(model):
    """Greedy with timestamps: the same segments as HF's return_timestamps=True (tokens, and
    start/end to the 0.02 s of a timestamp token) on every short clip."""
    m, name = model
    bad = []
    for clip, g in clips(name, GREEDY["models"][name]["clips"]):
        ref = g["timestamps"]["segments"]
        segs, _ = m.transcribe(audio(clip, g["audio_sha256"]), language=lang_arg(m, g["language"]), timestamps=True)
        ours = [(s.start, s.end, s.tokens) for s in segs]
        theirs = [(r["start"], r["end"], r["tokens"]) for r in ref]
        if len(ours) != len(theirs) or any(
                a[2] != b[2] or abs(a[0] - b[0]) > 0.011 or abs(a[1] - b[1]) > 0.011 for a, b in zip(ours, theirs)):
            bad.append((clip, [o[:2] for o in ours], [t[:2] for t in theirs]))
    assert not bad, bad


def test_long_form_segments_follow_openai(model):
    """The 63 s clip: openai-whisper's segmentation (windows advanced by the last timestamp):
    every segment whose tokens agree starts and ends within 0.02 s of openai's; at most the last
    window may differ."""
    m, name = model
    g = OPENAI["models"][name]["clips"]["espeak/en-63s.flac"]
    segs, _ = m.transcribe(audio("espeak/en-63s.flac", g["audio_sha256"]), language=lang_arg(m, "en"))
    ref = g["segments"]
    same = [(s, r) for s, r in zip(segs, ref) if s.tokens == r["tokens"]]
    print(f"{name}: {len(same)}/{len(ref)} segments with the same tokens")
    assert len(same) >= len(ref) - 2
    for s, r in same[:-1]:
        assert abs(s.start - r["start"]) <= 0.02 and abs(s.end - r["end"]) <= 0.02, (s, r)


# ------------------------------------------------------------------------------ languages

def test_language_detection_agrees_with_faster_whisper():
    """base (multilingual) on every clip: the same language as faster-whisper's detect_language
    on the same weights, probability within 0.02; right on the human-speech clips."""
    m = load("base")
    ref = FW["models"]["base"]["detect_language"]
    for clip, g in ref.items():
        a = audio(clip)
        lang, p, _ = m.detect_language(a)
        assert lang == g["language"], (clip, lang, g)
        assert abs(p - g["probability"]) < 0.02, (clip, p, g)
    # the 2.6 s Dutch and Czech "hlava" clips are heard as Arabic and Polish by base — by
    # faster-whisper on the same weights too (above): base's ear, not ours
    for clip, lang in [("jfk.wav", "en"), ("fillets/nl-vit-v-automat.ogg", "nl"),
                       ("fillets/cs-vit-v-automat.ogg", "cs"),
                       ("librivox/sense_and_sensibility_01_austen_64kb-0880.flac", "en")]:
        assert m.detect_language(audio(clip))[0] == lang, clip
    assert m.transcribe(audio("fillets/nl-vit-v-automat.ogg"))[1].language == "nl"   # detected when omitted


def test_lang_is_normalised_and_an_unknown_code_is_named():
    from click.testing import CliRunner

    from nwhisper.cli.main import cli

    m = load("base")
    segs, info = m.transcribe(audio("cards/001.wav"), language=" EN ")
    assert info.language == "en"
    with pytest.raises(ValueError, match="'xx'"):
        m.transcribe(audio("cards/001.wav"), language="xx")
    r = CliRunner().invoke(cli, ["transcribe", "base", os.path.join(FIX, "cards/001.wav"), "--lang", "Zz",
                                 "--device", "cpu"])
    assert r.exit_code != 0 and "'zz'" in r.output
    with pytest.raises(ValueError, match="English-only"):
        load("tiny.en").transcribe(audio("cards/001.wav"), task="translate")


def test_translate_gives_english():
    """--task translate on the Dutch clip: the <|translate|> prompt, English words out."""
    m = load("base")
    segs, info = m.transcribe(audio("fillets/nl-vit-m-hlava.ogg"), language="nl", task="translate")
    text = "".join(s.text for s in segs).lower()
    native = "".join(s.text for s in m.transcribe(audio("fillets/nl-vit-m-hlava.ogg"), language="nl")[0]).lower()
    english = {"i", "the", "of", "my", "a", "have", "get", "and", "we", "it", "to", "that", "is", "be", "not"}
    assert text != native and text.isascii() and english & set(text.replace(".", " ").split()), text


# ------------------------------------------------------------------------------ beam search

def test_beam5_equals_hf_num_beams_5(model):
    """Beam search, 5 beams, on every short clip: the same text as HF generate(num_beams=5)."""
    m, name = model
    bad = []
    for clip, g in clips(name, BEAM["models"][name]["clips"]):
        segs, _ = m.transcribe(audio(clip, g["audio_sha256"]), language=lang_arg(m, g["language"]), beam_size=5)
        text = "".join(s.text for s in segs)
        if text != g["text"]:
            bad.append((clip, text, g["text"]))
    assert not bad, "\n".join(f"{c}: ours {o!r}\n      HF   {h!r}" for c, o, h in bad)


def test_temperature_fallback_is_taken_on_repetition():
    """openai's fallback: a window whose text compresses too well is decoded again at the next
    temperature (a threshold no text meets forces it; sampling is seeded)."""
    m = load("tiny.en")
    segs, _ = m.transcribe(audio("jfk.wav"), temperature=(0.0, 0.4), compression_ratio_threshold=0.0)
    assert segs and all(s.temperature == 0.4 for s in segs)
    segs, _ = m.transcribe(audio("jfk.wav"), temperature=(0.0, 0.4))
    assert all(s.temperature == 0.0 for s in segs)


# ------------------------------------------------------------------------------ word timestamps

def test_word_timestamps_match_openai(model):
    """Every clip ≤ 30 s whose words are the same as openai-whisper's word_timestamps=True (same
    weights, same alignment heads): every word starts and ends within 0.1 s of openai's, except
    the end of the clip's last word, which meets the padding (HF's zero samples here, openai's
    zero log-mel there) and is reported. Clips where the transcripts differ are counted."""
    m, name = model
    worst, last, n, n_clips, differ = 0.0, 0.0, 0, 0, 0
    for clip, g in clips(name, OPENAI["models"][name]["clips"]):
        if not g["word_timestamps"]:
            continue
        segs, _ = m.transcribe(audio(clip, g["audio_sha256"]), language=lang_arg(m, g["language"]),
                               timestamps=True, word_timestamps=True)
        ours = [w for s in segs for w in s.words]
        ref = [w for s in g["segments"] for w in s["words"]]
        if [w.word for w in ours] != [w["word"] for w in ref]:
            differ += 1
            continue
        n_clips += 1
        for i, (a, b) in enumerate(zip(ours, ref)):
            assert abs(a.start - b["start"]) <= 0.1 + 1e-9, (clip, a, b)
            if i < len(ours) - 1:
                assert abs(a.end - b["end"]) <= 0.1 + 1e-9, (clip, a, b)
                worst = max(worst, abs(a.start - b["start"]), abs(a.end - b["end"]))
            else:
                last = max(last, abs(a.end - b["end"]))
            n += 1
    print(f"{name}: {n} words in {n_clips} clips within {worst:.3f} s of openai (last words' ends: "
          f"{last:.3f} s); {differ} clips with other words")
    assert n_clips >= (5 if name == "tiny.en" or ALL_CLIPS else 2) and n >= (50 if name == "tiny.en" or ALL_CLIPS else 20)


# ------------------------------------------------------------------------------ silences, VAD

@pytest.fixture(scope="module")
def silences():
    """The recording, where its speech is, and tiny.en's transcripts of it (timed): default
    (--nospeech 0.6), gate off (1), and with --vad."""
    x, placed = MGF.silences()
    m = load("tiny.en")
    t0 = time.perf_counter()
    full = m.transcribe(x)
    t1 = time.perf_counter()
    vad = m.transcribe(x, vad=True)
    t2 = time.perf_counter()
    loose = m.transcribe(x, no_speech_threshold=1.0)
    return x, placed, {"full": full, "vad": vad, "loose": loose, "t_full": t1 - t0, "t_vad": t2 - t1}


def _in_speech(t0, t1, placed, slack):
    return any(t0 < b + slack and t1 > a - slack for _, a, b in placed)


def test_no_text_in_the_silences(silences):
    """The 5-minute recording: with --nospeech 0.6 every segment overlaps a placed clip; with
    the gate off (1) the model writes its "Thank you." into the silences."""
    x, placed, r = silences
    segs, _ = r["full"]
    assert segs and all(_in_speech(s.start, s.end, placed, 1.0) for s in segs), [(s.start, s.end, s.text) for s in segs]
    assert not any("thank you" in s.text.lower() for s in segs)
    loose, _ = r["loose"]
    assert any(not _in_speech(s.start, s.end, placed, 1.0) for s in loose)


def test_vad_lands_on_the_speech_and_is_faster(silences):
    """--vad: the regions cover every placed clip; segments start and end within 1 s of the
    speech (on the recording's clock); it runs faster than the full recording."""
    x, placed, r = silences
    segs, info = r["vad"]
    print(f"tiny.en, 300 s: {r['t_full']:.2f} s without VAD, {r['t_vad']:.2f} s with "
          f"({info.duration_after_vad:.1f} s of speech)")
    for _, a, b in placed:
        assert any(r0 <= a + 0.1 and r1 >= b - 0.1 for r0, r1 in info.speech_regions), (a, b, info.speech_regions)
    assert info.duration_after_vad < 0.25 * info.duration
    for s in segs:
        assert _in_speech(s.start, s.end, placed, 1.0), (s.start, s.end, s.text)
    for _, a, _ in placed:
        assert any(abs(s.start - a) <= 1.0 for s in segs), (a, [(s.start, s.end) for s in segs])
    times = [t for s in segs for t in (s.start, s.end)]
    assert times == sorted(times)
    assert r["t_vad"] < r["t_full"]


def test_initial_prompt_conditions_the_first_window():
    """openai's initial_prompt: the text goes in as <|startofprev|> context (tiny.en writes the
    card clip as '5 5' alone, 'Five, five.' after a prompt written in words)."""
    m = load("tiny.en")
    assert m.transcribe(audio("cards/004.wav"))[0][0].text == " 5 5"
    segs, _ = m.transcribe(audio("cards/004.wav"), initial_prompt="Playing cards: five of hearts, queen of clubs.")
    assert segs[0].text == " Five, five."
