"""The one shape every model container is read into.

Three containers carry Whisper weights (a Hugging Face directory, a whisper.cpp ggml file, a
CTranslate2 directory). Each reader in this package turns its container into a `Checkpoint`:
hyperparameters read from the file (`Dims`), tensors under their Hugging Face names, and the
extra facts the decoder needs (suppressed tokens, alignment heads) where the container has them.
Nothing past `io/` ever sees a foreign tensor name.

Tensors are NumPy arrays, memory-mapped from the file wherever the format allows, in the file's
own precision (float32 or float16; bfloat16 is widened to float32 on load, exactly, because NumPy
has no bfloat16). A mapped array may be unaligned (CTranslate2 packs tensors with no padding):
consumers that need alignment copy.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from dataclasses import dataclass, field

import numpy as np


class CheckpointError(ValueError):
    """A model file that cannot be read: the message names the file and what is wrong."""

    def __init__(self, path, problem):
        self.path = str(path)
        # Names and strings quoted from a hostile file may hold control characters: escape
        # them, so the message stays one printable line.
        self.problem = "".join(c if c.isprintable() else repr(c)[1:-1] for c in problem)
        super().__init__(f"{self.path}: {self.problem}")


# Limits that no real Whisper exceeds by far; a header claiming more is lying, and we refuse it
# before allocating anything it asks for.
MAX_DIM = 1 << 20          # any one dimension (vocabularies are ~52k, widths ≤ 1280)
MAX_LAYERS = 256
MAX_HEADS = 1024

N_TIMESTAMPS = 1501        # <|0.00|> … <|30.00|> in 0.02 s steps

# openai-whisper's language codes in token order (its LANGUAGES dict). A model has the first
# num_languages of them: 99, or 100 since large-v3 added Cantonese.
LANGUAGE_CODES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no "
    "th ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw "
    "gl mr pa si km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl "
    "mg as tt haw ln ha ba jw su yue"
).split()

# The control tokens between the languages and the timestamps, in id order.
TASK_TOKENS = ("<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
               "<|nospeech|>", "<|notimestamps|>")


def special_names(num_languages):
    """The special tokens between the base words and the timestamps, in id order:
    <|endoftext|>, <|startoftranscript|>, one per language, then TASK_TOKENS."""
    return (["<|endoftext|>", "<|startoftranscript|>"]
            + [f"<|{c}|>" for c in LANGUAGE_CODES[:num_languages]] + list(TASK_TOKENS))


@dataclass(frozen=True)
class Dims:
    """Whisper's hyperparameters, named as openai-whisper's `ModelDimensions`."""

    n_mels: int
    n_audio_ctx: int      # encoder positions (1500 = 3000 mel frames / conv stride 2)
    n_audio_state: int    # encoder width d_model
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int       # decoder positions (448)
    n_text_state: int
    n_text_head: int
    n_text_layer: int

    def check(self, path):
        """Refuse dimensions no Whisper has, naming the field."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, np.integer)) or v <= 0 or v > MAX_DIM:
                raise CheckpointError(path, f"hyperparameter {f.name} = {v!r} is not a sane size")
        for name in ("n_audio_layer", "n_text_layer"):
            if getattr(self, name) > MAX_LAYERS:
                raise CheckpointError(path, f"hyperparameter {name} = {getattr(self, name)} is absurd")
        for width, heads in (("n_audio_state", "n_audio_head"), ("n_text_state", "n_text_head")):
            h = getattr(self, heads)
            if h > MAX_HEADS or getattr(self, width) % h:
                raise CheckpointError(path, f"{width} = {getattr(self, width)} is not divisible by {heads} = {h}")
        return self

    @property
    def is_multilingual(self):
        # openai-whisper: English-only vocabularies have 51864 entries, multilingual ones ≥ 51865.
        return self.n_vocab >= 51865

    @property
    def num_languages(self):
        # openai-whisper's count: 99 languages, or 100 for large-v3's 51866-entry vocabulary.
        return self.n_vocab - 51765 - int(self.is_multilingual)

    def positional_special_ids(self):
        """Special-token ids by position, {name: id} for special_names and <|0.00|>, as
        whisper.cpp derives them for a ggml file, whose vocabulary has no text for them.
        openai-whisper's vocabulary ends with special_names(num_languages) and 1501 timestamps
        (<|0.00|> … <|30.00|>, 0.02 s apart), so every id follows from n_vocab. None for a
        vocabulary too small to be Whisper's (e.g. a test model)."""
        if not 0 < self.num_languages <= len(LANGUAGE_CODES):
            return None
        names = special_names(self.num_languages) + ["<|0.00|>"]
        eot = self.n_vocab - N_TIMESTAMPS - len(names) + 1
        if eot <= 0:
            return None
        return {name: eot + k for k, name in enumerate(names)}


