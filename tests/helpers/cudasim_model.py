"""A whole random-weight Whisper on one backend: encoder states, greedy tokens and a batched
(beam search's) and a batch of windows' step's logits as JSON.

Run by tests/cuda/test_model_backends.py twice — plainly (CPU backend) and with
NUMBA_ENABLE_CUDASIM=1 (the CUDA backend on Numba's simulator) — so the same model code and
kernel bodies are compared across the two targets. Shapes are tiny: the simulator runs one
Python thread per CUDA thread.
"""

import json
import sys
import tempfile

import numpy as np

from helpers_models import tiny_dims, tiny_random_checkpoint  # noqa: E402

from nwhisper import backend  # noqa: E402
from nwhisper.decoding import DecodingOptions, GreedyDecoder  # noqa: E402
from nwhisper.model import Whisper  # noqa: E402
from nwhisper.tokenizer import Tokenizer  # noqa: E402


def main(kind):
    with tempfile.TemporaryDirectory() as tmp:
        ck = tiny_random_checkpoint(tiny_dims(width=32, heads=4, layers=2), dtype=np.float16, seed=3,
                                    tokenizer_dir=tmp)
        tok = Tokenizer.from_checkpoint(ck)
        d = ck.dims
        mel = np.random.default_rng(4).standard_normal((2 * d.n_audio_ctx, d.n_mels)).astype(np.float32)
        be = backend.get(kind)
        model = Whisper(ck, be)
        enc = model.encode(mel)
        decoder = GreedyDecoder(model, tok, ck)
        # Few steps: the simulator runs one Python thread per CUDA thread (minutes per dozen steps)
        plain = decoder.decode(enc, DecodingOptions(max_tokens=4))
        # Beam search's batched step: two rows after the prompt, each over its own cache
        single = model.new_state(enc)
        first = be.download(model.decode(single, np.array([1, 2], np.int32)))
        # (downloaded at once: the logits live in the backend's scratch, which the next decode reuses)
        batch = be.download(model.decode_batch(model.new_batch(single, 2), np.array([7, 9], np.int32)))
        # A batch of windows (transcribe's batch_size) whose second has ended: its attentions
        # are skipped, and the open row is the single-state step all the same
        rows = [model.new_state(enc) for _ in range(2)]
        for r in rows:
            model.decode(r, np.array([1, 2], np.int32))
        windows = be.download(model.decode_batch(model.new_window_batch(rows), np.array([7, 9], np.int32),
                                                 [True, False]))
        one = be.download(model.decode(single, np.array([7], np.int32)))
        # compute_type="int8" end to end: int8 weights, Int8Heads cross K/V. The backends' int8
        # encoders differ by design (the CPU's products of many rows on its int8 GEMM, CUDA's on
        # the full matrix), so its logits are held to float32's on each, not to each other's bits
        int8 = Whisper(ck, be, compute_type="int8")
        int8_enc = int8.encode(mel)
        quantized = GreedyDecoder(int8, tok, ck).decode(int8_enc, DecodingOptions(max_tokens=2))
        int8_first = be.download(int8.decode(int8.new_state(int8_enc), np.array([1, 2], np.int32)))
        print("REPORT " + json.dumps({
            "backend": be.name,
            "states": be.download(enc).ravel().tolist(),
            "tokens": plain.tokens,
            "no_speech_prob": plain.no_speech_prob,
            "batch_logits": batch.ravel().tolist(),
            "one_logits": one.ravel().tolist(),
            "window_logits": windows.ravel().tolist(),
            "first_logits": first.ravel().tolist(),
            "int8_first_logits": int8_first.ravel().tolist(),
            "int8_tokens": quantized.tokens,
            "int8_no_speech_prob": quantized.no_speech_prob,
        }))


if __name__ == "__main__":
    main(sys.argv[1])
