"""whisper.cpp's legacy ggml model file (`ggml-*.bin`) ↔ `Checkpoint`.

One self-contained little-endian file, no alignment padding (models/convert-pt-to-ggml.py and
whisper_model_load in src/whisper.cpp):

    u32 magic 0x67676d6c ('lmgg' on disk)
    i32 × 11  n_vocab n_audio_ctx n_audio_state n_audio_head n_audio_layer
              n_text_ctx n_text_state n_text_head n_text_layer n_mels ftype
    i32 n_mel, i32 n_fft, f32 mel filters [n_mel × n_fft]
    i32 n_words, then per word: u32 len, raw bytes (NOT the byte-level spelling of tokenizer.json)
    tensors until end of file:
        i32 n_dims, i32 name_len, i32 ttype, i32 ne[n_dims], name, data

`ne` is ggml's order, innermost first: ne = [3, n_mels, d] is NumPy's (d, n_mels, 3).
`ftype` is the file's weight type (0 f32, 1 f16, else a quantisation) plus 1000 × the
quantisation version. The vocabulary holds only the base words (50256 English-only, 50257
multilingual — the tiktoken files, without <|endoftext|>); the special tokens have no text and
whisper.cpp finds them by position.

whisper.cpp fixes each tensor's type: 2-D matrices in the file's weight type, the conv kernels
f16 (f32 in an all-f32 file), and everything else — biases, layer norms, positional
embeddings, the conv biases (stored as [1, d]) — f32. `write_ggml` writes that, so whisper.cpp
loads what it writes; it widens f16 vectors to f32 to do so (exact). Quantised tensors (q4_0,
q4_1, q5_0, q5_1, q8_0) are dequantised to float32 at load; other types are refused by name.

The file keeps OpenAI's tensor names; this module owns their translation to HF names.
"""

from __future__ import annotations

import os
import re
import struct

import numpy as np

from ..mel import slaney_filters
from .bytelevel import byte_level_to_bytes
from .checkpoint import (MAX_DIM, Checkpoint, CheckpointError, Dims, bf16_to_f32, expected_shapes,
                         open_map, validate)

MAGIC = 0x67676d6c
QNT_VERSION = 2            # GGML_QNT_VERSION: the block layouts below
QNT_VERSION_FACTOR = 1000  # ftype = weight type + 1000 × quantisation version
MAX_NAME = 1024
MAX_WORD = 1 << 16

# ggml_type ids (ggml.h) → name; the types this reader can turn into f32/f16 have a decoder below.
TYPE_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 9: "q8_1",
              10: "q2_K", 11: "q3_K", 12: "q4_K", 13: "q5_K", 14: "q6_K", 15: "q8_K", 16: "iq2_xxs",
              17: "iq2_xs", 18: "iq3_xxs", 19: "iq1_s", 20: "iq4_nl", 21: "iq3_s", 22: "iq2_s",
              23: "iq4_xs", 24: "i8", 25: "i16", 26: "i32", 27: "i64", 28: "f64", 29: "iq1_m",
              30: "bf16", 34: "tq1_0", 35: "tq2_0"}
F32, F16, BF16 = 0, 1, 30

# ---------------------------------------------------------------------------------------------
# Names: OpenAI's (kept by whisper.cpp) ↔ Hugging Face's (this package's)

_TOP = {
    "encoder.conv1.weight": "model.encoder.conv1.weight",
    "encoder.conv1.bias": "model.encoder.conv1.bias",
    "encoder.conv2.weight": "model.encoder.conv2.weight",
    "encoder.conv2.bias": "model.encoder.conv2.bias",
    "encoder.positional_embedding": "model.encoder.embed_positions.weight",
    "encoder.ln_post.weight": "model.encoder.layer_norm.weight",
    "encoder.ln_post.bias": "model.encoder.layer_norm.bias",
    "decoder.token_embedding.weight": "model.decoder.embed_tokens.weight",
    "decoder.positional_embedding": "model.decoder.embed_positions.weight",
    "decoder.ln.weight": "model.decoder.layer_norm.weight",
    "decoder.ln.bias": "model.decoder.layer_norm.bias",
}
_BLOCK = {
    "attn.query": "self_attn.q_proj",
    "attn.key": "self_attn.k_proj",
    "attn.value": "self_attn.v_proj",
    "attn.out": "self_attn.out_proj",
    "attn_ln": "self_attn_layer_norm",
    "cross_attn.query": "encoder_attn.q_proj",
    "cross_attn.key": "encoder_attn.k_proj",
    "cross_attn.value": "encoder_attn.v_proj",
    "cross_attn.out": "encoder_attn.out_proj",
    "cross_attn_ln": "encoder_attn_layer_norm",
    "mlp.0": "fc1",
    "mlp.2": "fc2",
    "mlp_ln": "final_layer_norm",
}
_TOP_BACK = {v: k for k, v in _TOP.items()}
_BLOCK_BACK = {v: k for k, v in _BLOCK.items()}
_OPENAI_BLOCK = re.compile(r"(encoder|decoder)\.blocks\.(\d+)\.(.+)\.(weight|bias)")
_HF_BLOCK = re.compile(r"model\.(encoder|decoder)\.layers\.(\d+)\.(.+)\.(weight|bias)")


