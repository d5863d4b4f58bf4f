"""Hugging Face Whisper directories ↔ `Checkpoint`.

A directory holds `config.json` (WhisperConfig: the hyperparameters), `model.safetensors` (the
weights), `tokenizer.json`, and usually `generation_config.json` (suppressed tokens, language
ids, alignment heads) and `preprocessor_config.json` (the feature extractor).

`model.safetensors` is parsed here, not by the `safetensors` package, so that every length is
checked before use and the tensors stay memory-mapped views:

    u64 n | n bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"?}
    | the data, each tensor's bytes at data_offsets relative to the end of the header

F32 and F16 tensors are views into the mapping; BF16 is widened to float32 (a copy, exact).

Hugging Face names are this package's canonical names, so there is no translation table: a
`model.` prefix is added where a checkpoint was saved without one, and `proj_out.weight` is
dropped (it is tied to the token embedding).
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np

from .bytelevel import byte_level_to_bytes, bytes_to_byte_level
from .checkpoint import Checkpoint, CheckpointError, Dims, bf16_to_f32, dims_from_tensors, open_map, validate

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}  # BF16: raw bits, widened below
_NAMES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}
MAX_HEADER = 100 << 20     # the safetensors package's own limit on the JSON header
MAX_RANK = 8

# WhisperConfig key -> Dims field
_CONFIG_DIMS = {
    "num_mel_bins": "n_mels",
    "max_source_positions": "n_audio_ctx",
    "encoder_attention_heads": "n_audio_head",
    "encoder_layers": "n_audio_layer",
    "vocab_size": "n_vocab",
    "max_target_positions": "n_text_ctx",
    "decoder_attention_heads": "n_text_head",
    "decoder_layers": "n_text_layer",
}


def read_safetensors(path):
    """Parse one .safetensors file → ({name: array}, the mapping the arrays view)."""
    path = os.fspath(path)
    m = open_map(path)
    if len(m) < 8:
        raise CheckpointError(path, f"is {len(m)} bytes, shorter than the 8-byte header length")
    n = struct.unpack("<Q", m[:8].tobytes())[0]
    if n > len(m) - 8:
        raise CheckpointError(path, f"header length {n} reaches past the end of the file ({len(m)} bytes): "
                                    "truncated or not a safetensors file")
    if n > MAX_HEADER:
        raise CheckpointError(path, f"header length {n} exceeds the {MAX_HEADER}-byte limit")
    try:
        header = json.loads(m[8:8 + n].tobytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(path, f"the header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(path, "the header is not a JSON object")
    data = m[8 + n:]
    tensors, spans = {}, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = _entry(path, name, info, len(data))
        if dtype not in _DTYPES:
            raise CheckpointError(path, f"tensor {name} has dtype {dtype}; only F32, F16 and BF16 are read")
        dt = np.dtype(_DTYPES[dtype])
        count = 1
        for s in shape:
            count *= s               # Python ints: no overflow, however large the claim
        if count * dt.itemsize != end - begin:
            raise CheckpointError(path, f"tensor {name}: shape {list(shape)} of {dtype} needs "
                                        f"{count * dt.itemsize} bytes, data_offsets span {end - begin}")
        arr = data[begin:end].view(dt).reshape(shape)
        tensors[name] = bf16_to_f32(arr) if dtype == "BF16" else arr
        spans.append((begin, end, name))
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise CheckpointError(path, f"tensors {n0} and {n1} overlap (bytes {b1}..{e0} of the data)")
    return tensors, m


def _entry(path, name, info, data_len):
    """One header entry's (dtype, shape, offsets), each checked for type and range."""
    if not isinstance(info, dict):
        raise CheckpointError(path, f"header entry {name} is not an object")
    dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise CheckpointError(path, f"tensor {name} has no dtype string")
    if (not isinstance(shape, list) or len(shape) > MAX_RANK
            or not all(type(s) is int and 0 <= s for s in shape)):
        raise CheckpointError(path, f"tensor {name} has shape {shape!r}: expected a list of at most "
                                    f"{MAX_RANK} non-negative integers")
    if (not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs)
            or not 0 <= offs[0] <= offs[1]):
        raise CheckpointError(path, f"tensor {name} has data_offsets {offs!r}: expected [begin, end], "
                                    "0 <= begin <= end")
    if offs[1] > data_len:
        raise CheckpointError(path, f"tensor {name}: data_offsets end {offs[1]} reaches past the end of the "
                                    f"data ({data_len} bytes): truncated or corrupt")
    return dtype, tuple(shape), tuple(offs)


