"""What the decoder remembers while it decodes: one window's state (its KV cache and the
window's cross-attention keys and values), and B rows of them decoded side by side."""

from __future__ import annotations

import numpy as np

from . import kernels as K
from .backend import StepRecording


class DecoderState:
    """What the decoder remembers within one 30 s window.

    `self_k/self_v`: per layer, the keys and values of every token decoded so far (fixed capacity
    n_text_ctx, written at position `length`, so a step has one shape). `cross_k/cross_v`: per
    layer, the encoder states projected by the cross-attention's key and value weights — the
    encoder does not change while the window is decoded, so these are computed ONCE here rather
    than recomputed for every token (that would be 2 · 1500 · d² multiply-adds per layer per token).
    They come from `Whisper.cross_kv`, shared by every state of the same window.
    """

    def __init__(self, model, enc):
        be, d = model.be, model.dims
        n_ctx, width = d.n_text_ctx, d.n_text_state
        self.length = 0
        self.self_k = [be.empty((n_ctx, width), np.float32) for _ in model.dec_blocks]
        self.self_v = [be.empty((n_ctx, width), np.float32) for _ in model.dec_blocks]
        self.cross_k, self.cross_v = model.cross_kv(enc)
        self.recording = StepRecording()    # a one-token step's launches, replayed (be.replay)


class BatchState:
    """B rows decoded side by side, one token each a step: one GEMM of B rows per projection
    reads the weights once for all of them. Every row has its own self-attention KV cache
    (`self_k[layer]` is (B, n_ctx, width)); the rows are at one position (`length`).

    Made from one-row `DecoderState`s that have decoded their prompts (each copied into its
    rows: a prompt is decoded once):
      * one state for all B rows: hypotheses of one window (beam search, best-of sampling), all
        reading the window's cross K/V (`cross_k`, `cross_v`); `reorder(src)` makes row b
        continue hypothesis src[b];
      * a state per row: windows decoded together (transcribe's batch_size), each row reading
        its own window's cross K/V (`row_cross[b]` = (k per layer, v per layer)); their prompts
        must be as long."""

    def __init__(self, model, singles, batch=None):
        be, d = model.be, model.dims
        n_ctx, width = d.n_text_ctx, d.n_text_state
        batch = len(singles) if batch is None else batch
        if len(singles) not in (1, batch):
            raise ValueError(f"BatchState: {len(singles)} states for {batch} rows")
        if len({s.length for s in singles}) != 1:
            raise ValueError("BatchState: the rows' prompts differ in length")
        self.be, self.batch, self.length = be, batch, singles[0].length
        self.cross_k, self.cross_v = singles[0].cross_k, singles[0].cross_v
        self.row_cross = None if len(singles) == 1 else [(s.cross_k, s.cross_v) for s in singles]
        self.self_k = [be.empty((batch, n_ctx, width), np.float32) for _ in model.dec_blocks]
        self.self_v = [be.empty((batch, n_ctx, width), np.float32) for _ in model.dec_blocks]
        self._spare_k = [be.empty((batch, n_ctx, width), np.float32) for _ in model.dec_blocks]
        self._spare_v = [be.empty((batch, n_ctx, width), np.float32) for _ in model.dec_blocks]
        n = self.length
        for i in range(len(model.dec_blocks)):
            for b in range(batch):
                single = singles[0 if len(singles) == 1 else b]
                K.kv_write(be, self.self_k[i][b], 0, single.self_k[i][:n])
                K.kv_write(be, self.self_v[i][b], 0, single.self_v[i][:n])

    def reorder(self, src):
        """Row b ← row src[b] (caches up to `length`, and its window); identity orders cost
        nothing."""
        src = [int(s) for s in src]
        if src == list(range(self.batch)):
            return
        n, be = self.length, self.be
        for i in range(len(self.self_k)):
            for b, s in enumerate(src):
                K.kv_write(be, self._spare_k[i][b], 0, self.self_k[i][s][:n])
                K.kv_write(be, self._spare_v[i][b], 0, self.self_v[i][s][:n])
            self.self_k[i], self._spare_k[i] = self._spare_k[i], self.self_k[i]
            self.self_v[i], self._spare_v[i] = self._spare_v[i], self.self_v[i]
        if self.row_cross is not None:
            self.row_cross = [self.row_cross[s] for s in src]
