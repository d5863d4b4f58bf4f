"""The three containers hold the same bits, and hostile files fail with a clear CheckpointError.

Round trips use the real tiny.en and base packages (skipped where not installed); the hostile
and quantisation tests use a small random-weight model (tests/helpers/helpers_models.py) so they are fast.
"""

import hashlib
import json
import mmap
import os
import struct

import numpy as np
import pytest
import safetensors.numpy
from helpers_models import N_BASE, SPECIALS, tiny_random_checkpoint, write_ct2

from nwhisper.io.checkpoint import CheckpointError, expected_shapes
from nwhisper.io.convert import convert
from nwhisper.io.ct2 import read_ct2
from nwhisper.io.ggml import QK, mel_filters, read_ggml, to_openai_name, write_ggml
from nwhisper.io.registry import load_checkpoint
from nwhisper.io.safetensors import read_hf, write_hf


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def assert_same_tensors(a, b, widened=()):
    """Every tensor bit-identical in the same dtype; names in `widened` went f16 → f32 (ggml
    stores vectors as f32) and must hold exactly the same values."""
    assert a.dims == b.dims
    assert set(a.tensors) == set(b.tensors)
    for name, x in a.tensors.items():
        y = b.tensors[name]
        if name in widened and x.dtype != y.dtype:
            assert x.dtype == np.float16 and y.dtype == np.float32, name
            assert _same_bits(x.astype(np.float32), y), name
        else:
            assert _same_bits(np.ascontiguousarray(x), np.ascontiguousarray(y)), name


def ggml_vectors(dims):
    """The tensors whisper.cpp keeps in f32: everything but the matrices and conv kernels."""
    return {n for n, s in expected_shapes(dims).items() if len(s) < 2 or "embed_positions" in n}


def is_mapped(arr):
    """True when the array's memory belongs to a file mapping, not to a heap copy."""
    while arr is not None:
        if isinstance(arr, (np.memmap, mmap.mmap)):
            return True
        if isinstance(arr, np.ndarray) and arr.flags.owndata:
            return False
        arr = arr.base
    return False


# ---------------------------------------------------------------------------------------------
# Real models: CT2 package → HF → ggml → HF


@pytest.fixture(scope="module", params=["tiny.en", "base"])
def real(request, tmp_path_factory):
    ck = load_checkpoint(request.param)   # the [test] extra installs both models: missing is a failure
    d = tmp_path_factory.mktemp(request.param)
    hf = write_hf(ck, str(d / "hf"))
    gg = write_ggml(ck, str(d / "model.bin"))
    return ck, hf, gg


def test_ct2_to_hf_is_bit_identical(real):
    ck, hf, _ = real
    h = read_hf(hf)
    assert h.container == "hf"
    assert_same_tensors(ck, h)
    assert (h.suppress_ids, h.suppress_ids_begin, h.alignment_heads) == \
           (ck.suppress_ids, ck.suppress_ids_begin, ck.alignment_heads)
    # language ids travel only for multilingual models (an English-only model has no choice)
    assert h.lang_ids == (ck.lang_ids if ck.dims.is_multilingual else None)
    assert all(is_mapped(t) for t in h.tensors.values())
    # The safetensors package reads what we wrote, to the same bits.
    ref = safetensors.numpy.load_file(os.path.join(hf, "model.safetensors"))
    assert set(ref) == set(ck.tensors)
    assert all(_same_bits(ref[n], np.ascontiguousarray(ck.tensors[n])) for n in ref)


