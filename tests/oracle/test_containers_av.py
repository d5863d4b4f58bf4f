"""Audio in containers libsndfile does not read (m4a, mp4 with video, webm/opus, mp3, wma), decoded
by PyAV: each fixture (fixtures/make_containers.py, from cards/005.wav) transcribes to HF's text of
its WAV (model-greedy.json, fixtures/make_golden_models.py); its samples, resampled by our resampler, match FFmpeg's own decoding; what is not
audio, truncated or damaged gets a one-line AudioError (fuzzed); the server takes the uploads."""

from __future__ import annotations

import io
import os

import av
import numpy as np
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nwhisper.io.audio import AudioError, load_audio

from paths import FIXTURES as FIX, golden
CONT = os.path.join(FIX, "containers")
# HF transformers' greedy transcript of the WAV the containers were made from
WAV_TEXT = golden("model-greedy.json")["models"]["tiny.en"]["clips"]["cards/005.wav"]["notimestamps"]["text"].strip()
SPEECH = ["speech.m4a", "speech.mp4", "speech.webm", "speech.mp3", "speech.wma"]


@pytest.fixture(scope="module")
def model(models):
    return models("tiny.en")


def text(model, source):
    segments, _ = model.transcribe(source)
    segments = list(segments)
    return "".join(s.text for s in segments)


@pytest.mark.parametrize("name", SPEECH)
def test_each_container_transcribes_as_its_wav(model, name):
    assert WAV_TEXT and text(model, os.path.join(CONT, name)).strip() == WAV_TEXT


@pytest.mark.parametrize("name", [n for n in SPEECH if n != "speech.mp3"])   # MP3: libsndfile's
def test_samples_are_ffmpegs_decoding_resampled_by_ours(name):
    """Truth: PyAV's decoding read independently here (packed float, mono), then our resample:
    the same samples whether the file is a path or bytes."""
    from nwhisper.io.audio import resample

    with av.open(os.path.join(CONT, name)) as c:
        s = c.streams.audio[0]
        rate = s.codec_context.sample_rate
        flat = [f.to_ndarray().reshape(-1) for f in
                (g for frame in c.decode(s)
                 for g in av.AudioResampler(format="flt", layout="mono", rate=rate).resample(frame))]
    truth = resample(np.concatenate(flat), rate) if rate != 16000 else np.concatenate(flat)
    path = os.path.join(CONT, name)
    got = load_audio(path)
    assert abs(len(got) - len(truth)) <= 2
    n = min(len(got), len(truth))
    np.testing.assert_allclose(got[:n], truth[:n], atol=2e-6)
    with open(path, "rb") as f:
        np.testing.assert_array_equal(load_audio(f.read()), got)


def test_not_audio_and_truncated_get_one_line_errors():
    with pytest.raises(AudioError, match="holds no audio stream"):
        load_audio(os.path.join(CONT, "video-only.mp4"))
    # ASF (wma) keeps no length FFmpeg reads (it estimates one from the file's size), so a
    # cut-off wma decodes to what is there, as a cut-off stream does
    for name in [n for n in SPEECH if n != "speech.wma"]:
        data = open(os.path.join(CONT, name), "rb").read()
        with pytest.raises(AudioError) as e:
            load_audio(data[:len(data) // 2])
        assert "\n" not in str(e.value) and str(e.value).startswith("audio bytes: "), (name, e.value)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SPEECH), st.integers(0, 1 << 20), st.lists(st.tuples(st.integers(0, 1 << 20),
                                                                          st.integers(0, 255)), max_size=6))
def test_fuzzed_containers_decode_or_refuse(name, cut, flips):
    data = bytearray(open(os.path.join(CONT, name), "rb").read())
    data = data[:max(1, cut % (len(data) + 1))]
    for at, value in flips:
        data[at % len(data)] = value
    try:
        x = load_audio(bytes(data))
    except AudioError as e:
        assert "\n" not in str(e)
        return
    assert x.dtype == np.float32 and len(x) and np.isfinite(x).all()


def test_the_server_takes_m4a_and_webm_uploads(tmp_path):
    """POST /v1/audio/transcriptions with the official client: the same text as the WAV."""
    from server_process import Server

    s = Server(str(tmp_path), "formats", "tiny.en").wait()
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none")
        got = {}
        for name in ("speech.m4a", "speech.webm", "../cards/005.wav"):
            with open(os.path.join(CONT, name), "rb") as f:
                got[name] = client.audio.transcriptions.create(model="whisper-1", file=f).text
        assert got["speech.m4a"].strip() == got["speech.webm"].strip() == got["../cards/005.wav"].strip() == WAV_TEXT
        bad = io.BytesIO(open(os.path.join(CONT, "video-only.mp4"), "rb").read())
        bad.name = "video.mp4"
        with pytest.raises(openai.BadRequestError, match="holds no audio stream"):
            client.audio.transcriptions.create(model="whisper-1", file=bad)
    finally:
        s.stop()