def to_hf_name(name):
    """OpenAI/whisper.cpp tensor name → HF name; None if it is not a Whisper tensor."""
    if name in _TOP:
        return _TOP[name]
    m = _OPENAI_BLOCK.fullmatch(name)
    if m and m[3] in _BLOCK:
        return f"model.{m[1]}.layers.{int(m[2])}.{_BLOCK[m[3]]}.{m[4]}"
    return None


def to_openai_name(name):
    """HF tensor name → the OpenAI name whisper.cpp expects; None if there is none."""
    if name in _TOP_BACK:
        return _TOP_BACK[name]
    m = _HF_BLOCK.fullmatch(name)
    if m and m[3] in _BLOCK_BACK:
        return f"{m[1]}.blocks.{m[2]}.{_BLOCK_BACK[m[3]]}.{m[4]}"
    return None


# ---------------------------------------------------------------------------------------------
# Quantised blocks (ggml-common.h, dequantize_row_* in ggml-quants.c). Every block holds 32
# weights and starts with an f16 scale d; the _1 types add an f16 offset m (y = q·d + m).
# Element j of a block takes the low nibble of qs[j] for j < 16 and the high nibble of
# qs[j - 16] after; the 5-bit types take bit j of the 32-bit qh as the fifth bit.

QK = 32
_BLOCK_BYTES = {2: 18, 3: 20, 6: 22, 7: 24, 8: 34}


def _f16(cols):
    """A (blocks, 2) byte column pair → (blocks, 1) float32."""
    return np.ascontiguousarray(cols).view(np.float16).astype(np.float32)


