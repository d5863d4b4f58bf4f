"""PyTorch's checkpoint files (`torch.save`'s zip format) read without torch and without
unrestricted pickle: openai-whisper's .pt models, the speaker network's weights.

    obj = read_torch_zip("tiny.en.pt")     # dicts, lists, numbers, strings and NumPy arrays

A checkpoint is a zip archive: `<name>/data.pkl` (a pickle of the object, protocol 2) beside one
entry per tensor storage (`<name>/data/<key>`, stored uncompressed). The pickle may name only the
few callables a state dict is made of — what `torch.load(weights_only=True)` allows:
collections.OrderedDict, torch._utils._rebuild_tensor_v2 / _rebuild_parameter and the storage
types — and its storages come through the persistent ids torch writes ("storage", type, key,
location, numel). Anything else it asks for (os.system, builtins.eval, a class) is refused with
a CheckpointError naming it: a hostile file is an error, never code that runs. Tensors are
NumPy views of the memory-mapped archive (no copy), shape and strides checked against their
storage's bounds; bfloat16 is widened to float32 exactly.
"""

from __future__ import annotations

import collections
import mmap
import pickle
import struct
import zipfile

import numpy as np

from .checkpoint import CheckpointError, bf16_to_f32

# torch's storage types (pickled as `torch <Name>`) → NumPy dtypes
STORAGES = {
    "FloatStorage": np.float32, "HalfStorage": np.float16, "DoubleStorage": np.float64,
    "BFloat16Storage": "bfloat16", "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}
MAX_PICKLE = 64 << 20            # bytes of data.pkl: a state dict's is kilobytes


class _Storage:
    """A storage type as the pickle names it (`torch FloatStorage`)."""

    def __init__(self, name):
        self.name, self.dtype = name, STORAGES[name]


class _Unpickler(pickle.Unpickler):
    def __init__(self, data, path, storage):
        import io

        super().__init__(io.BytesIO(data))
        self.path, self._storage = path, storage

    def find_class(self, module, name):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return self._tensor
        if module == "torch._utils" and name in ("_rebuild_parameter", "_rebuild_parameter_with_state"):
            return lambda data, requires_grad, hooks, state=None: data
        if module == "torch" and name in STORAGES:
            return _Storage(name)
        raise CheckpointError(self.path, f"the pickle asks for {module}.{name}, which a tensor "
                                         f"state dict never needs: refused (not loaded)")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _Storage) and isinstance(pid[2], str)
                and isinstance(pid[4], int) and pid[4] >= 0):
            raise CheckpointError(self.path, f"a persistent id that is not a tensor storage: {pid!r:.80}")
        return self._storage(pid[1], pid[2], pid[4])

    def _tensor(self, storage, offset, size, stride, requires_grad=False, hooks=None, *metadata):
        flat, dtype = storage
        if not (isinstance(offset, int) and isinstance(size, tuple) and isinstance(stride, tuple)
                and len(size) == len(stride) and all(isinstance(v, int) for v in size + stride)):
            raise CheckpointError(self.path, "a tensor whose offset, size or stride is not whole numbers")
        if offset < 0 or any(n < 0 for n in size) or any(s < 0 for s in stride):
            raise CheckpointError(self.path, f"a tensor with a negative offset, size or stride: "
                                             f"{offset}, {size}, {stride}")
        last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset - 1
        if last >= len(flat):
            raise CheckpointError(self.path, f"a tensor of shape {size} reaches element {last} of "
                                             f"a storage of {len(flat)}")
        item = flat.itemsize
        x = np.lib.stride_tricks.as_strided(flat[offset:] if len(flat) > offset else flat[:0],
                                            shape=size, strides=tuple(s * item for s in stride),
                                            writeable=False)
        return bf16_to_f32(np.ascontiguousarray(x)) if dtype == "bfloat16" else x


def read_torch_zip(path):
    """The object a torch.save'd zip holds, its tensors as read-only NumPy arrays."""
    try:
        zf = zipfile.ZipFile(path)
        infos = {i.filename: i for i in zf.infolist()}
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise CheckpointError(path, f"not a PyTorch checkpoint (zip): {e}") from None
    pkls = [n for n in infos if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pkls) != 1:
        raise CheckpointError(path, "not a PyTorch checkpoint: no <name>/data.pkl in the zip "
                                    "(a checkpoint from before PyTorch 1.6 must be re-saved)")
    root = pkls[0][:-len("data.pkl")]
    if infos[pkls[0]].file_size > MAX_PICKLE:
        raise CheckpointError(path, f"data.pkl of {infos[pkls[0]].file_size} bytes is no state dict's")
    order = infos.get(root + "byteorder")
    if order is not None and zf.read(order).strip() not in (b"little", b""):
        raise CheckpointError(path, "a big-endian checkpoint: not supported")
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    seen = {}

    def storage(kind, key, numel):
        name = f"{root}data/{key}"
        if name not in infos:
            raise CheckpointError(path, f"storage {key!r} is missing from the archive")
        dtype = np.uint16 if kind.dtype == "bfloat16" else np.dtype(kind.dtype)
        if name not in seen:
            seen[name] = _entry(path, mapped, infos[name])
        raw = seen[name]
        need = numel * np.dtype(dtype).itemsize
        if need > len(raw):
            raise CheckpointError(path, f"storage {key!r} holds {len(raw)} bytes, not the {need} "
                                        f"its {numel} {kind.name} elements take (truncated?)")
        return np.frombuffer(raw, dtype, count=numel), kind.dtype

    try:
        return _Unpickler(zf.read(pkls[0]), path, storage).load()
    except CheckpointError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
            AttributeError, struct.error, zipfile.BadZipFile) as e:
        raise CheckpointError(path, f"its data.pkl cannot be read: {type(e).__name__}: {e}") from None
    finally:
        zf.close()


def _entry(path, mapped, info):
    """A stored zip entry's bytes, as a view of the mapped file."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise CheckpointError(path, f"{info.filename} is compressed: torch stores its tensors raw")
    at = info.header_offset
    head = mapped[at:at + 30]
    if len(head) < 30 or head[:4] != b"PK\x03\x04":
        raise CheckpointError(path, f"{info.filename}: no local header where the zip says")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    start = at + 30 + name_len + extra_len
    if start + info.file_size > len(mapped):
        raise CheckpointError(path, f"{info.filename} runs past the end of the file (truncated)")
    return memoryview(mapped)[start:start + info.file_size]
