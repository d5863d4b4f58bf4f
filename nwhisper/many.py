"""Several short recordings transcribed together: each encoded alone, their windows decoded in
one batch (the decoder's weights read once a step for all of them), each answer the one it
would have alone.

    results = transcribe_many(transcriber, [samples, ...], options, cancelled=[None, ...])
    # each: (segments, TranscriptionInfo), or the exception its own transcription raised

This is how a server serves what is queued at once (server/inference.py): HTTP requests and
live streams' finals with the same options. Only the short form batches — one window of at
most 30 s each, greedy at the first temperature (GreedyDecoder.decode_windows: token for token
what decode gives; best_of is for the later temperatures, run alone) — and `batchable` says which options allow it. What follows the greedy pass
is each recording's own, exactly as in Transcriber._short_form: a window failing the fallback
thresholds is decoded again alone at the next temperatures, and its segments (and word timings)
are cut from its own result.
"""

from __future__ import annotations

from . import mel as M
from .records import TranscriptionInfo
from .transcribe import _numbered


def batchable(opts, n_samples):
    """Whether a recording of n_samples with TranscribeOptions opts can join a batch."""
    return (n_samples <= M.N_SAMPLES and opts.beam_size in (None, 1) and opts.audio_ctx is None and opts.hallucination_silence_threshold is None
            and opts.batch_size <= 1)


def transcribe_many(tr, audios, opts, cancelled=None):
    """tr: a Transcriber; audios: 16 kHz float32 samples, each `batchable` with opts; cancelled:
    one cancelled() (or None) per recording, asked between its encoder's layers."""
    cancelled = cancelled or [None] * len(audios)
    out = [None] * len(audios)
    windows = []                 # (index, samples, enc, (lang, p, probs))
    for i, (x, stop) in enumerate(zip(audios, cancelled)):
        try:
            enc = tr._encode(x, tr.n_frames, stop)
            windows.append((i, x, enc, tr._language(enc, opts.language)))
        except Exception as e:   # Cancelled, or this recording's own failure: the rest go on
            out[i] = e
    prompt = tr._initial_prompt(opts)
    for lang in dict.fromkeys(w[3][0] for w in windows):     # one batch per language, in order
        group = [w for w in windows if w[3][0] == lang]
        greedy = tr._options(opts, lang, opts.timestamps, prompt, opts.temperature[0])
        try:
            firsts = tr.decoder.decode_windows([w[2] for w in group], greedy)
        except Exception as e:   # the batch's own failure is each of its recordings'
            for w in group:
                out[w[0]] = e
            continue
        for (i, x, enc, (_, lang_p, probs)), first in zip(group, firsts):
            try:
                duration = len(x) / M.SAMPLE_RATE
                res = tr._decode(enc, opts, lang, opts.timestamps, prompt, first=first)
                segments = tr._window_segments(x, duration, enc, res, opts, lang, tr.n_frames)
                out[i] = (_numbered(segments), TranscriptionInfo(lang, lang_p, duration, probs))
            except Exception as e:
                out[i] = e
    return out