def test_hf_configs_take_ids_from_the_tokenizer(real):
    from tokenizers import Tokenizer

    ck, hf, _ = real
    tok = Tokenizer.from_file(ck.tokenizer_json)
    cfg = json.load(open(os.path.join(hf, "config.json")))
    gen = json.load(open(os.path.join(hf, "generation_config.json")))
    pre = json.load(open(os.path.join(hf, "preprocessor_config.json")))
    eot, sot = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|startoftranscript|>")
    assert (cfg["model_type"], cfg["d_model"], cfg["vocab_size"]) == ("whisper", ck.dims.n_audio_state, ck.dims.n_vocab)
    assert (cfg["eos_token_id"], cfg["decoder_start_token_id"]) == (eot, sot)
    assert gen["no_timestamps_token_id"] == tok.token_to_id("<|notimestamps|>")
    assert gen["is_multilingual"] == ck.dims.is_multilingual
    assert gen["alignment_heads"] == [list(h) for h in ck.alignment_heads]
    if ck.dims.is_multilingual:
        assert gen["lang_to_id"]["<|en|>"] == tok.token_to_id("<|en|>")
        assert sorted(gen["lang_to_id"].values()) == ck.lang_ids
        assert gen["task_to_id"]["transcribe"] == tok.token_to_id("<|transcribe|>")
    else:   # transformers would take a lang_to_id as a sign of a multilingual model
        assert "lang_to_id" not in gen and "task_to_id" not in gen
    assert pre["feature_size"] == ck.dims.n_mels
    with open(os.path.join(hf, "tokenizer.json"), "rb") as a, open(ck.tokenizer_json, "rb") as b:
        assert a.read() == b.read()


def test_ct2_to_ggml_keeps_matrices_and_widens_vectors(real):
    from tokenizers import Tokenizer

    from nwhisper.io.bytelevel import byte_level_to_bytes

    ck, _, gg = real
    g = read_ggml(gg)
    assert g.container == "ggml" and g.tokenizer_json is None
    assert_same_tensors(ck, g, widened=ggml_vectors(ck.dims))
    assert all(is_mapped(t) for t in g.tensors.values())
    # The base words: 50256 (English-only) or 50257 (multilingual), as whisper.cpp's converter
    # writes from openai-whisper's gpt2 / multilingual .tiktoken files.
    tok = Tokenizer.from_file(ck.tokenizer_json)
    eot = tok.token_to_id("<|endoftext|>")
    assert len(g.vocab_bytes) == eot == (50257 if ck.dims.is_multilingual else 50256)
    assert g.vocab_bytes[:300] == [byte_level_to_bytes(tok.id_to_token(i)) for i in range(300)]


def test_ggml_and_hf_chain_round_trips_bit_identically(real, tmp_path):
    _, hf, gg = real
    g = read_ggml(gg)
    again = write_ggml(g, str(tmp_path / "again.bin"))
    with open(gg, "rb") as a, open(again, "rb") as b:
        assert a.read() == b.read()                  # ggml → ggml: the same file
    h = read_hf(write_hf(g, str(tmp_path / "hf")))    # ggml → hf
    assert_same_tensors(g, h)
    h2 = read_hf(write_hf(read_hf(hf), str(tmp_path / "hf2")))   # hf → hf
    assert_same_tensors(read_hf(hf), h2)
    g2 = read_ggml(write_ggml(h, str(tmp_path / "back.bin")))    # hf → ggml
    assert_same_tensors(g, g2)


# ---------------------------------------------------------------------------------------------
# The small model through every container


@pytest.fixture
def tiny(tmp_path):
    ck = tiny_random_checkpoint(tokenizer_dir=str(tmp_path))
    ct2 = write_ct2(ck, str(tmp_path / "ct2"))
    hf = write_hf(ck, str(tmp_path / "hf"))
    gg = write_ggml(ck, str(tmp_path / "model.bin"))
    return ck, ct2, hf, gg


def test_tiny_round_trips(tiny, tmp_path):
    ck, ct2, hf, gg = tiny
    assert_same_tensors(ck, read_ct2(ct2))
    assert_same_tensors(ck, read_hf(hf))
    g = read_ggml(gg)
    assert_same_tensors(ck, g, widened=ggml_vectors(ck.dims))
    assert g.vocab_bytes == [bytes([b]) for b in range(N_BASE)]
    f32 = tiny_random_checkpoint(dtype=np.float32)
    assert_same_tensors(f32, read_ggml(write_ggml(f32, str(tmp_path / "f32.bin"))))   # f32 stays f32
    assert_same_tensors(f32, read_hf(write_hf(f32, str(tmp_path / "f32hf"))))