def _canonical(name):
    """HF names with or without the `model.` prefix → with it; proj_out → None (tied)."""
    if name == "proj_out.weight":
        return None
    if name.startswith(("encoder.", "decoder.")):
        return "model." + name
    return name


def _dims_from_config(path, config):
    vals = {}
    for key, field in _CONFIG_DIMS.items():
        v = config.get(key)
        if type(v) is not int:
            raise CheckpointError(path, f"{key} = {v!r}: expected an integer")
        vals[field] = v
    d = config.get("d_model")
    if type(d) is not int:
        raise CheckpointError(path, f"d_model = {d!r}: expected an integer")
    return Dims(n_audio_state=d, n_text_state=d, **vals).check(path)


def read_hf(directory):
    """Read a Hugging Face Whisper directory into a Checkpoint (tensors memory-mapped)."""
    directory = os.fspath(directory)
    weights = os.path.join(directory, "model.safetensors")
    cfg_path = os.path.join(directory, "config.json")
    for p in (weights, cfg_path):
        if not os.path.isfile(p):
            raise CheckpointError(p, "no such file")
    config = _read_json(cfg_path, required=True)
    dims = _dims_from_config(cfg_path, config)
    raw, mapping = read_safetensors(weights)
    tensors = {}
    for name, arr in raw.items():
        hf = _canonical(name)
        if hf is not None:
            tensors[hf] = arr
    # config.json says what the model should be; the tensors say what it is: they must agree.
    found = dims_from_tensors(weights, tensors, dims.n_audio_head, dims.n_text_head)
    for f in ("n_mels", "n_audio_ctx", "n_audio_state", "n_audio_layer", "n_vocab", "n_text_ctx",
              "n_text_state", "n_text_layer"):
        if getattr(found, f) != getattr(dims, f):
            raise CheckpointError(weights, f"the tensors give {f} = {getattr(found, f)}, "
                                           f"config.json says {getattr(dims, f)}")
    gen = _read_json(os.path.join(directory, "generation_config.json"))
    meta = {**config, **gen}   # generation_config.json wins where both say something
    heads = meta.get("alignment_heads")
    tok = os.path.join(directory, "tokenizer.json")
    has_tok = os.path.isfile(tok)
    ck = Checkpoint(
        dims=dims, tensors=tensors, path=directory, container="hf",
        tokenizer_json=tok if has_tok else None,
        vocab_bytes=None if has_tok else _read_vocab_json(os.path.join(directory, "vocab.json")),
        suppress_ids=_int_list(meta.get("suppress_tokens")),
        suppress_ids_begin=_int_list(meta.get("begin_suppress_tokens")),
        alignment_heads=[tuple(h) for h in heads] if _pairs(heads) else None,
        lang_ids=_lang_ids(meta.get("lang_to_id")),
        _keepalive=[mapping],
    )
    return validate(ck)


def _read_vocab_json(path):
    """vocab.json ({byte-level word: id}, ids 0..n-1) → raw words in id order; None if absent."""
    vocab = _read_json(path)
    if not vocab:
        return None
    ids = list(vocab.values())
    if not all(type(i) is int for i in ids) or sorted(ids) != list(range(len(ids))):
        raise CheckpointError(path, f"the ids are not 0..{len(vocab) - 1}, each once")
    words = [b""] * len(vocab)
    for w, i in vocab.items():
        words[i] = byte_level_to_bytes(w)
    return words