@dataclass
class Checkpoint:
    """A loaded model: dims, HF-named tensors, tokenizer source and decoding metadata."""

    dims: Dims
    tensors: dict                  # HF name -> np.ndarray (float32 or float16)
    path: str                      # the file or directory it was read from
    container: str                 # "hf" | "ggml" | "ct2"
    tokenizer_json: str | None = None   # path of a tokenizer.json, when the container has one
    vocab_bytes: list | None = None     # ggml: the raw base words, in id order
    suppress_ids: list | None = None    # non-speech tokens to suppress (HF/CT2 metadata)
    suppress_ids_begin: list | None = None
    alignment_heads: list | None = None  # [(layer, head), ...] for word timestamps
    lang_ids: list | None = None
    _keepalive: list = field(default_factory=list, repr=False)  # open maps the arrays view

    def __getitem__(self, name):
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(self.path, f"tensor {name} is missing") from None

    def nbytes(self):
        return sum(t.nbytes for t in self.tensors.values())

    def release_pages(self, prefix=""):
        """Let go of the mapped file's pages under the tensors whose names start with `prefix`
        (all of them by default). A model keeps what it converted in memory of its own, and
        lets each layer's pages go once it has converted them, so that the file and the model
        are not resident together; a tensor it reads in place (a decoder's float16 rows) comes
        back from the page cache when next read. Afterwards the process's resident memory is
        what the model holds, not also the file."""
        page = mmap.PAGESIZE
        for name, t in self.tensors.items():
            if t.size == 0 or not name.startswith(prefix):
                continue
            m = t
            while m is not None and getattr(m, "_mmap", None) is None:
                m = m.base if isinstance(m, np.ndarray) else None
            if m is None:
                continue
            m = m._mmap                # a memmap's views carry their file's map too
            at = np.frombuffer(m, np.uint8, count=1).ctypes.data
            lo = t.ctypes.data + sum(min(0, st * (n - 1)) for st, n in zip(t.strides, t.shape))
            hi = t.ctypes.data + sum(max(0, st * (n - 1)) for st, n in zip(t.strides, t.shape)) + t.itemsize
            start = (lo - at) // page * page
            end = min(-(-(hi - at) // page) * page, len(m))
            m.madvise(mmap.MADV_DONTNEED, start, end - start)


def expected_shapes(d: Dims):
    """Every tensor a Whisper checkpoint must have, HF name -> shape.

    Note what is absent: `k_proj` has no bias (openai-whisper's key projection was built with
    bias=False), and there is no `proj_out`: the output projection is the token embedding.
    """
    s = {}
    a, t = d.n_audio_state, d.n_text_state
    s["model.encoder.conv1.weight"] = (a, d.n_mels, 3)
    s["model.encoder.conv1.bias"] = (a,)
    s["model.encoder.conv2.weight"] = (a, a, 3)
    s["model.encoder.conv2.bias"] = (a,)
    s["model.encoder.embed_positions.weight"] = (d.n_audio_ctx, a)
    s["model.encoder.layer_norm.weight"] = (a,)
    s["model.encoder.layer_norm.bias"] = (a,)
    for i in range(d.n_audio_layer):
        _block(s, f"model.encoder.layers.{i}.", a, cross=False)
    s["model.decoder.embed_tokens.weight"] = (d.n_vocab, t)
    s["model.decoder.embed_positions.weight"] = (d.n_text_ctx, t)
    s["model.decoder.layer_norm.weight"] = (t,)
    s["model.decoder.layer_norm.bias"] = (t,)
    for i in range(d.n_text_layer):
        _block(s, f"model.decoder.layers.{i}.", t, cross=True)
    return s


def _block(s, p, n, cross):
    attns = ("self_attn", "encoder_attn") if cross else ("self_attn",)
    for att in attns:
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            s[f"{p}{att}.{proj}.weight"] = (n, n)
            if proj != "k_proj":
                s[f"{p}{att}.{proj}.bias"] = (n,)
        s[f"{p}{att}_layer_norm.weight"] = (n,)
        s[f"{p}{att}_layer_norm.bias"] = (n,)
    s[f"{p}fc1.weight"] = (4 * n, n)
    s[f"{p}fc1.bias"] = (4 * n,)
    s[f"{p}fc2.weight"] = (n, 4 * n)
    s[f"{p}fc2.bias"] = (n,)
    s[f"{p}final_layer_norm.weight"] = (n,)
    s[f"{p}final_layer_norm.bias"] = (n,)


def validate(ck: Checkpoint):
    """Check that every tensor Whisper needs is present with the shape its dims imply."""
    for name, shape in expected_shapes(ck.dims).items():
        t = ck.tensors.get(name)
        if t is None:
            raise CheckpointError(ck.path, f"tensor {name} is missing")
        if tuple(t.shape) != shape:
            raise CheckpointError(ck.path, f"tensor {name} has shape {tuple(t.shape)}, expected {shape}")
        if t.dtype not in (np.float32, np.float16):
            raise CheckpointError(ck.path, f"tensor {name} has dtype {t.dtype}, expected float32 or float16")
    return ck


def dims_from_tensors(path, t, n_audio_head, n_text_head):
    """Read the dims off tensor shapes (for containers that store only head counts)."""

    def shape(name):
        if name not in t:
            raise CheckpointError(path, f"tensor {name} is missing")
        return t[name].shape

    def count(prefix):
        n = 0
        while f"{prefix}{n}.fc1.weight" in t:
            n += 1
        return n

    conv1 = shape("model.encoder.conv1.weight")
    if len(conv1) != 3:
        raise CheckpointError(path, f"tensor model.encoder.conv1.weight has rank {len(conv1)}, expected 3")
    return Dims(
        n_mels=int(conv1[1]),
        n_audio_ctx=int(shape("model.encoder.embed_positions.weight")[0]),
        n_audio_state=int(conv1[0]),
        n_audio_head=int(n_audio_head),
        n_audio_layer=count("model.encoder.layers."),
        n_vocab=int(shape("model.decoder.embed_tokens.weight")[0]),
        n_text_ctx=int(shape("model.decoder.embed_positions.weight")[0]),
        n_text_state=int(shape("model.decoder.embed_tokens.weight")[1]),
        n_text_head=int(n_text_head),
        n_text_layer=count("model.decoder.layers."),
    ).check(path)


def open_map(path):
    """Memory-map a whole file read-only; an empty file gets a clear error (mmap refuses it)."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise CheckpointError(path, f"cannot open: {e.strerror}") from None
    if size == 0:
        raise CheckpointError(path, "the file is empty")
    return np.memmap(path, dtype=np.uint8, mode="r")


def bf16_to_f32(raw_u16):
    """bfloat16 is the top half of a float32: widening is a 16-bit shift, exact."""
    return (raw_u16.astype(np.uint32) << 16).view(np.float32)
