"""Speakers in every output: transcribe(diarize=True), the CLI's files, OpenAI's diarized_json,
Deepgram's diarize=true — on a conversation whose truth is known by construction.

The conversation: JFK (fixtures/jfk.wav), half a second of silence, a LibriVox reader (two of her
sentences, half a second apart), half a second, JFK again: three turns, two people, the first
coming back. Every segment and word must carry the speaker of the turn it lies in, the first
named SPEAKER_00 (OpenAI "A", Deepgram 0). Whether the turns are found well is
tests/oracle/test_diarization.py's question (DER against pyannote.metrics and senko); here the
question is whether every door carries them.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from fixture_audio import audio
from paths import ROOT
from server_process import Server

from nwhisper.speakers import weights

try:
    weights.locate()
except FileNotFoundError as e:
    pytest.skip(f"the speaker weights are not installed: {e}", allow_module_level=True)

SR = 16000
GAP = np.zeros(SR // 2, np.float32)
JFK, READER = audio("jfk.wav"), np.concatenate([
    audio("librivox/sense_and_sensibility_01_austen_64kb-0870.flac"), GAP,
    audio("librivox/sense_and_sensibility_01_austen_64kb-0890.flac")])
SCENE = np.concatenate([JFK, GAP, READER, GAP, JFK])
TURNS = [(0.0, len(JFK) / SR, 0), (len(JFK) / SR + 0.5, (len(JFK) + len(READER)) / SR + 0.5, 1),
         ((len(JFK) + len(READER)) / SR + 1.0, len(SCENE) / SR, 0)]


def truth(start, end):
    """The speaker (0, 1) of the turn holding the middle of [start, end]."""
    mid = (start + end) / 2
    return min(TURNS, key=lambda t: 0 if t[0] <= mid <= t[1] else min(abs(mid - t[0]), abs(mid - t[1])))[2]


def scene_wav():
    buf = io.BytesIO()
    sf.write(buf, SCENE, SR, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def diarized(models):
    segments, info = models("tiny.en").transcribe(SCENE, diarize=True, word_timestamps=True)
    return list(segments), info


def test_every_segment_and_word_has_its_turns_speaker(diarized):
    segments, info = diarized
    assert len(segments) >= 3
    for s in segments:
        assert s.speaker == f"SPEAKER_{truth(s.start, s.end):02d}", (s.start, s.end, s.text, s.speaker)
        for w in s.words:
            assert w.speaker == f"SPEAKER_{truth(w.start, w.end):02d}", (w.word, w.start, w.speaker)
    assert {t[2] for t in info.speaker_turns} == {"SPEAKER_00", "SPEAKER_01"}


def test_the_speaker_counts(models):
    m = models("tiny.en")
    one, _ = m.transcribe(SCENE, diarize=True, num_speakers=1)
    assert {s.speaker for s in one} == {"SPEAKER_00"}
    three, _ = m.transcribe(SCENE, diarize=True, min_speakers=3)
    assert len({s.speaker for s in three}) >= 2        # three asked for; segments span turns
    with pytest.raises(ValueError, match="not both"):
        m.transcribe(SCENE, diarize=True, num_speakers=2, max_speakers=3)
    with pytest.raises(ValueError, match="go with diarize"):
        m.transcribe(SCENE, num_speakers=2)


@pytest.mark.parametrize("kw", [{"vad": True}, {"batch_size": 4}])
def test_the_speakers_and_the_vad_share_one_silero_pass(models, monkeypatch, kw):
    """With diarize and Silero's VAD (vad=True, or batch_size's chunks), Silero runs once over
    the recording; the speakers and the transcript are what each makes alone."""
    from nwhisper.vad import regions
    m = models("tiny.en")
    alone = [s.text for s in m.transcribe(SCENE, **kw)[0]]
    turns = m.diarizer()(SCENE)
    passes = []
    real = regions.chunk_probs
    monkeypatch.setattr(regions, "chunk_probs", lambda *a: passes.append(1) or real(*a))
    segments, info = m.transcribe(SCENE, diarize=True, **kw)
    segments = list(segments)
    assert [s.text for s in segments] == alone and len(passes) == 1
    assert info.speaker_turns == [(t.start, t.end, t.name) for t in turns]
    assert {s.speaker for s in segments} == {"SPEAKER_00", "SPEAKER_01"}


def test_silence_and_a_short_recording(models):
    m = models("tiny.en")
    segments, info = m.transcribe(np.zeros(5 * SR, np.float32), diarize=True)
    assert [s for s in segments if s.text.strip()] == [] and info.speaker_turns == []
    segments, info = m.transcribe(audio("cards/001.wav"), diarize=True)          # 1.6 s
    assert {s.speaker for s in segments} == {"SPEAKER_00"}


def test_the_cli_files(tmp_path):
    wav = tmp_path / "scene.wav"
    wav.write_bytes(scene_wav())
    run = subprocess.run([sys.executable, "-m", "nwhisper", "transcribe", str(wav), "--diarize",
                          "--word-timestamps", "-f", "all", "-o", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    srt = (tmp_path / "scene.srt").read_text()
    assert "[SPEAKER_00]: And so, my fellow Americans" in srt and "[SPEAKER_01]: " in srt
    vtt = (tmp_path / "scene.vtt").read_text()
    assert "<v SPEAKER_01>" in vtt and "<v SPEAKER_00>" in vtt
    txt = (tmp_path / "scene.txt").read_text().splitlines()
    assert txt[0].startswith("[SPEAKER_00]: ") and txt[-1].startswith("[SPEAKER_00]: ")
    rttm = [ln.split() for ln in (tmp_path / "scene.rttm").read_text().splitlines()]
    assert rttm and all(r[0] == "SPEAKER" and r[1] == "scene" and r[7].startswith("SPEAKER_") for r in rttm)
    for r in rttm:
        start, dur = float(r[3]), float(r[4])
        assert r[7] == f"SPEAKER_{truth(start, start + dur):02d}", r
    doc = json.loads((tmp_path / "scene.json").read_text())
    assert doc["speaker_turns"] and all("speaker" in s and all("speaker" in w for w in s["words"])
                                        for s in doc["segments"])
    plain = subprocess.run([sys.executable, "-m", "nwhisper", "transcribe", str(wav), "-f", "rttm"],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert plain.returncode == 2 and "needs diarize" in plain.stderr


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(str(tmp_path_factory.mktemp("speakers")), "main", "tiny.en")
    try:
        yield s.wait()
    finally:
        s.stop()


def test_openai_diarized_json(server):
    from openai import OpenAI

    with OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
        r = client.audio.transcriptions.create(model="gpt-4o-transcribe-diarize", file=("scene.wav", scene_wav()),
                                               response_format="diarized_json")
    assert type(r).__name__ == "TranscriptionDiarized", type(r)
    assert r.task == "transcribe" and abs(r.duration - len(SCENE) / SR) < 0.01
    assert [s.type for s in r.segments] == ["transcript.text.segment"] * len(r.segments)
    assert len({s.id for s in r.segments}) == len(r.segments)
    assert [s.speaker for s in r.segments] == ["AB"[truth(s.start, s.end)] for s in r.segments]
    assert r.segments[0].speaker == "A" and r.text.startswith("And so, my fellow Americans")


def test_deepgram_diarize(server):
    from deepgram import DeepgramClient, DeepgramClientEnvironment

    ws = server.url.replace("http", "ws", 1)
    env = DeepgramClientEnvironment(base=server.url, production=ws, agent=ws, agent_rest=server.url)
    client = DeepgramClient(api_key="unused", environment=env)
    r = client.listen.v1.media.transcribe_file(request=scene_wav(), diarize=True, utterances=True,
                                               punctuate=True)
    words = r.results.channels[0].alternatives[0].words
    assert words and [w.speaker for w in words] == [truth(w.start, w.end) for w in words]
    assert [u.speaker for u in r.results.utterances] == [truth(u.start, u.end) for u in r.results.utterances]


def test_live_finals_name_their_speaker(server):
    """The seed socket with diarize: each utterance's final carries the session's speaker, the
    first again when JFK comes back."""
    import asyncio

    from nwhisper.server.client import stream

    got = asyncio.run(stream(server.url.replace("http", "ws", 1) + "/stream", SCENE, pace=0, linger=60,
                             config={"diarize": True, "pause_ms": 400, "lang": "en", "events": True,
                                     "near_db": 0}))     # the reader is quieter than JFK: no near-field gate
    finals = [f for f in got.finals if f["text"].strip()]
    assert len(finals) >= 5 and all("speaker" in f for f in finals), finals
    assert [f["speaker"] for f in finals] == [f"SPEAKER_{truth(f['t0'], f['t1']):02d}" for f in finals]
