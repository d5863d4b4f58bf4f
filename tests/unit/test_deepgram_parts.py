"""Deepgram's query parameters and response shapes without a server (deepgram_fields.py).

Truth: the parameter table in the module (Deepgram's documented names and types) and the SDK's
own response model (deepgram-sdk 7.x, ListenV1Response validated strictly). The parser is
fuzzed: any query gives a ListenAsk or a DeepgramError, never another exception.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nwhisper.records import Segment, TranscriptionInfo, Word
from nwhisper.server.deepgram_fields import (ACCEPTED, REFUSED, DeepgramError, ListenAsk, LiveAsk,
                                             listen_params, live_params, live_results, plain, prerecorded,
                                             raw_channels)

NAMES = ["language", "detect_language", "punctuate", "smart_format", "utterances", "utt_split",
         "keywords", "keyterm", "multichannel", "model", "encoding", "sample_rate", "channels",
         "interim_results", "endpointing", "utterance_end_ms", "vad_events", "diarize",
         *ACCEPTED, *REFUSED, "nonsense"]


def q(**kw):
    return {k: [v.encode() if isinstance(v, str) else v for v in (vs if isinstance(vs, list) else [vs])]
            for k, vs in kw.items()}


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(NAMES), st.lists(st.binary(max_size=12) | st.text(max_size=12).map(str.encode),
                                                        max_size=3), max_size=6))
def test_fuzz_any_query_gives_an_ask_or_a_deepgram_error(args):
    for parse, kind in ((listen_params, ListenAsk), (live_params, LiveAsk)):
        try:
            assert isinstance(parse(args), kind)
        except DeepgramError as e:
            assert e.status == 400 and str(e)


def test_live_parameters():
    a = live_params(q(encoding="linear16", sample_rate="16000", interim_results="true",
                      endpointing="10", utterance_end_ms="1000", vad_events="true"))
    assert (a.interim, a.pause_ms, a.utterance_end_ms, a.vad_events) == (True, 200, 1000, True)
    assert live_params(q(encoding="mulaw", sample_rate="8000", endpointing="false")).pause_ms is None
    assert live_params(q()).listen.encoding is None                  # a container (WebM, Ogg)
    assert live_params(q(encoding="opus")).listen.encoding == "opus"
    for args, says in [(q(encoding="speex"), "encoding 'speex'"),
                       (q(encoding="linear16", sample_rate="16000", multichannel="true"), "pre-recorded only"),
                       (q(encoding="linear16", sample_rate="16000", endpointing="soon"), "endpointing")]:
        with pytest.raises(DeepgramError, match=says):
            live_params(args)


def test_parameters_read():
    a = listen_params(q(language="en-US", punctuate="true", utterances="true", utt_split="1.5",
                        keywords=["Zorblax:3", "Vintrella"], keyterm=["Quenteroth", "Zorblax"],
                        multichannel="false", model="nova-3", tag="x", mip_opt_out="true"))
    assert (a.language, a.punctuate, a.utterances, a.utt_split, a.model) == ("en-us", True, True, 1.5, "nova-3")
    assert a.hotwords == "Zorblax, Vintrella, Quenteroth" and not a.multichannel
    assert listen_params(q(smart_format="true")).punctuate
    assert listen_params(q(diarize="true")).diarize and not listen_params(q()).diarize
    assert listen_params(q(language="multi")).language is None
    raw = listen_params(q(encoding="mulaw", sample_rate="8000", channels="2"))
    assert (raw.encoding, raw.sample_rate, raw.channels) == ("mulaw", 8000, 2)


@pytest.mark.parametrize("args, says", [
    (q(redact="pci"), "does not do redact"),
    (q(callback="http://x"), "does not do callback"),
    (q(punctuate="maybe"), "punctuate takes true or false"),
    (q(sample_rate="0", encoding="linear16"), "sample_rate must be"),
    (q(encoding="linear16"), "give its sample_rate"),
    (q(encoding="flac"), "encoding 'flac'"),
    (q(utt_split="nan"), "utt_split must be"),
    (q(keyterm=["x"] * 501), "more than 500"),
])
def test_parameters_refused(args, says):
    with pytest.raises(DeepgramError, match=says):
        listen_params(args)


def test_raw_audio_bodies():
    a = listen_params(q(encoding="linear16", sample_rate="16000", channels="2"))
    left, right = raw_channels(b"\x00\x40\x00\xc0" * 3, a)
    assert list(left) == [0.5] * 3 and list(right) == [-0.5] * 3
    with pytest.raises(DeepgramError, match="whole number"):
        raw_channels(b"\x00\x40\x00", a)


def test_plain_words():
    assert [plain(w) for w in [" Hello,", " don't", " U.S.", " —", " (yes)"]] == ["hello", "don't", "u.s", "", "yes"]


def test_the_response_passes_the_sdks_model():
    from deepgram.types.listen_v1response import ListenV1Response

    words = [Word(0.5, 0.9, " Hello,", 0.9), Word(1.0, 1.4, " world.", 0.7), Word(3.0, 3.5, " Again.", 0.8)]
    seg = Segment(0, 0, 0.5, 3.5, " Hello, world. Again.", [], -0.2, 0.01, words=words)
    info = TranscriptionInfo("en", 0.99, 4.0)
    ask = ListenAsk(punctuate=True, utterances=True, model="nova-3")
    body = prerecorded([([seg], info)], ask, b"abc", 4.0, "tiny.en", "0.1.0", "rid")
    r = ListenV1Response.model_validate(body)
    alt = r.results.channels[0].alternatives[0]
    assert alt.transcript == "Hello, world. Again." and [w.word for w in alt.words] == ["hello", "world", "again"]
    assert [u.transcript for u in r.results.utterances] == ["Hello, world.", "Again."]
    assert r.results.channels[0].detected_language == "en"        # no language asked: detected
    assert abs(alt.confidence - 0.8) < 1e-9 and r.metadata.request_id == "rid"


def test_live_words_carry_the_finals_speaker():
    m = {"text": " Ten of clubs.", "t0": 1.0, "t1": 2.0, "speaker": "SPEAKER_01",
         "words": [(1.1, 1.3, " Ten", 0.9), (1.3, 1.5, " of", 0.8), (1.5, 1.9, " clubs.", 0.7)]}
    model = ("uid", {"name": "tiny.en"})
    with_them = live_results(m, ListenAsk(diarize=True), "rid", model, final=True)
    assert [w["speaker"] for w in with_them["channel"]["alternatives"][0]["words"]] == [1, 1, 1]
    without = live_results(m, ListenAsk(), "rid", model, final=True)
    assert all("speaker" not in w for w in without["channel"]["alternatives"][0]["words"])
