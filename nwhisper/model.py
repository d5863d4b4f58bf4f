"""Whisper's network on the kernels: the encoder, and the decoder one step at a time.

    mel (2·n_audio_ctx, n_mels)
      → conv1 (k3 s1) → GELU → conv2 (k3 s2) → GELU      3000 frames → 1500 positions
      → + embed_positions (a stored tensor, not sinusoids computed here)
      → n_audio_layer × [ LN → self-attention (non-causal) → +x ; LN → fc1 → GELU → fc2 → +x ]
      → LN                                                 = the encoder states (1500, d)

    token ids at positions pos…pos+n-1
      → embed_tokens[ids] + embed_positions[pos…]
      → n_text_layer × [ LN → causal self-attention over the KV cache → +x ;
                         LN → cross-attention to the encoder states → +x ;
                         LN → fc1 → GELU → fc2 → +x ]
      → LN → · embed_tokensᵀ                               = logits (n, n_vocab)

Every array here lives on the backend (`be`): the encoder states and the cross-attention K/V stay
on the device for the whole window, and greedy decoding moves one token id in and one out.
Shapes are read from the checkpoint, never assumed from a model size.
"""

from __future__ import annotations

import warnings

import numpy as np

from . import kernels as K
from .kernels.attention import heads_int8
from .kernels.matmul import column_scales
from .io.checkpoint import Checkpoint
from .decoder_state import BatchState, DecoderState
from .records import COMPUTE_TYPES, stop_if

LN_EPS = 1e-5   # torch.nn.LayerNorm's default, which every Whisper was trained with


def _host(a, dtype=None):
    """A checkpoint array as an aligned, contiguous host array (memory-mapped CT2 tensors may be
    unaligned, which Numba refuses); float32 unless a dtype is given."""
    return np.require(a, dtype=dtype or np.float32, requirements=["C", "A"])


def _stacked(ck, parts):
    """(W, b) on the host: the weight rows of linear layers `parts` ((name, has_bias) each)
    stacked in the checkpoint's precision, [W0; W1; …], and their biases f32 (zeros for a layer
    without; None when no layer has one) -- several products of the same input made one."""
    ws = [_host(ck[name + ".weight"], ck[name + ".weight"].dtype) for name, _ in parts]
    bs = [_host(ck[name + ".bias"]) if has_bias else np.zeros(w.shape[0], np.float32)
          for (name, has_bias), w in zip(parts, ws)]

    def joined(xs):                 # one layer's array as it is: no copy
        return xs[0] if len(xs) == 1 else np.concatenate(xs)
    return joined(ws), (joined(bs) if any(has_bias for _, has_bias in parts) else None)


class _Linear:
    """y = x·Wᵀ (+ b), of one checkpoint layer `name`, or of several stacked (`parts`, as
    _stacked takes them: one product where they share their input). k_proj has no bias:
    openai-whisper built its key projections with bias=False (a bias on the keys would add the
    same constant to every score of a query, which softmax cancels), so `b` is None there.

    store: how W is kept — "full" (for products of many rows, the encoder's: f32 where the
    backend multiplies, be.weight_rows), "bf16" (the same, multiplied on bfloat16 operands where
    the backend can: be.weight_bf16), "gemv" (the
    checkpoint's f16 kept where the backend reads it at the point of use: decoding's few-row
    products, memory-bound), "int8" (int8 rows with per-row scales, kernels.matmul.Int8Weight:
    the encoder's, whose activations the CPU's int8 GEMM may quantise per row) or "int8-gemv"
    (the decoder's: its activations are never quantised, backend.weight_int8 says why).
    equalise: W's input columns multiplied by `columns` (column_scales) before it is stored;
    the LayerNorm that feeds it divides by them."""

    def __init__(self, be, ck, name=None, bias=True, store="full", parts=None, equalise=False):
        w, b = _stacked(ck, parts or [(name, bias)])
        if equalise and store != "int8-gemv":
            raise ValueError("only int8 rows read with float activations are equalised")
        self.columns = column_scales(w) if equalise else None
        if store.startswith("int8"):
            self.w = be.weight_int8(w, quantized_rows=store == "int8", columns=self.columns)
        elif store == "gemv":
            self.w = be.weight(w, gemv=True)
        else:
            self.w = be.weight_bf16(w) if store == "bf16" else be.weight_rows(w)
        self.b = None if b is None else be.upload(b)
        self.n_out = w.shape[0]

    def __call__(self, be, x, out, ln=None):
        """out = x·Wᵀ (+ b), or LayerNorm `ln`(x)·Wᵀ (+ b): the backend may normalise x as its
        product reads it (a GPU's GEMV: one launch, no normalised copy)."""
        K.linear(be, x, self.w, self.b, out, None if ln is None else ln.params)
        return out

    def add_to(self, be, x, out):
        """out += x·Wᵀ (+ b): the residual stream's update (one fused launch where it can be)."""
        K.linear_add(be, x, self.w, self.b, out)


