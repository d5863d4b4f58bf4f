"""The Python API, in the shape faster-whisper users know:

    import nwhisper
    model = nwhisper.load("tiny.en")                 # a name, or a path to any container
    segments, info = model.transcribe("clip.wav")    # segments: decoded as they are read
    print("".join(s.text for s in segments))

A loaded model is reusable: the weights are on the backend once, and every `transcribe` pays
only for its own audio (this is the seam the server stands on).
"""

from __future__ import annotations

import ctypes
import dataclasses

from . import backend as B, kernel_cache, sources
from .abilities import Abilities, options as transcribe_options
from .io.hub import locate, offline_by_default
from .io.registry import DEFAULT_MODEL, read
from .kernels import gemm_bf16
from .model import Whisper
from .tokenizer import Tokenizer
from .transcribe import Transcriber
from .vad import regions


class WhisperModel:
    """A checkpoint loaded onto a backend, with its tokenizer."""

    def __init__(self, name_or_path=DEFAULT_MODEL, device="auto", compute_type="float32", offline=None):
        self.checkpoint = ck = read(locate(name_or_path, offline))
        self.offline = offline_by_default() if offline is None else offline
        # before the backend's first kernel: what a helper compiles ahead (a bfloat16 model is
        # float32 on a CPU without AVX-512 BF16: model.Whisper)
        kernel_cache.expect("float32" if compute_type == "bfloat16" and not gemm_bf16.available() else compute_type)
        self.backend = B.get(device)
        self.dims = ck.dims
        self.tokenizer = Tokenizer.from_checkpoint(ck)
        self.abilities = Abilities.of(self.tokenizer, self.dims, f"this model ({name_or_path})")
        self.model = Whisper(ck, self.backend, compute_type)
        ck.release_pages()
        _trim_heap()
        self._transcriber = Transcriber(self.model, self.tokenizer, ck)
        self._diarizer = None

    def encode(self, audio):
        """Encoder states of the first 30 s of `audio` (path, bytes or 16 kHz samples),
        as a host (n_audio_ctx, n_audio_state) float32 array."""
        from . import mel as M

        samples = sources.samples_of(audio)[:M.N_SAMPLES]
        mel = M.log_mel(samples, self.dims.n_mels, 2 * self.dims.n_audio_ctx)
        return self.backend.download(self.model.encode(mel))

    def detect_language(self, audio):
        """(code, probability, {code: probability}) from the first 30 s of `audio`: one decoder
        step from <|startoftranscript|>, restricted to the language tokens (openai's rule).
        English-only models answer ("en", 1.0, {"en": 1.0})."""
        from . import mel as M
        from .decoding import detect_language

        if not self.dims.is_multilingual:
            return "en", 1.0, {"en": 1.0}
        # the first window as openai-whisper and faster-whisper cut it: the log-mel of the audio,
        # zero-padded to 30 s in the normalised log-mel domain
        samples = sources.samples_of(audio)
        n_frames = 2 * self.dims.n_audio_ctx
        content = min(len(samples), M.N_SAMPLES) // M.HOP_LENGTH
        mel = M.log_mel(samples[:M.N_SAMPLES], self.dims.n_mels, content + n_frames)
        enc = self.model.encode(M.pad_frames(mel[:content], 0, n_frames))
        probs, best = detect_language(self.model, self.tokenizer, enc)
        return best, probs[best], probs

    def transcribe(self, audio, options=None, *, vad=False, progress=None, on_segments=None,
                   cancelled=None, **fields):
        """audio: a path, bytes, or 16 kHz mono float32 samples → (segments, TranscriptionInfo),
        as faster-whisper returns them: the info is ready at once (the first window encoded, its
        language detected); segments is an iterator that decodes window after window as it is
        read (list() it to have them all). A file is decoded in pieces and read twice, so its
        length costs no memory; with vad, its speech is held.

        options: a TranscribeOptions (abilities.options builds one from what a user asked), or
        its fields as keywords (records.py holds each one's default): language (a
        code in any case, an unknown one named in the error; None detects it on a multilingual
        model), task, max_tokens, timestamps, condition_on_previous_text, beam_size, best_of,
        patience, temperature (a number, or a sequence for openai's fallback ladder,
        `records.FALLBACK_TEMPERATURES`), compression_ratio_threshold, logprob_threshold,
        no_speech_threshold (None or ≥ 1: never skip a window), word_timestamps,
        hallucination_silence_threshold (seconds; with word_timestamps, skip silences longer than
        this around text that looks made up: openai's option and rules), initial_prompt (text
        the first window is conditioned on), audio_ctx (encoder positions, whisper.cpp's option;
        fewer than the model's 30 s encode only audio_ctx · 20 ms, for audio that fits in it: a
        live stream's drafts), batch_size (> 1: faster-whisper's batched mode — the speech cut by
        Silero into chunks of at most 30 s, each decoded as its own window with no previous
        text, that many at once; greedy; timestamps and word timings kept), diarize (who spoke:
        each segment and word gets a speaker, SPEAKER_00 …, and info.speaker_turns the turns;
        speakers/diarize.py) with num_speakers, or min_speakers/max_speakers.
        vad: transcribe only the speech, joined, with times on the recording's clock — True or
        "silero" (Silero VAD with faster-whisper's vad_filter options: threshold 0.5,
        min_silence 2000 ms, speech_pad 400 ms), "energy" (the energy detector), a detector
        (chunk → p(speech), with reset()), or a function (samples, sr) → [(start, end)] in
        samples. progress(done_s, total_s): called after every long-form window and every batch.
        on_segments(new): called with each window's new segments as they are decoded, on the
        recording's clock. cancelled(): asked
        before each encoder layer, after the pass and before each decoder step; True raises
        nwhisper.records.Cancelled there (a live stream's speculative final that more speech
        made stale), from this call or from reading the segments."""
        if options is not None:
            if fields:
                raise TypeError("transcribe() takes TranscribeOptions or its fields as keywords, not both")
            fields = dataclasses.asdict(options)
        opts = self.abilities.check(transcribe_options(vad, **fields))
        silero = None
        if opts.diarize:        # the speakers need the whole recording before its first segment
            from .speakers.diarize import REGIONS
            audio = sources.samples_of(audio)
            # one Silero pass (the diarizer's detector) for the speakers' regions and, if it is
            # Silero, the transcription's VAD
            diarizer = self.diarizer()
            silero = regions.chunk_probs(audio, diarizer.vad)
            turns = diarizer(audio, opts.num_speakers, opts.min_speakers, opts.max_speakers,
                             regions=regions.speech_regions(audio, opts=REGIONS, probs=silero))
        segments, info = self._transcriber.transcribe(sources.of(audio, vad, opts.batch_size, silero), opts,
                                                      progress=progress, on_segments=on_segments,
                                                      cancelled=cancelled)
        if opts.diarize:
            from .speakers.diarize import assign
            info.speaker_turns = [(t.start, t.end, t.name) for t in turns]
            segments = assign(segments, turns)
        return segments, info

    def diarizer(self):
        """The speaker network on this model's backend, its products in the model's compute type
        (loaded on first use)."""
        if self._diarizer is None:
            from .speakers.diarize import Diarizer
            self._diarizer = Diarizer(self.backend, download=not self.offline,
                                      compute_type=self.model.compute_type)
        return self._diarizer


def load(name_or_path=DEFAULT_MODEL, device="auto", compute_type="float32", offline=None):
    """A WhisperModel. compute_type "int8" decodes with int8 weights (per-row scales): faster on
    the CPU, transcripts checked against float32's in tests/oracle/test_transcribe.py;
    "bfloat16": the encoder's products on bfloat16 operands, on CPUs with AVX-512 BF16 (float32
    elsewhere, with a warning). A model
    name found nowhere here is downloaded from the Hugging Face Hub (io/hub.py) unless `offline`
    (default: HF_HUB_OFFLINE)."""
    return WhisperModel(name_or_path, device, compute_type, offline)


def _trim_heap():
    """Give the C heap's free memory back to the system (glibc's malloc_trim; elsewhere
    nothing). Loading frees many matrix-sized temporaries (stacked rows, int8 rows before
    they are packed), and glibc keeps what was freed for reuse: without this a model's RSS
    after load would go on holding them."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)