def test_ggml_file_layout_is_whisper_cpps(tiny):
    """Header fields and per-tensor types as whisper.cpp's whisper_model_load expects them."""
    ck, _, _, gg = tiny
    with open(gg, "rb") as f:
        blob = f.read()
    assert blob[:4] == b"lmgg"
    h = struct.unpack_from("<11i", blob, 4)
    d = ck.dims
    assert h == (d.n_vocab, d.n_audio_ctx, d.n_audio_state, d.n_audio_head, d.n_audio_layer, d.n_text_ctx,
                 d.n_text_state, d.n_text_head, d.n_text_layer, d.n_mels, 1)
    n_mel, n_fft = struct.unpack_from("<2i", blob, 48)
    assert (n_mel, n_fft) == (d.n_mels, 201)
    pos = 56 + 4 * n_mel * n_fft
    (n_words,) = struct.unpack_from("<i", blob, pos)
    pos += 4
    for _ in range(n_words):
        pos += 4 + struct.unpack_from("<I", blob, pos)[0]
    seen = {}
    while pos < len(blob):
        n_dims, name_len, ttype = struct.unpack_from("<3i", blob, pos)
        ne = struct.unpack_from(f"<{n_dims}i", blob, pos + 12)
        name = blob[pos + 12 + 4 * n_dims:pos + 12 + 4 * n_dims + name_len].decode()
        seen[name] = (ne, ttype)
        pos += 12 + 4 * n_dims + name_len + int(np.prod(ne)) * (2 if ttype == 1 else 4)
    assert seen["encoder.conv1.bias"] == ((1, d.n_audio_state), 0)
    assert seen["encoder.conv1.weight"] == ((3, d.n_mels, d.n_audio_state), 1)
    assert seen["encoder.positional_embedding"] == ((d.n_audio_state, d.n_audio_ctx), 0)
    assert seen["decoder.token_embedding.weight"] == ((d.n_text_state, d.n_vocab), 1)
    assert seen["decoder.blocks.1.cross_attn.key.weight"] == ((d.n_text_state, d.n_text_state), 1)
    assert seen["decoder.blocks.1.mlp_ln.bias"] == ((d.n_text_state,), 0)
    assert len(seen) == len(expected_shapes(d))


