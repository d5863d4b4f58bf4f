"""openai-whisper's .pt checkpoints, written and read without torch (io/pt.py, io/torch_zip.py).

Golden data: features-pt.json (fixtures/make_golden_features.py --only pt) — the .pt that
`nwhisper convert MODEL X.pt --to pt` writes, read by `torch.load(weights_only=True)` (every tensor
bit for bit) and transcribed by openai-whisper 20250625 on the 63 s clip. Here: the .pt written
now holds the same bytes, reads back as a Checkpoint, and transcribes the 63 s clip into
openai-whisper's tokens, window for window. (That torch.save's own files read right is
test_torch_zip.py's, on a file torch wrote.)
"""

import dataclasses
import hashlib
import zipfile

import numpy as np
import pytest
from fixture_audio import MODELS, audio
from paths import golden

import nwhisper
from nwhisper.io.checkpoint import CheckpointError
from nwhisper.io.convert import convert
from nwhisper.io.ggml import to_openai_name
from nwhisper.io.pt import write_pt
from nwhisper.io.registry import load_checkpoint, resolve

PT = golden("features-pt.json")


@pytest.fixture(scope="module", params=MODELS)
def written(request, tmp_path_factory):
    name = request.param
    return name, convert(name, tmp_path_factory.mktemp("pt") / f"{name}.pt", to="pt")


def test_the_file_torch_and_openai_whisper_read(written):
    name, path = written
    g = PT["models"][name]
    assert g["torch_read_same"] == len(g["tensors"])
    ck = load_checkpoint(path)
    assert resolve(path).container == ck.container == "pt"
    got = {to_openai_name(k): hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()
           for k, v in ck.tensors.items()}
    assert got == g["tensors"]


def test_transcribes_as_openai_whisper_does_from_it(written):
    name, path = written
    m = nwhisper.load(path)
    x = audio(PT["clip"], PT["audio_sha256"])
    segments = list(m.transcribe(x, language="en" if m.dims.is_multilingual else None)[0])
    assert [list(s.tokens) for s in segments] == [s["tokens"] for s in PT["models"][name]["segments"]]


def test_broken_pt_files_are_named(written, tmp_path):
    name, path = written
    ck = load_checkpoint(path)
    wrong = dataclasses.replace(ck, dims=dataclasses.replace(ck.dims, n_text_state=ck.dims.n_text_state * 2,
                                                             n_text_head=ck.dims.n_text_head))
    write_pt(wrong, tmp_path / "wrong.pt")
    with pytest.raises(CheckpointError, match="shape"):
        load_checkpoint(str(tmp_path / "wrong.pt"))
    cut = tmp_path / "cut.pt"
    cut.write_bytes(open(path, "rb").read()[:1 << 20])
    with pytest.raises(CheckpointError, match="PyTorch checkpoint|truncated"):
        load_checkpoint(str(cut))
    evil = tmp_path / "evil.pt"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueJ\x01\x00\x00\x00\x85R.")
    with pytest.raises(CheckpointError, match="os.system"):
        nwhisper.load(str(evil))