class _LayerNorm:
    """columns: the gain and bias divided by these, the column scales of the product this
    LayerNorm alone feeds (column_scales)."""

    def __init__(self, be, ck, name, columns=None):
        c = 1.0 if columns is None else columns
        self.w = be.upload(_host(ck[name + ".weight"]) / c)
        self.b = be.upload(_host(ck[name + ".bias"]) / c)
        self.params = (self.w, self.b, np.float32(LN_EPS))   # K.linear's `ln`

    def __call__(self, be, x, out):
        K.layernorm(be, x, self.w, self.b, out, LN_EPS)
        return out


class _Attention:
    """q/k/v/out projections. kv="apart": q, k and v (the encoder's, whose attention reads them
    as they are); "stacked": one product `qkv` giving [q | k | v] (the decoder's self-attention:
    one launch instead of three, whose k and v are appended to the cache at a position read on
    the device, kernels.kv_append); None: q only, the cross-attention's (its k and v run once per
    window, all layers in one product: Whisper.cross_kv)."""

    def __init__(self, be, ck, prefix, store, kv="apart", equalise=False):
        if kv == "stacked":
            self.qkv = _Linear(be, ck, store=store, equalise=equalise, parts=[
                (prefix + ".q_proj", True), (prefix + ".k_proj", False), (prefix + ".v_proj", True)])
        else:
            self.q = _Linear(be, ck, prefix + ".q_proj", store=store, equalise=equalise)
        if kv == "apart":
            self.k = _Linear(be, ck, prefix + ".k_proj", bias=False, store=store)
            self.v = _Linear(be, ck, prefix + ".v_proj", store=store)
        self.out = _Linear(be, ck, prefix + ".out_proj", store=store)
        # the column scales of the product the LayerNorm before this attention feeds
        self.columns = (self.qkv if kv == "stacked" else self.q).columns


class _Block:
    """One pre-LayerNorm residual block; `cross` adds the decoder's cross-attention; `store`:
    how its matrices are kept (_Linear). "int8-gemv" (the decoder's int8 rows, read with float
    activations): each product that a LayerNorm feeds has its columns equalised
    (column_scales) -- the encoder's int8 GEMM quantises its activations too, which such
    scales would change."""

    def __init__(self, be, ck, prefix, cross, store):
        eq = store == "int8-gemv"
        self.attn = _Attention(be, ck, prefix + ".self_attn", store,
                               kv="stacked" if cross else "apart", equalise=eq)
        self.attn_ln = _LayerNorm(be, ck, prefix + ".self_attn_layer_norm", self.attn.columns)
        if cross:
            self.cross = _Attention(be, ck, prefix + ".encoder_attn", store, kv=None, equalise=eq)
            self.cross_ln = _LayerNorm(be, ck, prefix + ".encoder_attn_layer_norm", self.cross.columns)
        else:
            self.cross_ln = self.cross = None
        self.fc1 = _Linear(be, ck, prefix + ".fc1", store=store, equalise=eq)
        self.mlp_ln = _LayerNorm(be, ck, prefix + ".final_layer_norm", self.fc1.columns)
        self.fc2 = _Linear(be, ck, prefix + ".fc2", store=store)


