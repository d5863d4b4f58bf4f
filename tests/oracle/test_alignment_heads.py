"""The released models' alignment heads, used where a checkpoint carries none (a ggml file):
the table (openai-whisper's, written out) against the heads the CT2 packages carry, which their
converter took from each model's Hugging Face generation_config; and a ggml tiny.en, which has
no heads, timing its words exactly as the CT2 model that has them."""

from __future__ import annotations

import pytest
from fixture_audio import audio

import nwhisper
from nwhisper.alignment_heads import RELEASED, alignment_heads, released
from nwhisper.io.convert import convert


@pytest.mark.parametrize("name", ["tiny.en", "base"])
def test_the_table_is_what_the_packages_carry(models, name):
    m = models(name)
    assert m.checkpoint.alignment_heads
    got = released(m.dims)
    assert got[0] == name and got[1] == [tuple(h) for h in m.checkpoint.alignment_heads]


def test_every_entry_fits_its_shape():
    heads = {384: 6, 512: 8, 768: 12, 1024: 16, 1280: 20}
    for (width, layers, _, _), (name, pairs) in RELEASED.items():
        assert pairs == sorted(set(pairs)), name
        assert all(0 <= l < layers and 0 <= h < heads[width] for l, h in pairs), name


def test_a_ggml_file_times_words_as_the_checkpoint_with_heads(models, tmp_path):
    ct2 = models("tiny.en")
    path = convert("tiny.en", str(tmp_path / "ggml-tiny.en.bin"), to="ggml")
    gg = nwhisper.load(path, device="cpu")
    assert not gg.checkpoint.alignment_heads
    assert alignment_heads(gg.checkpoint, gg.dims) == alignment_heads(ct2.checkpoint, ct2.dims)
    x = audio("jfk.wav")
    words = []
    for m in (ct2, gg):
        segments, _ = m.transcribe(x, word_timestamps=True)
        segments = list(segments)
        words.append([(w.word, w.start, w.end) for s in segments for w in s.words])
    assert words[0] and words[0] == words[1]
