"""The alignment heads of the Whisper models OpenAI released: the cross-attention heads whose
weights follow the speech in time, which word timestamps read (timing.py).

A checkpoint usually says which they are (CTranslate2's config.json, Hugging Face's
generation_config.json); a ggml file and many conversions do not. Then the released model is
recognised by its shape — width, decoder layers, vocabulary (51864: English-only; 51865; 51866:
v3, with `<|yue|>`) and mel bands — and its heads are taken from this table, which is
openai-whisper's `_ALIGNMENT_HEADS` (release 20250625) written out as (layer, head) pairs. The
two 80-band large models share a shape: large-v2's heads are used (large-v1 was replaced by it).
A shape not here (distil-whisper, a fine-tune with other layers) falls back to openai's default,
every head of the decoder's second half.
"""

from __future__ import annotations

RELEASED = {
    # (n_audio_state, n_text_layer, n_vocab, n_mels): (model, [(layer, head), ...])
    (384, 4, 51864, 80): ("tiny.en", [(1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)]),
    (384, 4, 51865, 80): ("tiny", [(2, 2), (3, 0), (3, 2), (3, 3), (3, 4), (3, 5)]),
    (512, 6, 51864, 80): ("base.en", [(3, 3), (4, 7), (5, 1), (5, 5), (5, 7)]),
    (512, 6, 51865, 80): ("base", [(3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4), (5, 6)]),
    (768, 12, 51864, 80): ("small.en", [(6, 6), (7, 0), (7, 3), (7, 8), (8, 2), (8, 5), (8, 7), (9, 0),
                                        (9, 4), (9, 8), (9, 10), (10, 0), (10, 1), (10, 2), (10, 3),
                                        (10, 6), (10, 11), (11, 2), (11, 4)]),
    (768, 12, 51865, 80): ("small", [(5, 3), (5, 9), (8, 0), (8, 4), (8, 7), (8, 8), (9, 0), (9, 7),
                                     (9, 9), (10, 5)]),
    (1024, 24, 51864, 80): ("medium.en", [(11, 4), (14, 1), (14, 12), (14, 14), (15, 4), (16, 0), (16, 4),
                                          (16, 9), (17, 12), (17, 14), (18, 7), (18, 10), (18, 15),
                                          (20, 0), (20, 3), (20, 9), (20, 14), (21, 12)]),
    (1024, 24, 51865, 80): ("medium", [(13, 15), (15, 4), (15, 15), (16, 1), (20, 0), (23, 4)]),
    (1280, 32, 51865, 80): ("large-v2", [(10, 12), (13, 17), (16, 11), (16, 12), (16, 13), (17, 15),
                                         (17, 16), (18, 4), (18, 11), (18, 19), (19, 11), (21, 2),
                                         (21, 3), (22, 3), (22, 9), (22, 12), (23, 5), (23, 7),
                                         (23, 13), (25, 5), (26, 1), (26, 12), (27, 15)]),
    (1280, 32, 51866, 128): ("large-v3", [(7, 0), (10, 17), (12, 18), (13, 12), (16, 1), (17, 14),
                                          (19, 11), (21, 4), (24, 1), (25, 6)]),
    (1280, 4, 51866, 128): ("large-v3-turbo", [(2, 4), (2, 11), (3, 3), (3, 6), (3, 11), (3, 14)]),
}


def released(dims):
    """(model name, heads) of the released model with these dims, or None."""
    return RELEASED.get((dims.n_audio_state, dims.n_text_layer, dims.n_vocab, dims.n_mels))


def alignment_heads(ck, dims):
    """The checkpoint's own heads; else the released model's of this shape; else openai's
    default, every head of the last half of the decoder layers."""
    if ck.alignment_heads:
        return [(int(l), int(h)) for l, h in ck.alignment_heads]
    known = released(dims)
    if known is not None:
        return list(known[1])
    return [(l, h) for l in range(dims.n_text_layer // 2, dims.n_text_layer) for h in range(dims.n_text_head)]