def _blocks(ck, be, side, n, store):
    """The n blocks of the encoder or decoder `side`, each layer's file pages let go once it is
    converted (Checkpoint.release_pages): a large model's file and its converted matrices are
    never resident together."""
    blocks = []
    for i in range(n):
        prefix = f"model.{side}.layers.{i}"
        blocks.append(_Block(be, ck, prefix, cross=side == "decoder", store=store))
        ck.release_pages(prefix + ".")
    return blocks


class Scratch:
    """Activation buffers reused across calls: the backend's scratch (Backend.scratch), under
    names of the model's. A decode step of one token and a prompt of four use the same memory,
    and the hot loop neither allocates nor, once it has seen a shape, slices."""

    def __init__(self, be):
        self.be = be

    def get(self, name, rows, cols, dtype=np.float32):
        return self.be.scratch("model." + name, (rows, cols), dtype)


class Whisper:
    """A Whisper model's weights on a backend, with `encode` and `decode`.

    compute_type "float32": the encoder's matrices multiply in f32 on BLAS (the CPU keeps them in
    the checkpoint's f16 and widens each for its product: be.weight_rows); the decoder's (and the tied
    token embedding) stay in the checkpoint's precision where the backend reads it at the point
    of use (f16: half the bytes of a memory-bound decoder step, the same values).

    compute_type "int8" (as CTranslate2's): every linear layer, the window's cross K/V and the
    output projection keep int8 rows with per-row scales. The decoder reads them with float
    activations, a step's rows and a prompt's alike (a quarter of the bytes of f32; its hidden
    states are never quantised: backend.weight_int8 says why); it looks the token embedding up
    in the checkpoint's own rows, read in place (Backend.table). The encoder's products of 1500
    rows, and its attention scores, run on the CPU's int8 GEMM with the activations quantised
    per row (kernels/gemm_int8.py), or on f32 where it does not run. The cross-attention K/V
    are int8 per key (kernels.attention.Int8Heads). The encoder's attention probabilities and
    values are bfloat16 where the CPU has AVX-512 BF16 (kernels/attention_blocked.py), else f32;
    the convolutions and the normalisations stay f32.

    compute_type "bfloat16": float32's, but the encoder's linear layers, its attention and the
    window's cross K/V multiply bfloat16 operands with float32 sums (kernels/gemm_bf16.py and
    attention_blocked.py: twice a float32 FMA's multiply-adds an instruction); the decoder's
    steps, memory-bound, are float32's. A backend without a bfloat16 GEMM makes it float32, with
    a warning (as CTranslate2 does)."""

    def __init__(self, ck: Checkpoint, be, compute_type="float32"):
        if compute_type not in COMPUTE_TYPES:
            raise ValueError(f"unknown compute type {compute_type!r}: expected one of "
                             f"{', '.join(COMPUTE_TYPES)}")
        if compute_type == "bfloat16" and not be.has_bfloat16():
            warnings.warn(f"compute_type bfloat16 runs on a CPU with AVX-512 BF16, not on this "
                          f"{be.name}: this model computes in float32", RuntimeWarning, stacklevel=3)
            compute_type = "float32"
        self.be, self.dims, self.compute_type = be, ck.dims, compute_type
        int8 = compute_type == "int8"
        many = {"int8": "int8", "bfloat16": "bf16"}.get(compute_type, "full")   # the encoder's store
        d = ck.dims
        self.conv1_w = be.upload(_host(ck["model.encoder.conv1.weight"]))
        self.conv1_b = be.upload(_host(ck["model.encoder.conv1.bias"]))
        self.conv2_w = be.upload(_host(ck["model.encoder.conv2.weight"]))
        self.conv2_b = be.upload(_host(ck["model.encoder.conv2.bias"]))
        self.enc_pos = be.upload(_host(ck["model.encoder.embed_positions.weight"]))
        self.enc_blocks = _blocks(ck, be, "encoder", d.n_audio_layer, many)
        self.enc_ln = _LayerNorm(be, ck, "model.encoder.layer_norm")
        emb = ck["model.decoder.embed_tokens.weight"]
        c = None
        if int8:
            # The output projection is its own int8 copy, columns equalised (column_scales) and
            # the final LayerNorm, which feeds only this product, divided by the same scales; the
            # embedding itself is only looked up, a row a token, where the checkpoint holds it.
            c = column_scales(emb)
            aligned = _host(emb, emb.dtype)    # the quantiser's input: a copy where emb is unaligned
            ck.release_pages("model.decoder.embed_tokens.")    # not resident beside the copy
            self.out_proj = be.weight_int8(aligned, quantized_rows=False, columns=c)
            del aligned
            self.tok_emb = be.table(emb)
        else:
            # The token embedding is also the output projection (Whisper ties them), in the
            # checkpoint's precision: at f16 that halves the bytes the last GEMV of a step reads.
            emb = _host(emb, emb.dtype)    # one host copy (where the mapped tensor is unaligned)
            self.tok_emb = self.out_proj = be.weight(emb, gemv=True)
        self.dec_pos = be.upload(_host(ck["model.decoder.embed_positions.weight"]))
        self.dec_blocks = _blocks(ck, be, "decoder", d.n_text_layer, "int8-gemv" if int8 else "gemv")
        self.dec_ln = _LayerNorm(be, ck, "model.decoder.layer_norm", c)
        # Each layer's cross-attention k and v weights stacked, [k; v]: a window's cross K/V are
        # one (1500, 2·d) product a layer (k_proj has no bias: zeros in its rows).
        self.cross_kv_w = []
        for i in range(d.n_text_layer):
            w, b = _stacked(ck, [(f"model.decoder.layers.{i}.encoder_attn.{proj}", proj == "v_proj")
                                 for proj in ("k_proj", "v_proj")])
            self.cross_kv_w.append((be.weight_int8(_host(w)) if int8 else
                                    be.weight_bf16(w) if many == "bf16" else be.weight_rows(w),
                                    be.upload(b)))
            ck.release_pages(f"model.decoder.layers.{i}.encoder_attn.")
        self._cross = None  # (enc, cross_k, cross_v) of the last window
        self.scratch = Scratch(be)

    # ---------------------------------------------------------------- encoder
    def encode(self, mel, cancelled=None):
        """mel: (2·n, n_mels) float32, time-major (host or device) → encoder states
        (n, n_audio_state) on the device. n is n_audio_ctx (30 s) for a transcription; a shorter
        context (whisper.cpp's audio_ctx: the positional embedding's first n rows) encodes
        2·n·10 ms of audio for a fraction of the cost, which is what a live draft does.
        cancelled() before each layer: True raises records.Cancelled (a live stream's
        speculative final that more speech made stale gives the model back at once)."""
        be, d, s = self.be, self.dims, self.scratch
        width = d.n_audio_state
        n_frames = mel.shape[0]
        if (len(mel.shape) != 2 or mel.shape[1] != d.n_mels or n_frames % 2
                or not 2 <= n_frames <= 2 * d.n_audio_ctx):
            raise ValueError(f"encode expects a (2·n, {d.n_mels}) log-mel with n in "
                             f"1..{d.n_audio_ctx}, got {tuple(mel.shape)}")
        mel = be.upload(np.require(mel, np.float32, ["C", "A"])) if isinstance(mel, np.ndarray) else mel
        self._cross = None    # the last window's cross K/V: not held through this encoder pass
        c1 = s.get("conv1", n_frames, width)
        K.conv1d(be, mel, self.conv1_w, self.conv1_b, c1, 1)
        K.gelu(be, c1, c1)
        n = n_frames // 2
        x = be.empty((n, width), np.float32)  # returned to the caller: not a scratch buffer
        K.conv1d(be, c1, self.conv2_w, self.conv2_b, x, 2)
        K.gelu(be, x, x)
        K.add_rows(be, x, self.enc_pos, 0)
        for blk in self.enc_blocks:
            stop_if(cancelled)
            self._self_attention(blk, x, n, None)
            self._mlp(blk, x, n, in_place=True)
        self.enc_ln(be, x, x)
        return x

    # ---------------------------------------------------------------- decoder
    def cross_kv(self, enc):
        """Per layer, the cross-attention's keys and values of encoder states `enc`, in the
        layout the backend's attention reads fastest (`be.heads`): ([k per layer], [v …]).
        Kept for the last `enc` seen, so language detection, the decode, its temperature
        fallbacks and word alignment of one window compute them once."""
        if self._cross is not None and self._cross[0] is enc:
            return self._cross[1], self._cross[2]
        be, d = self.be, self.dims
        width = d.n_text_state
        int8 = self.compute_type == "int8"
        shape = (enc.shape[0], 2 * width)
        self._cross = None    # the last window's are let go before this one's are made
        ks, vs = [], []
        for w, b in self.cross_kv_w:
            # int8 and a backend whose heads() copies keep their own copies, so the product is
            # a short-lived array; another backend's heads() keeps the product itself
            kv = be.workspace(shape) if int8 or be.HEADS_COPY else be.empty(shape, np.float32)
            K.linear(be, enc, w, b, kv)
            # int8: quantised per key / per channel (kernels.attention.Int8Heads), a quarter of
            # the bytes every decoder step reads; else in the layout the backend reads fastest.
            k, v = heads_int8(be, kv, d.n_text_head, 2) if int8 else (
                be.heads(be.columns(kv, 0, width), d.n_text_head),
                be.heads(be.columns(kv, width, 2 * width), d.n_text_head))
            ks.append(k)
            vs.append(v)
        self._cross = (enc, ks, vs)
        return ks, vs

    def new_state(self, enc):
        """A fresh decoder state for one window: empty KV cache, cross K/V from `enc`."""
        return DecoderState(self, enc)

    def new_batch(self, single, batch):
        """B rows continuing the one-row `single` state (which has decoded the prompt)."""
        return BatchState(self, [single], batch)

    def new_window_batch(self, singles):
        """A row for each of the one-row states `singles`, each of its own window (their
        prompts decoded, all as long)."""
        return BatchState(self, singles)

    def decode_batch(self, state: BatchState, ids, open_rows=None):
        """One token for each of the B rows of `state` (ids (B,) int32), all at position
        state.length → logits (B, n_vocab) on the device. The projections, the cross-attention
        and the MLP run on the B rows together; the self-attention is per row (each row
        attends to its own cache), and the cross-attention too when the rows are windows.
        open_rows: the rows still decoding (None: all); a closed row's attentions are skipped
        (a window that has ended no longer reads its cross K/V), its logits meaningless."""
        be, d, s = self.be, self.dims, self.scratch
        ids = be.upload(np.asarray(ids, np.int32)) if isinstance(ids, (list, tuple, np.ndarray)) else ids
        n, width, pos = ids.shape[0], d.n_text_state, state.length
        if n != state.batch:
            raise ValueError(f"decode_batch: {n} ids for a state of {state.batch} rows")
        if pos + 1 > d.n_text_ctx:
            raise ValueError(f"decoder context is {d.n_text_ctx} tokens; {pos} + 1 do not fit")
        x = s.get("dx", n, width)
        K.embed(be, self.tok_emb, ids, x)
        pe = s.get("dpe", n, width)
        K.embed(be, self.dec_pos, be.upload(np.full(n, pos, np.int32)), pe)
        K.add(be, x, pe, x)
        at = be.upload(np.array([pos], np.int32))   # kv_append's position
        closed = set() if open_rows is None else {b for b in range(n) if not open_rows[b]}
        live = [b for b in range(n) if b not in closed]
        a = s.get("a", n, width)      # every attention's output: a closed row's stays zero
        for b in closed:
            be.write(a[b:b + 1], np.zeros((1, width), np.float32))
        cross = state.row_cross and [None if b in closed else state.row_cross[b] for b in range(n)]
        for i, blk in enumerate(self.dec_blocks):
            qkv = self._qkv(blk, x, n)
            for b in live:   # each row as _self_attention runs a row decoded alone: the same
                # arrays (a row of qkv whole, the whole cache read up to `at`), so the same code
                K.kv_append(be, qkv[b:b + 1], state.self_k[i][b], state.self_v[i][b], at)
                K.attention(be, qkv[b:b + 1], state.self_k[i][b], state.self_v[i][b], a[b:b + 1],
                            d.n_text_head, causal=True, q_offset=pos, n_keys=pos + 1, at=at)
            blk.attn.out.add_to(be, a, x)
            self._cross_attention(blk, x, n, state, i, rows=cross)
            self._mlp(blk, x, n)
        hh = s.get("dh", n, width)
        self.dec_ln(be, x, hh)
        logits = s.get("logits", n, d.n_vocab)
        K.logits(be, hh, self.out_proj, logits)
        state.length = pos + 1
        return logits

    def decode(self, state, ids, cross_weights=None, logits_for=None):
        """Run tokens `ids` (int32, host, n ≥ 1) at positions state.length… and return their
        logits (n, n_vocab) on the device; the KV cache grows by n.

        logits_for: positions within `ids` whose logits are wanted (a prompt needs one or two of
        its rows, and the vocabulary projection is the biggest product of the decoder); the
        result then has one row per position, in that order.
        cross_weights: a dict {layer: None} to fill with each listed layer's cross-attention
        probabilities, host (n_head, n, n_audio_ctx) float32 (word timestamps).

        The position travels to the device with the ids (`tokens`, [position, ids…]) and every
        kernel that needs it reads it there: the launches of a one-token step are then the same
        at every position, and a backend may replay them (be.replay: a CUDA graph)."""
        be, d = self.be, self.dims
        ids = np.asarray(ids if isinstance(ids, (list, tuple, np.ndarray)) else be.download(ids), np.int32)
        n, pos = ids.shape[0], state.length
        if pos + n > d.n_text_ctx:
            raise ValueError(f"decoder context is {d.n_text_ctx} tokens; {pos} + {n} do not fit")
        tokens = be.scratch("model.tokens", (1 + n,), np.int32)
        be.write(tokens, np.concatenate([[pos], ids]).astype(np.int32))

        def run():
            return self._forward(state, tokens, n, cross_weights, logits_for)

        step = n == 1 and cross_weights is None and logits_for is None
        logits = be.replay(state.recording, run) if step else run()
        state.length += n
        return logits

    def _forward(self, state, tokens, n, cross_weights, logits_for):
        """decode's launches, for the n tokens of device `tokens` (decode says what it holds)."""
        be, d, s = self.be, self.dims, self.scratch
        width = d.n_text_state
        x = s.get("dx", n, width)
        K.embed_at(be, self.tok_emb, self.dec_pos, tokens, x)
        for i, blk in enumerate(self.dec_blocks):
            self._self_attention(blk, x, n, (state, i, tokens))
            if cross_weights is not None and i in cross_weights:
                cross_weights[i] = be.download(self._cross_attention(blk, x, n, state, i, True))
            else:
                self._cross_attention(blk, x, n, state, i)
            self._mlp(blk, x, n)
        if logits_for is not None:
            rows = s.get("rows", len(logits_for), width)
            K.embed(be, x, be.upload(np.asarray(logits_for, np.int32)), rows)
            x, n = rows, len(logits_for)
        h = s.get("dh", n, width)
        self.dec_ln(be, x, h)
        logits = s.get("logits", n, d.n_vocab)
        K.logits(be, h, self.out_proj, logits)
        return logits

    # ---------------------------------------------------------------- the three sublayers
    def _self_attention(self, blk, x, n, cache):
        """x += out_proj(attention(LN(x))). Encoder: non-causal over its own n rows. Decoder
        (`cache` = (state, layer, tokens)): this call's keys/values are appended to the layer's
        KV cache at the position in tokens[0], and query i attends to every cached key up to its
        own position (the backend reads it from tokens where it can: the host's `state.length`
        is the same number)."""
        be, s, width = self.be, self.scratch, x.shape[1]
        heads = self.dims.n_text_head if cache else self.dims.n_audio_head
        if cache is None:
            h = blk.attn_ln(be, x, s.get("h", n, width))
            q = blk.attn.q(be, h, s.get("q", n, width))
            k = blk.attn.k(be, h, s.get("k", n, width))
            v = blk.attn.v(be, h, s.get("v", n, width))
            a = h    # LN(x) is spent once q, k and v are made: the output takes its rows
            K.attention(be, q, k, v, a, heads, weights=False, int8=self.compute_type == "int8",
                        bf16=self.compute_type == "bfloat16")
        else:
            state, i, tokens = cache
            pos = state.length
            qkv = self._qkv(blk, x, n)
            K.kv_append(be, qkv, state.self_k[i], state.self_v[i], tokens)
            a = s.get("a", n, width)
            K.attention(be, qkv, state.self_k[i], state.self_v[i], a, heads, causal=True,
                        q_offset=pos, n_keys=pos + n, at=tokens)
        blk.attn.out.add_to(be, a, x)

    def _qkv(self, blk, x, n):
        """The decoder self-attention's [q | k | v] (n, 3d) of LN(x), one stacked product, which
        kv_append and attention take whole (they read their columns)."""
        return blk.attn.qkv(self.be, x, self.scratch.get("qkv", n, 3 * x.shape[1]), ln=blk.attn_ln)

    def _cross_attention(self, blk, x, n, state, i, weights=False, rows=None):
        """x += out_proj(attention(LN(x)) over the window's cross K/V); returns the attention
        probabilities (n_head, n, n_audio_ctx) when `weights`, else None. rows: row b of x
        attends to rows[b]'s K/V instead, none where it is None (BatchState.row_cross)."""
        be, s, width, heads = self.be, self.scratch, x.shape[1], self.dims.n_text_head
        q = blk.cross.q(be, x, s.get("q", n, width), ln=blk.cross_ln)
        a = s.get("a", n, width)
        if rows is None:
            p = K.attention(be, q, state.cross_k[i], state.cross_v[i], a, heads, weights=weights)
        else:
            p = None
            for b, kv in enumerate(rows):
                if kv is not None:
                    K.attention(be, q[b:b + 1], kv[0][i], kv[1][i], a[b:b + 1], heads, weights=False)
        blk.cross.out.add_to(be, a, x)
        return p

    def _mlp(self, blk, x, n, in_place=False):
        """x += fc2(GELU(fc1(LN(x)))), fc1's output in the backend's workspace. in_place (the
        encoder's 1500 rows): LN(x) goes to the rows the attention's LN(x) had, and the GELU
        overwrites fc1's output, where a second 9 MB buffer would cost more memory traffic than
        it saves. Else matmul.linear normalises x (in its product, where it can), and the GELU writes
        another buffer: a decoder's launch is small enough to run as a serial loop, which LLVM
        vectorises only where out is not x (it cannot tell that the overlap is harmless)."""
        be, s = self.be, self.scratch
        f = be.workspace((n, blk.fc1.n_out))
        if in_place:
            blk.fc1(be, blk.mlp_ln(be, x, s.get("h", n, x.shape[1])), f)
        else:
            blk.fc1(be, x, f, ln=blk.mlp_ln)
        g = f if in_place else s.get("g", n, blk.fc1.n_out)
        K.gelu(be, f, g)
        blk.fc2.add_to(be, g, x)
