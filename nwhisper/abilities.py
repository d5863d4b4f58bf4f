"""What a model can be asked, checked in one place: every door (the API, the CLI, batch, the HTTP
routes, the live streams) turns what its user asked into TranscribeOptions here.

    opts = options(vad, formats=("srt",), language="EN-us", beam_size=5)   # before a model loads
    able = Abilities.of(model.tokenizer, model.dims, "base")
    opts = able.check(opts)            # the language normalised and known, translation possible

An option a door leaves as None takes TranscribeOptions' default (records.py holds each one).
What the model cannot do is an Unsupported error (a ValueError) naming the request's field.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .records import TranscribeOptions
from .tokenizer import ALIASES
from .writers import needs_timestamps


class Unsupported(ValueError):
    """A request this model cannot honour; `param` names the request's field."""

    def __init__(self, message, param):
        super().__init__(message)
        self.param = param


def normalize_language(code):
    """A requested language as a code: 'EN', ' en ', 'en-US', 'en_GB' → 'en' (a region or script
    suffix is dropped); None, '' and 'auto' → None (detect it)."""
    if code is None:
        return None
    c = str(code).strip().lower().replace("_", "-")
    if c in ("", "auto"):
        return None
    base = c.split("-")[0]
    return base if "-" in c and len(base) in (2, 3) else c


def options(vad=False, formats=(), **asked):
    """transcribe()'s keywords as TranscribeOptions, with every check that needs no model (a
    command checks its options once, before it loads one): unknown names, values, and what
    batch_size > 1 cannot take. `asked`: TranscribeOptions' fields (None: the default, where
    None is not a value of the field's own); timestamps also when one of the output `formats`
    (writers.FORMATS) shows them."""
    unknown = sorted(set(asked) - {f.name for f in dataclasses.fields(TranscribeOptions)})
    if unknown:
        raise TypeError(f"transcribe() got an unknown option {unknown[0]!r}; the options are "
                        f"TranscribeOptions' fields")
    asked = {k: v for k, v in asked.items() if v is not None or k not in _DEFAULT_FOR_NONE}
    if needs_timestamps(formats) or asked.get("diarize"):     # a speaker is found by the times
        asked["timestamps"] = True
    if "rttm" in formats and not asked.get("diarize"):
        raise ValueError("the rttm format is the speaker turns: it needs diarize (--diarize)")
    opts = TranscribeOptions(**asked)
    if opts.batch_size > 1 and vad not in (None, False, True, "silero"):
        raise ValueError("batch_size > 1 cuts the speech into chunks with Silero; vad cannot "
                         f"be {vad!r} with it")
    return opts


# fields for which None is no value: a door that leaves them None means their default
_DEFAULT_FOR_NONE = frozenset({"task", "max_tokens", "timestamps", "condition_on_previous_text", "patience",
                               "temperature", "word_timestamps", "batch_size", "prepend_punctuations",
                               "append_punctuations"})


@dataclass(frozen=True)
class Abilities:
    """A model's languages (the codes its tokenizer knows; none for an English-only one but
    'en') and whether it can translate."""

    name: str
    multilingual: bool
    languages: tuple
    aliases: dict = dataclasses.field(default_factory=dict)    # an older code → the model's

    @classmethod
    def of(cls, tok, dims, name="this model"):
        codes = tuple(c for c, _ in tok.languages)
        aliases = {a[2:-2]: b[2:-2] for a, b in ALIASES.items() if b[2:-2] in codes}
        return cls(str(name), bool(dims.is_multilingual), codes, aliases)

    def language(self, code):
        """The code to transcribe in (None: detect it); Unsupported when this model does not
        know it, or is English-only and it is not 'en'."""
        code = normalize_language(code)
        if code is None:
            return None
        code = self.aliases.get(code, code)
        if self.languages and code not in self.languages:
            raise Unsupported(f"unknown language code '{code}'; this model knows: "
                              f"{', '.join(self.languages)}", "language")
        if not self.multilingual and code != "en":
            raise Unsupported(f"{self.name} is English-only; it cannot transcribe language "
                              f"'{code}'", "language")
        return code

    def check(self, opts):
        """opts with its language normalised, once this model can do what they ask."""
        if opts.task == "translate" and not self.multilingual:
            raise Unsupported(f"{self.name} is English-only: it cannot translate", "model")
        return dataclasses.replace(opts, language=self.language(opts.language))
