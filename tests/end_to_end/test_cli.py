"""The commands as a user types them: `models`, `encode`, `convert`, `transcribe`'s decoding
options, and `serve` with PEMs of the user's own, --vad, --compute-type and --device.

Truth: the golden files of HF transformers (model-greedy.json, features-beam.json,
model-encoder-tiny.en.npz, features-translate.json: fixtures/make_golden_models.py and
make_golden_features.py) and openai-whisper's word times (features-openai.json); the
certificate is made by the `openssl` command, not by nwhisper; VAD's effect is held to the API's
transcribe(vad=True) (tests/oracle/test_silences.py holds that to Silero's own package)."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from fixture_audio import audio
from paths import FIXTURES as FIX, ROOT, golden
from server_process import Server, http, inference

GREEDY = golden("model-greedy.json")["models"]
BEAM = golden("features-beam.json")["models"]
OPENAI = golden("features-openai.json")["models"]
TRANSLATE = golden("features-translate.json")["clips"]
JFK = os.path.join(FIX, "jfk.wav")


def nwhisper(*args, cwd=ROOT):
    """`python -m nwhisper ARGS`: (exit code, stdout, stderr)."""
    r = subprocess.run([sys.executable, "-m", "nwhisper", *args], cwd=cwd, capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def test_models_lists_the_installed_names():
    code, out, _ = nwhisper("models")
    lines = {ln.split()[0]: ln for ln in out.splitlines()}
    assert code == 0 and "(default)" in lines["tiny.en"] and "ct2" in lines["tiny.en"]
    assert "not here" not in lines["base"]                   # the test extra installs its packages
    assert "not here" in lines["small"] and "pip install" in lines["small"]     # and the caches
    assert "Systran/faster-whisper-large-v3" in lines["large-v3"] and "whisper/large-v3.pt" in lines["large-v3"]


def test_encode_writes_hfs_encoder_states_from_a_name_and_from_a_hf_directory(tmp_path):
    """`encode tiny.en clip -o F` writes HF's encoder states (r ≥ 0.99999); `convert --to hf`
    then `encode config.json model.safetensors clip` writes the same bytes."""
    g = golden("model-encoder-tiny.en.npz")
    clip = os.path.join(FIX, str(g["clip"]))
    code, out, err = nwhisper("encode", "tiny.en", clip, "-o", str(tmp_path / "a.f32"), "--device", "cpu")
    assert code == 0 and "1500 x 384 float32" in out, err
    states = np.fromfile(tmp_path / "a.f32", "<f4").reshape(1500, 384)
    ours, ref = states[g["rows"]], g["states"]
    assert np.corrcoef(ours.ravel(), ref.ravel())[0, 1] >= 0.99999
    hf = tmp_path / "hf"
    code, out, err = nwhisper("convert", "tiny.en", str(hf), "--to", "hf")
    assert code == 0 and os.path.exists(hf / "model.safetensors"), err
    code, _, err = nwhisper("encode", str(hf / "config.json"), str(hf / "model.safetensors"), clip,
                            "-o", str(tmp_path / "b.f32"), "--device", "cpu")
    assert code == 0, err
    assert (tmp_path / "a.f32").read_bytes() == (tmp_path / "b.f32").read_bytes()


def test_convert_to_ggml_transcribes_as_hf_and_bad_sources_are_named(tmp_path):
    out = tmp_path / "ggml-tiny.en.bin"
    code, _, err = nwhisper("convert", "tiny.en", str(out), "--to", "ggml")
    assert code == 0 and out.read_bytes()[:4] == b"lmgg", err
    code, text, err = nwhisper("transcribe", str(out), JFK, "--device", "cpu")
    assert code == 0 and text.strip() == GREEDY["tiny.en"]["clips"]["jfk.wav"]["notimestamps"]["text"].strip(), err
    code, _, err = nwhisper("convert", str(tmp_path / "nothing-here"), str(tmp_path / "x.bin"), "--to", "ggml")
    assert code == 2 and "nothing-here" in err and "Traceback" not in err


def test_transcribe_options_reach_the_decoder():
    """--beam 5 gives HF's beam text where greedy's differs; --max stops early; --prompt changes
    the words as openai's initial_prompt does; --temperature takes a fallback ladder; --task
    translate gives HF's translation; --word-timestamps -f json gives openai's word times."""
    clip = "librivox/sense_and_sensibility_01_austen_64kb-0880.flac"
    path = os.path.join(FIX, clip)
    greedy = GREEDY["tiny.en"]["clips"][clip]["notimestamps"]["text"].strip()
    beam = BEAM["tiny.en"]["clips"][clip]["text"].strip()
    assert greedy != beam
    assert nwhisper("transcribe", path, "--device", "cpu")[1].strip() == greedy
    assert nwhisper("transcribe", path, "--beam", "5", "--device", "cpu")[1].strip() == beam
    short = nwhisper("transcribe", path, "--max", "3", "--device", "cpu")[1].strip()
    assert short and greedy.startswith(short) and len(short) < len(greedy)
    cards = os.path.join(FIX, "cards/004.wav")
    assert nwhisper("transcribe", cards, "--device", "cpu")[1].strip() == "5 5"
    prompted = nwhisper("transcribe", cards, "--prompt", "Playing cards: five of hearts, queen of clubs.",
                        "--device", "cpu")[1].strip()
    assert prompted == "Five, five."
    code, text, err = nwhisper("transcribe", path, "--temperature", "0,0.2,0.4", "--device", "cpu")
    assert code == 0 and text.strip() == greedy, err   # T=0 is good enough here: no fallback taken
    code, _, err = nwhisper("transcribe", path, "--temperature", "hot")
    assert code == 2 and "temperature" in err
    dutch = "fillets/nl-vit-v-automat.ogg"
    code, text, err = nwhisper("transcribe", "base", os.path.join(FIX, dutch), "--lang", "nl",
                               "--task", "translate", "--device", "cpu")
    assert code == 0 and text.strip() == TRANSLATE[dutch]["text"].strip(), err


def test_hotwords_from_the_command_line(tmp_path):
    """--hotwords spells made-up names right (tests/oracle/test_hotwords.py holds them to
    faster-whisper); `nwhisper batch --hotwords` the same."""
    names = os.path.join(FIX, "espeak/en-names.flac")
    plain = nwhisper("transcribe", names, "--device", "cpu")[1]
    code, hot, err = nwhisper("transcribe", names, "--hotwords", "Zorblax Quenteroth, Vintrella",
                              "--device", "cpu")
    assert code == 0 and "Zorblax Quenteroth" in hot and "Vintrella" in hot, err
    assert "Zorblax" not in plain
    code, _, err = nwhisper("batch", names, "-o", str(tmp_path), "-f", "txt", "--no-progress",
                            "--hotwords", "Zorblax Quenteroth, Vintrella", "--device", "cpu")
    assert code == 0, err
    (txt,) = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".txt")]
    assert "Zorblax Quenteroth" in open(txt).read()


def test_word_timestamps_from_the_command_line(tmp_path):
    clip = "librivox/sense_and_sensibility_01_austen_64kb-0870.flac"   # openai's words, 22 of them
    code, _, err = nwhisper("transcribe", os.path.join(FIX, clip), "--word-timestamps", "-f", "json",
                            "-o", str(tmp_path), "--device", "cpu")
    assert code == 0, err
    data = json.loads((tmp_path / (os.path.basename(clip).rsplit(".", 1)[0] + ".json")).read_text())
    ours = [w for s in data["segments"] for w in s["words"]]
    ref = [w for s in OPENAI["tiny.en"]["clips"][clip]["segments"] for w in s["words"]]
    assert [w["word"] for w in ours] == [w["word"] for w in ref]
    assert all(abs(a["start"] - b["start"]) <= 0.04 + 1e-6 for a, b in zip(ours, ref))
    assert all(abs(a["end"] - b["end"]) <= 0.04 + 1e-6 for a, b in zip(ours[:-1], ref[:-1]))


def noisy_jfk(path):
    """jfk.wav after 25 s of noise and before 4 s more: without VAD tiny.en's first window
    starts its text at 0 s and mishears it; with VAD it hears only the speech, at 25 s."""
    rng = np.random.default_rng(0)
    noise = lambda s: (rng.standard_normal(16000 * s) * 0.01).astype(np.float32)   # noqa: E731
    sf.write(path, np.concatenate([noise(25), audio("jfk.wav"), noise(4)]), 16000, subtype="FLOAT")
    return path


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command (Debian's openssl)")
def test_serve_with_its_own_pems_vad_int8_on_the_cpu(tmp_path, models):
    """`serve --cert --key --vad --compute-type int8 --device cpu`: https with the user's
    certificate (made by openssl), /health names int8 and the CPU, and every request is
    transcribed with VAD (the API's transcribe(vad=True) of the same audio) unless it says
    vad=false."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    s = Server(str(tmp_path), "pems", "tiny.en", "--cert", str(cert), "--key", str(key), "--vad",
               "--compute-type", "int8", "--device", "cpu").wait()
    try:
        assert s.url.startswith("https://")
        trusted = ssl.create_default_context(cafile=str(cert))
        status, _, body = http(s.url + "/health", context=trusted)
        model = json.loads(body)["model"]
        assert status == 200 and model["compute_type"] == "int8" and model["device"] == "cpu"
        wav = noisy_jfk(str(tmp_path / "noisy.wav"))
        with open(wav, "rb") as f:
            data = f.read()
        answers = {}
        for vad in ("default", "false"):
            fields = [("response_format", "verbose_json")] + ([] if vad == "default" else [("vad", vad)])
            status, _, body = inference(s.url, fields, data=data, context=trusted)
            assert status == 200, body
            answers[vad] = json.loads(body)
    finally:
        s.stop()
    m = models("tiny.en", "int8")
    for vad, answer in (("default", True), ("false", False)):
        want, _ = m.transcribe(wav, vad=answer, timestamps=True, word_timestamps=True)  # as verbose_json
        want = [(w.text, round(w.start, 2), round(w.end, 2)) for w in want]
        got = [(s["text"], round(s["start"], 2), round(s["end"], 2)) for s in answers[vad]["segments"]]
        assert got == want, vad
    assert answers["default"]["segments"] != answers["false"]["segments"]
    assert "ask not what your country can do for you" in answers["default"]["text"].lower()
