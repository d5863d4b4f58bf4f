"""transcribe() end to end on one backend, with a small random-weight Whisper: greedy, beam search,
word timings and batched chunks, as JSON (tokens, segment and word times).

Run by tests/cuda/test_model_backends.py twice — plainly (the CPU backend) and with
NUMBA_ENABLE_CUDASIM=1 (the CUDA backend on Numba's simulator) — so that the window loop, the
searches, the aligner and the batched step run on both targets through the public API. A few
tokens a window: the simulator runs one Python thread per CUDA thread.
"""

import json
import os
import sys
import tempfile

import numpy as np

from helpers_models import tiny_dims, tiny_random_checkpoint  # noqa: E402

import nwhisper  # noqa: E402
from nwhisper.io.safetensors import write_hf  # noqa: E402
from nwhisper.vad import regions  # noqa: E402

SR = 16000
CHUNKS = [[(0, SR // 2)], [(SR, 2 * SR)]]   # the batched mode's chunks, fixed (no Silero run)


def segments_of(segments):
    return [{"tokens": s.tokens, "start": s.start, "end": s.end,
             "words": [(w.word, w.start, w.end) for w in (s.words or [])]} for s in segments]


def main(kind):
    with tempfile.TemporaryDirectory() as tmp:
        ck = tiny_random_checkpoint(tiny_dims(width=32, heads=4, layers=2, n_text_ctx=16),
                                    dtype=np.float16, seed=3, tokenizer_dir=tmp)
        write_hf(ck, os.path.join(tmp, "hf"))
        model = nwhisper.load(os.path.join(tmp, "hf"), device=kind)
        x = np.random.default_rng(1).standard_normal(2 * SR).astype(np.float32) * np.float32(0.1)
        regions.speech_chunks = lambda samples, *args, **kw: CHUNKS
        runs = {"greedy": {}, "beam": {"beam_size": 2}, "words": {"timestamps": True, "word_timestamps": True},
                "batched": {"batch_size": 2, "word_timestamps": True}}
        report = {"backend": model.backend.name}
        for name, options in runs.items():
            segments, _ = model.transcribe(x, max_tokens=4, language="en", **options)
            report[name] = segments_of(segments)
        print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