def test_hf_reader_accepts_names_without_prefix_bf16_and_proj_out(tmp_path):
    ck = tiny_random_checkpoint(dtype=np.float32)
    d = write_hf(ck, str(tmp_path / "hf"))
    raw = {}
    for name, t in ck.tensors.items():
        name = name.removeprefix("model.")
        bits = np.ascontiguousarray(t).view(np.uint32) & np.uint32(0xFFFF0000)   # exactly bf16
        raw[name] = (bits >> 16).astype(np.uint16)
    raw["proj_out.weight"] = raw["decoder.embed_tokens.weight"]
    header = {n: {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [0, 0]} for n, a in raw.items()}
    off = 0
    for n, a in raw.items():
        header[n]["data_offsets"] = [off, off + a.nbytes]
        off += a.nbytes
    blob = json.dumps(header).encode()
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob + b"".join(a.tobytes() for a in raw.values()))
    h = read_hf(d)
    assert "proj_out.weight" not in h.tensors and "model.proj_out.weight" not in h.tensors
    for name, t in ck.tensors.items():
        want = (np.ascontiguousarray(t).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        assert _same_bits(want, h.tensors[name]), name


def test_hf_config_must_agree_with_tensors(tiny):
    _, _, hf, _ = tiny
    cfg_path = os.path.join(hf, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["encoder_layers"] += 1
    json.dump(cfg, open(cfg_path, "w"))
    with pytest.raises(CheckpointError, match="n_audio_layer"):
        read_hf(hf)


def test_convert(tiny, tmp_path):
    ck, ct2, _, _ = tiny
    hf = convert(ct2, str(tmp_path / "out_hf"), to="hf")
    assert hf == str(tmp_path / "out_hf")
    gg = convert(hf, str(tmp_path / "out.bin"), to="ggml")
    assert_same_tensors(ck, read_ggml(gg), widened=ggml_vectors(ck.dims))
    with pytest.raises(CheckpointError, match="same"):
        convert(gg, gg, to="ggml")
    with pytest.raises(CheckpointError, match="same"):
        convert(hf, hf, to="hf")
    with pytest.raises(ValueError, match="expected hf, ggml or pt"):
        convert(hf, str(tmp_path / "x"), to="onnx")


# ---------------------------------------------------------------------------------------------
# Mel filters written into ggml files


def test_mel_filters_match_openai_whispers_asset():
    # sha256 of mel_80 / mel_128 in openai-whisper 20250625's whisper/assets/mel_filters.npz
    # (librosa.filters.mel(sr=16000, n_fft=400, n_mels=N), float32), computed from the sdist.
    golden = {80: "4f2701b1d287d74a0dc9871026e9519d98cb76426615f2539b0d151a0ae4ec2e",
              128: "2a5f9822897750e047c85dea37cc268d3be0ecfd23c28a5f10da129d99d05afe"}
    for n, digest in golden.items():
        w = mel_filters(n)
        assert w.shape == (n, 201) and w.dtype == np.float32 and (w >= 0).all()
        peaks = w.argmax(axis=1)
        assert (np.diff(peaks) >= 0).all()        # triangles, in order of frequency
        assert hashlib.sha256(w.tobytes()).hexdigest() == digest


# ---------------------------------------------------------------------------------------------
# Quantised ggml tensors. The quantiser below follows ggml's reference quantize_row_*_ref
# (ggml-quants.c) and packs blocks as ggml-common.h lays them out; the expected values are
# computed from the integer codes it chose, independently of the reader's unpacking.

BLOCK = {"q4_0": (2, 18), "q4_1": (3, 20), "q5_0": (6, 22), "q5_1": (7, 24), "q8_0": (8, 34)}
FTYPE = {"q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9, "q8_0": 7}   # ggml_ftype of a "mostly qX" file


def quantize(kind, x):
    """x (n × 32 floats) → (block bytes, the float32 values ggml's dequantiser must give)."""
    blocks, expect = [], []
    for v in x.reshape(-1, QK).astype(np.float32):
        if kind in ("q4_1", "q5_1"):
            lo, hi = v.min(), v.max()
            levels = 15 if kind == "q4_1" else 31
            d = np.float16((hi - lo) / levels)
            m = np.float16(lo)
            idd = 1 / np.float32(d) if d else 0.0
            q = np.clip(np.floor((v - np.float32(m)) * idd + 0.5), 0, levels).astype(np.int32)
            y = q.astype(np.float32) * np.float32(d) + np.float32(m)
            head = np.array([d, m], np.float16).tobytes()
        else:
            amax_i = int(np.argmax(np.abs(v)))
            if kind == "q8_0":
                d = np.float16(np.abs(v).max() / 127)
                q = np.clip(np.round(v / np.float32(d) if d else v * 0), -127, 127).astype(np.int32)
                bias = 0
            else:
                levels, bias = (-8, 8) if kind == "q4_0" else (-16, 16)
                d = np.float16(v[amax_i] / levels)
                idd = 1 / np.float32(d) if d else 0.0
                q = np.clip(np.floor(v * idd + bias + 0.5), 0, 2 * bias - 1).astype(np.int32) - bias
            y = q.astype(np.float32) * np.float32(d)
            head = np.array([d], np.float16).tobytes()
        if kind == "q8_0":
            body = q.astype(np.int8).tobytes()
        else:
            u = (q + (0 if kind in ("q4_1", "q5_1") else (8 if kind == "q4_0" else 16))).astype(np.uint32)
            nib = ((u[:16] & 0xF) | ((u[16:] & 0xF) << 4)).astype(np.uint8).tobytes()
            if kind in ("q5_0", "q5_1"):
                qh = int(sum(((int(u[j]) >> 4) & 1) << j for j in range(QK)))
                body = struct.pack("<I", qh) + nib
            else:
                body = nib
        blocks.append(head + body)
        expect.append(y)
    return b"".join(blocks), np.concatenate(expect)


def write_quantized(ck, path, kind, qntvr=2):
    """Write a ggml file as whisper.cpp's quantize tool does: 2-D matrices quantised, the rest as
    write_ggml wrote them. Returns {HF name: expected float32 values} for the quantised ones."""
    write_ggml(ck, path)
    tid, _ = BLOCK[kind]
    g = read_ggml(path)
    expected = {}
    out = bytearray(open(path, "rb").read())
    struct.pack_into("<i", out, 44, FTYPE[kind] + 1000 * qntvr)
    # Rewrite the tensor section.
    pos = 56 + 4 * ck.dims.n_mels * 201
    (n_words,) = struct.unpack_from("<i", out, pos)
    pos += 4
    for _ in range(n_words):
        pos += 4 + struct.unpack_from("<I", out, pos)[0]
    tensors = bytearray()
    for name, t in g.tensors.items():
        oname = to_openai_name(name).encode()
        if t.ndim == 2 and "embed_positions" not in name:
            data, expected[name] = quantize(kind, t.astype(np.float32).reshape(-1))
            ttype = tid
        else:
            if name.endswith(("conv1.bias", "conv2.bias")):
                t = t.reshape(-1, 1)
            if t.ndim == 3:                 # whisper.cpp keeps conv kernels f16 in quantised files
                t = t.astype(np.float16)
            data, ttype = np.ascontiguousarray(t).tobytes(), (1 if t.dtype == np.float16 else 0)
        tensors += struct.pack(f"<3i{t.ndim}i", t.ndim, len(oname), ttype, *reversed(t.shape)) + oname + data
    with open(path, "wb") as f:
        f.write(bytes(out[:pos]) + bytes(tensors))
    return expected


@pytest.mark.parametrize("kind", sorted(BLOCK))
def test_quantised_tensors_dequantise_exactly(kind, tmp_path):
    ck = tiny_random_checkpoint(dtype=np.float32, seed=3)
    path = str(tmp_path / f"{kind}.bin")
    expected = write_quantized(ck, path, kind)
    g = read_ggml(path)
    assert expected
    for name, want in expected.items():
        got = g.tensors[name]
        assert got.dtype == np.float32 and got.shape == ck.tensors[name].shape
        assert _same_bits(got.reshape(-1), want), name
        scale = np.abs(ck.tensors[name]).max()
        assert np.abs(got - ck.tensors[name]).max() <= scale / (4 if kind.startswith("q4") else 8)


def test_old_quantisation_version_and_unknown_types_are_refused(tmp_path):
    ck = tiny_random_checkpoint(dtype=np.float32)
    old = str(tmp_path / "old.bin")
    write_quantized(ck, old, "q4_0", qntvr=1)
    with pytest.raises(CheckpointError, match="version 1"):
        read_ggml(old)
    # q4_K (type 12) has 256-weight super-blocks this reader does not decode: refused by name.
    path = str(tmp_path / "q8.bin")
    write_quantized(ck, path, "q8_0")
    blob = bytearray(open(path, "rb").read())
    i = blob.index(b"decoder.blocks.0.attn.query.weight")
    struct.pack_into("<i", blob, i - 4 * 2 - 4 * 3 + 8, 12)    # the ttype of its 2-D header
    bad = tmp_path / "k.bin"
    bad.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="q4_K"):
        read_ggml(str(bad))


# ---------------------------------------------------------------------------------------------
# Hostile files: each must fail with one CheckpointError naming the file, and nothing else.


def expect_refusal(read, target, path_named):
    with pytest.raises(CheckpointError) as e:
        read(target)
    msg = str(e.value)
    assert "\n" not in msg and path_named in msg, msg
    return msg


def truncation_offsets(size, header_end, n=50):
    """n offsets: most spread over the header region, some in the data, and the edges."""
    head = np.linspace(0, min(header_end, size - 1), n - 10).astype(int)
    data = np.linspace(header_end, size - 1, 10).astype(int)
    return sorted(set(head) | set(data) | {0, 1, 7, size - 1})


def _truncations(tmp_path, src, header_end, read, directory):
    """Cut `src` at many offsets; a directory container gets its other files copied beside it."""
    blob = open(src, "rb").read()
    for cut in truncation_offsets(len(blob), header_end):
        p = tmp_path / f"cut{cut}"
        p.mkdir()
        dst = p / os.path.basename(src)
        dst.write_bytes(blob[:cut])
        if directory:
            for extra in os.listdir(os.path.dirname(src)):
                if extra != os.path.basename(src):
                    (p / extra).write_bytes(open(os.path.join(os.path.dirname(src), extra), "rb").read())
        target = str(p) if directory else str(dst)
        expect_refusal(read, target, target)


def test_truncated_ct2(tiny, tmp_path):
    _, ct2, _, _ = tiny
    _truncations(tmp_path, os.path.join(ct2, "model.bin"), 4000, read_ct2, directory=True)


def test_truncated_hf(tiny, tmp_path):
    _, _, hf, _ = tiny
    src = os.path.join(hf, "model.safetensors")
    (n,) = struct.unpack("<Q", open(src, "rb").read(8))
    _truncations(tmp_path, src, 8 + n, read_hf, directory=True)


def test_truncated_ggml(tiny, tmp_path):
    ck, _, _, gg = tiny
    header_end = 56 + 4 * ck.dims.n_mels * 201 + 5 * N_BASE + 4 + 2000
    _truncations(tmp_path, gg, header_end, read_ggml, directory=False)


def _patched(tmp_path, src, name, patch):
    blob = bytearray(open(src, "rb").read())
    patch(blob)
    dst = tmp_path / name
    dst.write_bytes(bytes(blob))
    return str(dst)


@pytest.mark.parametrize("case, field, value, message", [
    ("wrong magic", 0, 0x12345678, "magic"),
    ("negative n_vocab", 4, -5, "n_vocab"),
    ("absurd width", 12, 1 << 30, "n_audio_state"),
    ("heads do not divide width", 16, 7, "divisible"),
    ("negative ftype", 44, -1, "ftype"),
    ("absurd n_mel", 48, 1 << 28, "n_mel"),
    ("filters past the end", 52, 1 << 19, "past"),
])
def test_hostile_ggml_header(tiny, tmp_path, case, field, value, message):
    _, _, _, gg = tiny
    fmt = "<I" if case == "wrong magic" else "<i"
    bad = _patched(tmp_path, gg, "bad.bin", lambda b: struct.pack_into(fmt, b, field, value))
    assert message in expect_refusal(read_ggml, bad, bad)


def test_hostile_ggml_tensors(tiny, tmp_path):
    ck, _, _, gg = tiny
    blob = open(gg, "rb").read()
    i = blob.index(b"encoder.conv1.weight") - 4 * 3 - 4 * 3     # its header: n_dims name_len ttype ne[3]
    cases = {
        "n_dims": (i, 9),
        "name length": (i + 4, -1),
        "ne[0]": (i + 12, -3),
        "ne[2]": (i + 20, 1 << 24),
        "f32, f16": (i + 8, 99),       # unknown type id: the error lists what is read
    }
    for message, (off, value) in cases.items():
        bad = _patched(tmp_path, gg, f"t{off}.bin", lambda b: struct.pack_into("<i", b, off, value))
        assert message in expect_refusal(read_ggml, bad, bad)
    words_at = 56 + 4 * ck.dims.n_mels * 201
    for value, message in ((-1, "out of range"), (1 << 30, "out of range")):
        bad = _patched(tmp_path, gg, "w.bin", lambda b: struct.pack_into("<i", b, words_at, value))
        assert message in expect_refusal(read_ggml, bad, bad)
    bad = _patched(tmp_path, gg, "len.bin", lambda b: struct.pack_into("<I", b, words_at + 4, 0xFFFFFFF0))
    expect_refusal(read_ggml, bad, bad)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert "empty" in expect_refusal(read_ggml, str(empty), str(empty))
    dup = tmp_path / "dup.bin"
    j = blob.index(b"decoder.ln.bias") - 4 * 4
    dup.write_bytes(blob + blob[j:j + 16 + len(b"decoder.ln.bias") + 4 * ck.dims.n_text_state])
    assert "twice" in expect_refusal(read_ggml, str(dup), str(dup))


def _safetensors(tmp_path, header, data=b"", raw_header=None, declared=None):
    d = tmp_path / f"st{len(os.listdir(tmp_path))}"
    d.mkdir()
    src = tiny_random_checkpoint(dtype=np.float32)
    write_hf(src, str(d))
    blob = raw_header if raw_header is not None else json.dumps(header).encode()
    n = len(blob) if declared is None else declared
    (d / "model.safetensors").write_bytes(struct.pack("<Q", n) + blob + data)
    return str(d)


@pytest.mark.parametrize("case", ["offsets past the end", "shape x dtype != span", "header longer than file",
                                  "non-JSON header", "overlapping offsets", "unsupported dtype",
                                  "negative shape", "offsets reversed", "header is a list", "tiny file",
                                  "missing tensors"])
def test_hostile_safetensors(tmp_path, case):
    t = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    header, data, raw, declared, message = {"a": t}, bytes(16), None, None, None
    if case == "offsets past the end":
        header, message = {"a": {**t, "data_offsets": [0, 1 << 40]}}, "past the end"
    elif case == "shape x dtype != span":
        header, message = {"a": {**t, "shape": [1 << 30, 1 << 30]}}, "needs"
    elif case == "header longer than file":
        declared, message = 1 << 62, "header length"
    elif case == "non-JSON header":
        raw, message = b"{not json", "JSON"
    elif case == "overlapping offsets":
        header, data, message = {"a": {**t, "shape": [4], "data_offsets": [0, 16]},
                                 "b": {**t, "shape": [2], "data_offsets": [8, 16]}}, bytes(16), "overlap"
    elif case == "unsupported dtype":
        header, message = {"a": {**t, "dtype": "I8", "shape": [16]}}, "I8"
    elif case == "negative shape":
        header, message = {"a": {**t, "shape": [-2, -2]}}, "shape"
    elif case == "offsets reversed":
        header, message = {"a": {**t, "data_offsets": [16, 0]}}, "data_offsets"
    elif case == "header is a list":
        raw, message = b"[1, 2]", "object"
    elif case == "tiny file":
        d = tmp_path / "tiny"
        d.mkdir()
        write_hf(tiny_random_checkpoint(), str(d))
        (d / "model.safetensors").write_bytes(b"\x01\x02")
        assert "8-byte" in expect_refusal(read_hf, str(d), str(d / "model.safetensors"))
        return
    elif case == "missing tensors":
        message = "missing"
    d = _safetensors(tmp_path, header, data, raw, declared)
    msg = expect_refusal(read_hf, d, d)
    assert message in msg, msg


def test_hostile_hf_json(tiny, tmp_path):
    _, _, hf, _ = tiny
    for name, text, message in (("config.json", "{", "JSON"), ("config.json", "[]", "object"),
                                ("config.json", '{"d_model": "wide"}', "expected an integer"),
                                ("generation_config.json", "\xff{", "JSON")):
        with open(os.path.join(hf, name), "w", encoding="latin-1") as f:
            f.write(text)
        assert message in expect_refusal(read_hf, hf, os.path.join(hf, name))
        write_hf(read_ct2(tiny[1]), hf)    # restore
    os.remove(os.path.join(hf, "config.json"))
    expect_refusal(read_hf, hf, os.path.join(hf, "config.json"))


def test_hostile_ct2(tiny, tmp_path):
    _, ct2, _, _ = tiny
    src = os.path.join(ct2, "model.bin")

    def variant(name, patch):
        d = tmp_path / name
        d.mkdir()
        for f in os.listdir(ct2):
            (d / f).write_bytes(open(os.path.join(ct2, f), "rb").read())
        blob = bytearray(open(src, "rb").read())
        patch(blob)
        (d / "model.bin").write_bytes(bytes(blob))
        return str(d)

    blob = open(src, "rb").read()
    first = blob.index(b"decoder/embeddings/weight\0") + len(b"decoder/embeddings/weight\0")
    cases = {
        "wrong version": lambda b: struct.pack_into("<I", b, 0, 77),
        "absurd variable count": lambda b: struct.pack_into("<I", b, 4 + 2 + 12 + 4, 1 << 31),
        "absurd rank": lambda b: struct.pack_into("<B", b, first, 200),
        "length past the end": lambda b: struct.pack_into("<I", b, first + 1 + 8 + 1, 1 << 31),
        "dims disagree with bytes": lambda b: struct.pack_into("<I", b, first + 1, 3),
    }
    for name, patch in cases.items():
        d = variant(name.replace(" ", "_"), patch)
        expect_refusal(read_ct2, d, os.path.join(d, "model.bin"))


def test_vocab_and_specials_of_the_tiny_tokenizer(tiny):
    """The helper's tokenizer puts the specials where Whisper's vocabulary does."""
    from tokenizers import Tokenizer

    ck = tiny[0]
    tok = Tokenizer.from_file(ck.tokenizer_json)
    assert [tok.token_to_id(s) for s in SPECIALS] == list(range(N_BASE, N_BASE + len(SPECIALS)))


@pytest.mark.parametrize("name, text", [("config.json", '{"alignment_heads": [1, 2]}'),
                                        ("vocabulary.json", "{bad"), ("vocabulary.json", "[1, 2]")])
def test_hostile_ct2_side_files(tiny, name, text):
    _, ct2, _, _ = tiny
    if name.startswith("vocabulary"):
        os.remove(os.path.join(ct2, "tokenizer.json"))
    with open(os.path.join(ct2, name), "w") as f:
        f.write(text)
    expect_refusal(read_ct2, ct2, os.path.join(ct2, name))


def test_ct2_vocabulary_txt_and_json_read_alike(tiny):
    """Without tokenizer.json a CT2 directory's vocabulary comes from vocabulary.json or
    vocabulary.txt (one token a line, as CTranslate2's converter writes it, ending in a newline);
    both give the same words, and the last line's newline is not a token."""
    import json

    from nwhisper.io.bytelevel import bytes_to_byte_level

    _, ct2, _, _ = tiny
    os.remove(os.path.join(ct2, "tokenizer.json"))
    words = [bytes_to_byte_level(bytes([b])) for b in range(N_BASE)]
    with open(os.path.join(ct2, "vocabulary.json"), "w", encoding="utf-8") as f:
        json.dump(words, f)
    from_json = read_ct2(ct2).vocab_bytes
    os.remove(os.path.join(ct2, "vocabulary.json"))
    with open(os.path.join(ct2, "vocabulary.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(words) + "\n")
    from_txt = read_ct2(ct2).vocab_bytes
    assert from_json == from_txt == [bytes([b]) for b in range(N_BASE)]


def test_released_pages_read_back_the_same():
    """Checkpoint.release_pages lets the mapped file's pages go; the tensors read the same after
    (the decoder's float16 rows are read in place), and the resident memory falls."""
    from nwhisper.io.registry import load_checkpoint

    def resident_mib():
        with open("/proc/self/status") as f:
            return int(next(ln for ln in f if ln.startswith("VmRSS")).split()[1]) / 1024

    ck = load_checkpoint("tiny.en")
    before = {n: np.array(t) for n, t in ck.tensors.items()}   # reads every page
    touched = resident_mib()
    ck.release_pages()
    assert resident_mib() < touched - 30, "tiny.en's ~75 MB of mapped pages stayed resident"
    assert all(np.array_equal(t, before[n]) for n, t in ck.tensors.items())


def test_released_pages_of_one_layer():
    """release_pages(prefix) lets go of that layer's pages only, as the model does after
    converting each layer: the mapping's resident size (/proc/self/smaps) falls by the layer's
    bytes, to within a page at each tensor's ends, and the rest stays."""
    import mmap
    from nwhisper.io.registry import load_checkpoint

    def mapped_kib(path):
        kib, inside = 0, False
        with open("/proc/self/smaps") as f:
            for ln in f:
                if ln[:1].isalnum() and "-" in ln.split()[0]:
                    inside = ln.split()[-1].startswith(path)
                elif inside and ln.startswith("Rss:"):
                    kib += int(ln.split()[1])
        return kib

    ck = load_checkpoint("tiny.en")
    for t in ck.tensors.values():
        np.array(t)                                  # every page resident
    full = mapped_kib(ck.path)
    prefix = "model.encoder.layers.2."
    layer = [t for n, t in ck.tensors.items() if n.startswith(prefix)]
    ck.release_pages(prefix)
    fell = full - mapped_kib(ck.path)
    nbytes = sum(t.nbytes for t in layer)
    slack = 2 * len(layer) * mmap.PAGESIZE
    assert nbytes - slack <= fell * 1024 <= nbytes + slack, (fell, nbytes)

def test_int8_token_embedding_is_read_in_place(models):
    """An int8 model looks its token embedding up where the checkpoint's mapped file holds it
    (only the rows looked up come back into memory): no copy of it is made, though tiny.en's CT2
    tensor lies at an odd address; its int8 copy is the output projection."""
    model = models("tiny.en", "int8")
    emb = model.checkpoint["model.decoder.embed_tokens.weight"]
    assert not emb.flags.aligned
    assert np.shares_memory(model.model.tok_emb, emb)
