"""Windows decoded together (GreedyDecoder.decode_windows, Whisper.decode_batch over a batch of
windows) against the same windows decoded one at a time, the path the other oracle tests hold
to Hugging Face and faster-whisper: token for token, and every step's log-probability equal;
and the batched mode against faster-whisper's own on the chunks it makes (features-batched.json,
fixtures/make_golden_features.py --only batched)."""

import difflib
import os
import re

import numpy as np
import pytest
from fixture_audio import audio, MODELS
from paths import FIXTURES, golden

from nwhisper import mel as M
from nwhisper.decoding import DecodingOptions

# Clips of speech, noise and silence: windows that end after a few tokens and after many
CLIPS = ["jfk.wav", "forever.wav", "cards/001.wav", "espeak/en-11s.flac",
         "librivox/sense_and_sensibility_01_austen_64kb-0870.flac", "chan3.wav"]


def windows(m):
    """Encoder states of each clip's first 30 s and of a second of silence."""
    clips = [audio(c)[:M.N_SAMPLES] for c in CLIPS] + [np.zeros(16000, np.float32)]
    return [m.model.encode(M.log_mel(x, m.dims.n_mels, 2 * m.dims.n_audio_ctx)) for x in clips]


@pytest.mark.parametrize("name,compute_type,timestamps", [
    ("tiny.en", "float32", False), ("tiny.en", "int8", True), ("base", "float32", True), ("base", "int8", False)])
def test_windows_decoded_together_equal_one_at_a_time(models, name, compute_type, timestamps):
    m = models(name, compute_type)
    decoder = m._transcriber.decoder
    options = DecodingOptions(language="en" if m.dims.is_multilingual else None, timestamps=timestamps)
    encs = windows(m)
    alone = [decoder.decode(enc, options) for enc in encs]
    together = decoder.decode_windows(encs, options)
    assert len({len(r.tokens) for r in alone}) > 1, "the windows should end at different steps"
    for clip, a, t in zip(CLIPS + ["silence"], alone, together):
        assert t.tokens == a.tokens, f"{clip}: {t.text!r} together, {a.text!r} alone"
        assert (t.sum_logprob, t.no_speech_prob, t.text) == (a.sum_logprob, a.no_speech_prob, a.text), clip


def test_decode_windows_refuses_what_it_does_not_do(models):
    m = models("tiny.en")
    decoder = m._transcriber.decoder
    enc = windows(m)[:1]
    with pytest.raises(ValueError, match="greedily"):
        decoder.decode_windows(enc, DecodingOptions(temperature=0.4))
    with pytest.raises(ValueError, match="greedily"):
        decoder.decode_windows(enc, DecodingOptions(beam_size=3))


def speech_with_pauses():
    """Fixture speech with pauses between the clips (2.5 s: the Silero chunks' closing
    silence is 2 s) and one clip over 30 s: about 110 s."""
    gap = np.zeros(40000, np.float32)
    parts = []
    for c in ["jfk.wav", "espeak/en-63s.flac", "forever.wav", "cards/001.wav",
              "librivox/sense_and_sensibility_01_austen_64kb-0870.flac", "cards/003.wav"]:
        parts += [audio(c), gap]
    return np.concatenate(parts)


@pytest.mark.parametrize("name,compute_type,timestamps,words", [
    ("tiny.en", "float32", False, False), ("base", "int8", True, True)])
