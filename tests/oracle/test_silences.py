"""Long silences: a 5-minute recording with fixture clips at known places in faint noise
(fixtures/make_golden_features.silences(), so its speech times are known exactly), through the
no-speech gate, the energy and Silero VADs, and openai's hallucination skip.

Truth:
  * features-vad.json — silero-vad 6.2.3's get_speech_timestamps (ONNX) on that recording;
  * features-hallucination.json — openai-whisper 20250625 with hallucination_silence_threshold=2
    on its first 2 minutes.
"""

import json
import os

import make_golden_features as MGF
import numpy as np
import pytest
from fixture_audio import audio, lang_arg, MODELS
from paths import FIXTURES as FIX, golden

OPENAI = golden("features-openai.json")
VAD = golden("features-vad.json")
HALLUCINATION = golden("features-hallucination.json")



# ------------------------------------------------------------------------------ silences, VAD

@pytest.fixture(scope="module")
def silences_audio():
    """The 5-minute recording with long silences, and where its clips were placed."""
    return MGF.silences()


@pytest.fixture(scope="module")
def silences(models, silences_audio):
    """The recording, where its speech is, and tiny.en's transcripts of it: default (--nospeech
    0.6), gate off (1), with --vad energy and with --vad silero."""
    x, placed = silences_audio
    m = models("tiny.en")

    def run(**options):
        segments, info = m.transcribe(x, **options)
        return list(segments), info

    return x, placed, {"full": run(), "vad": run(vad="energy"),
                       "silero": run(vad="silero", timestamps=True), "loose": run(no_speech_threshold=1.0)}


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


def test_vad_lands_on_the_speech(silences):
    """--vad energy: the regions cover every placed clip; segments start and end within 1 s of the
    speech (on the recording's clock)."""
    x, placed, r = silences
    segs, info = r["vad"]
    _check_on_the_speech(segs, info, placed, share=0.25, margin=1.0)


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
    as openai-whisper writes it from the full recording."""
    x, placed, r = silences
    segs, info = r["silero"]
    _check_on_the_speech(segs, info, placed, share=0.2, margin=0.5)
    joined_ends = np.cumsum([b - a for a, b in info.speech_regions])
    k = int(np.searchsorted(joined_ends, 30.0))            # the region holding joined second 30
    assert joined_ends[k] - (info.speech_regions[k][1] - info.speech_regions[k][0]) < 30.0 < joined_ends[k]
    r0, r1 = info.speech_regions[k]
    ours = "".join(s.text for s in segs if r0 <= s.start and s.end <= r1)
    ref = OPENAI["models"]["tiny.en"]["clips"][MGF.SILENCES]["segments"]
    assert ours == "".join(g["text"] for g in ref if r0 - 5 <= g["start"] and g["end"] <= r1 + 5), ours


def test_hallucination_silence_threshold_follows_openai(models, silences_audio):
    """hallucination_silence_threshold=2 with word timestamps, the no-speech gate off, on the
    silences recording's first 2 minutes: every segment on the speech has openai-whisper's
    tokens, start and end (±0.1 s, word timing's tolerance) and its window's seek — the seeks
    come from the skipping rules (openai without them puts "Thank you." at 52 s and 79 s, and
    its next window starts elsewhere); at most as many segments in the silences as openai's."""
    g = HALLUCINATION
    x = silences_audio[0][:int(g["seconds"] * 16000)]
    for name in MODELS:
        m = models(name)
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


def test_vad_and_hallucination_options_are_checked(models):
    from click.testing import CliRunner

    from nwhisper.cli.main import cli

    m = models("tiny.en")
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


def test_cli_bare_vad_is_silero(models, tmp_path, silences_audio):
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
