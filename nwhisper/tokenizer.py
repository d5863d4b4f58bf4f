"""Whisper's tokenizer: text ↔ token ids, and the special tokens that steer decoding.

A Whisper vocabulary is GPT-2's byte-level BPE (50 256 base words for English-only models,
50 257 for multilingual ones) followed by control tokens in a fixed order:

    <|endoftext|> <|startoftranscript|> <|en|> <|zh|> … (one per language)
    <|translate|> <|transcribe|> <|startoflm|> <|startofprev|> <|nospeech|> <|notimestamps|>
    <|0.00|> <|0.02|> … <|30.00|>                          (the rest of the vocabulary)

Two sources feed the same `Tokenizer`:

- a `tokenizer.json` (Hugging Face and CTranslate2 directories), read with the `tokenizers`
  package; the control tokens are looked up there by name.
- raw base words with no control tokens at all (whisper.cpp's ggml files; a CTranslate2
  `vocabulary.txt`). The control tokens are then synthesised at the ids whisper.cpp gives them
  by position (src/whisper.cpp, `whisper_vocab` and the vocabulary load in `whisper_model_load`):
  EOT is 50256 (English-only) or 50257 (multilingual, n_vocab ≥ 51865); SOT follows EOT; then
  one token per language, n_vocab − 51765 − is_multilingual of them (99, or 100 for large-v3's
  51866-entry vocabulary); then translate, transcribe, startoflm, startofprev, nospeech,
  notimestamps; the timestamps fill the rest. Encoding is byte-pair merging in which a word's id
  is its merge rank (openai-whisper's tiktoken files are exactly these ranks).

Both sources spell the control tokens the current openai-whisper way (`<|nospeech|>`, `<|he|>`);
the older spellings some tokenizer.json files carry (`<|nocaptions|>`, `<|iw|>`) are accepted on
lookup, so the same weights give the same text from every container.

Text is encoded literally: "<|en|>" typed into a prompt is six characters, never a control token.
"""

from __future__ import annotations

import tokenizers
from tokenizers import pre_tokenizers

from .io.bytelevel import byte_level_to_bytes, bytes_to_byte_level
from .io.checkpoint import LANGUAGE_CODES, TASK_TOKENS, special_names  # noqa: F401 (re-exported)

# Older spellings some vocabularies use → the spelling this module speaks.
ALIASES = {"<|nocaptions|>": "<|nospeech|>", "<|iw|>": "<|he|>"}

# Base words: GPT-2's byte-level vocabulary, plus one (empty) word in the multilingual one.
N_BASE_ENGLISH = 50256
N_BASE_MULTILINGUAL = 50257

# openai-whisper's non-speech symbols: a token that spells one of these alone (or after a space)
# is suppressed by default, as are all tokens of the musical signs.
NON_SPEECH_SYMBOLS = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』') + \
    "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
MUSIC_SIGNS = "♩♪♫♬♭♮♯"


def timestamp_name(i):
    """The spelling of the i-th timestamp token: 0.02 s per step, `<|1.08|>` for i = 54."""
    cs = 2 * i  # centiseconds, so the text is exact (no float rounding)
    return f"<|{cs // 100}.{cs % 100:02d}|>"


