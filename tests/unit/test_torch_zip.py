"""PyTorch checkpoints read without torch (nwhisper/io/torch_zip.py).

Truth: fixtures/torch/state.pt was written by torch.save itself (torch 2.13,
fixtures/make_torch_fixtures.py); every value is rebuilt here from the same recipe with NumPy.
Hostile files are built here: a pickle that asks for os.system or builtins.eval, a tensor that
reaches past its storage, a storage shorter than it says, truncated and compressed archives.
"""

from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import pytest
from paths import fixture

from nwhisper.io.checkpoint import CheckpointError
from nwhisper.io.torch_zip import read_torch_zip

STATE = fixture("torch", "state.pt")


def test_reads_what_torch_saved():
    obj = read_torch_zip(STATE)
    assert obj["dims"] == {"n_mels": 80, "n_vocab": 51864, "name": "recipe"}
    sd = obj["model_state_dict"]
    f32 = (np.arange(12, dtype=np.float32).reshape(3, 4) / np.float32(7)).astype(np.float32)
    want = {"f32": f32, "f16": f32.astype(np.float16), "bf16": np.arange(6, dtype=np.float32) * 0.5,
            "i64": np.arange(5, dtype=np.int64) - 2, "t": f32.T, "slice": f32[1:, 2:],
            "param": np.ones((2, 2), np.float32), "bool": np.array([True, False, True]),
            "empty": np.zeros((0, 3), np.float32)}
    assert list(sd) == list(want)
    for name, w in want.items():
        assert sd[name].dtype == w.dtype and sd[name].shape == w.shape, name
        assert np.array_equal(sd[name], w), name
    assert not sd["f32"].flags.writeable
    assert np.shares_memory(sd["f32"], sd["t"])             # views of one storage, not copies


def _int(v):
    return b"J" + struct.pack("<i", v)


def _tuple(vs):
    return b"(" + b"".join(_int(v) for v in vs) + b"t"


def tensor_pickle(numel, offset, size, stride, callee=b"torch._utils\n_rebuild_tensor_v2\n"):
    """data.pkl of {"w": tensor}, written opcode by opcode as torch writes it."""
    storage = (b"(X\x07\x00\x00\x00storage" + b"ctorch\nFloatStorage\n" + b"X\x01\x00\x00\x000"
               + b"X\x03\x00\x00\x00cpu" + _int(numel) + b"tQ")
    args = (b"(" + storage + _int(offset) + _tuple(size) + _tuple(stride) + b"\x89"
            + b"ccollections\nOrderedDict\n)R" + b"t")
    return b"\x80\x02}(X\x01\x00\x00\x00w" + b"c" + callee + args + b"Ru."


def archive(pkl, storage=b"", compress=zipfile.ZIP_STORED):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compress) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", storage)
    return buf.getvalue()


@pytest.fixture
def read_bytes(tmp_path):
    def read(data):
        path = tmp_path / "model.pt"
        path.write_bytes(data)
        return read_torch_zip(str(path))
    return read


def test_a_hand_made_tensor_reads(read_bytes):
    data = np.arange(6, dtype="<f4").tobytes()
    w = read_bytes(archive(tensor_pickle(6, 1, (2, 2), (2, 1)), data))["w"]
    assert np.array_equal(w, np.array([[1, 2], [3, 4]], np.float32))


@pytest.mark.parametrize("data, says", [
    (archive(tensor_pickle(4, 0, (4,), (1,), b"os\nsystem\n"), b"\0" * 16), "asks for os.system"),
    (archive(tensor_pickle(4, 0, (4,), (1,), b"builtins\neval\n"), b"\0" * 16), "asks for builtins.eval"),
    (archive(tensor_pickle(4, 0, (3, 2), (2, 1)), b"\0" * 16), "reaches element 5"),
    (archive(tensor_pickle(4, 3, (2,), (1,)), b"\0" * 16), "reaches element 4"),
    (archive(tensor_pickle(4, 0, (2,), (-1,)), b"\0" * 16), "negative"),
    (archive(tensor_pickle(8, 0, (8,), (1,)), b"\0" * 16), "holds 16 bytes"),
    (archive(tensor_pickle(4, 0, (4,), (1,)), b"\0" * 16, zipfile.ZIP_DEFLATED), "compressed"),
    (archive(b"\x80\x02}(X\x01\x00\x00\x00w" + b"cposix\nsystem\n" + b"X\x02\x00\x00\x00idtR" + b"u."),
     "asks for posix.system"),
    (archive(b"\x80\x02not a pickle at all"), "cannot be read"),
    (open(STATE, "rb").read()[:2000], "not a PyTorch checkpoint"),
    (b"\x80\x02}." * 10, "not a PyTorch checkpoint"),
], ids=["os.system", "eval", "shape past storage", "offset past storage", "negative stride",
        "storage short", "compressed", "posix.system called", "not a pickle", "truncated",
        "not a zip"])
def test_hostile_and_broken_files_are_refused(read_bytes, data, says):
    with pytest.raises(CheckpointError, match=says):
        read_bytes(data)


def test_an_archive_without_data_pkl_is_named(read_bytes):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("model.bin", b"x")
    with pytest.raises(CheckpointError, match="no <name>/data.pkl"):
        read_bytes(buf.getvalue())
