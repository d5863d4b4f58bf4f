"""Pack a model small enough to travel to a lent GPU machine, and unpack it there.

    python3 bench/carry_model.py pack tiny.en .gpu/tiny.en-q8.npz
    python3 bench/carry_model.py unpack .gpu/tiny.en-q8.npz /tmp/tiny.en-q8     (on the device)

A device call carries at most 64 MiB and tiny.en's float16 weights are 75 MB, so every matrix
travels as int8 with one float32 scale per row (vectors stay float16), about half the bytes.
Unpacking writes a Hugging Face directory (float16 safetensors, the source's tokenizer.json and
configs) that nwhisper loads as a path. The weights are then tiny.en's rounded to 8 bits per row:
not the published model bit for bit, but real speech still decodes to nearly the same words, and
on the device both backends load the same unpacked weights, so the GPU-against-CPU comparison
bench/gpu.py makes is exact.
"""

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import nwhisper  # noqa: E402,F401  (before NumPy: nwhisper sets OpenBLAS's options)
import numpy as np  # noqa: E402

from nwhisper.io.convert import convert  # noqa: E402
from nwhisper.io.safetensors import read_safetensors, write_safetensors  # noqa: E402

TEXT_FILES = ("config.json", "generation_config.json", "tokenizer.json")


def pack(model, dst):
    with tempfile.TemporaryDirectory() as tmp:
        hf = convert(model, os.path.join(tmp, "hf"), to="hf")
        arrays = {}
        for name, t in read_safetensors(os.path.join(hf, "model.safetensors"))[0].items():
            t = np.asarray(t, np.float32)
            if t.ndim < 2:
                arrays["v:" + name] = t.astype(np.float16)
                continue
            rows = t.reshape(t.shape[0], -1)
            scale = np.abs(rows).max(axis=1) / 127
            scale[scale == 0] = 1
            arrays["q:" + name] = np.rint(rows / scale[:, None]).astype(np.int8).reshape(t.shape)
            arrays["s:" + name] = scale.astype(np.float32)
        for f in TEXT_FILES:
            path = os.path.join(hf, f)
            if os.path.isfile(path):
                with open(path, "rb") as fh:
                    arrays["f:" + f] = np.frombuffer(fh.read(), np.uint8)
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    np.savez_compressed(dst, **arrays)
    print(f"{dst}: {os.path.getsize(dst) / 2**20:.1f} MiB")


def unpack(src, dst):
    os.makedirs(dst, exist_ok=True)
    tensors = {}
    with np.load(src) as z:
        for key in z.files:
            kind, name = key.split(":", 1)
            if kind == "v":
                tensors[name] = z[key]
            elif kind == "q":
                q = z[key]
                scale = z["s:" + name].reshape((-1,) + (1,) * (q.ndim - 1))
                tensors[name] = (q.astype(np.float32) * scale).astype(np.float16)
            elif kind == "f":
                with open(os.path.join(dst, name), "wb") as fh:
                    fh.write(z[key].tobytes())
    write_safetensors(tensors, os.path.join(dst, "model.safetensors"), {"format": "pt"})
    print(f"{dst}: {len(tensors)} tensors")


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "unpack"):
        sys.exit(__doc__)
    (pack if sys.argv[1] == "pack" else unpack)(sys.argv[2], sys.argv[3])
