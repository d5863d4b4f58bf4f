"""Every kernel op on the CPU backend against a NumPy reference computed in float64.

Truth: the NumPy formulas below (LayerNorm, erf-GELU, Conv1d, scaled dot-product attention as in
openai/whisper model.py), on random inputs. Each assertion message carries max |Δ|; tolerances
are for float32 arithmetic with reassociated sums. Fast paths (BLAS GEMM, BLAS attention) are
also checked against the portable bodies they stand in for.
"""

import math
import os
import subprocess
import sys

import numpy as np
import paths
import pytest

from nwhisper import backend
from nwhisper import kernels as K
from nwhisper.kernels import (_compile, attention_blocked, attention_fused, gemm_bf16, gemm_f32,
                              gemm_int8, linear_tiles, matmul)
from nwhisper.kernels.matmul import GEMV_ROWS, linear_elem, quantize_int8

# The module, not the op that nwhisper.kernels re-exports under the same name.
attention_mod = sys.modules["nwhisper.kernels.attention"]

RTOL = 1e-5


@pytest.fixture(scope="module")
def be():
    return backend.get("cpu")


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


def rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def check(name, got, want, rtol=RTOL):
    """Assert |got - want| <= rtol * max(1, max|want|); print and return max |Δ|."""
    want = np.asarray(want, np.float64)
    diff = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
    bound = rtol * max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    print(f"{name}: max |Δ| = {diff:.3g}")
    assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
    assert diff <= bound, f"{name}: max |Δ| = {diff:.3g} > {bound:.3g}"
    return diff


def assert_as_linear_elem(got, body):
    """A decoder product on the CPU (linear_tiles where it runs) against linear_elem's: bit for
    bit where the tiles sum in the body's order (linear_tiles.same_as_body: an AVX2 CPU), else
    within float32 rounding."""
    if not linear_tiles.available() or linear_tiles.same_as_body():
        assert np.array_equal(got, body), f"max |Δ| = {np.abs(got - body).max():.3g}"
    else:
        check("linear_tiles against linear_elem", got, body)


# --- references (float64) ---

def ref_layernorm(x, w, b, eps=1e-5):
    x = x.astype(np.float64)
    return (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + eps) * w + b


ERF = np.vectorize(math.erf)


def ref_gelu(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1 + ERF(x / math.sqrt(2)))


