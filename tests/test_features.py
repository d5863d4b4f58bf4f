"""The transcription features against their oracles, for tiny.en and base.

Where the truth came from (all on the same 16 kHz samples, sha256-checked):
  * model-greedy.json (fixtures/make_golden_models.py) — HF transformers 5.24 greedy with
    return_timestamps=True: HF's own segments (start, end, tokens);
  * model-fw.json — faster-whisper 1.2.1 `detect_language` with base on every clip;
  * features-beam.json (fixtures/make_golden_features.py) — HF `generate(num_beams=5)`;
  * features-openai.json — openai-whisper 20250625 `transcribe(temperature=0.0, greedy)` on a
    .pt of the same weights: word timestamps on every clip ≤ 30 s, segments of the 63 s clip;
  * the 5-minute recording with long silences is built by make_golden_features.silences()
    (fixture clips at known places in faint noise), so its speech times are known exactly;
  * features-vad.json — silero-vad 6.2.3's get_speech_timestamps (ONNX) on that recording;
  * features-hallucination.json — openai-whisper with hallucination_silence_threshold=2 on its
    first 2 minutes;
  * features-language.json — faster-whisper 1.2.1 `detect_language` with base on every clip.
"""

import json
import os
import sys
import time

import numpy as np
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
VAD = json.load(open(os.path.join(FIX, "golden", "features-vad.json"), encoding="utf-8"))
HALLUCINATION = json.load(open(os.path.join(FIX, "golden", "features-hallucination.json"), encoding="utf-8"))
LANGUAGE = json.load(open(os.path.join(FIX, "golden", "features-language.json"), encoding="utf-8"))
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
        segs = list(segs)
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
    segs = list(segs)
    ref = g["segments"]
    same = [(s, r) for s, r in zip(segs, ref) if s.tokens == r["tokens"]]
    print(f"{name}: {len(same)}/{len(ref)} segments with the same tokens")
    assert len(same) >= len(ref) - 2
    for s, r in same[:-1]:
        assert abs(s.start - r["start"]) <= 0.02 and abs(s.end - r["end"]) <= 0.02, (s, r)


# ------------------------------------------------------------------------------ languages

def test_language_detection_agrees_with_faster_whisper():
    """base (multilingual) on every clip: the same language as faster-whisper's detect_language
    on the same weights, probability within 0.02; right on every clip of 5 s or more (en, nl, cs
    — the Dutch and Czech ones are 12–14 s of one speaker's dialogue lines)."""
    m = load("base")
    for clip, g in LANGUAGE["clips"].items():
        lang, p, _ = m.detect_language(audio(clip, g["audio_sha256"]))
        assert lang == g["language"], (clip, lang, g)
        assert abs(p - g["probability"]) < 0.02, (clip, p, g)
    # Wrong only on lines under 3 s — base's weakness, not ours: faster-whisper hears the 2.6 s
    # Dutch and Czech "hlava" lines as Arabic and Polish too (ours equal its answers, above).
    # Right on every clip of 5 s or more, in all three languages.
    seconds = {c: len(audio(c)) / 16000 for c in LANGUAGE["clips"]}
    wrong = {c: g["language"] for c, g in LANGUAGE["clips"].items() if g["language"] != g["truth"]}
    assert all(seconds[c] < 3 for c in wrong), wrong
    assert {g["truth"] for c, g in LANGUAGE["clips"].items() if seconds[c] >= 5} == {"en", "nl", "cs"}
    print(f"base: right on {len(seconds) - len(wrong)}/{len(seconds)} clips; wrong (as faster-whisper): {wrong}")
    assert m.transcribe(audio("fillets/nl-city-vit-v-joined.ogg"))[1].language == "nl"   # detected when omitted


def test_lang_is_normalised_and_an_unknown_code_is_named():
    from click.testing import CliRunner

    from nwhisper.cli.main import cli

    m = load("base")
    segs, info = m.transcribe(audio("cards/001.wav"), language=" EN ")
    segs = list(segs)
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
    segs = list(segs)
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
        segs = list(segs)
        text = "".join(s.text for s in segs)
        if text != g["text"]:
            bad.append((clip, text, g["text"]))
    assert not bad, "\n".join(f"{c}: ours {o!r}\n      HF   {h!r}" for c, o, h in bad)


def test_temperature_fallback_is_taken_on_repetition():
    """openai's fallback: a window whose text compresses too well is decoded again at the next
    temperature (a threshold no text meets forces it; sampling is seeded)."""
    m = load("tiny.en")
    segs, _ = m.transcribe(audio("jfk.wav"), temperature=(0.0, 0.4), compression_ratio_threshold=0.0)
    segs = list(segs)
    assert segs and all(s.temperature == 0.4 for s in segs)
    segs, _ = m.transcribe(audio("jfk.wav"), temperature=(0.0, 0.4))
    segs = list(segs)
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
        segs = list(segs)
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
def silences_audio():
    """The 5-minute recording with long silences, and where its clips were placed."""
    return MGF.silences()


