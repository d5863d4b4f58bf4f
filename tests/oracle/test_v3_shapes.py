"""The layouts of the models people run — large-v3 (128 mel bands, 51866 tokens with <|yue|>,
100 languages), large-v3-turbo (4 decoder layers) and distil-large-v3 (2) — on small checkpoints
made from base's weights (fixtures/v3_checkpoints.py says which tensors are real), through the
Hugging Face directory and its ggml conversion.

Truth: fixtures/golden/v3-shapes.json, by fixtures/make_golden_v3.py — HF transformers' greedy
`generate` (with and without timestamps) and `detect_language` on the same checkpoints (their
sha256 is checked here, so this is the model HF ran), and openai-whisper's tokenizer with 100
languages for the special ids. The CTranslate2 conversions (CTranslate2's own converter, not in
the test environment) are checked against the same numbers when that script makes them.
"""

import os

import numpy as np
import pytest
from fixture_audio import audio
from make_golden_v3 import ours_and_hf, sha256
from paths import golden
from v3_checkpoints import build

import nwhisper
from nwhisper.io.convert import convert

GOLDEN = golden("v3-shapes.json")


@pytest.fixture(scope="module", params=list(GOLDEN["models"]))
def built(request, tmp_path_factory):
    kind = request.param
    d = build(kind, str(tmp_path_factory.mktemp(kind) / "hf"))
    want = GOLDEN["models"][kind]
    assert sha256(os.path.join(d, "model.safetensors")) == want["safetensors_sha256"], "not the checkpoint HF ran"
    assert sha256(os.path.join(d, "tokenizer.json")) == want["tokenizer_sha256"]
    return kind, d


def clips():
    for clip, c in GOLDEN["clips"].items():
        yield clip, c["language"], audio(clip, c["audio_sha256"])


@pytest.mark.parametrize("container", ["hf", "ggml"])
def test_tokens_and_language_are_hfs(built, container, tmp_path):
    kind, d = built
    g = GOLDEN["models"][kind]
    path = d if container == "hf" else convert(d, str(tmp_path / "model.ggml.bin"), to="ggml")
    m = nwhisper.load(path)
    assert (m.dims.n_mels, m.dims.n_vocab, m.dims.num_languages) == (128, 51866, 100)
    for clip, language, x in clips():
        res = g["clips"][clip]
        for ours, hf in ours_and_hf(m, x, language, res, g["hf_special_ids"]["<|endoftext|>"]):
            assert ours == hf, (kind, container, clip, m.tokenizer.decode(ours), m.tokenizer.decode(hf))
        code, _, _ = m.detect_language(x)
        assert m.tokenizer.language_id(code) == res["detected"], (kind, container, clip, code)


def test_v3_special_ids_are_openai_whispers(built):
    """<|yue|>, <|transcribe|>, <|notimestamps|>, <|0.00|> …: openai-whisper's ids with 100
    languages, HF's tokenizer's, and the same by position (what a ggml file, which has no
    tokenizer.json, gets)."""
    kind, d = built
    want = GOLDEN["openai_special_ids"]
    assert GOLDEN["models"][kind]["hf_special_ids"] == want
    for path in (d, convert(d, os.path.join(os.path.dirname(d), "ids.ggml.bin"), to="ggml")):
        tok = nwhisper.load(path).tokenizer
        assert (tok.eot, tok.sot, tok.translate, tok.transcribe, tok.sot_lm, tok.sot_prev, tok.no_speech,
                tok.no_timestamps, tok.timestamp_begin) == (
            want["<|endoftext|>"], want["<|startoftranscript|>"], want["<|translate|>"], want["<|transcribe|>"],
            want["<|startoflm|>"], want["<|startofprev|>"], want["<|nospeech|>"], want["<|notimestamps|>"],
            want["<|0.00|>"])
        assert tok.language_id("yue") == want["<|yue|>"] and tok.language_id("en") == want["<|en|>"]


def test_word_timestamps_run_on_the_large_v3_layout(tmp_path):
    """Its alignment heads (base's) time jfk.wav's words in order, inside the clip (the cut
    decoders' words are not speech, so only large-v3's layout is timed)."""
    m = nwhisper.load(build("large-v3", str(tmp_path / "hf")))
    x = audio("jfk.wav", GOLDEN["clips"]["jfk.wav"]["audio_sha256"])
    segments, _ = m.transcribe(x, language="en", word_timestamps=True)
    words = [w for s in segments for w in s.words]
    assert "".join(w.word for w in words).strip().startswith("And so my fellow Americans")
    assert all(0 <= a.start <= a.end <= b.start + 1e-6 for a, b in zip(words, words[1:]))
    assert words[-1].end <= len(x) / 16000 + 0.02
    assert np.mean([w.probability for w in words]) > 0.5
