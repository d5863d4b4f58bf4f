"""CTranslate2 model directories (faster-whisper's format) → `Checkpoint`.

A directory holds `model.bin`, `config.json` (suppressed tokens, language ids, alignment heads)
and `tokenizer.json` and/or `vocabulary.{json,txt}`. `model.bin` is a flat little-endian
container (CTranslate2's `ModelSpec._serialize`, binary version 6):

    u32 version | str spec_name | u32 revision | u32 n_vars
    n_vars × ( str name | u8 rank | u32 dims[rank] | u8 dtype | u32 nbytes | bytes )
    u32 n_aliases | n_aliases × ( str alias | str target )

with `str` = u16 length including a trailing NUL, then the bytes. Tensors are packed with no
padding, so the arrays mapped from it may be unaligned.

CTranslate2 fuses Whisper's projections: self-attention q, k, v are one `[3d, d]` matrix
(`linear_0`), cross-attention k, v one `[2d, d]` matrix (`attention/linear_1`). The converter
fills the missing k bias with zeros; we split the matrices back (row slices stay memory-mapped)
and drop that zero bias, since Whisper's k_proj has none.

A model.bin may arrive split into parts across two PyPI packages (`model.bin.part1`,
`model.bin.part2`): `read_ct2(dir, parts=[...])` maps each part; a tensor that straddles the cut
is the only thing copied.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from .bytelevel import byte_level_to_bytes
from .checkpoint import Checkpoint, CheckpointError, bf16_to_f32, dims_from_tensors, open_map, validate

# dtype ids of binary version ≥ 4
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}
_ITEMSIZE = {0: 4, 1: 1, 2: 2, 3: 4, 4: 2, 5: 2}
MAX_RANK = 8
MAX_STR = 4096


class _Bytes:
    """One logical byte string over one or more memory-mapped parts."""

    def __init__(self, paths):
        self.paths = list(paths)
        self.maps = [open_map(p) for p in self.paths]
        self.starts = np.cumsum([0] + [len(m) for m in self.maps])
        self.size = int(self.starts[-1])
        self.name = self.paths[0] if len(self.paths) == 1 else " + ".join(self.paths)

    def take(self, off, n):
        """n bytes at off as a uint8 array: a view inside one part, a copy across a cut."""
        if off < 0 or n < 0 or off + n > self.size:
            raise CheckpointError(self.name, f"a length at byte {off} reaches past the end of the file "
                                             f"({off + n} > {self.size}): truncated or corrupt")
        i = int(np.searchsorted(self.starts, off, side="right")) - 1
        lo = off - int(self.starts[i])
        if lo + n <= len(self.maps[i]):
            return self.maps[i][lo:lo + n]
        return np.concatenate([self.take(off, len(self.maps[i]) - lo),
                               self.take(int(self.starts[i + 1]), n - (len(self.maps[i]) - lo))])


class _Reader:
    def __init__(self, buf):
        self.b = buf
        self.o = 0

    def raw(self, n):
        a = self.b.take(self.o, n)
        self.o += n
        return a

    def u8(self):
        return int(self.raw(1)[0])

    def u16(self):
        return struct.unpack("<H", self.raw(2).tobytes())[0]

    def u32(self):
        return struct.unpack("<I", self.raw(4).tobytes())[0]

    def str(self):
        n = self.u16()
        if n == 0 or n > MAX_STR:
            raise CheckpointError(self.b.name, f"string length {n} at byte {self.o - 2} is invalid")
        s = self.raw(n).tobytes()
        try:
            return s[:-1].decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointError(self.b.name, f"string at byte {self.o - n} is not UTF-8") from None


def read_model_bin(paths):
    """Parse model.bin (or its parts) → ({ct2 name: array}, {alias: target}, spec name)."""
    buf = _Bytes(paths)
    r = _Reader(buf)
    version = r.u32()
    if not 1 <= version <= 6:
        raise CheckpointError(buf.name, f"not a CTranslate2 model.bin (binary version {version}, expected 1..6)")
    spec = ""
    if version >= 2:
        spec = r.str()
        r.u32()   # the spec's revision: nothing here depends on it
    n_vars = r.u32()
    if n_vars > buf.size // 8:
        raise CheckpointError(buf.name, f"claims {n_vars} variables, more than the file can hold")
    out = {}
    for _ in range(n_vars):
        name = r.str()
        rank = r.u8()
        if rank > MAX_RANK:
            raise CheckpointError(buf.name, f"variable {name}: rank {rank} is absurd")
        dims = tuple(r.u32() for _ in range(rank))
        dt = r.u8()
        if version >= 4:
            if dt not in _DTYPES:
                raise CheckpointError(buf.name, f"variable {name}: unknown dtype id {dt}")
            nbytes = r.u32()
            item = _ITEMSIZE[dt]
        else:  # versions 1..3 store the item size and an element count
            item = dt
            dt = {4: 0, 1: 1, 2: 4}.get(item)
            if dt is None:
                raise CheckpointError(buf.name, f"variable {name}: unsupported item size {item}")
            nbytes = r.u32() * item
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if count * item != nbytes:
            raise CheckpointError(buf.name, f"variable {name}: shape {dims} needs {count * item} bytes, "
                                            f"the file says {nbytes}")
        raw = r.raw(nbytes)
        if _DTYPES[dt] == "bfloat16":
            arr = bf16_to_f32(raw.view(np.uint16)).reshape(dims)
        else:
            arr = raw.view(_DTYPES[dt]).reshape(dims)
        out[name] = arr
    aliases = {}
    if version >= 3:
        n_alias = r.u32()
        if n_alias > buf.size:
            raise CheckpointError(buf.name, f"claims {n_alias} aliases")
        for _ in range(n_alias):
            a, t = r.str(), r.str()
            aliases[a] = t
    if spec and spec != "WhisperSpec":
        raise CheckpointError(buf.name, f"holds a {spec} model, not Whisper")
    return out, aliases, buf.maps


def _dequant(path, v, name):
    """A weight as float: int8 weights carry per-row `weight_scale` (w = q / scale)."""
    w = v[name]
    if w.dtype in (np.float32, np.float16):
        return w
    scale = v.get(name + "_scale")
    if scale is None:
        raise CheckpointError(path, f"variable {name} is {w.dtype} without a scale: unsupported")
    if w.dtype == np.int8:
        return (w.reshape(w.shape[0], -1).astype(np.float32) / scale.astype(np.float32).reshape(-1, 1)).reshape(w.shape)
    return w.astype(np.float32) / np.float32(scale)  # int16: one scalar scale


def _scalar(v, name, default):
    a = v.get(name)
    return default if a is None else int(np.asarray(a).reshape(-1)[0])


def to_hf(path, v):
    """Translate CT2 variable names (and fused projections) to HF tensors."""
    t = {}

    def put(hf, ct2, rows=None):
        if ct2 not in v:
            raise CheckpointError(path, f"variable {ct2} is missing")
        a = _dequant(path, v, ct2) if ct2.endswith("weight") else v[ct2]
        t[hf] = a if rows is None else a[rows]

    def ln(hf, ct2):
        put(hf + ".weight", ct2 + "/gamma")
        put(hf + ".bias", ct2 + "/beta")

    def lin(hf, ct2, rows=None, bias=True):
        put(hf + ".weight", ct2 + "/weight", rows)
        if bias:
            put(hf + ".bias", ct2 + "/bias", rows)

    put("model.encoder.conv1.weight", "encoder/conv1/weight")
    put("model.encoder.conv1.bias", "encoder/conv1/bias")
    put("model.encoder.conv2.weight", "encoder/conv2/weight")
    put("model.encoder.conv2.bias", "encoder/conv2/bias")
    put("model.encoder.embed_positions.weight", "encoder/position_encodings/encodings")
    ln("model.encoder.layer_norm", "encoder/layer_norm")
    put("model.decoder.embed_tokens.weight", "decoder/embeddings/weight")
    put("model.decoder.embed_positions.weight", "decoder/position_encodings/encodings")
    ln("model.decoder.layer_norm", "decoder/layer_norm")

    for side in ("encoder", "decoder"):
        i = 0
        while f"{side}/layer_{i}/ffn/linear_0/weight" in v:
            c, h = f"{side}/layer_{i}/", f"model.{side}.layers.{i}."
            d = v[c + "self_attention/linear_1/weight"].shape[0]
            q, k, w = slice(0, d), slice(d, 2 * d), slice(2 * d, 3 * d)
            lin(h + "self_attn.q_proj", c + "self_attention/linear_0", q)
            lin(h + "self_attn.k_proj", c + "self_attention/linear_0", k, bias=False)
            lin(h + "self_attn.v_proj", c + "self_attention/linear_0", w)
            lin(h + "self_attn.out_proj", c + "self_attention/linear_1")
            ln(h + "self_attn_layer_norm", c + "self_attention/layer_norm")
            if side == "decoder":
                lin(h + "encoder_attn.q_proj", c + "attention/linear_0")
                lin(h + "encoder_attn.k_proj", c + "attention/linear_1", slice(0, d), bias=False)
                lin(h + "encoder_attn.v_proj", c + "attention/linear_1", slice(d, 2 * d))
                lin(h + "encoder_attn.out_proj", c + "attention/linear_2")
                ln(h + "encoder_attn_layer_norm", c + "attention/layer_norm")
            lin(h + "fc1", c + "ffn/linear_0")
            lin(h + "fc2", c + "ffn/linear_1")
            ln(h + "final_layer_norm", c + "ffn/layer_norm")
            i += 1
    return t


def read_ct2(directory, parts=None, meta_dir=None):
    """Read a CTranslate2 Whisper directory. `parts`: model.bin split into files, in order;
    `meta_dir`: where config.json / tokenizer.json live when not beside the weights."""
    directory = os.fspath(directory)
    meta_dir = os.fspath(meta_dir or directory)
    if parts is None:
        parts = [os.path.join(directory, "model.bin")]
    for p in parts:
        if not os.path.isfile(p):
            raise CheckpointError(p, "no such file")
    v, aliases, maps = read_model_bin(parts)
    name = parts[0] if len(parts) == 1 else " + ".join(parts)
    for a, target in aliases.items():
        if target in v:
            v.setdefault(a, v[target])
    tensors = to_hf(name, v)
    dims = dims_from_tensors(name, tensors, _scalar(v, "encoder/num_heads", 0), _scalar(v, "decoder/num_heads", 0))
    cfg_path = os.path.join(meta_dir, "config.json")
    config = _read_json(cfg_path)
    tok = os.path.join(meta_dir, "tokenizer.json")
    ck = Checkpoint(
        dims=dims, tensors=tensors, path=directory, container="ct2",
        tokenizer_json=tok if os.path.isfile(tok) else None,
        vocab_bytes=None if os.path.isfile(tok) else _read_vocabulary(meta_dir),
        suppress_ids=_ids(cfg_path, config, "suppress_ids"),
        suppress_ids_begin=_ids(cfg_path, config, "suppress_ids_begin"),
        alignment_heads=_heads(cfg_path, config),
        lang_ids=_ids(cfg_path, config, "lang_ids"),
        _keepalive=maps,
    )
    return validate(ck)


def _read_json(path, kind=dict):
    if not os.path.isfile(path):
        return kind()
    try:
        with open(path, encoding="utf-8") as f:
            out = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"not valid JSON: {e}") from None
    if not isinstance(out, kind):
        raise CheckpointError(path, f"expected a JSON {'object' if kind is dict else 'list'}")
    return out


def _ids(path, config, key):
    """A list of token ids from config.json, or None; anything else is named as wrong."""
    v = config.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise CheckpointError(path, f"{key} must be a list of token ids")
    return v


def _heads(path, config):
    v = config.get("alignment_heads")
    if not v:
        return None
    if not isinstance(v, list) or not all(isinstance(h, list) and len(h) == 2 and
                                          all(isinstance(i, int) for i in h) for h in v):
        raise CheckpointError(path, "alignment_heads must be a list of [layer, head] pairs")
    return [tuple(h) for h in v]


def _read_vocabulary(d):
    """vocabulary.json (a list) or vocabulary.txt (a line each) → raw token bytes, in id order."""
    pj, pt = os.path.join(d, "vocabulary.json"), os.path.join(d, "vocabulary.txt")
    if os.path.isfile(pj):
        words = _read_json(pj, list)
        if not all(isinstance(w, str) for w in words):
            raise CheckpointError(pj, "expected a JSON list of token strings")
    elif os.path.isfile(pt):
        try:
            with open(pt, encoding="utf-8") as f:
                words = f.read().split("\n")
        except UnicodeDecodeError:
            raise CheckpointError(pt, "not UTF-8 text") from None
        if words and words[-1] == "":   # the newline that ends the last line
            words.pop()
    else:
        raise CheckpointError(d, "no tokenizer.json, vocabulary.json or vocabulary.txt")
    return [byte_level_to_bytes(w) for w in words]