def _int_list(v):
    return list(v) if isinstance(v, list) and all(type(x) is int for x in v) else None


def _lang_ids(lang_to_id):
    """{"<|en|>": 50259, ...} → the ids in order, as CTranslate2's lang_ids."""
    ids = _int_list(list(lang_to_id.values())) if isinstance(lang_to_id, dict) else None
    return sorted(ids) if ids else None


def _pairs(v):
    return isinstance(v, list) and v and all(isinstance(h, list) and len(h) == 2 and _int_list(h) for h in v)


def _read_json(path, required=False):
    if not os.path.isfile(path):
        if required:
            raise CheckpointError(path, "no such file")
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            out = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"not valid JSON: {e}") from None
    if not isinstance(out, dict):
        raise CheckpointError(path, "expected a JSON object")
    return out


# ---------------------------------------------------------------------------------------------
# Writing


def write_safetensors(tensors, path, metadata=None):
    """Write {name: float32/float16 array} as .safetensors, each tensor's bytes unchanged.

    Written beside `path` and renamed into place, so a reader mapping an older file at `path`
    (the source of a conversion, say) keeps its bytes."""
    header, offset = {}, 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in _NAMES:
            raise CheckpointError(path, f"tensor {name} is {t.dtype}; safetensors here takes float32 or float16")
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    if metadata:
        header["__metadata__"] = metadata
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)   # pad with spaces so the data starts 8-byte aligned
    part = path + ".part"
    with open(part, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in sorted(tensors):
            f.write(np.ascontiguousarray(tensors[name]).data)
    os.replace(part, path)


def special_ids(ck):
    """The special tokens' ids: read from tokenizer.json when there is one, else by position
    (see Dims.positional_special_ids). None when neither is possible."""
    names = ("<|endoftext|>", "<|startoftranscript|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
             "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>", "<|0.00|>")
    if ck.tokenizer_json:
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(ck.tokenizer_json)
        except Exception as e:  # the tokenizers package raises its own exception type
            raise CheckpointError(ck.tokenizer_json, f"not a readable tokenizer.json ({e})") from None
        ids = {n: tok.token_to_id(n) for n in names}
        if ids["<|nospeech|>"] is None:   # English-only vocabularies spell it <|nocaptions|>
            ids["<|nospeech|>"] = tok.token_to_id("<|nocaptions|>")
        langs = {}   # id -> "<|xx|>": the language tokens lie between SOT and <|translate|>
        if ids["<|startoftranscript|>"] is not None and ids["<|translate|>"] is not None:
            for i in range(ids["<|startoftranscript|>"] + 1, ids["<|translate|>"]):
                langs[i] = tok.id_to_token(i)
        return ids, langs
    ids = ck.dims.positional_special_ids()
    return (ids, {}) if ids else None


def write_hf(ck, directory):
    """Write a Checkpoint as a Hugging Face Whisper directory that
    `transformers.WhisperForConditionalGeneration.from_pretrained(directory)` loads.

    Tensors keep their dtype and bits. Special-token ids come from the checkpoint's tokenizer.json
    (copied alongside). A checkpoint without one (a ggml file) gets the ids by position and no
    tokenizer.json, and its generation_config.json has no `lang_to_id`: the model loads and runs
    in transformers, but a tokenizer (and language detection) needs a tokenizer.json from the
    same model family put beside it."""
    directory = os.fspath(directory)
    d = ck.dims
    if d.n_audio_state != d.n_text_state:
        raise CheckpointError(ck.path, f"encoder width {d.n_audio_state} != decoder width {d.n_text_state}: "
                                       "Hugging Face's WhisperConfig has one d_model")
    os.makedirs(directory, exist_ok=True)
    write_safetensors(validate(ck).tensors, os.path.join(directory, "model.safetensors"), {"format": "pt"})
    found = special_ids(ck)
    ids, langs = found if found else ({}, {})
    eot, sot = ids.get("<|endoftext|>"), ids.get("<|startoftranscript|>")
    dtypes = {t.dtype for t in ck.tensors.values()}
    config = {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "num_mel_bins": d.n_mels,
        "d_model": d.n_audio_state,
        "encoder_layers": d.n_audio_layer,
        "encoder_attention_heads": d.n_audio_head,
        "encoder_ffn_dim": 4 * d.n_audio_state,
        "decoder_layers": d.n_text_layer,
        "decoder_attention_heads": d.n_text_head,
        "decoder_ffn_dim": 4 * d.n_text_state,
        "num_hidden_layers": d.n_audio_layer,
        "vocab_size": d.n_vocab,
        "max_source_positions": d.n_audio_ctx,
        "max_target_positions": d.n_text_ctx,
        "max_length": d.n_text_ctx,
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "use_cache": True,
        "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "init_std": 0.02,
        "torch_dtype": "float16" if np.dtype(np.float16) in dtypes else "float32",
        # HF's Whisper configs use <|endoftext|> for bos, eos and pad, and start decoding at SOT.
        "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot,
        "decoder_start_token_id": sot,
        "suppress_tokens": ck.suppress_ids or [],
        "begin_suppress_tokens": ck.suppress_ids_begin or [],
    }
    gen = {
        "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot,
        "decoder_start_token_id": sot,
        "max_length": d.n_text_ctx,
        "forced_decoder_ids": None,
        "is_multilingual": d.is_multilingual,
        "no_timestamps_token_id": ids.get("<|notimestamps|>"),
        "prev_sot_token_id": ids.get("<|startofprev|>"),
        "suppress_tokens": ck.suppress_ids or [],
        "begin_suppress_tokens": ck.suppress_ids_begin or [],
        "return_timestamps": False,
        "max_initial_timestamp_index": 50,   # openai-whisper's max_initial_timestamp 1.0 s / 0.02 s
    }
    if ck.alignment_heads:
        gen["alignment_heads"] = [list(h) for h in ck.alignment_heads]
    if d.is_multilingual:
        gen["task_to_id"] = {"translate": ids.get("<|translate|>"), "transcribe": ids.get("<|transcribe|>")}
    # The checkpoint's own language list where it has one (CTranslate2's lang_ids), else every
    # language token of a multilingual vocabulary. English-only models get none, as in Hugging
    # Face's own .en configs: with a lang_to_id, transformers treats the model as multilingual
    # and puts a detected language token into the prompt, which changes the transcript.
    lang_ids = ck.lang_ids or sorted(langs)
    if d.is_multilingual and langs and lang_ids:
        gen["lang_to_id"] = {langs[i]: i for i in lang_ids if i in langs}
    preprocessor = {
        "feature_extractor_type": "WhisperFeatureExtractor",
        "processor_class": "WhisperProcessor",
        "feature_size": d.n_mels,
        "sampling_rate": 16000,
        "hop_length": 160,
        "n_fft": 400,
        "chunk_length": 30,
        "n_samples": 480000,       # 30 s × 16 kHz
        "nb_max_frames": 3000,     # n_samples / hop_length
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": False,
    }
    for name, obj in (("config.json", config), ("generation_config.json", gen),
                      ("preprocessor_config.json", preprocessor)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
    if ck.tokenizer_json:
        dst = os.path.join(directory, "tokenizer.json")
        if not (os.path.exists(dst) and os.path.samefile(ck.tokenizer_json, dst)):
            shutil.copyfile(ck.tokenizer_json, dst)
    elif ck.vocab_bytes and len(set(ck.vocab_bytes)) == len(ck.vocab_bytes):
        # No tokenizer.json to copy: keep the words (HF's vocab.json spelling) so that nothing
        # is lost on the way back to ggml.
        vocab = {bytes_to_byte_level(w): i for i, w in enumerate(ck.vocab_bytes)}
        with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump(vocab, f, ensure_ascii=False)
    return directory