class Tokenizer:
    """Text ↔ ids for one Whisper vocabulary, with its control tokens by name and by role.

    Build it with `Tokenizer.from_checkpoint(ck)`."""

    def __init__(self, text, specials, timestamp_begin, n_vocab, multilingual):
        """`text`: the base-word codec (ids < eot); `specials`: control-token spelling → id for
        every control token below the timestamps (language tokens included)."""
        self._text = text
        self._n_vocab = n_vocab
        self._multilingual = multilingual
        self._timestamp_begin = timestamp_begin
        self._by_name = dict(specials)
        self._by_id = {i: name for name, i in specials.items()}
        for name in ("<|endoftext|>", "<|startoftranscript|>") + TASK_TOKENS:
            if name not in self._by_name:
                raise ValueError(f"the vocabulary has no {name} token; it is not a Whisper vocabulary")
        self._eot = self._by_name["<|endoftext|>"]
        sot = self._by_name["<|startoftranscript|>"]
        # The language tokens are the ones between <|startoftranscript|> and <|translate|>.
        lang_ids = range(sot + 1, self._by_name["<|translate|>"])
        if any(i not in self._by_id for i in lang_ids):
            raise ValueError("the vocabulary's language tokens are not contiguous between "
                             "<|startoftranscript|> and <|translate|>; it is not a Whisper vocabulary")
        self._languages = [(self._by_id[i][2:-2], i) for i in lang_ids]
        self._non_speech = None

    @classmethod
    def from_checkpoint(cls, ck):
        """The tokenizer of a loaded `Checkpoint`: its tokenizer.json when it has one, else its
        raw base words (`ck.vocab_bytes`) with the control tokens placed by whisper.cpp's rule."""
        n_vocab, multilingual = ck.dims.n_vocab, ck.dims.is_multilingual
        if ck.tokenizer_json:
            return cls._from_tokenizer_json(ck.tokenizer_json, n_vocab, multilingual)
        if ck.vocab_bytes is not None:
            return cls._from_raw_words(ck.vocab_bytes, n_vocab, multilingual,
                                       ck.dims.num_languages, ck.path)
        raise ValueError(f"{ck.path}: the model carries no vocabulary (no tokenizer.json and no word list)")

    @classmethod
    def _from_tokenizer_json(cls, path, n_vocab, multilingual):
        try:
            tok = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # the tokenizers package raises its own exception type
            raise ValueError(f"{path}: cannot read the tokenizer: {e}") from None
        eot = tok.token_to_id("<|endoftext|>")
        if eot is None:
            raise ValueError(f"{path}: the tokenizer has no <|endoftext|> token; it is not a Whisper tokenizer")
        specials, ts_begin = {}, None
        for i, added in tok.get_added_tokens_decoder().items():
            name = ALIASES.get(added.content, added.content)
            if name == "<|0.00|>":
                ts_begin = i
            elif i >= eot and not _is_timestamp_name(name):
                specials[name] = i
        if "<|notimestamps|>" not in specials:
            raise ValueError(f"{path}: the tokenizer has no <|notimestamps|> token; it is not a Whisper tokenizer")
        # Some English-only tokenizer.json files stop at <|notimestamps|>; the timestamps the
        # model still predicts come right after it (openai-whisper: timestamp_begin is the id
        # after the last control token).
        if ts_begin is None:
            ts_begin = specials["<|notimestamps|>"] + 1
        return cls(_JsonText(tok, eot), specials, ts_begin, n_vocab, multilingual)

    @classmethod
    def _from_raw_words(cls, words, n_vocab, multilingual, num_languages, path):
        n_base = N_BASE_MULTILINGUAL if multilingual else N_BASE_ENGLISH
        if len(words) < n_base:
            raise ValueError(f"{path}: the vocabulary has {len(words)} words, expected at least {n_base} "
                             f"base words for a{' multilingual' if multilingual else 'n English-only'} model")
        if not 0 < num_languages <= len(LANGUAGE_CODES):
            raise ValueError(f"{path}: n_vocab = {n_vocab} implies {num_languages} language tokens; "
                             f"a Whisper vocabulary has 1 to {len(LANGUAGE_CODES)}")
        # Anything past the base words (a CTranslate2 vocabulary.txt spells the control tokens)
        # is ignored: the control tokens' ids follow from the rule, not from their text.
        names = special_names(num_languages)
        specials = {name: n_base + k for k, name in enumerate(names)}
        return cls(_RawText(words[:n_base]), specials, n_base + len(names), n_vocab, multilingual)

    # --- ids of the control tokens --------------------------------------------------------

    @property
    def eot(self):
        return self._eot

    @property
    def sot(self):
        return self._by_name["<|startoftranscript|>"]

    @property
    def translate(self):
        return self._by_name["<|translate|>"]

    @property
    def transcribe(self):
        return self._by_name["<|transcribe|>"]

    @property
    def sot_lm(self):
        return self._by_name["<|startoflm|>"]

    @property
    def sot_prev(self):
        return self._by_name["<|startofprev|>"]

    @property
    def no_speech(self):
        return self._by_name["<|nospeech|>"]

    @property
    def no_timestamps(self):
        return self._by_name["<|notimestamps|>"]

    @property
    def timestamp_begin(self):
        """The id of <|0.00|>; timestamp i (i × 0.02 s) is timestamp_begin + i."""
        return self._timestamp_begin

    @property
    def n_vocab(self):
        return self._n_vocab

    @property
    def is_multilingual(self):
        return self._multilingual

    @property
    def languages(self):
        """[(code, id)] for every language token, in id order: [('en', 50259), ('zh', 50260), …]."""
        return list(self._languages)

    def language_id(self, code):
        """The id of the token for a language code ('fi', 'FI' → <|fi|>)."""
        name = f"<|{str(code).strip().lower()}|>"
        i = self._by_name.get(ALIASES.get(name, name))
        if i is None or not self.sot < i < self.translate:
            known = ", ".join(c for c, _ in self._languages)
            raise ValueError(f"unknown language code '{code}'; this model knows: {known}")
        return i

    def special(self, name):
        """The id of a control or timestamp token by its exact spelling, e.g. '<|transcribe|>'."""
        i = self._special_id(name)
        if i is None:
            raise ValueError(f"the vocabulary has no control token {name!r}")
        return i

    def token_to_id(self, name):
        """The id of a token by its spelling, or None: control and timestamp tokens as
        '<|…|>', base words in the byte-level spelling of tokenizer.json ('Ġthe')."""
        i = self._special_id(name)
        return i if i is not None else self._text.word_id(name)

    def id_to_token(self, i):
        """The spelling of one token (the inverse of `token_to_id`)."""
        self._check_id(i)
        if i < self._eot:
            return bytes_to_byte_level(self._text.word_bytes(i))
        return self._special_name(i)

    def _special_id(self, name):
        name = ALIASES.get(name, name)
        i = self._by_name.get(name)
        if i is None and _is_timestamp_name(name):
            cs = round(float(name[2:-2]) * 100)
            if cs % 2 == 0 and self._timestamp_begin + cs // 2 < self._n_vocab:
                i = self._timestamp_begin + cs // 2
        return i

    def _special_name(self, i):
        if i >= self._timestamp_begin:
            return timestamp_name(i - self._timestamp_begin)
        return self._by_id.get(i, f"<|extra_{i}|>")

    def _check_id(self, i):
        if not 0 <= i < self._n_vocab:
            raise ValueError(f"token id {i} is outside the vocabulary (0 … {self._n_vocab - 1})")

    # --- text ----------------------------------------------------------------------------

    def encode(self, text):
        """Text → base-word ids; no control tokens are added (and none are recognised)."""
        return self._text.encode(text)

    def decode(self, ids, skip_special=False):
        """Ids → text. Control and timestamp tokens are written as their spelling ('<|en|>',
        '<|1.08|>') unless `skip_special`, which drops every id ≥ eot. A character split across
        tokens is joined before UTF-8 decoding; undecodable bytes become U+FFFD."""
        out, run = [], bytearray()
        for i in ids:
            i = int(i)
            self._check_id(i)
            if i < self._eot:
                run += self._text.word_bytes(i)
            elif not skip_special:
                out.append(run.decode("utf-8", errors="replace"))
                out.append(self._special_name(i))
                run = bytearray()
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def decode_with_timestamps(self, ids):
        """Ids → text with the timestamp tokens written as '<|1.08|>' and the other control
        tokens left out (faster-whisper's rendering)."""
        return self.decode([i for i in ids if int(i) < self._eot or int(i) >= self._timestamp_begin])

    # --- the prompt and the suppressed tokens --------------------------------------------

    def sot_sequence(self, language=None, task="transcribe", timestamps=True):
        """The decoder's start: [sot, <|lang|>, <|task|>] on a multilingual model, [sot] on an
        English-only one; with `timestamps=False`, <|notimestamps|> is appended."""
        if task not in ("transcribe", "translate"):
            raise ValueError(f"unknown task '{task}'; expected 'transcribe' or 'translate'")
        seq = [self.sot]
        if self._multilingual:
            if language is None:
                raise ValueError("a multilingual model needs a language; detect it first "
                                 "(language detection decodes one step from [sot])")
            seq += [self.language_id(language), self.special(f"<|{task}|>")]
        else:
            if language is not None and str(language).strip().lower() != "en":
                self.language_id(language)  # an unknown code gets the unknown-code error
                raise ValueError(f"this model is English-only; it cannot transcribe language '{language}'")
            if task == "translate":
                raise ValueError("this model is English-only; it cannot translate")
        if not timestamps:
            seq.append(self.no_timestamps)
        return seq

    def non_speech_tokens(self):
        """openai-whisper's default suppressed tokens, sorted: tokens that spell a speaker tag,
        a bracket, a formatting symbol or a musical sign rather than speech.

        A symbol counts when it (or space + symbol) encodes to ONE token; the musical signs are
        multi-byte, so the first token of each is suppressed whatever it is (it is a byte
        fragment that starts those signs). Tokens starting a hyphen or quote after a space
        (' -', " '") are suppressed too. Control tokens are not included."""
        if self._non_speech is None:
            ids = {self.encode(" -")[0], self.encode(" '")[0]}
            for symbol in NON_SPEECH_SYMBOLS + list(MUSIC_SIGNS):
                for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                    if len(tokens) == 1 or symbol in MUSIC_SIGNS:
                        ids.add(tokens[0])
            self._non_speech = sorted(ids)
        return list(self._non_speech)