def test_transcribe_batched_equals_each_window_alone(models, monkeypatch, name, compute_type,
                                                     timestamps, words):
    """transcribe(batch_size=2): each window it decodes — a chunk of the speech
    (regions.speech_chunks: Silero, at most 30 s each, the clip over 30 s cut in two), the rest
    of a chunk whose text ended over REST_S before its speech did, alone or in the window of a
    later chunk with room for it (sources.requeue) — gives the segments (tokens, text, times on
    the recording's clock, word timings) that transcribing that window's joined speech alone
    with timestamps gives (the batched mode decodes timestamp tokens whether or not they are
    asked for, as the long form does); the segments go out in the recording's order; every
    chunk's speech is decoded, and every clip's words are in the text."""
    from nwhisper import sources, transcribe
    from nwhisper.vad import regions

    m = models(name, compute_type)
    x = speech_with_pauses()
    lang = {"language": "en"} if m.dims.is_multilingual else {}
    lang["word_timestamps"] = words
    windows = []
    decode = transcribe.Transcriber._decode_windows

    def seen_windows(self, run, group, encs):
        windows.extend(p.spans for p in group)
        return decode(self, run, group, encs)
    monkeypatch.setattr(transcribe.Transcriber, "_decode_windows", seen_windows)
    segments, info = m.transcribe(x, batch_size=2, timestamps=timestamps, **lang)
    together = list(segments)
    monkeypatch.undo()
    chunks = regions.speech_chunks(x)
    pieces = [r for c in chunks for r in c]
    assert len(chunks) >= 4 and max(len(c) for c in chunks) > 1        # chunks of several regions
    assert all(sum(b - a for a, b in c) <= 30 * 16000 for c in chunks)
    assert any(b == a2 for (_, b), (a2, _) in zip(pieces, pieces[1:]))  # the 63 s region cut
    assert windows[:2] == chunks[:2]                                   # the first batch
    assert all(sum(b - a for a, b in w) <= 30 * 16000 for w in windows)
    assert set(pieces) <= {r for w in windows for r in w}
    alone = []
    for spans in windows:
        piece = sources.chunk_piece(x, spans)
        segs = list(m.transcribe(piece.samples, timestamps=True, **lang)[0])
        alone += piece.clock.place(segs)
    rests = [w for w in windows if w not in chunks]
    print(f"{len(chunks)} chunks, {len(windows)} windows; rests decoded again, alone or with a "
          f"chunk: {rests}")
    assert rests, "no window left speech to decode again: that path went untested"

    def seen(segments):
        return [(s.tokens, s.text, s.start, s.end, [(w.word, w.start, w.end) for w in s.words or []])
                for s in segments]
    assert seen(together) == seen(sorted(alone, key=lambda s: s.start))
    assert [s.start for s in together] == sorted(s.start for s in together)
    assert all(s.words for s in together) == words
    assert [s.id for s in together] == list(range(1, len(together) + 1))
    text = " ".join(s.text for s in together).lower()
    # the 63 s clip's last words: base int8 hears "Nothing care needs ..." where the CPU has VNNI
    # and BF16 (the blocked int8 attention), float32 and the AVX2 path "Nothing here needs ..."
    for heard in ("ask not what your country", "go on forever", "needs a network connection", "dashwood"):
        assert heard in text, heard
    assert info.language == "en" and 0 < info.duration_after_vad < info.duration


@pytest.mark.parametrize("name", MODELS)
def test_batched_mode_on_faster_whispers_chunks(models, name, monkeypatch):
    """The 63 s clip cut into the chunks faster-whisper's batched mode makes (its VAD and packing,
    from the golden file): transcribe(batch_size=8) gives each chunk HF's short-form segments of
    that chunk's joined audio, token for token (then, where the text ended early, the rest of
    the chunk's speech, which HF's single window does not decode); and its words are at least as
    close to the clip's script as faster-whisper BatchedInferencePipeline's on the same chunks
    (it pads each chunk in the log-mel domain, HF in samples: a convention, so no token match)."""
    from nwhisper.vad import regions

    g = golden("features-batched.json")
    x = audio(g["clip"], g["audio_sha256"])
    chunks = [[tuple(r) for r in c] for c in g["chunks"]]
    monkeypatch.setattr(regions, "speech_chunks", lambda samples, *args, **kw: chunks)
    m = models(name)
    segments, _ = m.transcribe(x, batch_size=8, language="en" if m.dims.is_multilingual else None)
    segments = list(segments)
    for c, hf in zip(chunks, g["models"][name]["hf_chunks"]):
        mine = [s for s in segments if c[0][0] / 16000 - 0.5 <= s.start < c[-1][1] / 16000]
        assert [s.tokens for s in mine[:len(hf)]] == [h["tokens"] for h in hf], \
            f"chunk at {c[0][0] / 16000:.2f} s: ours {[s.text for s in mine]}, HF {[h['text'] for h in hf]}"
    with open(os.path.join(FIXTURES, g["clip"].rsplit(".", 1)[0] + ".txt"), encoding="utf-8") as f:
        script = f.read()

    def agreement(text):
        def words(t):
            return re.sub(r"[^a-z0-9' ]", " ", t.lower()).split()
        return difflib.SequenceMatcher(None, words(text), words(script)).ratio()
    ours = agreement(" ".join(s.text for s in segments))
    peer = agreement(" ".join(s["text"] for s in g["models"][name]["segments"]))
    print(f"{name}: word agreement with the script {ours:.3f}, faster-whisper batched {peer:.3f}")
    assert ours >= peer


def test_batch_size_options_are_checked(models):
    m = models("tiny.en")
    x = audio("jfk.wav")
    for bad, match in [({"batch_size": 0}, "batch_size"), ({"batch_size": 2, "beam_size": 3}, "greedily"),
                       ({"batch_size": 2, "temperature": 0.5}, "greedily"),
                       ({"batch_size": 2, "audio_ctx": 500}, "one window")]:
        with pytest.raises(ValueError, match=match):
            m.transcribe(x, **bad)
    with pytest.raises(ValueError, match="Silero"):
        m.transcribe(x, batch_size=2, vad="energy")


def test_the_command_takes_batch_size():
    """`nwhisper transcribe --batch-size 4 --timestamps`: the batched segments on stdout, on the
    recording's clock, as the Python call gives them."""
    from click.testing import CliRunner

    from nwhisper.cli.main import cli
    from paths import fixture

    r = CliRunner().invoke(cli, ["transcribe", fixture("espeak/en-63s.flac"), "--batch-size", "4", "--timestamps"])
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) >= 2 and lines[0].startswith("[00:00.") and "nothing here needs" in r.output.lower()
