"""abilities.py: the one check of what a model can be asked, and the one builder of the options
every door passes (pure logic: a tokenizer's language list stands in for a model)."""

import types

import pytest

from nwhisper.abilities import Abilities, Unsupported, normalize_language, options
from nwhisper.records import TranscribeOptions
from nwhisper.writers import needs_timestamps


def able(multilingual=True, codes=("en", "fi", "he")):
    tok = types.SimpleNamespace(languages=[(c, 50259 + i) for i, c in enumerate(codes)])
    return Abilities.of(tok, types.SimpleNamespace(is_multilingual=multilingual), "this model (m)")


@pytest.mark.parametrize("asked, code", [("EN", "en"), (" en ", "en"), ("en-US", "en"), ("en_GB", "en"),
                                         ("yue", "yue"), ("zh-Hant", "zh"), (None, None), ("", None),
                                         ("auto", None), ("AUTO", None)])
def test_a_requested_language_becomes_its_code(asked, code):
    assert normalize_language(asked) == code


def test_languages_are_checked_against_the_model():
    m = able()
    assert m.language("FI") == "fi" and m.language("auto") is None
    assert m.language("iw") == "he"          # openai's older code for Hebrew, as the tokenizer reads it
    with pytest.raises(Unsupported, match="unknown language code 'xx'; this model knows: en, fi, he") as e:
        m.language("xx")
    assert e.value.param == "language" and isinstance(e.value, ValueError)


def test_an_english_only_model_takes_english_and_cannot_translate():
    m = able(multilingual=False, codes=())
    assert m.language("en-US") == "en"
    with pytest.raises(Unsupported, match=r"this model \(m\) is English-only; it cannot transcribe language 'fi'"):
        m.language("fi")
    with pytest.raises(Unsupported, match="English-only: it cannot translate") as e:
        m.check(TranscribeOptions(task="translate"))
    assert e.value.param == "model"
    assert able().check(TranscribeOptions(task="translate", language="FI_fi")).language == "fi"


def test_options_take_the_default_for_what_a_door_left_unset():
    assert options() == TranscribeOptions()
    assert options(task=None, max_tokens=None, temperature=None, batch_size=None) == TranscribeOptions()
    # None is a value of its own for these: no threshold, no beam, detect the language
    o = options(no_speech_threshold=None, logprob_threshold=None, beam_size=None, language=None)
    assert o.no_speech_threshold is None and o.logprob_threshold is None
    assert options(temperature=0.2).temperature == (0.2,)


def test_formats_that_show_times_decode_with_timestamps():
    assert not needs_timestamps(()) and not needs_timestamps(("txt",))
    assert all(needs_timestamps((f,)) for f in ("srt", "vtt", "tsv", "json", "all"))
    assert options(formats=("txt", "srt")).timestamps
    assert not options(formats=("txt",)).timestamps and options(timestamps=True).timestamps


def test_options_refuse_what_needs_no_model_to_refuse():
    with pytest.raises(TypeError, match="unknown option 'beam'"):
        options(beam=5)
    with pytest.raises(ValueError, match="vad cannot be 'energy'"):
        options("energy", batch_size=2)
    with pytest.raises(ValueError, match="decodes greedily"):
        options(batch_size=2, beam_size=5)