def _is_timestamp_name(name):
    body = name[2:-2]
    return name.startswith("<|") and name.endswith("|>") and body.replace(".", "", 1).isdigit() \
        and "." in body


class _JsonText:
    """Base words through a tokenizer.json's byte-level BPE (the `tokenizers` package)."""

    def __init__(self, tok, eot):
        self._tok = tok
        self._eot = eot
        self._bytes = {}  # id → raw bytes, of the ids decoded so far

    def encode(self, text):
        # Pre-tokenise and run the BPE model directly, so the added tokens ('<|en|>',
        # '<|0.00|>' …) are never matched inside text.
        ids = []
        for piece, _ in self._tok.pre_tokenizer.pre_tokenize_str(text):
            ids += [t.id for t in self._tok.model.tokenize(piece)]
        return ids

    def word_bytes(self, i):
        # One id at a time: a transcription meets a few hundred of the 50 K words, and
        # converting them all at its first decode cost ~0.1 s of every command.
        b = self._bytes.get(i)
        if b is None:
            if not 0 <= i < self._eot:
                raise IndexError(f"token {i} is not a base word (those are 0..{self._eot - 1})")
            word = self._tok.id_to_token(i)
            b = self._bytes[i] = b"" if word is None else byte_level_to_bytes(word)
        return b

    def word_id(self, word):
        i = self._tok.model.token_to_id(word)
        return i if i is not None and i < self._eot else None