def _nibbles(qs):
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _fifth_bits(qh4):
    qh = np.ascontiguousarray(qh4).view("<u4")                      # (blocks, 1)
    return (((qh >> np.arange(QK, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def dequantize(ttype, raw):
    """Blocks of a quantised ggml type (uint8, a multiple of the block size) → float32, flat."""
    b = raw.reshape(-1, _BLOCK_BYTES[ttype])
    if ttype == 8:      # q8_0: d, int8 q[32]
        q = b[:, 2:].view(np.int8).astype(np.float32)
        return (q * _f16(b[:, 0:2])).reshape(-1)
    if ttype == 2:      # q4_0: d, 16 bytes of nibbles; q - 8
        q = _nibbles(b[:, 2:]).astype(np.float32) - np.float32(8)
        return (q * _f16(b[:, 0:2])).reshape(-1)
    if ttype == 3:      # q4_1: d, m, 16 bytes of nibbles
        q = _nibbles(b[:, 4:]).astype(np.float32)
        return (q * _f16(b[:, 0:2]) + _f16(b[:, 2:4])).reshape(-1)
    if ttype == 6:      # q5_0: d, qh[4], 16 bytes of nibbles; q - 16
        q = (_nibbles(b[:, 6:]) | _fifth_bits(b[:, 2:6])).astype(np.float32) - np.float32(16)
        return (q * _f16(b[:, 0:2])).reshape(-1)
    # q5_1: d, m, qh[4], 16 bytes of nibbles
    q = (_nibbles(b[:, 8:]) | _fifth_bits(b[:, 4:8])).astype(np.float32)
    return (q * _f16(b[:, 0:2]) + _f16(b[:, 2:4])).reshape(-1)


def _nbytes(path, name, ttype, ne, qntvr):
    """Bytes a tensor of this type and shape occupies; refuses the types this reader cannot decode."""
    count = 1
    for n in ne:
        count *= n
    if ttype == F32:
        return count * 4
    if ttype in (F16, BF16):
        return count * 2
    if ttype in _BLOCK_BYTES:
        if qntvr != QNT_VERSION:
            raise CheckpointError(path, f"tensor {name} is {TYPE_NAMES[ttype]} of quantisation version "
                                        f"{qntvr}; only version {QNT_VERSION}, ggml's current block layout, is read")
        if ne[0] % QK:
            raise CheckpointError(path, f"tensor {name}: row length {ne[0]} is not a multiple of the "
                                        f"{QK}-weight {TYPE_NAMES[ttype]} block")
        return count // QK * _BLOCK_BYTES[ttype]
    kind = TYPE_NAMES.get(ttype, f"unknown type id {ttype}")
    raise CheckpointError(path, f"tensor {name} is stored as {kind}; nwhisper reads f32, f16, bf16, "
                                "q4_0, q4_1, q5_0, q5_1 and q8_0")


# ---------------------------------------------------------------------------------------------
# Reading


class _Cursor:
    """Reads forward through the mapped file; every read is checked against its size first."""

    def __init__(self, path, m):
        self.path, self.m, self.mv = path, m, memoryview(m)
        self.size, self.pos = len(m), 0

    def need(self, n, what):
        if n < 0 or self.pos + n > self.size:
            raise CheckpointError(self.path, f"{what} at byte {self.pos} needs {n} bytes, past the end of the "
                                             f"file ({self.size} bytes): truncated or corrupt")

    def ints(self, n, what, fmt="i"):
        self.need(4 * n, what)
        out = struct.unpack_from(f"<{n}{fmt}", self.mv, self.pos)
        self.pos += 4 * n
        return out

    def bytes(self, n, what):
        self.need(n, what)
        out = self.mv[self.pos:self.pos + n].tobytes()
        self.pos += n
        return out

    def array(self, n, what):
        self.need(n, what)
        out = self.m[self.pos:self.pos + n]
        self.pos += n
        return out


def _sane(path, what, v, lo=1, hi=MAX_DIM):
    if not lo <= v <= hi:
        raise CheckpointError(path, f"{what} = {v} is out of range ({lo}..{hi})")
    return v


def read_ggml(path):
    """Read a whisper.cpp ggml model file into a Checkpoint (f32/f16 tensors memory-mapped)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(path, "no such file")
    m = open_map(path)
    c = _Cursor(path, m)
    (magic,) = c.ints(1, "the magic number", "I")
    if magic != MAGIC:
        raise CheckpointError(path, f"not a whisper.cpp ggml file (magic 0x{magic:08x}, expected 0x{MAGIC:08x})")
    h = c.ints(11, "the hyperparameters")
    dims = Dims(n_vocab=h[0], n_audio_ctx=h[1], n_audio_state=h[2], n_audio_head=h[3], n_audio_layer=h[4],
                n_text_ctx=h[5], n_text_state=h[6], n_text_head=h[7], n_text_layer=h[8], n_mels=h[9]).check(path)
    qntvr = _sane(path, "ftype", h[10], 0, 100 * QNT_VERSION_FACTOR) // QNT_VERSION_FACTOR

    n_mel, n_fft = c.ints(2, "the mel filter shape")
    _sane(path, "mel filter count n_mel", n_mel)
    _sane(path, "mel filter length n_fft", n_fft)
    c.array(4 * n_mel * n_fft, "the mel filters")   # unused: nwhisper's log-mel has its own

    (n_words,) = c.ints(1, "the vocabulary size")
    _sane(path, "vocabulary word count", n_words, 0, dims.n_vocab)
    words = []
    for i in range(n_words):
        (n,) = c.ints(1, f"the length of word {i}", "I")
        words.append(c.bytes(_sane(path, f"length of word {i}", n, 0, MAX_WORD), f"word {i}"))

    tensors = {}
    while c.pos < c.size:
        n_dims, name_len, ttype = c.ints(3, "a tensor header")
        _sane(path, "a tensor's n_dims", n_dims, 1, 4)
        _sane(path, "a tensor's name length", name_len, 1, MAX_NAME)
        ne = c.ints(n_dims, "a tensor's dims")
        raw_name = c.bytes(name_len, "a tensor name")
        try:
            name = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(path, f"tensor name {raw_name!r} is not UTF-8") from None
        for i, n in enumerate(ne):
            _sane(path, f"tensor {name} ne[{i}]", n)
        hf = to_hf_name(name)
        if hf is None:
            raise CheckpointError(path, f"unknown tensor {name}: not a Whisper weight")
        if hf in tensors:
            raise CheckpointError(path, f"tensor {name} appears twice")
        raw = c.array(_nbytes(path, name, ttype, ne, qntvr), f"the data of tensor {name}")
        shape = tuple(reversed(ne))
        if ttype == F32:
            arr = raw.view(np.float32).reshape(shape)
        elif ttype == F16:
            arr = raw.view(np.float16).reshape(shape)
        elif ttype == BF16:
            arr = bf16_to_f32(raw.view(np.uint16)).reshape(shape)
        else:
            arr = dequantize(ttype, raw).reshape(shape)
        tensors[hf] = arr

    # The converter squeezes every tensor and stores the conv biases as [1, d]: restore the
    # shapes HF uses wherever only size-1 axes differ.
    for name, want in expected_shapes(dims).items():
        t = tensors.get(name)
        if t is not None and t.shape != want and _unit_free(t.shape) == _unit_free(want):
            tensors[name] = t.reshape(want)
    ck = Checkpoint(dims=dims, tensors=tensors, path=path, container="ggml", vocab_bytes=words,
                    _keepalive=[m])
    return validate(ck)


def _unit_free(shape):
    return tuple(s for s in shape if s != 1)


# ---------------------------------------------------------------------------------------------
# Writing


def mel_filters(n_mels):
    """The filterbank a ggml file carries: Slaney's, float32, as openai-whisper's
    assets/mel_filters.npz (librosa) — mel.slaney_filters rounds where librosa does."""
    return slaney_filters(n_mels, dtype=np.float32)


def base_words(ck):
    """The words a ggml file carries: raw bytes of ids 0 … <|endoftext|> - 1."""
    if ck.tokenizer_json:
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(ck.tokenizer_json)
        except Exception as e:  # the tokenizers package raises its own exception type
            raise CheckpointError(ck.tokenizer_json, f"not a readable tokenizer.json ({e})") from None
        eot = tok.token_to_id("<|endoftext|>")
        if eot is None:
            raise CheckpointError(ck.tokenizer_json, "has no <|endoftext|> token")
        return [byte_level_to_bytes(tok.id_to_token(i) or "") for i in range(eot)]
    if ck.vocab_bytes is None:
        raise CheckpointError(ck.path, "has no vocabulary to write")
    words = list(ck.vocab_bytes)
    return words[:words.index(b"<|endoftext|>")] if b"<|endoftext|>" in words else words


def _ggml_types(ck):
    """HF name → the ggml type whisper.cpp expects it in, for this checkpoint's weight type."""
    shapes = expected_shapes(ck.dims)
    mats = [n for n, s in shapes.items() if len(s) >= 2 and "embed_positions" not in n]
    # A checkpoint whose matrices are all f16 stays f16; any f32 matrix makes an all-f32 file
    # (f16 widened, exactly), since whisper.cpp has one weight type per file.
    wtype = F16 if all(ck.tensors[n].dtype == np.float16 for n in mats) else F32
    return {n: (wtype if n in mats else F32) for n in shapes}, wtype


def write_ggml(ck, path):
    """Write a Checkpoint as a whisper.cpp ggml file that whisper.cpp and read_ggml load.

    Matrices keep their dtype and bits (see _ggml_types for a mixed checkpoint); vectors and
    positional embeddings are f32, as whisper.cpp requires (f16 ones widened exactly). The
    vocabulary is the base words as raw bytes; the mel filters are the Slaney filterbank."""
    path = os.fspath(path)
    validate(ck)
    d = ck.dims
    types, wtype = _ggml_types(ck)
    words = base_words(ck)
    part = path + ".part"
    with open(part, "wb") as f:
        f.write(struct.pack("<I11i", MAGIC, d.n_vocab, d.n_audio_ctx, d.n_audio_state, d.n_audio_head,
                            d.n_audio_layer, d.n_text_ctx, d.n_text_state, d.n_text_head, d.n_text_layer,
                            d.n_mels, wtype))
        filters = mel_filters(d.n_mels)
        f.write(struct.pack("<2i", *filters.shape))
        f.write(filters.astype("<f4").tobytes())
        f.write(struct.pack("<i", len(words)))
        for w in words:
            f.write(struct.pack("<I", len(w)))
            f.write(w)
        for hf, ttype in types.items():
            t = ck.tensors[hf]
            if hf.endswith(("conv1.bias", "conv2.bias")):
                t = t.reshape(-1, 1)          # whisper.cpp's [1, d]
            t = np.ascontiguousarray(t, dtype="<f2" if ttype == F16 else "<f4")
            name = to_openai_name(hf).encode("utf-8")
            f.write(struct.pack(f"<3i{t.ndim}i", t.ndim, len(name), ttype, *reversed(t.shape)))
            f.write(name)
            f.write(t.data)
    os.replace(part, path)
    return path
