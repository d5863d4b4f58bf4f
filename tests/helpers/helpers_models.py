"""Small random-weight Whisper models for tests that must be fast.

`tiny_random_checkpoint` builds a valid `Checkpoint` (width 32, 2 + 2 layers, a 256-byte base
vocabulary plus Whisper's special tokens) whose weights are random; `write_ct2` writes any
checkpoint as a CTranslate2 directory (the package has readers only for that container) so that
all three containers can be made from one model.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from nwhisper.io.bytelevel import BYTE_TO_CHAR
from nwhisper.io.checkpoint import Checkpoint, Dims, expected_shapes, validate

# Whisper's special tokens in vocabulary order, cut down to two languages and three timestamps.
SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|fi|>", "<|translate|>", "<|transcribe|>",
            "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>",
            "<|0.00|>", "<|0.02|>", "<|0.04|>"]
N_BASE = 256  # one word per byte


def tiny_dims(width=32, heads=4, layers=2, n_mels=8, n_audio_ctx=12, n_text_ctx=10):
    return Dims(n_mels=n_mels, n_audio_ctx=n_audio_ctx, n_audio_state=width, n_audio_head=heads,
                n_audio_layer=layers, n_vocab=N_BASE + len(SPECIALS), n_text_ctx=n_text_ctx,
                n_text_state=width, n_text_head=heads, n_text_layer=layers).check("tiny_dims")


def tiny_random_checkpoint(dims=None, dtype=np.float16, seed=0, tokenizer_dir=None):
    """A valid random-weight Checkpoint. Matrices are `dtype`; vectors too (as in CTranslate2's
    f16 packages). With `tokenizer_dir`, a matching byte-level tokenizer.json is written there
    and referenced; without, the checkpoint carries raw `vocab_bytes`, as a ggml file does."""
    dims = dims or tiny_dims()
    rng = np.random.default_rng(seed)
    tensors = {name: (rng.standard_normal(shape) * 0.1).astype(dtype)
               for name, shape in expected_shapes(dims).items()}
    ck = Checkpoint(dims=dims, tensors=tensors, path="<tiny random>", container="synthetic",
                    suppress_ids=[1, 2, 3], suppress_ids_begin=[N_BASE + 0, 32],
                    alignment_heads=[(1, 0), (1, 3)], lang_ids=[N_BASE + 2, N_BASE + 3])
    if tokenizer_dir is None:
        ck.vocab_bytes = [bytes([b]) for b in range(N_BASE)]
    else:
        ck.tokenizer_json = write_tiny_tokenizer(os.path.join(tokenizer_dir, "tokenizer.json"))
    return validate(ck)


def write_tiny_tokenizer(path):
    """A byte-level BPE tokenizer.json: one token per byte (no merges), then SPECIALS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {BYTE_TO_CHAR[b]: b for b in range(N_BASE)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(path)
    return path


# ---------------------------------------------------------------------------------------------
# CTranslate2 writer (layout: nwhisper/io/ct2.py's docstring)

def _str(s):
    b = s.encode("utf-8") + b"\0"
    return struct.pack("<H", len(b)) + b


def _var(name, arr):
    arr = np.ascontiguousarray(arr)
    dtype_id = {np.dtype(np.float32): 0, np.dtype(np.float16): 4, np.dtype(np.int16): 2}[arr.dtype]
    return (_str(name) + struct.pack("<B", arr.ndim) + struct.pack(f"<{arr.ndim}I", *arr.shape)
            + struct.pack("<BI", dtype_id, arr.nbytes) + arr.tobytes())


def ct2_variables(ck):
    """The checkpoint in CTranslate2's names, with its fused projections (k bias = zeros)."""
    t, v = ck.tensors, {}
    v["encoder/num_heads"] = np.array(ck.dims.n_audio_head, np.int16)
    v["decoder/num_heads"] = np.array(ck.dims.n_text_head, np.int16)
    for k in ("conv1", "conv2"):
        v[f"encoder/{k}/weight"] = t[f"model.encoder.{k}.weight"]
        v[f"encoder/{k}/bias"] = t[f"model.encoder.{k}.bias"]
    for side in ("encoder", "decoder"):
        v[f"{side}/position_encodings/encodings"] = t[f"model.{side}.embed_positions.weight"]
        v[f"{side}/layer_norm/gamma"] = t[f"model.{side}.layer_norm.weight"]
        v[f"{side}/layer_norm/beta"] = t[f"model.{side}.layer_norm.bias"]
    v["decoder/embeddings/weight"] = t["model.decoder.embed_tokens.weight"]

    def ln(c, h):
        v[c + "/gamma"], v[c + "/beta"] = t[h + ".weight"], t[h + ".bias"]

    def fused(c, h, projs):
        ws = [t[f"{h}.{p}.weight"] for p in projs]
        bs = [t.get(f"{h}.{p}.bias", np.zeros(ws[0].shape[0], ws[0].dtype)) for p in projs]
        v[c + "/weight"], v[c + "/bias"] = np.concatenate(ws), np.concatenate(bs)

    layers = {"encoder": ck.dims.n_audio_layer, "decoder": ck.dims.n_text_layer}
    for side, n in layers.items():
        for i in range(n):
            c, h = f"{side}/layer_{i}/", f"model.{side}.layers.{i}."
            fused(c + "self_attention/linear_0", h + "self_attn", ("q_proj", "k_proj", "v_proj"))
            fused(c + "self_attention/linear_1", h + "self_attn", ("out_proj",))
            ln(c + "self_attention/layer_norm", h + "self_attn_layer_norm")
            if side == "decoder":
                fused(c + "attention/linear_0", h + "encoder_attn", ("q_proj",))
                fused(c + "attention/linear_1", h + "encoder_attn", ("k_proj", "v_proj"))
                fused(c + "attention/linear_2", h + "encoder_attn", ("out_proj",))
                ln(c + "attention/layer_norm", h + "encoder_attn_layer_norm")
            for k, fc in (("0", "fc1"), ("1", "fc2")):
                v[f"{c}ffn/linear_{k}/weight"], v[f"{c}ffn/linear_{k}/bias"] = t[h + fc + ".weight"], t[h + fc + ".bias"]
            ln(c + "ffn/layer_norm", h + "final_layer_norm")
    return v


def write_ct2(ck, directory):
    """Write model.bin (binary version 6), config.json and tokenizer.json (when ck has one)."""
    os.makedirs(directory, exist_ok=True)
    v = ct2_variables(ck)
    out = [struct.pack("<I", 6), _str("WhisperSpec"), struct.pack("<II", 3, len(v))]
    out += [_var(name, v[name]) for name in sorted(v)]
    out += [struct.pack("<I", 1), _str("decoder/projection/weight"), _str("decoder/embeddings/weight")]
    with open(os.path.join(directory, "model.bin"), "wb") as f:
        f.write(b"".join(out))
    config = {"suppress_ids": ck.suppress_ids, "suppress_ids_begin": ck.suppress_ids_begin,
              "lang_ids": ck.lang_ids, "alignment_heads": [list(h) for h in ck.alignment_heads or []]}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    if ck.tokenizer_json:
        with open(ck.tokenizer_json, "rb") as src, open(os.path.join(directory, "tokenizer.json"), "wb") as dst:
            dst.write(src.read())
    return directory