class _RawText:
    """Base words given as raw bytes in merge-rank order (ggml, vocabulary.txt).

    Encoding is GPT-2's: split the text with GPT-2's pre-tokenisation pattern, then within each
    piece repeatedly merge the adjacent pair whose concatenation is the lowest-ranked word, until
    no adjacent pair forms a word. The rank table is built at the first encode, not at load."""

    _pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    _CACHE_MAX = 1 << 16

    def __init__(self, words):
        self._words = words
        self._ranks = None
        self._cache = {}

    def _rank_table(self):
        if self._ranks is None:
            ranks = {}
            for i, w in enumerate(self._words):
                ranks.setdefault(bytes(w), i)  # a duplicated word keeps its lowest rank
            self._ranks = ranks
        return self._ranks

    def encode(self, text):
        ids = []
        for piece, _ in self._pre.pre_tokenize_str(text):
            ids += self._bpe(byte_level_to_bytes(piece))
        return ids

    def _bpe(self, piece):
        hit = self._cache.get(piece)
        if hit is not None:
            return hit
        ranks = self._rank_table()
        parts = [piece[k:k + 1] for k in range(len(piece))]
        while len(parts) > 1:
            best, at = None, -1
            for k in range(len(parts) - 1):
                r = ranks.get(parts[k] + parts[k + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, k
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        try:
            out = [ranks[p] for p in parts]
        except KeyError as e:
            raise ValueError(f"the vocabulary has no word for byte {e.args[0]!r}; it is not a byte-level vocabulary") from None
        if len(self._cache) >= self._CACHE_MAX:
            self._cache.clear()
        self._cache[piece] = out
        return out

    def word_bytes(self, i):
        return bytes(self._words[i])

    def word_id(self, word):
        return self._rank_table().get(byte_level_to_bytes(word))