@pytest.fixture(scope="module")
def silences(silences_audio):
    """The recording, where its speech is, and tiny.en's transcripts of it (timed): default
    (--nospeech 0.6), gate off (1), with --vad energy and with --vad silero."""
    x, placed = silences_audio
    m = load("tiny.en")

    def run(**options):
        segments, info = m.transcribe(x, **options)
        return list(segments), info

    t0 = time.perf_counter()
    full = run()
    t1 = time.perf_counter()
    vad = run(vad="energy")
    t2 = time.perf_counter()
    silero = run(vad="silero", timestamps=True)
    t3 = time.perf_counter()
    loose = run(no_speech_threshold=1.0)
    return x, placed, {"full": full, "vad": vad, "silero": silero, "loose": loose, "t_full": t1 - t0,
                       "t_vad": t2 - t1, "t_silero": t3 - t2}


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


def _check_on_the_speech(segs, info, placed, share, margin):
    """A --vad transcription of the silences recording: the regions cover every placed clip and
    keep less than `share` of the recording; every segment lies within `margin` s of the speech;
    one starts within 1 s of every clip; the times are monotonic."""
    for _, a, b in placed:
        assert any(r0 <= a + 0.1 and r1 >= b - 0.1 for r0, r1 in info.speech_regions), (a, b, info.speech_regions)
    assert info.duration_after_vad < share * info.duration
    for s in segs:
        assert _in_speech(s.start, s.end, placed, margin), (s.start, s.end, s.text)
    for _, a, _ in placed:
        assert any(abs(s.start - a) <= 1.0 for s in segs), (a, [(s.start, s.end) for s in segs])
    times = [t for s in segs for t in (s.start, s.end)]
    assert times == sorted(times)


def test_vad_lands_on_the_speech_and_is_faster(silences):
    """--vad energy: the regions cover every placed clip; segments start and end within 1 s of the
    speech (on the recording's clock); it runs faster than the full recording."""
    x, placed, r = silences
    segs, info = r["vad"]
    print(f"tiny.en, 300 s: {r['t_full']:.2f} s without VAD, {r['t_vad']:.2f} s with "
          f"({info.duration_after_vad:.1f} s of speech)")
    _check_on_the_speech(segs, info, placed, share=0.25, margin=1.0)
    assert r["t_vad"] < r["t_full"]


def test_silero_regions_equal_the_silero_vad_package(silences_audio):
    """Silero on our kernels and our region rule against silero-vad's get_speech_timestamps on
    the ONNX model, over the 5-minute recording, for three sets of options (faster-whisper's
    vad_filter = our SILERO default, the package's defaults, and a set where neighbours split
    their gap): every region equal to the sample, or within one 32 ms chunk — our probabilities
    are within 4e-6 of onnxruntime's, which could move a threshold crossing by a chunk."""
    import hashlib

    from nwhisper.vad.regions import SILERO, VadOptions, chunk_probs, detector, regions_from_probs

    x = silences_audio[0]
    assert hashlib.sha256(x.tobytes()).hexdigest() == VAD["audio_sha256"]
    probs = chunk_probs(x, detector("silero"))
    exact = n = 0
    for key, g in VAD["regions"].items():
        o = g["options"]
        opts = VadOptions(**{k: o[name] for k, name in (
            ("threshold", "threshold"), ("neg_threshold", "neg_threshold"), ("min_speech_ms", "min_speech_duration_ms"),
            ("min_silence_ms", "min_silence_duration_ms"), ("speech_pad_ms", "speech_pad_ms")) if name in o})
        if key == "vad_filter":
            assert opts == SILERO       # the default is faster-whisper's vad_filter
        ours = regions_from_probs(probs, len(x), opts)
        theirs = [tuple(r) for r in g["samples"]]
        assert len(ours) == len(theirs), (key, ours, theirs)
        for a, b in zip(ours, theirs):
            assert abs(a[0] - b[0]) <= 512 and abs(a[1] - b[1]) <= 512, (key, a, b)
            exact += a == b
            n += 1
    print(f"silero regions: {exact}/{n} equal to the sample, the rest within a chunk")
    assert n >= 20


def test_silero_vad_lands_on_the_speech(silences):
    """--vad silero: the regions cover every placed clip and little else; every segment is on
    the speech (nothing made up in the silences), one starts within 1 s of every clip, times
    are monotonic; the clip that straddles the joined speech's 30 s boundary comes out whole,
    as openai-whisper writes it from the full recording; faster than without VAD."""
    x, placed, r = silences
    segs, info = r["silero"]
    print(f"tiny.en, 300 s: {r['t_full']:.2f} s without VAD, {r['t_silero']:.2f} s with Silero "
          f"({info.duration_after_vad:.1f} s of speech)")
    _check_on_the_speech(segs, info, placed, share=0.2, margin=0.5)
    joined_ends = np.cumsum([b - a for a, b in info.speech_regions])
    k = int(np.searchsorted(joined_ends, 30.0))            # the region holding joined second 30
    assert joined_ends[k] - (info.speech_regions[k][1] - info.speech_regions[k][0]) < 30.0 < joined_ends[k]
    r0, r1 = info.speech_regions[k]
    ours = "".join(s.text for s in segs if r0 <= s.start and s.end <= r1)
    ref = OPENAI["models"]["tiny.en"]["clips"][MGF.SILENCES]["segments"]
    assert ours == "".join(g["text"] for g in ref if r0 - 5 <= g["start"] and g["end"] <= r1 + 5), ours
    assert r["t_silero"] < r["t_full"]


