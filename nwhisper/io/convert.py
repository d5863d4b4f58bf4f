"""Write any loadable model into another container: `nwhisper convert SRC DST --to hf|ggml|pt`.

The source is read the usual way (a model name, an HF directory, a ggml file, a CTranslate2
directory) and written with the target container's writer; tensors keep their bits (see
`write_hf` and `write_ggml` for what each target adds or widens).
"""

from __future__ import annotations

import os

from .checkpoint import CheckpointError
from .ggml import write_ggml
from .pt import write_pt
from .registry import load_checkpoint, resolve
from .safetensors import write_hf

WRITERS = {"hf": write_hf, "ggml": write_ggml, "pt": write_pt}


def convert(src, dst, to="hf"):
    """Read model `src` and write it to `dst` as `to` ("hf": a directory, "ggml" or "pt": a file).
    Returns the path written."""
    if to not in WRITERS:
        raise ValueError(f"unknown target container {to!r}: expected hf, ggml or pt")
    dst = os.fspath(dst)
    source = resolve(src)
    if os.path.exists(dst) and os.path.exists(source.path) and os.path.samefile(source.path, dst):
        raise CheckpointError(dst, "is the same as the source: write the conversion somewhere else")
    WRITERS[to](load_checkpoint(src), dst)
    return dst
