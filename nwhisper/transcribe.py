"""From a recording to segments of text: 30 s windows, the two conventions, the public records.

Whisper's encoder sees exactly 30 s (its positional embedding has 1500 rows), so a recording is
transcribed window by window. Two conventions, each chosen to match a reference exactly:

* Short-form (≤ 30 s), as Hugging Face transformers: the samples are zero-padded to 30 s, one
  window is decoded, with `<|notimestamps|>` unless timestamps were asked for.
* Long-form (> 30 s), as openai-whisper and faster-whisper: the log-mel of the whole recording,
  windows cut from it in the mel domain (the last one zero-padded in the normalised log-mel
  domain, not in samples), decoded WITH timestamp tokens, and the next window starts at the
  last complete timestamp — whether or not timestamps are printed. (A full window decoded with
  `<|notimestamps|>` can stop after one word; both peers avoid that this way.) The previous
  windows' tokens are given as the prompt (openai's condition_on_previous_text).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import mel as M
from .decoding import DecodingOptions, GreedyDecoder, detect_language

INPUT_STRIDE = 2                  # mel frames per encoder position (conv2 has stride 2)
TIME_PER_TOKEN = 0.02             # seconds per timestamp step: HOP · INPUT_STRIDE / SAMPLE_RATE
FRAME_SECONDS = M.HOP_LENGTH / M.SAMPLE_RATE   # 10 ms


@dataclass
class Segment:
    """One piece of the transcript (faster-whisper's record, field for field where it has one)."""

    id: int
    seek: int                     # the window's start, in mel frames
    start: float                  # seconds on the recording's clock
    end: float
    text: str
    tokens: list
    avg_logprob: float
    no_speech_prob: float
    temperature: float = 0.0


@dataclass
class TranscriptionInfo:
    language: str
    language_probability: float
    duration: float               # seconds of audio
    all_language_probs: dict | None = None


def _numbered(segments):
    """Segment ids count from 1 in the order they are returned (faster-whisper's convention)."""
    for i, s in enumerate(segments):
        s.id = i + 1
    return segments


def _pad_window(mel, seek, n_frames):
    """mel[seek : seek+n] zero-padded (in the normalised log-mel domain) to n_frames rows."""
    seg = mel[seek:seek + n_frames]
    if len(seg) == n_frames:
        return np.ascontiguousarray(seg)
    out = np.zeros((n_frames, mel.shape[1]), np.float32)
    out[:len(seg)] = seg
    return out


class Transcriber:
    """Runs the window loop of one model; `transcribe(audio)` → ([Segment], TranscriptionInfo)."""

    def __init__(self, model, tok, ck):
        self.model, self.tok = model, tok
        self.decoder = GreedyDecoder(model, tok, ck)
        self.n_frames = 2 * model.dims.n_audio_ctx

    def _language(self, enc, language):
        if not self.model.dims.is_multilingual:
            return "en", 1.0, None
        if language:
            self.tok.language_id(language)          # validates the code, naming it if unknown
            return language, 1.0, None
        probs, best = detect_language(self.model, self.tok, enc)
        return best, probs[best], probs

    def transcribe(self, audio, language=None, task="transcribe", max_tokens=224,
                   timestamps=False, condition_on_previous_text=True):
        audio = np.asarray(audio, np.float32)
        duration = len(audio) / M.SAMPLE_RATE
        n_mels = self.model.dims.n_mels
        if len(audio) <= M.N_SAMPLES:
            return self._short_form(audio, duration, n_mels, language, task, max_tokens, timestamps)
        return self._long_form(audio, duration, n_mels, language, task, max_tokens, condition_on_previous_text)

    def _short_form(self, audio, duration, n_mels, language, task, max_tokens, timestamps):
        mel = M.log_mel(audio, n_mels, self.n_frames)
        enc = self.model.encode(mel)
        lang, lang_p, probs = self._language(enc, language)
        opts = DecodingOptions(task=task, language=lang, max_tokens=max_tokens, timestamps=timestamps)
        res = self.decoder.decode(enc, opts)
        info = TranscriptionInfo(lang, lang_p, duration, probs)
        if timestamps:
            segments = self._split(res, 0, 0.0, self.n_frames, [])[0]
        else:
            segments = [self._segment(0, 0, 0.0, duration, res.tokens, res)]
        return _numbered([s for s in segments if s.text.strip()]), info

    def _long_form(self, audio, duration, n_mels, language, task, max_tokens, condition):
        content = len(audio) // M.HOP_LENGTH
        mel = M.log_mel(audio, n_mels, content + self.n_frames)
        seek, segments, history = 0, [], []
        lang = info = None
        while seek < content:
            size = min(self.n_frames, content - seek)
            enc = self.model.encode(_pad_window(mel, seek, self.n_frames))
            if lang is None:
                lang, lang_p, probs = self._language(enc, language)
                info = TranscriptionInfo(lang, lang_p, duration, probs)
            prompt = tuple(history[-(self.model.dims.n_text_ctx // 2 - 1):]) if condition else ()
            opts = DecodingOptions(task=task, language=lang, max_tokens=max_tokens, timestamps=True, prompt=prompt)
            res = self.decoder.decode(enc, opts)
            offset = seek * FRAME_SECONDS
            if res.no_speech_prob > 0.6 and res.avg_logprob < -1.0:
                seek += size            # the model is sure this window holds no speech
                continue
            new, advance = self._split(res, seek, offset, size, segments)
            new = [s for s in new if s.text.strip() and s.end > s.start]   # empty ones are dropped,
            for s in new:                                                 # and condition nothing
                history.extend(s.tokens)
            segments.extend(new)
            seek += advance
        return _numbered(segments), info

    def _split(self, res, seek, offset, size, earlier):
        """Cut a window's tokens into segments at consecutive timestamp pairs; return them and
        how many mel frames the next window advances (openai-whisper's rules)."""
        b = self.tok.timestamp_begin
        toks = res.tokens
        is_ts = [t >= b for t in toks]
        single_ending = len(toks) >= 2 and not is_ts[-2] and is_ts[-1]
        pairs = [i + 1 for i in range(len(toks) - 1) if is_ts[i] and is_ts[i + 1]]
        segs, n0 = [], len(earlier)
        if pairs:
            cuts = pairs + ([len(toks)] if single_ending else [])
            last = 0
            for cut in cuts:
                piece = toks[last:cut]
                start = offset + (piece[0] - b) * TIME_PER_TOKEN
                end = offset + (piece[-1] - b) * TIME_PER_TOKEN
                segs.append(self._segment(n0 + len(segs), seek, start, end, piece, res))
                last = cut
            advance = size if single_ending else (toks[last - 1] - b) * INPUT_STRIDE
            if advance <= 0:        # a window must move on, whatever the model wrote
                advance = size
        else:
            end = offset + size * FRAME_SECONDS
            stamps = [t for t in toks if t >= b]
            if stamps and stamps[-1] != b:
                end = offset + (stamps[-1] - b) * TIME_PER_TOKEN
            segs.append(self._segment(n0, seek, offset, end, toks, res))
            advance = size
        return segs, advance

    def _segment(self, i, seek, start, end, tokens, res):
        text = self.tok.decode([t for t in tokens if t < self.tok.eot])
        return Segment(id=i, seek=seek, start=round(start, 3), end=round(end, 3), text=text,
                       tokens=list(tokens), avg_logprob=res.avg_logprob, no_speech_prob=res.no_speech_prob)


def as_dict(segments, info):
    return {"text": "".join(s.text for s in segments), "language": info.language,
            "language_probability": info.language_probability, "duration": info.duration,
            "segments": [dataclasses.asdict(s) for s in segments]}