def test_hallucination_silence_threshold_follows_openai(silences_audio):
    """hallucination_silence_threshold=2 with word timestamps, the no-speech gate off, on the
    silences recording's first 2 minutes: every segment on the speech has openai-whisper's
    tokens, start and end (±0.1 s, word timing's tolerance) and its window's seek — the seeks
    come from the skipping rules (openai without them puts "Thank you." at 52 s and 79 s, and
    its next window starts elsewhere); at most as many segments in the silences as openai's."""
    g = HALLUCINATION
    names = MODELS if ALL_CLIPS else ["tiny.en"]
    x = silences_audio[0][:int(g["seconds"] * 16000)]
    for name in names:
        m = load(name)
        segs, _ = m.transcribe(x, language=lang_arg(m, "en"), word_timestamps=True, no_speech_threshold=None,
                               hallucination_silence_threshold=g["threshold"])
        segs = list(segs)
        ref = [s for s in g["models"][name]["threshold"] if s["text"].strip()]
        on = [s for s in segs if _in_speech(s.start, s.end, g["placed"], 1.0)]
        ref_on = [s for s in ref if _in_speech(s["start"], s["end"], g["placed"], 1.0)]
        assert [s.tokens for s in on] == [s["tokens"] for s in ref_on], name
        for s, t in zip(on, ref_on):
            assert s.seek == t["seek"] and abs(s.start - t["start"]) <= 0.1 and abs(s.end - t["end"]) <= 0.1, (s, t)
        assert len(segs) - len(on) <= len(ref) - len(ref_on), [(s.start, s.text) for s in segs]
        print(f"{name}: {len(on)} segments on the speech as openai's; {len(segs) - len(on)} in the silences "
              f"(openai: {len(ref) - len(ref_on)})")


def test_vad_and_hallucination_options_are_checked():
    from click.testing import CliRunner

    from nwhisper.cli.main import cli

    m = load("tiny.en")
    x = audio("jfk.wav")
    with pytest.raises(ValueError, match="'webrtc'"):
        m.transcribe(x, vad="webrtc")
    with pytest.raises(ValueError, match="word_timestamps"):
        m.transcribe(x, hallucination_silence_threshold=2.0)
    with pytest.raises(ValueError, match="≥ 0"):
        m.transcribe(x, word_timestamps=True, hallucination_silence_threshold=-1.0)
    jfk = os.path.join(FIX, "jfk.wav")
    r = CliRunner().invoke(cli, ["transcribe", jfk, "--vad", "webrtc"])
    assert r.exit_code != 0 and "'webrtc' is not one of 'silero', 'energy'" in r.output
    r = CliRunner().invoke(cli, ["transcribe", jfk, "--hallucination-silence-threshold", "-1"])
    assert r.exit_code != 0 and "--hallucination-silence-threshold" in r.output


def test_cli_bare_vad_is_silero(tmp_path, silences_audio):
    """`--vad` alone means Silero (faster-whisper's vad_filter); `--vad energy` the energy
    detector: the json output's speech regions are each detector's (they differ on the first
    30 s of the silences recording: jfk.wav in noise)."""
    import soundfile as sf
    from click.testing import CliRunner

    from nwhisper.cli.main import cli
    from nwhisper.vad.regions import detector, speech_regions

    x = silences_audio[0][:30 * 16000]
    wav = tmp_path / "jfk-in-noise.wav"
    sf.write(wav, x, 16000, subtype="FLOAT")
    found = {}
    for args, name in ((["--vad"], "silero"), (["--vad", "energy"], "energy")):
        r = CliRunner().invoke(cli, ["transcribe", str(wav), *args, "-f", "json", "-o", str(tmp_path),
                                     "--device", "cpu"])
        assert r.exit_code == 0, r.output
        with open(tmp_path / "jfk-in-noise.json", encoding="utf-8") as f:
            found[name] = json.load(f)["speech_regions"]
        want = [[round(a / 16000, 3), round(b / 16000, 3)] for a, b in speech_regions(x, detector(name))]
        assert found[name] == want, (name, found[name], want)
    assert found["silero"] != found["energy"]


def test_initial_prompt_conditions_the_first_window():
    """openai's initial_prompt: the text goes in as <|startofprev|> context (tiny.en writes the
    card clip as '5 5' alone, 'Five, five.' after a prompt written in words)."""
    m = load("tiny.en")
    assert next(m.transcribe(audio("cards/004.wav"))[0]).text == " 5 5"
    segs, _ = m.transcribe(audio("cards/004.wav"), initial_prompt="Playing cards: five of hearts, queen of clubs.")
    segs = list(segs)
    assert segs[0].text == " Five, five."