def ref_gelu_tanh(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_conv1d(x, w, b, stride):
    x = np.pad(x.astype(np.float64), ((1, 1), (0, 0)))
    t_out = (x.shape[0] - 3) // stride + 1
    w = w.astype(np.float64)
    return np.stack([sum(x[t * stride + k] @ w[:, :, k].T for k in range(3))
                     for t in range(t_out)]) + b


def ref_attention(q, k, v, n_head, causal=False, q_offset=0):
    """(out (nq, d), p (H, nq, nk)) in float64."""
    nq, d = q.shape
    nk = k.shape[0]
    hd = d // n_head
    out = np.zeros((nq, d))
    probs = np.zeros((n_head, nq, nk))
    for h in range(n_head):
        c = slice(h * hd, (h + 1) * hd)
        s = q[:, c].astype(np.float64) @ k[:, c].T.astype(np.float64) / math.sqrt(hd)
        if causal:
            s[np.arange(nk)[None, :] > np.arange(nq)[:, None] + q_offset] = -np.inf
        s = np.exp(s - s.max(1, keepdims=True))
        probs[h] = s / s.sum(1, keepdims=True)
        out[:, c] = probs[h] @ v[:, c]
    return out, probs


# --- ops ---

@pytest.mark.parametrize("rows,d", [(1, 8), (7, 64), (300, 384)])
def test_layernorm(be, rng, rows, d):
    x = rand(rng, rows, d) * 4 + 2
    w, b = rand(rng, d), rand(rng, d)
    out = be.empty((rows, d))
    K.layernorm(be, x, w, b, out)
    check("layernorm", out, ref_layernorm(x, w, b))
    want = ref_layernorm(x, w, b)
    K.layernorm(be, x, w, b, x)  # in place
    check("layernorm in place", x, want)


# erf is Eigen's float32 rational approximation (kernels/activation.py): a few float32 ulps.
GELU_RTOL = 1.5e-6


def test_gelu_is_the_erf_form(be, rng):
    x = np.concatenate([np.linspace(-6, 6, 1001, dtype=np.float32), rand(rng, 5000) * 3])
    out = be.empty(x.shape)
    K.gelu(be, x, out)
    check("gelu vs math.erf", out, ref_gelu(x), rtol=GELU_RTOL)
    tanh_gap = float(np.max(np.abs(out - ref_gelu_tanh(x))))
    print(f"gelu vs tanh form: max |Δ| = {tanh_gap:.3g}")
    assert tanh_gap > 1e-4, f"GELU matches the tanh approximation (max |Δ| {tanh_gap:.3g})"
    y = x.reshape(6001, 1)[:6000].reshape(60, 100).copy()
    K.gelu(be, y, y)  # in place, 2-D
    check("gelu in place", y.reshape(-1), ref_gelu(x[:6000]), rtol=GELU_RTOL)


@pytest.mark.parametrize("t_in,c_in,c_out,stride", [(5, 2, 3, 1), (20, 8, 16, 2), (301, 80, 64, 1),
                                                    (300, 64, 64, 2)])
@pytest.mark.parametrize("wdtype", [np.float32, np.float16])
def test_conv1d(be, rng, t_in, c_in, c_out, stride, wdtype):
    x, w, b = rand(rng, t_in, c_in), rand(rng, c_out, c_in, 3, dtype=wdtype), rand(rng, c_out)
    out = be.empty((K.conv.out_len(t_in, stride), c_out))
    K.conv1d(be, x, be.upload(w), b, out, stride)
    check(f"conv1d {w.dtype}", out, ref_conv1d(x, w, b, stride))
    # the CPU's NumPy im2col against the portable body (the CUDA path)
    t_out = out.shape[0]
    cols, want = np.empty((t_out, c_in * 3), np.float32), be.empty((t_out, c_in * 3))
    K.conv.im2col_numpy(x, cols, stride)
    be.launch(K.conv.im2col_elem, want.size, x, want, t_in, c_in, stride)
    assert np.array_equal(cols, be.download(want))


# CAM++'s convolutions: (W, T, F, C, C_out, k, stride, dilation, two_d), its shapes made small;
# those with outputs in 32s are the micro-tile's (conv_tiles.COLS), lines longer than its rows
# too; those with 32 or 128 channels take its loops for constant steps (conv_tiles.STEPS): the
# front end's 3 × 3 and 1 × 1 shortcut (stride 1 and 2), the CAM layers' (dilated), and the
# TDNN's, two groups of outputs
SPEAKER_CONVS = [(1, 5, 14, 32, 32, 3, 1, 1, True), (1, 5, 14, 32, 32, 3, 2, 1, True),
                 (1, 4, 13, 32, 32, 1, 2, 1, True), (2, 13, 1, 128, 32, 3, 1, 2, False),
                 (2, 11, 1, 20, 64, 5, 2, 1, False),
                 (2, 9, 12, 1, 8, 3, 1, 1, True), (2, 9, 12, 5, 8, 3, 2, 1, True),
                 (3, 7, 5, 4, 8, 1, 2, 1, True), (2, 11, 1, 6, 8, 5, 2, 1, False),
                 (2, 13, 1, 16, 4, 3, 1, 2, False), (1, 600, 1, 8, 4, 3, 1, 1, False),
                 (2, 9, 12, 1, 32, 3, 1, 1, True), (2, 9, 12, 5, 32, 3, 2, 1, True),
                 (2, 5, 40, 6, 32, 3, 1, 1, True), (2, 11, 1, 6, 32, 5, 2, 1, False),
                 (2, 13, 1, 16, 32, 3, 1, 2, False), (1, 600, 1, 8, 32, 3, 1, 1, False)]


def int8_operands(x, w):
    """x (W, …) ≥ 0 and w (O, K) as conv_tiles' int8 arithmetic quantises them, back in floats:
    each window of x by its largest value / 255 (in float32, unsigned bytes rounded half up),
    each row of w by its largest |w| / 127 (NumPy's rounding, as conv_tiles._taps)."""
    top = x.reshape(len(x), -1).max(axis=1)
    sx = np.where(top > 0, top / np.float32(255), np.float32(1)).astype(np.float32)
    scaled = np.minimum(np.maximum(x * (np.float32(1) / sx).reshape(-1, *[1] * (x.ndim - 1)), 0), 255)
    xq = np.floor(scaled + np.float32(0.5)) * sx.reshape(-1, *[1] * (x.ndim - 1)).astype(np.float64)
    sw = (np.abs(w).max(axis=1) / np.float32(127)).astype(np.float32)
    sw[sw == 0] = 1
    wq = np.clip(np.round(w / sw[:, None]), -127, 127) * sw[:, None].astype(np.float64)
    return xq, wq


@pytest.mark.parametrize("n,t,f,c,c_out,k,stride,dilation,two_d", SPEAKER_CONVS)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("path", ["direct", "direct_bf16", "direct_int8", "blas"])
def test_speaker_conv_tiles_match_the_bodies(be, rng, monkeypatch, n, t, f, c, c_out, k, stride,
                                             dilation, two_d, residual, with_bias, path):
    """conv_tiles (the host's fast path: BLAS on tiles of columns, or with AVX-512 the direct
    micro-tile for outputs in 32s, in float32, on bfloat16 pairs or on bytes) against the
    portable bodies it stands in for: im2col2d_row or im2col1d_row, then the product, bias,
    residual and ReLU in NumPy (float64; for bfloat16, of the operands rounded as vecmath.bf16
    rounds; for int8, of the operands quantised as int8_operands says, x ≥ 0 as after a ReLU)."""
    from nwhisper.kernels import conv_tiles, speaker_ops
    from nwhisper.kernels.vecmath import bf16
    if not conv_tiles.available():
        pytest.skip("no BLAS callable from Numba's threads")
    if path != "blas" and not conv_tiles.direct_available():
        pytest.skip("no AVX-512 here for the direct micro-tile (path blas ran the BLAS tiles)")
    if path == "direct_bf16" and not conv_tiles.bf16_available():
        pytest.skip("no AVX-512 BF16 here for bfloat16 pairs (path direct ran float32's)")
    if path == "direct_int8" and not conv_tiles.int8_available():
        pytest.skip("no AVX-512 VNNI here for bytes (path direct ran float32's)")
    if path == "blas":
        monkeypatch.setattr(conv_tiles, "direct_available", lambda: False)
    pad = (k - 1) // 2 * dilation
    x = rand(rng, n, t, f, c)
    x = np.abs(x) if path == "direct_int8" else x
    w, b = rand(rng, c_out, k * (k if two_d else 1) * c), rand(rng, c_out) if with_bias else None
    asked = {"direct_bf16": "bfloat16", "direct_int8": "int8"}.get(path, "float32")
    used = conv_tiles.arithmetic_for(asked, c) if c_out % conv_tiles.COLS == 0 and path != "blas" else "float32"
    if used == "bfloat16":      # the bodies take the operands the pairs hold
        rounded = lambda a: (np.vectorize(bf16)(a).astype(np.uint32) << 16).view(np.float32)  # noqa: E731
        x_ref, w_ref = rounded(x), rounded(w)
    elif used == "int8":
        x_ref, w_ref = int8_operands(x, w)
    else:
        x_ref, w_ref = x, w
    if two_d:
        t_out, f_out = t, (f - 1) // stride + 1
        cols = np.zeros((n * t_out * f_out, w.shape[1]), np.float64)
        be.launch(speaker_ops.im2col2d_row, len(cols), x_ref, cols, f_out, k, stride)
    else:
        t_out, f_out = (t + 2 * pad - dilation * (k - 1) - 1) // stride + 1, 1
        cols = np.zeros((n * t_out, w.shape[1]), np.float64)
        be.launch(speaker_ops.im2col1d_row, len(cols), x_ref[:, :, 0], cols, t_out, k, stride,
                  dilation, pad)
    want = cols @ w_ref.T.astype(np.float64)
    short = rand(rng, *want.shape) if residual else None
    want = want + (0 if b is None else b) + (0 if short is None else short)
    want = np.maximum(want, 0) if residual else want
    kept = {}   # w in the micro-tile's layout, made at the first call, read at the second
    for call in range(2):
        got = np.full(want.shape, np.nan, np.float32)
        conv_tiles.conv(be, x, w, b, got, k, k if two_d else 1, stride_t=1 if two_d else stride,
                        stride_f=stride if two_d else 1, dilation_t=dilation, pad_t=pad,
                        pad_f=pad if two_d else 0, residual=short, relu=residual,
                        arithmetic=asked, keep=kept)
        check("conv_tiles", got, want)
    assert bool(kept) == (path != "blas" and c_out % conv_tiles.COLS == 0)


@pytest.mark.parametrize("n,i,o", [(1, 8, 4), (5, 64, 96), (1, 384, 1536), (300, 384, 384)])
@pytest.mark.parametrize("wdtype", [np.float32, np.float16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear(be, rng, n, i, o, wdtype, with_bias):
    x, w = rand(rng, n, i), rand(rng, o, i, dtype=wdtype)
    bias = rand(rng, o) if with_bias else None
    out = be.empty((n, o))
    K.linear(be, x, be.weight(w), bias, out)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + (0 if bias is None else bias)
    check("linear (BLAS)", out, want)
    portable = be.empty((n, o))
    none = np.zeros(0, np.float32)
    be.launch(linear_elem, o, x, be.weight(w), none,
              none if bias is None else bias, portable, n, i, False)
    check("linear portable body vs BLAS", portable, out)
    # gemv=True (the decoder's matrices): f16 stays f16 — on the CPU as uint16 bits that
    # linear_elem widens (kernels/widen.py), whatever the number of rows.
    compact = be.weight(w, gemv=True)
    assert compact.dtype == (np.uint16 if wdtype == np.float16 else np.float32)
    kept = be.empty((n, o))
    K.linear(be, x, compact, bias, kept)
    check("linear, gemv weight", kept, want)
    if wdtype == np.float16 and n <= GEMV_ROWS:
        assert_as_linear_elem(kept, portable)   # the same sums on the same (exact) values


@pytest.mark.parametrize("n,i,o", [(1, 8, 3), (2, 64, 96), (1, 384, 1537), (12, 40, 9)])
def test_linear_int8(be, rng, n, i, o):
    """compute_type="int8": per-row int8 weights give x·(q·scale)ᵀ, whichever path runs (up to
    GEMV_ROWS rows on linear_elem, more on BLAS with the full matrix); and q·scale is within half
    a step of w."""
    x, w, bias = rand(rng, n, i), rand(rng, o, i), rand(rng, o)
    w[0] = 0.0  # an all-zero row: scale 1, not 0/0
    q, scale = (be.download(a) for a in quantize_int8(be, be.upload(w)))
    assert q.dtype == np.int8 and np.abs(q).max() == 127 and scale[0] == 1 and not q[0].any()
    assert np.all(np.abs(q * scale[:, None] - w) <= scale[:, None] * (0.5 + 1e-5))  # f32 division
    out = be.empty((n, o))
    K.linear(be, x, be.weight_int8(w), bias, out)
    # o is never a multiple of 64 here: no int8 GEMM, float activations on linear_elem (CPU; the
    # CUDA backend's full matrix above GEMV_ROWS rows)
    full = w if n > GEMV_ROWS and be.name != "cpu" else q.astype(np.float64) * scale[:, None]
    check("linear int8", out, x.astype(np.float64) @ full.T + bias)


def test_quantize_int8_equalised_columns(be, rng):
    """The quantiser applying column scales itself (matmul.column_scales' path: float16 weights,
    as the CPU keeps them in uint16 bits) = NumPy's rounding of w·diag(c), within one step where
    the product's order of rounding lands a value on a half; scales within float32 rounding (the
    kernel's fastmath multiplies by 1/127)."""
    w = (rand(rng, 37, 96) * 3).astype(np.float16)
    w[4] = 0.0                                     # an all-zero row: scale 1
    c = (1 / np.abs(w.astype(np.float32)).max(axis=0).clip(min=1e-3)).astype(np.float32)
    q, scale = (be.download(a) for a in quantize_int8(be, be.weight(w, gemv=True), c))
    wc = w.astype(np.float32) * c
    top = np.abs(wc).max(axis=1)
    want_scale = np.where(top > 0, top / np.float32(127), np.float32(1)).astype(np.float32)
    want = np.floor(np.clip(wc * (np.float32(1) / want_scale[:, None]), -127, 127) + np.float32(0.5))
    assert np.allclose(scale, want_scale, rtol=2e-7, atol=0) and scale[4] == 1 and not q[4].any()
    assert np.abs(q.astype(np.int64) - want).max() <= 1
    assert (q != want).mean() < 0.01, f"{(q != want).sum()} of {q.size} values off by one step"


needs_int8_gemm = pytest.mark.skipif(
    not gemm_int8.available(), reason="the int8 GEMM needs AVX-512 VNNI or AVX2 and Numba compiling for this CPU")


def quantized_rows_oracle(x):
    """The int8 GEMM's activation rounding, written in NumPy: per row sx = max|x| / 127 and
    round half up of x / sx (float32, as the kernel divides)."""
    top = np.abs(x).max(axis=1)
    sx = np.where(top > 0, top / np.float32(127), np.float32(1)).astype(np.float32)
    v = np.clip(x * (np.float32(1) / sx[:, None]), -127, 127)
    return np.floor(v + np.float32(0.5)).astype(np.int64), sx


def exact_int8_gemm(xq, sx, q, scale):
    """The int8 GEMM's result done exactly: the integer product of the quantised activations
    (quantized_rows_oracle) and weights, scaled, in float64."""
    return (xq @ q.astype(np.int64).T) * (sx[:, None].astype(np.float64) * scale)


@needs_int8_gemm
@pytest.mark.parametrize("m,k,n", [(1500, 384, 64), (9, 40, 128), (67, 130, 192), (4, 2048, 64),
                                   (130, 512, 1536)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemm_int8(rng, m, k, n, with_bias):
    """The int8 GEMM (compute_type="int8", many rows, CPU; this CPU's micro-tile) = NumPy's exact
    integer product of the same quantised matrices, scaled (int32 sums are exact; the float
    epilogue rounds once); and within the activations' rounding of the float product. Rows not
    a multiple of the tile's 4, K not a multiple of 4, a result written into a row slice of a
    wider buffer."""
    x, w = rand(rng, m, k), rand(rng, n, k) * np.float32(0.05)
    bias = rand(rng, n) if with_bias else None
    x[m // 2] = 0.0                        # a zero row: scale 1, no 0/0
    q, scale = quantize_int8(backend.get("cpu"), w)
    packed = gemm_int8.PackedInt8(q, scale)
    big = np.full((m, n + 64), np.float32(7))
    out = big[:, 32:32 + n]
    scratch = lambda name, shape, dtype: np.empty(shape, dtype)  # noqa: E731
    gemm_int8.gemm(x, packed, bias, out, scratch)
    xq, sx = quantized_rows_oracle(x)
    exact = exact_int8_gemm(xq, sx, q, scale) + (0 if bias is None else bias)
    check("int8 GEMM vs exact integer product", out, exact)
    assert (big[:, :32] == 7).all() and (big[:, 32 + n:] == 7).all()
    # The activations' rounding: each |Δx| <= sx / 2, so |Δout| <= sx/2 · Σ|w| per element.
    want = x.astype(np.float64) @ (q * scale[:, None]).T.astype(np.float64) + (0 if bias is None else bias)
    bound = (sx[:, None] / 2) * np.abs(q * scale[:, None]).sum(axis=1)[None, :] + 1e-4
    assert np.all(np.abs(out - want) <= bound)


def test_intrinsics_follow_the_cpu_numba_compiles_for(monkeypatch):
    """llvm_ir.host_has: this CPU's features when Numba compiles for it; for another CPU
    (NUMBA_CPU_NAME) only what NUMBA_CPU_FEATURES turns on, none without it (a portable cache's
    generic CPU must get no intrinsic built for this one)."""
    from numba.core import config
    from nwhisper.kernels import llvm_ir
    import llvmlite.binding as llvm
    monkeypatch.setattr(config, "CPU_NAME", None)
    assert llvm_ir.host_has("avx2") == bool(llvm.get_host_cpu_features().get("avx2", False))
    monkeypatch.setattr(config, "CPU_NAME", "generic")
    monkeypatch.setattr(config, "CPU_FEATURES", None)
    assert not llvm_ir.host_has("avx2")
    monkeypatch.setattr(config, "CPU_NAME", "haswell")
    monkeypatch.setattr(config, "CPU_FEATURES", "+avx2, +fma,-avx512f")
    assert llvm_ir.host_has("avx2", "fma")
    assert not llvm_ir.host_has("avx512f") and not llvm_ir.host_has("avx2", "avx512vnni")


@needs_int8_gemm
def test_int8_gemm_applies_a_batch_norm_and_relu_as_it_quantises(rng):
    """matmul.linear_bn_relu (CAM++'s dense layers: a batch norm and ReLU over the first K
    columns of a wider concatenation, then the product) on the int8 GEMM, which applies them as
    it quantises each row, against NumPy's batch norm and ReLU (a multiply, then an add, as
    the quantiser does them) and then the GEMM: the same quantised rows, so the same floats;
    and the portable path (a float32 weight: scale_shift_relu_row, then the product) against
    NumPy."""
    be = backend.get("cpu")
    m, wide, k, n = 67, 200, 130, 128
    x, scale, shift = rand(rng, m, wide), rand(rng, k), rand(rng, k)
    w, bias = rand(rng, n, k) * np.float32(0.05), rand(rng, n)
    normed = np.maximum(x[:, :k] * scale + shift, np.float32(0))
    assert (normed == 0).any() and (normed > 0).any()
    weight = be.weight_int8(w)
    fused, apart = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    K.matmul.linear_bn_relu(be, x, scale, shift, weight, bias, fused)
    K.matmul.linear(be, normed, weight, bias, apart)
    assert np.array_equal(fused, apart)
    plain = np.empty((m, n), np.float32)
    K.matmul.linear_bn_relu(be, x, scale, shift, be.weight(w), bias, plain)
    check("linear_bn_relu, float32", plain, normed.astype(np.float64) @ w.T + bias)


@needs_int8_gemm
def test_gemm_int8_at_the_extremes(rng):
    """Activations and weights that quantise to ±127 everywhere, signs agreeing or alternating:
    every pair of products at the largest magnitude a tile sums (2 · 127 · 127 = 32258, where the
    AVX2 tile's int16 pair sums are nearest to saturating at 32767) and long runs of one sign, so
    the int32 sums reach ±127² · K. Equal to NumPy's exact integer product."""
    m, k, n = 9, 1028, 128
    sign = np.where(rng.random((m, k)) < 0.5, -1, 1).astype(np.float32)
    x = np.concatenate([np.ones((2, k)), -np.ones((2, k)), sign[4:]]).astype(np.float32) * 3
    alternating = np.where(np.arange(k) % 2, -1, 1) * np.ones((64, 1))
    w = np.concatenate([np.ones((64, k)), alternating]).astype(np.float32)
    q, scale = quantize_int8(backend.get("cpu"), w)
    assert np.abs(q).min() == 127
    out = np.empty((m, n), np.float32)
    scratch = lambda name, shape, dt: np.empty(shape, dt)  # noqa: E731
    gemm_int8.gemm(x, gemm_int8.PackedInt8(q, scale), None, out, scratch)
    xq, sx = quantized_rows_oracle(x)
    assert np.abs(xq).min() == 127
    exact = exact_int8_gemm(xq, sx, q, scale)
    assert np.abs(xq @ q.astype(np.int64).T).max() == 127 * 127 * k
    check("int8 GEMM at ±127 vs exact integer product", out, exact)


def test_bf16_rounding_is_ml_dtypes(rng):
    """gemm_bf16.to_pairs (vecmath.bf16, on every CPU) rounds as ml_dtypes' bfloat16: random
    floats of every magnitude, exact ties both ways, the largest finite values, subnormals,
    infinities and signed zeros (NaNs are not activations: not compared); odd K and rows past M
    are zero."""
    import ml_dtypes
    bits = rng.integers(0, 2 ** 32, 4000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    ties = ((rng.integers(0, 2 ** 16, 400, dtype=np.uint32) << 16) | 0x8000).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 1e-40, -3e-39, 3.4e38, -3.389e38, 1.0, 1 + 2 ** -8],
                       np.float32)
    x = np.concatenate([x, ties, special])     # ties: exactly halfway between two bfloat16
    x = x[~np.isnan(x)]
    x = x[: len(x) - len(x) % 2 - 1].reshape(1, -1)          # an odd K
    xb = np.full((3, (x.shape[1] + 1) // 2), 7, np.uint32)
    gemm_bf16.to_pairs(x, xb)
    got = np.stack([xb[0] & 0xFFFF, xb[0] >> 16], 1).reshape(-1)[: x.shape[1]].astype(np.uint16)
    want = x[0].astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(got, want), f"{(got != want).sum()} of {got.size} differ"
    assert xb[0, -1] >> 16 == 0 and (xb[1:] == 0).all()


needs_bf16_gemm = pytest.mark.skipif(
    not gemm_bf16.available(), reason="the bfloat16 GEMM needs AVX-512 BF16 and Numba compiling for this CPU")


@needs_bf16_gemm
@pytest.mark.parametrize("m,k,n", [(1500, 384, 64), (9, 40, 128), (67, 131, 192), (1, 2048, 64),
                                   (130, 512, 1536)])
@pytest.mark.parametrize("wdtype", [np.float16, np.float32])
def test_gemm_bf16(be, rng, m, k, n, wdtype):
    """The bfloat16 GEMM (compute_type="bfloat16", CPU with AVX-512 BF16) = the exact product
    of its operands rounded to bfloat16 (ml_dtypes), within float32 sums' rounding; and =
    linear_elem, the portable body, on the same rounded operands, within two float32 sums'
    difference. Weights from float16 bits (a checkpoint's) and float32; rows not a multiple of
    the tile's 6, an odd K, the result written into a row slice of a wider buffer, a bias."""
    x, w, bias = rand(rng, m, k), (rand(rng, n, k) * np.float32(0.05)).astype(wdtype), rand(rng, n)
    packed = gemm_bf16.PackedBf16(w.view(np.uint16) if wdtype == np.float16 else w)
    wr = bf16_oracle(w.astype(np.float32))
    assert np.array_equal(packed.rows(), wr.astype(np.float32))
    big = np.full((m, n + 64), np.float32(7))
    out = big[:, 32:32 + n]
    gemm_bf16.gemm(x, packed, bias, out, lambda name, shape, dtype: np.empty(shape, dtype))
    assert (big[:, :32] == 7).all() and (big[:, 32 + n:] == 7).all()
    xr = bf16_oracle(x)
    exact = xr @ wr.T + bias
    bound = (np.abs(xr) @ np.abs(wr).T + np.abs(bias)) * k * 2.0 ** -24
    assert np.all(np.abs(out - exact) <= bound), f"max |Δ| = {np.abs(out - exact).max():.3g}"
    body = np.empty((m, n), np.float32)
    be.launch(linear_elem, n, xr.astype(np.float32), wr.astype(np.float32), np.zeros(0, np.float32),
              bias, body, m, k, False)
    check("bfloat16 GEMM vs linear_elem on the rounded operands", out, body)


def test_bfloat16_weights(be, rng, monkeypatch):
    """be.weight_bf16: packed for the bfloat16 GEMM where it runs (every product of the matrix,
    any number of rows, K.linear and K.linear_add alike, is gemm_bf16's); a width not a multiple
    of 64, or a CPU without it (patched off here), keeps float32's matrix (weight_rows) and BLAS."""
    x, a, bias = rand(rng, 12, 96), rand(rng, 128, 96).astype(np.float16), rand(rng, 128)
    if be.has_bfloat16():
        w = be.weight_bf16(a)
        assert isinstance(w, gemm_bf16.PackedBf16) and matmul.variant(be, 1, w)[0] == "bf16"
        direct, out = np.empty((12, 128), np.float32), np.empty((12, 128), np.float32)
        gemm_bf16.gemm(x, w, bias, direct, be.scratch)
        K.linear(be, x, w, bias, out)
        assert np.array_equal(out, direct)
        added = np.ones((12, 128), np.float32)
        K.linear_add(be, x, w, bias, added)
        assert np.array_equal(added, direct + 1)
        assert matmul.variant(be, 40, be.weight_bf16(a[:100]))[0] == "blas"
    monkeypatch.setattr(gemm_bf16, "available", lambda: False)
    assert not be.has_bfloat16()
    w = be.weight_bf16(a)
    assert isinstance(w, matmul.HalfRows) and matmul.variant(be, 40, w)[0] == "blas"



@pytest.mark.parametrize("m,k,n", [(1500, 384, 64), (64, 40, 128), (67, 131, 192), (130, 1152, 384)])
@pytest.mark.parametrize("wdtype", [np.float16, np.float32])
@pytest.mark.parametrize("accumulate", [False, True])
def test_gemm_f32(be, rng, m, k, n, wdtype, accumulate):
    """The float32 GEMM (many rows on AVX-512) = the exact product within float32 sums' rounding,
    on every CPU (LLVM splits the tile's 16-lane vectors where the CPU has narrower ones; only
    matmul.variant's choice of it needs AVX-512),
    and = linear_elem, the portable body, within two float32 sums' difference. Weights from
    float16 bits (a checkpoint's, widened as they are packed) and float32; rows not a multiple of
    the tile's 6 (the last tile starts earlier and stores only its own rows: with `accumulate`
    none is added twice), an odd K, the result in a column slice of a wider buffer, a bias."""
    x, w, bias = rand(rng, m, k), (rand(rng, n, k) * np.float32(0.05)).astype(wdtype), rand(rng, n)
    big = np.full((m, n + 64), np.float32(7))
    out = big[:, 32:32 + n]
    start = rand(rng, m, n)
    out[:] = start
    gemm_f32.gemm(x, w.view(np.uint16) if wdtype == np.float16 else w, bias, out, accumulate,
                  lambda name, shape, dtype: np.empty(shape, dtype))
    assert (big[:, :32] == 7).all() and (big[:, 32 + n:] == 7).all()
    wf = w.astype(np.float64)
    exact = x @ wf.T + bias + (start if accumulate else 0)
    bound = (np.abs(x) @ np.abs(wf).T + np.abs(bias) + np.abs(start)) * (k + 2) * 2.0 ** -24
    assert np.all(np.abs(out - exact) <= bound), f"max |Δ| = {np.abs(out - exact).max():.3g}"
    body = start.copy() if accumulate else np.empty((m, n), np.float32)
    be.launch(linear_elem, n, x, w.astype(np.float32), np.zeros(0, np.float32), bias, body, m, k,
              accumulate)
    check("float32 GEMM vs linear_elem", out, body)


def test_float32_products_take_the_gemm(be, rng, monkeypatch):
    """matmul.variant: a float32 matrix or a HalfRows times MIN_ROWS rows or more is gemm_f32's
    where it runs (K.linear and K.linear_add alike give its floats); fewer rows, a width not a
    multiple of 64, or a CPU without AVX-512 (patched off here) stay on BLAS."""
    m = gemm_f32.MIN_ROWS
    x, a, bias = rand(rng, m, 96), rand(rng, 128, 96).astype(np.float16), rand(rng, 128)
    w = be.weight_rows(a)
    assert isinstance(w, matmul.HalfRows)
    if gemm_f32.available():
        assert [matmul.variant(be, r, v)[0] for r, v in ((m, w), (m, be.weight(a)))] == ["f32"] * 2
        direct, out = np.empty((m, 128), np.float32), np.empty((m, 128), np.float32)
        gemm_f32.gemm(x, w.bits, bias, direct, False, be.scratch)
        K.linear(be, x, w, bias, out)
        assert np.array_equal(out, direct)
        added = np.ones((m, 128), np.float32)
        K.linear_add(be, x, w, bias, added)
        assert np.array_equal(added, direct + 1)
    assert matmul.variant(be, m - 1, w)[0] == "blas"
    assert matmul.variant(be, m, be.weight_rows(a[:100]))[0] == "blas"
    monkeypatch.setattr(gemm_f32, "available", lambda: False)
    assert matmul.variant(be, m, w)[0] == "blas"

INT8_TILE_PROBE = """
import sys
import numpy as np
from nwhisper import backend
from nwhisper.kernels import gemm_int8
from nwhisper.kernels.matmul import quantize_int8
gemm_int8.isa = lambda: sys.argv[1]        # before anything compiles: the tile built for it
rng = np.random.default_rng(5)
x, w = rng.standard_normal((67, 130), np.float32), rng.standard_normal((128, 130), np.float32)
x[3] = 0.0
q, scale = quantize_int8(backend.get("cpu"), w)
out = np.empty((67, 128), np.float32)
gemm_int8.gemm(x, gemm_int8.PackedInt8(q, scale), None, out, lambda n, shape, dt: np.empty(shape, dt))
np.save(sys.argv[2], out)
"""


@pytest.mark.parametrize("isa", ["avx512vnni", "avx2"])
def test_gemm_int8_on_each_instruction_set(tmp_path, isa):
    """Each micro-tile the CPU can run besides its own (test_gemm_int8's) — on an AVX-512 VNNI
    machine the AVX2 one — built in a fresh process (its own kernel cache) = NumPy's exact
    integer product of the same quantised matrices, scaled."""
    if isa not in gemm_int8.supported():
        pytest.skip(f"this CPU has no {isa} (or Numba compiles for another CPU)")
    if isa == gemm_int8.isa():
        pytest.skip(f"{isa} is this CPU's own tile: test_gemm_int8 runs it")
    env = paths.env(NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", INT8_TILE_PROBE, isa, str(tmp_path / "out.npy")],
                   env=env, check=True, capture_output=True, timeout=600)
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((67, 130), np.float32), rng.standard_normal((128, 130), np.float32)
    x[3] = 0.0
    q, scale = quantize_int8(backend.get("cpu"), w)
    exact = exact_int8_gemm(*quantized_rows_oracle(x), q, scale)
    check(f"int8 GEMM ({isa}) vs exact integer product", np.load(tmp_path / "out.npy"), exact)


@pytest.mark.parametrize("n,k", [(64, 384), (192, 130), (128, 1)])
def test_int8_packing(rng, n, k):
    """PackedInt8's one-pass pack = NumPy's transposing copy of the zero-padded rows, the layout
    the micro-tiles read; its shift = 128 · each row's sum (int64 in NumPy); rows() returns
    the rows again."""
    q = rng.integers(-128, 128, (n, k), dtype=np.int8)
    packed = gemm_int8.PackedInt8(q, np.ones(n, np.float32))
    kp = -(-k // 4) * 4
    padded = np.zeros((n, kp), np.int8)
    padded[:, :k] = q
    want = padded.reshape(n // 64, 4, 16, kp // 4, 4).transpose(0, 3, 1, 2, 4)
    assert np.array_equal(packed.panels, want)
    assert np.array_equal(packed.shift, 128 * q.sum(axis=1, dtype=np.int64))
    assert np.array_equal(packed.rows(), q)


@needs_int8_gemm
def test_int8_weights_use_the_int8_gemm_for_many_rows(be, rng):
    """K.linear on an int8 weight (CPU, no full-precision copy kept): up to GEMV_ROWS rows
    linear_elem (float activations), above the int8 GEMM (packed rows); a width that is not a
    multiple of 64, or a weight whose activations must not be quantised (the decoder's),
    linear_elem for any number of rows."""
    a = rand(rng, 128, 96)
    w = be.weight_int8(a)
    assert w.packed is not None and w.full is None
    assert w._q is None, "a packed weight keeps its row-major copy too"
    q, scale = quantize_int8(be, a)
    assert np.array_equal(w.q, q) and np.array_equal(w.scale, scale)   # unpacked on demand
    x = rand(rng, 12, 96)
    out, direct = np.empty((12, 128), np.float32), np.empty((12, 128), np.float32)
    K.linear(be, x, w, None, out)
    gemm_int8.gemm(x, w.packed, None, direct, be.scratch)
    assert np.array_equal(out, direct)
    few, body = np.empty((3, 128), np.float32), np.empty((3, 128), np.float32)
    K.linear(be, x[:3], w, None, few)                 # few rows: linear_elem on the unpacked rows
    be.launch(linear_elem, 128, x[:3], q, scale, np.zeros(0, np.float32), body, 3, 96, False)
    assert_as_linear_elem(few, body)
    none = np.zeros(0, np.float32)
    for odd in (be.weight_int8(rand(rng, 100, 96)), be.weight_int8(rand(rng, 128, 96), quantized_rows=False)):
        assert odd.packed is None and odd.full is None
        got, body = np.empty((12, odd.shape[0]), np.float32), np.empty((12, odd.shape[0]), np.float32)
        K.linear(be, x, odd, None, got)
        be.launch(linear_elem, odd.shape[0], x, odd.q, odd.scale, none, body, 12, 96, False)
        assert_as_linear_elem(got, body)
    with pytest.raises(ValueError, match="multiple of 64"):
        gemm_int8.PackedInt8(odd.q[:100], odd.scale[:100])


def test_int8_weights_without_the_int8_gemm_run_many_rows_on_blas(rng, monkeypatch):
    """Where the int8 GEMM cannot run (no AVX-512 VNNI nor AVX2: patched off here, so on every CPU), an int8
    weight's products of many rows are BLAS's on its rows dequantised — NumPy's float32 product
    with q·scale, as close as two float32 sums get — added into the output for linear_add; few
    rows stay on linear_elem, and so does a decoder's matrix (quantized_rows=False: a row's sums
    must not depend on how many rows are decoded with it)."""
    from nwhisper.kernels import blas

    monkeypatch.setattr(gemm_int8, "available", lambda: False)
    calls = []
    monkeypatch.setattr(blas, "gemm", lambda *a, gemm=blas.gemm: calls.append(a[1]) or gemm(*a))
    be = backend.get("cpu")
    none = np.zeros(0, np.float32)
    x = rand(rng, 40, 96)
    for w in (be.weight_int8(rand(rng, 128, 96)), be.weight_int8(rand(rng, 100, 96))):
        assert w.packed is None and w.full is None and matmul.variant(be, 40, w)[0] == "blas"
        bias = rand(rng, w.shape[0])
        want = x @ (w.q.astype(np.float32) * w.scale[:, None]).T + bias
        out = np.empty((40, w.shape[0]), np.float32)
        K.linear(be, x, w, bias, out)
        check("int8 dequantised on BLAS", out, want, rtol=1e-5)
        added = np.ones((40, w.shape[0]), np.float32)
        K.linear_add(be, x, w, bias, added)
        check("int8 dequantised on BLAS, added", added, want + 1, rtol=1e-5)
        assert len(calls) == 2 and all(np.array_equal(c, w.q * w.scale[:, None]) for c in calls)
        calls.clear()
        few, body = np.empty((3, w.shape[0]), np.float32), np.empty((3, w.shape[0]), np.float32)
        K.linear(be, x[:3], w, None, few)
        be.launch(linear_elem, w.shape[0], x[:3], w.q, w.scale, none, body, 3, 96, False)
        assert_as_linear_elem(few, body)
        assert not calls
    decoder = be.weight_int8(rand(rng, 128, 96), quantized_rows=False)
    assert matmul.variant(be, 40, decoder)[0] == "rows"
    got, body = np.empty((40, 128), np.float32), np.empty((40, 128), np.float32)
    K.linear(be, x, decoder, None, got)
    be.launch(linear_elem, 128, x, decoder.q, decoder.scale, none, body, 40, 96, False)
    assert_as_linear_elem(got, body)
    assert not calls


def test_a_rows_layernorm_is_the_same_alone_and_among_a_decoders_rows(rng):
    """A decoder step's rows (a batch of windows, beams) are normalised as one row alone is, bit
    for bit: below LAYERNORM_PARALLEL_ROWS the launch stays serial (the parallel launcher rounds
    a row's sums differently on some CPUs: on an AVX2 one, from 6 rows of 384)."""
    be = backend.get("cpu")
    x = rand(rng, be.LAYERNORM_PARALLEL_ROWS - 1, 384) * np.float32(3) + np.float32(1)
    w, b = rand(rng, 384), rand(rng, 384)
    alone = np.empty((1, 384), np.float32)
    K.layernorm(be, x[:1], w, b, alone)
    for n in (2, 6, 8, be.LAYERNORM_PARALLEL_ROWS - 1):
        out = np.empty((n, 384), np.float32)
        K.layernorm(be, x[:n], w, b, out)
        assert np.array_equal(out[:1], alone), n


needs_linear_tiles = pytest.mark.skipif(
    not linear_tiles.available(), reason="linear_tiles needs AVX2, FMA and F16C and Numba compiling for this CPU")


def tiles(x, w, scale, bias, out, acc, serial=False):
    """linear_tiles' product as matmul runs it: its items shared out on the threads, or serial."""
    backend.get("cpu").share(linear_tiles.linear_range, linear_tiles.items(w.shape[0]),
                             x, w, scale, bias, out, acc, serial=serial)


@needs_linear_tiles
@pytest.mark.parametrize("kind", ["int8", "float16"])
@pytest.mark.parametrize("n,n_in,n_out", [(1, 384, 1537), (2, 32, 7), (3, 96, 13), (5, 384, 384),
                                          (8, 64, 51), (9, 1536, 30), (13, 128, 6)])
def test_linear_tiles(rng, kind, n, n_in, n_out):
    """The decoder's CPU product (linear_tiles) against the portable body linear_elem on the same
    int8 or float16 weights: bit for bit on an AVX2 CPU (assert_as_linear_elem), with a bias or
    without, stored or added; each row's sums the same whatever rows come with it (every count
    from 1 to n, each row alone), parallel or serial. Shapes: every tile of 1-4 rows, groups of
    6 outputs and the outputs past them (a vocabulary of 1537), widths from one vector loop
    iteration (32) to fc2's. The arrays are of the types the backend passes (a float16 weight's
    bits read-only), so the suite compiles what a transcription does."""
    be = backend.get("cpu")
    if kind == "int8":
        w, scale = rng.integers(-127, 128, (n_out, n_in)).astype(np.int8), rand(rng, n_out) ** 2
    else:
        w, scale = be.weight(rand(rng, n_out, n_in).astype(np.float16) * np.float16(0.1), gemv=True), None
    x, bias, none = rand(rng, n, n_in), rand(rng, n_out), np.zeros(0, np.float32)
    s_arg = np.ones(n_out, np.float32) if scale is None else scale   # as the backend passes them
    for b in (bias, None):
        b_arg = np.zeros(n_out, np.float32) if b is None else b
        for acc in (False, True):
            start = rand(rng, n, n_out)
            got, body, serial = start.copy(), start.copy(), start.copy()
            tiles(x, w, s_arg, b_arg, got, int(acc))
            be._launcher(linear_elem, "_range")(0, n_out, 0, 1, x, w, none if scale is None else scale,
                                                none if b is None else b, body, n, n_in, acc)
            assert_as_linear_elem(got, body)
            tiles(x, w, s_arg, b_arg, serial, int(acc), serial=True)
            assert np.array_equal(serial, got)
    full = np.empty((n, n_out), np.float32)
    tiles(x, w, s_arg, bias, full, 0)
    for m in range(1, n + 1):
        part = np.empty((m, n_out), np.float32)
        tiles(x[:m], w, s_arg, bias, part, 0)
        assert np.array_equal(part, full[:m])
    for r in range(n):
        alone = np.empty((1, n_out), np.float32)
        tiles(x[r:r + 1], w, s_arg, bias, alone, 0)
        assert np.array_equal(alone[0], full[r])


def test_decoder_products_run_on_linear_tiles(rng, monkeypatch):
    """K.linear of a decoder's weight (int8 rows, float16 bits) goes to linear_tiles where it
    runs and the width fits, for one row and for many, with the layer's scales (or ones) and
    bias (or zeros); linear_elem otherwise (a width of 40, an output that is a column slice)."""
    be = backend.get("cpu")
    calls = []
    share = be.share
    monkeypatch.setattr(be, "share", lambda ranged, count, *a, **kw: (
        calls.append(a) if ranged is linear_tiles.linear_range else None) or share(ranged, count, *a, **kw))
    int8 = be.weight_int8(rand(rng, 100, 96), quantized_rows=False)
    half = be.weight(rand(rng, 100, 96).astype(np.float16), gemv=True)
    for w in (int8, half):
        for n in (1, 8, 40):
            out = np.empty((n, 100), np.float32)
            K.linear(be, rand(rng, n, 96), w, None, out)
        assert len(calls) == (3 if linear_tiles.available() else 0)
        if calls:
            assert calls[0][1].dtype == (np.int8 if w is int8 else np.uint16)
            assert not calls[0][3].any() and np.array_equal(calls[0][2], int8.scale if w is int8 else np.ones(100))
        calls.clear()
    K.linear(be, rand(rng, 3, 40), be.weight_int8(rand(rng, 100, 40), quantized_rows=False), None,
             np.empty((3, 100), np.float32))
    x, wide = rand(rng, 3, 96), np.zeros((3, 120), np.float32)
    K.linear(be, x, int8, None, wide[:, 10:110])
    assert not calls
    body = np.empty((3, 100), np.float32)
    be.launch(linear_elem, 100, x, int8.q, int8.scale, np.zeros(0, np.float32), body, 3, 96, False)
    assert np.array_equal(wide[:, 10:110], body) and not wide[:, :10].any() and not wide[:, 110:].any()


def test_linear_into_row_slices(be, rng):
    x, w = rand(rng, 10, 16), be.weight(rand(rng, 8, 16))
    big = np.zeros((12, 8), np.float32)
    K.linear(be, x[3:6], w, None, big[4:7])
    check("linear on row slices", big[4:7], x[3:6].astype(np.float64) @ w.T)
    assert not big[:4].any() and not big[7:].any()


@pytest.mark.parametrize("tdtype", [np.float32, np.float16])
def test_logits(be, rng, tdtype):
    x, table = rand(rng, 2, 64), rand(rng, 1000, 64, dtype=tdtype)
    out = be.empty((2, 1000))
    K.logits(be, x, be.weight(table), out)
    check("logits", out, x.astype(np.float64) @ table.T.astype(np.float64))


def test_f16_must_be_prepared(be, rng):
    w = rand(rng, 4, 8, dtype=np.float16)
    with pytest.raises(TypeError, match="be.weight"):
        K.linear(be, rand(rng, 2, 8), w, None, be.empty((2, 4)))
    with pytest.raises(TypeError, match="float16"):
        K.embed(be, w, np.array([1], np.int32), be.empty((1, 8)))


ATTENTION_CASES = [  # nq, nk, n_head, causal, q_offset
    (1, 1, 1, False, 0),
    (4, 4, 2, False, 0),
    (5, 9, 4, True, 4),     # prompt tokens after 4 cached ones
    (1, 24, 2, True, 23),   # one decode step over a KV cache
    (1, 1500, 6, False, 0),  # cross-attention step (tiny)
    (1, 448, 8, True, 447),  # self-attention step at full context (base)
    (150, 150, 6, False, 0),
    (64, 64, 4, True, 0),
    (20, 30, 2, True, 10),  # a prompt of 20 tokens after 10 cached ones: NumPy's masked softmax
]


@pytest.mark.parametrize("nq,nk,n_head,causal,q_offset", ATTENTION_CASES)
def test_attention(be, rng, nq, nk, n_head, causal, q_offset):
    d = 16 * n_head
    q, k, v = rand(rng, nq, d), rand(rng, nk, d), rand(rng, nk, d)
    out = be.empty((nq, d))
    p = K.attention(be, q, k, v, out, n_head, causal=causal, q_offset=q_offset)
    want_out, want_p = ref_attention(q, k, v, n_head, causal, q_offset)
    check("attention out", out, want_out)
    check("attention probabilities", p, want_p)
    # The decoder passes its stacked [q | k | v] whole: the queries are q's first d columns.
    out_wide = be.empty((nq, d))
    K.attention(be, np.concatenate([q, rand(rng, nq, 2 * d)], axis=1), k, v, out_wide, n_head,
                causal=causal, q_offset=q_offset)
    check("attention, queries the first columns of a wider q", out_wide, want_out)
    # Every path against the portable bodies (the CUDA path), whichever one K.attention took.
    out_portable, p_portable = be.empty((nq, d)), be.empty((n_head, nq, nk))
    attention_mod.attention_portable(be, q, k, v, out_portable, p_portable, causal, q_offset)
    check("attention portable, out", out_portable, want_out)
    check("attention portable, probabilities", p_portable, want_p)
    if be.name == "cpu":
        out_blas, p_blas = be.empty((nq, d)), be.empty((n_head, nq, nk))
        attention_mod.attention_blas(be, q, k, v, out_blas, n_head, p_blas, causal, q_offset)
        check("attention BLAS, out", out_blas, out_portable)
        check("attention BLAS, probabilities", p_blas, p_portable)
        if nq > attention_mod.FEW_QUERIES:
            attention_mod.attention_blas(be, q, k, v, out_blas, n_head, None, causal, q_offset)
            check("attention BLAS without weights, out", out_blas, out_portable)
        kh, vh = be.heads(k, n_head), be.heads(v, n_head)  # the cross-attention's layout
        assert kh.shape == (n_head, nk, d // n_head)
        p_heads = K.attention(be, q, kh, vh, out_blas, n_head, causal=causal, q_offset=q_offset)
        check("attention over head-major K/V, out", out_blas, out_portable)
        check("attention over head-major K/V, probabilities", p_heads, p_portable)
    if not causal:  # the encoder's call: no probabilities asked for
        out_now = be.empty((nq, d))
        assert K.attention(be, q, k, v, out_now, n_head, weights=False) is None
        check("attention without weights, out", out_now, want_out)


@pytest.mark.parametrize("nq,q_offset", [(1, 9), (6, 4)])
def test_attention_over_a_whole_cache_with_n_keys(be, rng, nq, q_offset):
    """A KV cache passed whole with its filled length: the same as its filled rows passed alone,
    whatever the rows past it hold."""
    n_head, d, n_ctx = 2, 32, 40
    nk = q_offset + nq
    q, cache_k, cache_v = rand(rng, nq, d), rand(rng, n_ctx, d) * 50, rand(rng, n_ctx, d) * 50
    want = be.empty((nq, d))
    K.attention(be, q, cache_k[:nk].copy(), cache_v[:nk].copy(), want, n_head, causal=True,
                q_offset=q_offset)
    got = be.empty((nq, d))
    p = K.attention(be, be.upload(q), be.upload(cache_k), be.upload(cache_v), got, n_head,
                    causal=True, q_offset=q_offset, n_keys=nk)
    assert p.shape == (n_head, nq, nk)
    check("attention with n_keys, out", got, be.download(want))


def test_exp_rows(be, rng):
    """The encoder softmax's exponential (2^floor · polynomial) against float64 exp: relative
    error ≤ 3e-6 where exp(t) ≥ 2^-20 of the row's max, masked (-inf) entries exactly 0."""
    x = (rng.standard_normal((37, 1500)) * 40).astype(np.float32)
    x[3, 100:] = -np.inf
    x[5, :] = -200.0
    x[5, 7] = 0.0
    want = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    got, total = be.upload(x.copy()), be.empty((37, 1))
    K.exp_rows(be, got, total)
    got = be.download(got)
    big = want >= 2.0 ** -20
    assert np.max(np.abs(got[big] / want[big] - 1)) <= 3e-6
    assert np.all(np.abs(got[~big] - want[~big]) <= 2.0 ** -20 * 3e-6)
    assert np.all(got[3, 100:] == 0) and got[5, 7] == 1 and np.all(got[5, :7] == 0)
    assert np.allclose(be.download(total)[:, 0], want.sum(axis=1), rtol=1e-5)


@needs_int8_gemm
@pytest.mark.parametrize("nq,nk,n_head", [(40, 100, 2), (300, 1500, 6)])
def test_attention_int8_scores(be, rng, nq, nk, n_head):
    """compute_type="int8", the encoder's attention: the scores are the int8 GEMM of the queries
    (times 1/√hd) and keys, each quantised per row; the output is exactly softmax of those
    quantised scores times v (the padding keys of the last 64-column panel score -inf and weigh
    nothing), and near the float32 attention."""
    q, k, v = rand(rng, nq, 32 * n_head), rand(rng, nk, 32 * n_head), rand(rng, nk, 32 * n_head)
    out = be.empty((nq, 32 * n_head))
    assert K.attention(be, q, k, v, out, n_head, weights=False, int8=True) is None
    want = np.zeros((nq, 32 * n_head))
    for h in range(n_head):
        c = slice(32 * h, 32 * (h + 1))
        xq, sx = quantized_rows_oracle(q[:, c] * np.float32(1 / math.sqrt(32)))
        kq, sk = quantize_int8(be, np.ascontiguousarray(k[:, c]))
        scores = (xq @ kq.astype(np.int64).T) * (sx[:, None].astype(np.float64) * sk[None, :])
        e = np.exp(scores - scores.max(1, keepdims=True))
        want[:, c] = (e / e.sum(1, keepdims=True)) @ v[:, c]
    check("attention with int8 scores vs the same quantisation in float64", out, want, rtol=1e-4)
    exact, _ = ref_attention(q, k, v, n_head)
    check("attention with int8 scores vs float attention", out, exact, rtol=5e-2)


def bf16_oracle(x):
    """ml_dtypes' bfloat16 rounding of float32 x (nearest, ties to even: JAX's own type), back
    as float64."""
    import ml_dtypes
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


@pytest.mark.parametrize("nq,nk,n_head", [(1500, 1500, 8), (37, 70, 2), (49, 130, 1)])
@pytest.mark.parametrize("scores", ["int8", "bf16"])
def test_attention_blocked(be, rng, nq, nk, n_head, scores):
    """compute_type="int8" and "bfloat16", the encoder's attention with heads of 64: against the
    portable body (float32 attention) within the roundings' own size, on every CPU (the blocked
    kernel where it runs, else the int8-score path or float32's). Where the CPU has BF16 (and
    VNNI for int8 scores: attention_blocked): also against the same roundings done in NumPy
    (int8: scores of the queries and keys quantised per row, exact in float64; bf16: of the
    queries and keys / 8 rounded to bfloat16 (ml_dtypes), exact in float64; then probabilities
    and values rounded to bfloat16, each row divided by the sum of its rounded probabilities),
    within what its exponential's 9e-5 moves a bfloat16 by (one step, now and then). Query
    counts that leave a block or a tile part full, keys that leave a 64-key panel part full."""
    q, k, v = rand(rng, nq, 64 * n_head), rand(rng, nk, 64 * n_head), rand(rng, nk, 64 * n_head)
    out = np.full((nq, 64 * n_head), np.float32(np.nan))
    assert K.attention(be, q, k, v, out, n_head, weights=False, int8=scores == "int8",
                       bf16=scores == "bf16") is None
    body, p = np.empty_like(out), np.empty((n_head, nq, nk), np.float32)
    attention_mod.attention_portable(be, q, k, v, body, p, False, 0)
    check(f"{scores} attention vs the portable body", out, body, rtol=3e-2)
    if not attention_blocked.available(scores):
        pytest.skip(f"no AVX-512 BF16 (and VNNI) here: the blocked kernel's {scores} oracle cannot "
                    "run (its product against the portable body did)")
    want = np.zeros((nq, 64 * n_head))
    for h in range(n_head):
        c = slice(64 * h, (h + 1) * 64)
        if scores == "int8":
            xq, sx = quantized_rows_oracle(q[:, c])
            kq, sk = quantize_int8(be, np.ascontiguousarray(k[:, c]))
            s = (xq @ kq.astype(np.int64).T) * (sx[:, None].astype(np.float64) * sk[None, :]) / 8
        else:
            s = bf16_oracle(q[:, c]) @ bf16_oracle(k[:, c] / np.float32(8)).T
        e = bf16_oracle(np.exp(s - s.max(1, keepdims=True)))
        want[:, c] = (e @ bf16_oracle(v[:, c])) / e.sum(1, keepdims=True)
    check("blocked attention vs its roundings in NumPy", out, want, rtol=2e-3)


@pytest.mark.parametrize("nq,nk,n_head", [(1500, 1500, 6), (37, 70, 2), (49, 130, 1), (48, 8, 3),
                                          (100, 9, 1)])
@pytest.mark.parametrize("stacked", [False, True])
def test_attention_fused(be, rng, nq, nk, n_head, stacked):
    """float32, the encoder's attention with heads of 64 (no probabilities kept): on a CPU with
    AVX-512 attention_fused, against the portable body and float64 NumPy. Query counts that
    leave a block and a values tile part full, key counts that leave a scores tile part full
    (the last overlaps the one before), the fewest keys it takes; q, k and v as they come, or
    as column slices of one stacked product (rows of a wider stride)."""
    d = 64 * n_head
    q, k, v = rand(rng, nq, d), rand(rng, nk, d), rand(rng, nk, d)
    if stacked:
        q = np.concatenate([q, rand(rng, nq, 2 * d)], axis=1)[:, :d]
        kv = np.concatenate([k, v], axis=1)
        k, v = kv[:, :d], kv[:, d:]
    if be.name == "cpu" and attention_fused.available():
        assert attention_mod.variant(be, nq, nk, k, False, keep=False, hd=64) == "fused"
    out = np.full((nq, d), np.float32(np.nan))
    assert K.attention(be, q, k, v, out, n_head, weights=False) is None
    body, p = np.empty_like(out), np.empty((n_head, nq, nk), np.float32)
    attention_mod.attention_portable(be, np.ascontiguousarray(q), np.ascontiguousarray(k),
                                     np.ascontiguousarray(v), body, p, False, 0)
    check("attention vs the portable body", out, body)
    want, _ = ref_attention(q, k, v, n_head, False, 0)
    check("attention vs NumPy", out, want)


@pytest.mark.parametrize("nq,nk,n_head", [(1, 1500, 8), (5, 37, 2)])
@pytest.mark.parametrize("weights", [False, True])
def test_attention_over_int8_heads(be, rng, nq, nk, n_head, weights):
    """compute_type="int8"'s cross-attention: keys and values quantised per key and head
    (Int8Heads, scale = max|row| · (1/127), q = round half up of row · (1/scale)), keys and values
    in one launch as the decoder makes them or one set alone; the output is the attention over
    the dequantised K/V (to float32 rounding), the probabilities too when asked for, and near
    the float attention."""
    attn = sys.modules["nwhisper.kernels.attention"]
    d = 64 * n_head
    q, k, v = rand(rng, nq, d), rand(rng, nk, d), rand(rng, nk, d)
    k[3] = 0.0                                   # a zero row: scale 1
    kh, vh = attn.heads_int8(be, np.hstack([k, v]), n_head, groups=2)   # the decoder's form
    alone = attn.heads_int8(be, v, n_head)
    assert np.array_equal(alone.q, vh.q) and np.array_equal(alone.scale, vh.scale)
    for x, h in ((k, kh), (v, vh)):
        rows = x.reshape(nk, n_head, 64).transpose(1, 0, 2)
        top = np.abs(rows).max(axis=2)
        assert np.array_equal(h.scale, np.where(top > 0, top * np.float32(1 / 127), 1).astype(np.float32))
        inv = np.float32(1) / h.scale[..., None]
        assert np.array_equal(h.q, np.floor(np.clip(rows * inv, -127, 127) + np.float32(0.5)))
    deq = [(h.q * h.scale[..., None]).transpose(1, 0, 2).reshape(nk, d) for h in (kh, vh)]
    out = be.empty((nq, d))
    p = K.attention(be, q, kh, vh, out, n_head, weights=weights)
    want, probs = ref_attention(q, deq[0], deq[1], n_head)
    check("attention over Int8Heads vs dequantised K/V", out, want)
    if weights:
        check("its probabilities", p, probs)
    else:
        assert p is None
    check("attention over Int8Heads vs float K/V", out, ref_attention(q, k, v, n_head)[0], rtol=3e-2)


def test_attention_over_a_cache_prefix(be, rng):
    """The decoder passes kcache[:L] of a fixed-capacity cache; scratch shrinks and grows."""
    d, cap = 32, 16
    kc, vc = be.zeros((cap, d)), be.zeros((cap, d))
    for L in range(1, 6):
        K.kv_write(be, kc, L - 1, rand(rng, 1, d))
        K.kv_write(be, vc, L - 1, rand(rng, 1, d))
        q, out = rand(rng, 1, d), be.empty((1, d))
        K.attention(be, q, kc[:L], vc[:L], out, 2, causal=True, q_offset=L - 1)
        check(f"decode step L={L}", out, ref_attention(q, kc[:L], vc[:L], 2)[0])


def test_add_add_rows(be, rng):
    a, b = rand(rng, 7, 24), rand(rng, 7, 24)
    table16 = rand(rng, 20, 24, dtype=np.float16)
    want = a.astype(np.float64) + b + table16[3:10]
    K.add(be, a, b, a)
    summed = be.download(a).copy()
    K.add_rows(be, a, be.upload(table16), 3)
    check("add, add_rows", a, want)
    # the body, which the CPU's add_rows does in NumPy: the same sums
    from nwhisper.kernels.elementwise import add_rows_elem
    body = be.upload(summed)
    be.launch(add_rows_elem, summed.size, body, be.upload(table16), 3, 24)
    assert np.array_equal(be.download(body), be.download(a))
    with pytest.raises(IndexError):
        K.add_rows(be, a, be.upload(table16), 14)


@pytest.mark.parametrize("tdtype", [np.float32, np.float16])
def test_embed(be, rng, tdtype):
    table = rand(rng, 50, 16, dtype=tdtype)
    ids = np.array([0, 49, 7, 7], np.int32)
    out = be.empty((4, 16))
    K.embed(be, be.upload(table), ids, out)
    check("embed", out, table[ids].astype(np.float32), rtol=0)
    K.embed(be, be.weight(table, gemv=True), ids, out)   # the tied output projection's storage
    check("embed from a gemv weight", out, table[ids].astype(np.float32), rtol=0)
    # be.table: read where it lies, not copied, even at an odd address and read-only (a tensor
    # of a memory-mapped CT2 file, as an int8 model's token embedding is read)
    raw = np.zeros(table.nbytes + 1, np.uint8)
    lying = raw[1:].view(tdtype).reshape(table.shape)
    lying[:] = table
    lying.flags.writeable = False
    looked_up = be.table(lying)
    assert not lying.flags.aligned and np.shares_memory(looked_up, lying)
    K.embed(be, looked_up, ids, out)
    check("embed from an unaligned table", out, table[ids].astype(np.float32), rtol=0)


def test_widen_reads_every_float16_exactly():
    """On the CPU a float16 matrix travels as uint16 bits; widen() must give NumPy's float16 →
    float32 value for every one of the 65536 patterns (normals, subnormals, ±0, ±inf; NaN stays
    NaN)."""
    from numba import njit

    from nwhisper.kernels.widen import widen

    @njit
    def widen_all(bits, out):
        for i in range(bits.size):
            out[i] = widen(bits[i])

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.empty(bits.size, np.float32)
    widen_all(bits, out)
    want = bits.view(np.float16).astype(np.float32)
    same = (out == want) | (np.isnan(out) & np.isnan(want))
    assert same.all() and np.array_equal(np.signbit(out), np.signbit(want))


def test_f16_gemv_weights_are_one_array_type(be, rng):
    """A decoder's float16 matrix read in place (a mapped, read-only tensor) and one copied
    (unaligned in its file) reach the kernels as the same Numba type, so linear_elem compiles once
    for both (it had compiled twice on a first transcription: ~2 s)."""
    from numba import typeof

    w = rand(rng, 8, 16, dtype=np.float16)
    mapped = w.copy()
    mapped.flags.writeable = False
    raw = np.zeros(w.nbytes + 1, np.uint8)
    unaligned = raw[1:].view(np.float16).reshape(w.shape)
    unaligned[:] = w
    kept, copied = be.weight(mapped, gemv=True), be.weight(unaligned, gemv=True)
    assert np.shares_memory(kept, mapped) and not np.shares_memory(copied, unaligned)
    assert typeof(kept) == typeof(copied)
    assert np.array_equal(kept, copied)


def test_to_float32_widens_as_numpy_does(be):
    """widen.to_float32 (a float32 encoder's weights at load, on Numba's threads) = NumPy's cast,
    bit for bit, for every float16 pattern but NaNs (NaN stays NaN), read in place from a read-only tensor at an odd
    address (a CT2 file's); CpuBackend.weight uses it for float16 and its uint16 bits alike."""
    from nwhisper.kernels.widen import to_float32

    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    raw = np.zeros(halves.nbytes + 1, np.uint8)
    lying = raw[1:].view(np.float16).reshape(256, 256)
    lying[:] = halves.reshape(256, 256)
    lying.flags.writeable = False
    want = halves.astype(np.float32).reshape(256, 256)
    for got in (to_float32(lying), be.weight(lying), be.weight(lying.view(np.uint16))):
        assert got.dtype == np.float32 and got.flags.c_contiguous
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan)
        assert np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


def test_kv_write(be, rng):
    cache = be.zeros((10, 8))
    rows = rand(rng, 3, 8)
    K.kv_write(be, cache, 4, rows)
    want = np.zeros((10, 8))
    want[4:7] = rows
    check("kv_write", cache, want, rtol=0)
    with pytest.raises(IndexError):
        K.kv_write(be, cache, 8, rows)


def test_softmax_rows(be, rng):
    x = rand(rng, 5, 300) * 30
    x[0, :] = -1e30
    x[1, 7] = 1e4
    want = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    be.softmax_rows(x)
    check("softmax_rows", x, want)


def test_zeros_upload_download(be, rng):
    assert not be.zeros((3, 4)).any()
    x = rand(rng, 3, 4)
    assert be.upload(x) is x  # contiguous f32: no copy
    y = be.download(x)
    assert y is not x and np.array_equal(y, x)
    assert be.upload(x.astype(np.float16)).dtype == np.float32
    assert be.weight(x) is x


@pytest.mark.parametrize("aligned", [True, False])
def test_an_encoders_float16_matrix_is_kept_as_it_lies_and_multiplies_as_its_float32_copy(be, rng, aligned):
    """weight_rows (a float32 model's encoder matrices): a float16 matrix is kept as its bits,
    read where it lies when aligned (a copy of the bits where not: Numba's BLAS loops refuse
    unaligned arrays), and widened for each product: the products, plain and added, equal
    those with weight()'s float32 copy bit for bit, for one row and for an encoder's many."""
    from nwhisper.kernels.matmul import HalfRows

    w16 = rand(rng, 96, 64, dtype=np.float16)
    if not aligned:
        raw = np.zeros(w16.nbytes + 1, np.uint8)
        w16 = raw[1:].view(np.float16).reshape(w16.shape)
        w16[:] = rand(rng, 96, 64, dtype=np.float16)
    w16.flags.writeable = False
    half, full = be.weight_rows(w16), be.weight(w16)
    assert isinstance(half, HalfRows) and half.shape == w16.shape
    assert np.shares_memory(half.bits, w16) == aligned
    bias = rand(rng, 96)
    for n in (1, 300):
        x = rand(rng, n, 64)
        got, want = np.empty((n, 96), np.float32), np.empty((n, 96), np.float32)
        K.linear(be, x, half, bias, got)
        K.linear(be, x, full, bias, want)
        assert np.array_equal(got, want), n
        K.linear_add(be, x, half, bias, got)
        K.linear_add(be, x, full, bias, want)
        assert np.array_equal(got, want), n
    f32 = rand(rng, 8, 4)
    assert be.weight_rows(f32) is be.weight(f32)


def test_the_hosts_fft_a_block_of_frames_at_a_time_is_one_calls_bit_for_bit(be, rng):
    """stft_power on the host runs NumPy's FFT on HOST_FFT_FRAMES frames at a time (its
    temporaries stay small): every frame's power equals the one-call FFT's, for fewer frames than
    a block, whole blocks and a partial last block."""
    from nwhisper.kernels import spectral

    n_fft, hop, block = 400, 160, spectral.HOST_FFT_FRAMES
    window = np.hanning(n_fft + 1)[:-1]
    for frames in (3, 2 * block, 2 * block + 37):
        signal = rand(rng, (frames - 1) * hop + n_fft)
        power = np.empty((frames, n_fft // 2 + 1))
        spectral.stft_power(be, signal, window, None, None, power, hop)
        x = np.lib.stride_tricks.sliding_window_view(signal, n_fft)[::hop][:frames] * window
        spec = np.fft.rfft(x, axis=1)
        assert np.array_equal(power, spec.real ** 2 + spec.imag ** 2), frames


def test_the_workspace_is_one_buffer_grown_to_the_size_asked():
    """Backend.workspace: the short-lived arrays of different ops are views of one buffer, which
    grows to exactly the largest size asked (not geometrically, as scratch buffers do)."""
    from nwhisper.backend.cpu import CpuBackend

    be = CpuBackend()   # a workspace of its own
    a = be.workspace((30, 7))
    b = be.workspace((4, 5))
    assert np.shares_memory(a, b)
    c = be.workspace((1000, 33))
    assert c.shape == (1000, 33) and c.base.size == 1000 * 33
    assert np.shares_memory(c, be.workspace((30, 7)))


def test_scratch_is_reused_and_grows(be):
    a = be.scratch("test.scratch", (4, 5))
    b = be.scratch("test.scratch", (2, 3))
    assert a.shape == (4, 5) and b.shape == (2, 3) and np.shares_memory(a, b)
    c = be.scratch("test.scratch", (21,))
    assert c.size == 21 and not np.shares_memory(a, c)


# --- machinery ---

def test_launchers_are_fresh():
    for target in ("cpu", "cuda"):
        assert _compile.is_fresh(target), (f"{_compile.path(target)} did not match the kernel bodies: run "
                                           "`python -m nwhisper.kernels` and commit it")


def test_nothing_under_the_package_is_written_at_run_time(tmp_path):
    """A stale launcher file is refused with the command that writes it, never rewritten in the
    installed package (which may be read-only, and which two processes may start at once); a
    fresh process that transcribes writes nothing under nwhisper/ but Numba's own cache."""
    import nwhisper

    pkg = os.path.dirname(nwhisper.__file__)

    def listing():
        return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
                for d, dirs, files in os.walk(pkg) if "__pycache__" not in d for f in files}
    before = listing()
    code = ("import numpy as np, nwhisper; m = nwhisper.load('tiny.en'); "
            "print(''.join(s.text for s in m.transcribe(np.zeros(16000, np.float32))[0]))")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=600)
    assert listing() == before
    real = _compile.source
    try:
        _compile.source = lambda target: real(target) + "# edited\n"
        with pytest.raises(RuntimeError, match="python -m nwhisper.kernels"):
            _compile.launchers("cpu")
    finally:
        _compile.source = real
    assert listing() == before


def test_cpu_bodies_compute_in_float32():
    """No float64 arithmetic crept into a body: a float64 literal or an int/float promotion would be
    slow on GPUs. Recompiles each body (uncached, so its LLVM is at hand) for every signature its
    range function ran with in this session, and reads the IR."""
    import numba

    from nwhisper.kernels import _launch_cpu
    from nwhisper.kernels import speaker_ops, spectral
    seen = 0
    for name, body in _compile.bodies().items():
        # the log-mel and the speakers' fbank need float64 (kernels/spectral.py says why)
        if name in spectral.FLOAT64_BODIES + speaker_ops.FLOAT64_BODIES:
            continue
        fresh = numba.njit(body)
        for sig in getattr(_launch_cpu, name + "_range").signatures:   # every launch runs it
            fsig = (numba.int64,) + tuple(sig[4:])   # after (lo, hi, spread, chunks)
            fresh.compile(fsig)
            ops = [line for line in fresh.inspect_llvm(fsig).splitlines()
                   if "double" in line and any(op in line for op in ("fadd", "fmul", "fdiv", "fsub"))]
            assert not ops, f"{name}{fsig} computes in float64:\n" + "\n".join(ops[:5])
            seen += 1
    if not seen:
        pytest.skip("no kernel ran in this session")


def test_unknown_kernel_and_backend():
    with pytest.raises(ValueError, match="unknown backend"):
        backend.get("tpu")
    with pytest.raises(KeyError, match="not a kernel body"):
        backend.get("cpu").launch(ref_gelu, 1)


def test_cuda_unusable_is_a_sentence():
    why = backend.cuda_unusable()
    if why is None:
        pytest.skip("CUDA is usable here")
    with pytest.raises(RuntimeError, match="CUDA backend cannot run"):
        backend.get("cuda")
    assert isinstance(backend.get("auto"), backend.CpuBackend)


def test_cpu_path_never_imports_numba_cuda():
    code = ("import sys, numpy as np\n"
            "from nwhisper import backend, kernels as K\n"
            "be = backend.get('cpu'); x = np.ones((2, 4), np.float32); K.gelu(be, x, x)\n"
            "print(sorted(m for m in sys.modules if m.startswith('numba.cuda')))\n")
    env = paths.env()
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", f"the CPU path imported {out.strip()}"


def test_an_edited_body_is_not_served_from_a_stale_cache(tmp_path):
    """Numba's cache of a launcher keys on the launcher's file, not on the body it inlines: edit a
    body in a copy of the package and the stale launcher is refused (naming the command), then
    `python -m nwhisper.kernels` writes it again and the edit runs."""
    import shutil
    shutil.copytree(os.path.join(paths.ROOT, "nwhisper"), tmp_path / "nwhisper",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import numpy as np\n"
            "from nwhisper import backend, kernels as K\n"
            "x = np.ones((2, 4), np.float32)\n"
            "K.add(backend.get('cpu'), x, x, x)\n"
            "print(x[0, 0])\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), NUMBA_CACHE_DIR=str(tmp_path / "cache"))

    def run(*args):
        return subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True)

    assert float(run("-c", code).stdout.split()[-1]) == 2.0  # compiles and caches
    path = tmp_path / "nwhisper" / "kernels" / "elementwise.py"
    text = path.read_text()
    assert "    out[i] = a[i] + b[i]\n" in text
    path.write_text(text.replace("    out[i] = a[i] + b[i]\n", "    out[i] = a[i] + b[i] + b[i]\n"))
    stale = run("-c", code)
    assert stale.returncode != 0 and "run `python -m nwhisper.kernels`" in stale.stderr, stale.stderr[-500:]
    assert run("-m", "nwhisper.kernels").returncode == 0
    assert float(run("-c", code).stdout.split()[-1]) == 3.0, "a stale cached launcher was used"


def test_stft_power_fast_path_equals_portable_body():
    """The CPU's FFT fast path against the portable direct-DFT body, and both against NumPy."""
    from nwhisper import mel as M
    from nwhisper.kernels import spectral

    be = backend.get("cpu")
    rng = np.random.default_rng(7)
    frames, hop = 37, 160
    signal = rng.standard_normal(frames * hop + 400)
    cos_t, sin_t = M.dft_basis()
    fast = np.empty((frames, 201))
    slow = np.empty((frames, 201))
    spectral.stft_power(be, signal, M.hann_window(), cos_t, sin_t, fast, hop)
    be.launch(spectral.stft_power_frame, frames, signal, M.hann_window(), cos_t, sin_t, slow, hop, 400, 201)
    x = np.lib.stride_tricks.sliding_window_view(signal, 400)[::hop][:frames] * M.hann_window()
    want = np.abs(np.fft.rfft(x)) ** 2
    check("stft fast", fast, want, rtol=1e-9)
    check("stft portable", slow, want, rtol=1e-9)


PROBE = """
import pickle, sys
import numpy as np
import cudasim_check
from nwhisper import backend
cpu = backend.get("cpu")
out = {name: [np.asarray(x).copy() for x in case(cpu, *inputs)] for name, case, inputs in cudasim_check.CASES}
pickle.dump(out, open(sys.argv[1], "wb"))
"""


def test_kernels_compiled_here_and_loaded_from_the_cache_compute_the_same(tmp_path):
    """Every op case of tests/helpers/cudasim_check.py on the CPU backend, in a process that compiles
    the kernels (an empty Numba cache) and in one that loads them from it: the same bits. (A body
    linked into its launcher rather than inlined rounded its sums one way or the other, so the
    first run after an install could transcribe differently from the next.)"""
    import pickle

    env = paths.env(NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    runs = []
    for k in range(2):
        subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / f"{k}.pkl")], env=env, check=True,
                       capture_output=True, timeout=600)
        with open(tmp_path / f"{k}.pkl", "rb") as f:
            runs.append(pickle.load(f))
    differ = [name for name in runs[0]
              if any(not np.array_equal(a, b) for a, b in zip(runs[0][name], runs[1][name]))]
    assert not differ, f"compiled and cached kernels differ: {differ}"


@pytest.mark.parametrize("live,n_frames", [(37, 37), (20, 50), (0, 12)])
def test_log_mel_on_the_host_is_the_bodies(live, n_frames):
    """The CPU's NumPy filter bank, log10, maximum and clamp against the bodies that a device
    runs (mel_log_frame, mel_max, mel_normalize_row) on the same power: the same float32 values
    but where float64 sums in another order round a value the other way (at most one step)."""
    from nwhisper import mel as M
    from nwhisper.kernels import spectral

    be = backend.get("cpu")
    rng = np.random.default_rng(11)
    hop, n_mels = 160, 80
    signal = rng.standard_normal(max(live, 1) * hop + 400) * np.float64(0.05)
    signal[: len(signal) // 3] *= 1e-5        # quiet frames: the clamp at top − 8 applies
    window, (cos_t, sin_t), filters = M.hann_window(), M.dft_basis(), M.mel_filters(n_mels)
    got = np.full((n_frames, n_mels), np.nan, np.float32)
    spectral.log_mel(be, signal, window, cos_t, sin_t, filters, live, hop, got)
    power = np.empty((max(live, 1), 201))
    spectral.stft_power(be, signal, window, cos_t, sin_t, power, hop)
    logspec, top = np.empty((max(live, 1), n_mels)), np.array([-10.0])
    if live:
        be.launch(spectral.mel_log_frame, live, power, filters, logspec, n_mels, 201)
        be.launch(spectral.mel_max, 1, logspec, live, top)
    want = np.empty((n_frames, n_mels), np.float32)
    be.launch(spectral.mel_normalize_row, n_frames, logspec, top, live, np.float64(-10.0), want)
    steps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
    print(f"log-mel host vs bodies: {int((steps > 0).sum())} of {steps.size} values a step apart")
    assert steps.max() <= 1
    if live:
        assert (got == -1.5).sum() < got.size       # not all floor: the signal was seen
