"""openai-whisper's checkpoints (`~/.cache/whisper/NAME.pt`): `torch.save({"dims": …,
"model_state_dict": …})`, read without torch (torch_zip.py) and written the same way.

    ck = read_pt("large-v3-turbo.pt")           # a Checkpoint like any other container's
    write_pt(ck, "tiny.en.pt")                  # what openai-whisper's load_model reads

The dims are openai's ModelDimensions; the tensors carry openai's names (whisper.cpp keeps the
same ones: io/ggml.py maps them). A .pt holds no vocabulary: its words come from openai-whisper's
own tokenizer files when that package is installed (assets/gpt2.tiktoken, multilingual.tiktoken),
else from an installed model of the same vocabulary (English-only: tiny.en's; multilingual:
base's). Alignment heads come from the released models' table by shape (alignment_heads.py), as
openai-whisper takes them from its own.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import importlib.util
import io
import os
import struct
import zipfile

import numpy as np

from .checkpoint import Checkpoint, CheckpointError, Dims, validate
from .ggml import to_hf_name, to_openai_name
from .torch_zip import read_torch_zip

STORAGE_NAMES = {np.dtype(np.float32): "FloatStorage", np.dtype(np.float16): "HalfStorage"}


def read_pt(path, tokenizers=None):
    """`tokenizers`: {n_vocab: tokenizer.json path} of the models at hand (the registry's
    installed ones), for a .pt whose vocabulary openai-whisper's files cannot give."""
    path = os.fspath(path)
    obj = read_torch_zip(path)
    if not (isinstance(obj, dict) and isinstance(obj.get("dims"), dict)
            and isinstance(obj.get("model_state_dict"), dict)):
        raise CheckpointError(path, "not an openai-whisper checkpoint: expected {\"dims\", "
                                    "\"model_state_dict\"}")
    fields = {f.name for f in dataclasses.fields(Dims)}
    missing = sorted(fields - set(obj["dims"]))
    if missing:
        raise CheckpointError(path, f"dims lacks {', '.join(missing)}")
    dims = Dims(**{k: obj["dims"][k] for k in fields}).check(path)
    tensors = {}
    for name, t in obj["model_state_dict"].items():
        hf = to_hf_name(name) if isinstance(name, str) else None
        if hf is None:
            if name == "alignment_heads":          # a buffer some savers keep: heads come by shape
                continue
            raise CheckpointError(path, f"unknown tensor {name!r:.80}: not a Whisper weight")
        if not isinstance(t, np.ndarray) or t.dtype not in (np.float32, np.float16):
            raise CheckpointError(path, f"tensor {name} is not float32 or float16")
        tensors[hf] = t
    tokenizer_json, words = _vocabulary(path, dims, tokenizers or {})
    return validate(Checkpoint(dims=dims, tensors=tensors, path=path, container="pt",
                               tokenizer_json=tokenizer_json, vocab_bytes=words))


def _vocabulary(path, dims, tokenizers):
    """(tokenizer.json path, None) or (None, base words) for a .pt of these dims."""
    spec = importlib.util.find_spec("whisper")
    if spec is not None and spec.submodule_search_locations:
        name = "multilingual.tiktoken" if dims.is_multilingual else "gpt2.tiktoken"
        assets = os.path.join(list(spec.submodule_search_locations)[0], "assets", name)
        if os.path.isfile(assets):
            return None, tiktoken_words(assets)
    if dims.n_vocab in tokenizers:
        return tokenizers[dims.n_vocab], None
    raise CheckpointError(path, "a .pt carries no vocabulary: install openai-whisper (its "
                                "tokenizer files) or a model of the same vocabulary "
                                "(tiny.en for English-only, base for multilingual)")


def tiktoken_words(path):
    """The base words of a tiktoken file ("<base64 bytes> <rank>" per line), in rank order."""
    words = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                words[int(rank)] = base64.b64decode(token)
    return [words[i] for i in range(len(words))]


# -- writing --------------------------------------------------------------------------------------


def write_pt(ck, path):
    """ck as openai-whisper saves its models: a torch zip of {"dims", "model_state_dict"}, the
    tensors in the checkpoint's precision (float32 or float16; others widened to float32)."""
    path = os.fspath(path)
    state = collections.OrderedDict()
    for hf, t in ck.tensors.items():
        name = to_openai_name(hf)
        if name is None:
            raise CheckpointError(ck.path, f"tensor {hf} has no openai-whisper name")
        a = np.ascontiguousarray(t)
        state[name] = a if a.dtype in STORAGE_NAMES else a.astype(np.float32)
    dims = {f.name: int(getattr(ck.dims, f.name)) for f in dataclasses.fields(Dims)}
    pkl = _pickle(dims, state)
    tmp = path + ".partial"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        for i, a in enumerate(state.values()):
            z.writestr(f"archive/data/{i}", a.tobytes())
        z.writestr("archive/version", "3\n")
    os.replace(tmp, path)
    return path


def _pickle(dims, state):
    """data.pkl as torch.save writes it (protocol 2): the dims dict, then an OrderedDict of
    _rebuild_tensor_v2(storage, 0, shape, strides, False, OrderedDict()) with storages as
    persistent ids ("storage", torch.<Type>Storage, key, "cpu", numel)."""
    out = io.BytesIO()
    w = out.write

    def text(s):
        b = s.encode("utf-8")
        w(b"X" + struct.pack("<I", len(b)) + b)

    def whole(v):
        w(b"J" + struct.pack("<i", v)) if v < 1 << 31 else w(b"\x8a\x08" + struct.pack("<q", v))

    def ints(vs):
        w(b"(")
        for v in vs:
            whole(v)
        w(b"t")

    w(b"\x80\x02}(")
    text("dims")
    w(b"}(")
    for k, v in dims.items():
        text(k)
        whole(v)
    w(b"u")
    text("model_state_dict")
    w(b"ccollections\nOrderedDict\n)R(")
    for i, (name, a) in enumerate(state.items()):
        text(name)
        w(b"ctorch._utils\n_rebuild_tensor_v2\n((")
        text("storage")
        w(f"ctorch\n{STORAGE_NAMES[a.dtype]}\n".encode())
        text(str(i))
        text("cpu")
        whole(a.size)
        w(b"tQ")
        whole(0)
        ints(a.shape)
        ints([s // a.itemsize for s in a.strides])
        w(b"\x89ccollections\nOrderedDict\n)RtR")
    w(b"uu.")
    return out.getvalue()
