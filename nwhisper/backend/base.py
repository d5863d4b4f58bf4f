"""What both backends share: the launcher lookup, the scratch buffers, int8 weights, the op hooks
(each with its portable body, which a backend may replace by a fast path) and the replay of a
decoder step. Ops read a backend's capabilities (`on_host`), never its name.
"""

import math
import os

import numpy as np

from nwhisper.kernels import _compile
from nwhisper.kernels.elementwise import add
from nwhisper.kernels.matmul import Int8Weight, linear_elem, quantize_int8
from nwhisper.kernels.norm import layernorm_row
from nwhisper.kernels.reduce import softmax_row


class StepRecording:
    """What Backend.replay keeps of one decoder state's step: the scratch `generation` it was
    seen in, whether its launches are `fixed` (None: not run yet; False: it reads a position
    from the host), and once recorded the backend's `tape` and the `result` it returns."""

    __slots__ = ("generation", "fixed", "tape", "result")

    def __init__(self):
        self.reset(None)

    def reset(self, generation):
        self.generation, self.fixed, self.tape, self.result = generation, None, None, None


class Backend:
    """What both backends share: the launcher lookup and the scratch buffers."""

    name = None
    # What the ops choose their variants by (an op never reads `name`): the arrays are NumPy
    # arrays in host memory, so NumPy, BLAS and array views work on them where they lie.
    on_host = False

    def __init__(self, target):
        self._launchers = _compile.launchers(target)
        self._fns = {}
        self._scratch = {}
        self.scratch_generation = 0   # bumped whenever a scratch buffer is (re)allocated
        self.replays = os.environ.get("NWHISPER_REPLAY", "1") != "0"   # replay() records
        self._position_from_host = False   # note_host_position() since replay() last looked
        self._constants = {}

    def _launcher(self, kernel, suffix=""):
        fn = self._fns.get((kernel, suffix))
        if fn is None:
            fn = getattr(self._launchers, kernel.__name__ + suffix, None)
            if fn is None:
                raise KeyError(f"{kernel.__module__}.{kernel.__name__} is not a kernel body: "
                               "decorate it with @kernel in a module of _compile.BODY_MODULES")
            self._fns[(kernel, suffix)] = fn
        return fn

    def scratch(self, name, shape, dtype=np.float32, exact=False):
        """A reusable array of `shape` for the op called `name`; contents undefined.

        One buffer per (name, dtype), grown geometrically, so a decoder whose key count grows by
        one each step does not allocate each step (exact: grown to the size asked, for a buffer
        asked for a few sizes). Valid until the next scratch(name) call.
        """
        shape = tuple(shape)
        key = (name, np.dtype(dtype))
        buf, views = self._scratch.get(key, (None, None))
        view = views.get(shape) if views else None
        if view is not None:
            return view  # the same view again: a device array's slicing is costly Python
        size = math.prod(shape)
        if buf is None or buf.size < size:
            grown = size if buf is None or exact else max(size, 2 * buf.size)
            buf, views = self.empty((max(grown, 1),), dtype), {}
            self._scratch[key] = buf, views
            self.scratch_generation += 1
        if len(views) >= 512:  # shapes that grow by a key each step: keep the cache bounded
            views.clear()
        view = views[shape] = buf[:size].reshape(shape)
        return view

    def workspace(self, shape, dtype=np.float32):
        """The buffer that the widest short-lived arrays of a forward pass share: a
        convolution's columns, a head's attention scores, an MLP's hidden rows, a window's cross
        K/V product. Contents undefined, valid until the next workspace() call: each is made and
        read within one op (the MLP's: its three launches), so one buffer, sized for the widest,
        serves them all (an encoder's 1500 rows: 9 MB for tiny.en, instead of 33)."""
        return self.scratch("workspace", shape, dtype, exact=True)

    # Up to this many rows an int8 weight runs linear_elem (a GEMV streaming the int8 rows once
    # for all rows; on the CPU linear_tiles); above, a GEMM: the CPU's int8 GEMM when the weight was packed for it, the
    # full matrix's on CUDA.
    GEMV_ROWS = 8

    def weight_rows(self, a):
        """A matrix that only products of many rows multiply (an encoder's, compute_type
        float32): as weight(a) here; a backend may keep it in the checkpoint's precision and
        widen it for each product instead (the CPU's HalfRows)."""
        return self.weight(a)

    def table(self, a):
        """A matrix only looked up a few rows at a time by embed (an int8 model's token
        embedding, whose int8 copy is the output projection), in the checkpoint's precision."""
        return self.weight(a, gemv=True)

    def weight_int8(self, a, quantized_rows=True, columns=None):
        """A matrix for gemm as int8 rows with per-row scales (kernels.matmul.Int8Weight); the
        full-precision matrix (`a` prepared by weight()) stays beside it for GEMMs of many rows.

        quantized_rows=False: the activations multiplied by this matrix must not be quantised
        (the CPU's int8 GEMM does so per row). The decoder's: its hidden states carry a few
        outlier features whose row scale crushes the rest — measured, tiny.en's prompts through
        the int8 GEMM lost a whole window of the 63 s clip.

        columns (i,) f32: the matrix is a · diag(columns) (model._column_scales)."""
        if columns is not None:
            a = np.asarray(a, np.float32) * columns   # the full-precision matrix as well
        full = self.weight(a)
        return Int8Weight(*quantize_int8(self, full), full)

    def _linear_body(self, x, w, out, bias, accumulate=False):
        """out = x @ w.T (+ bias) by linear_elem (out += … when `accumulate`); w f32/f16 (CPU:
        uint16 bits) or an Int8Weight."""
        q, scale = (w.q, w.scale) if isinstance(w, Int8Weight) else (w, self._none)
        n, n_in = x.shape
        self.launch(linear_elem, q.shape[0], x, q, scale,
                    self._none if bias is None else bias, out, n, n_in, accumulate,
                    work=n * q.shape[0] * n_in // 64)  # vectorised: ~64 MACs per scalar step

    def flat(self, a):
        """`a` as one dimension (an elementwise kernel's view)."""
        return a.reshape(-1)

    def columns(self, x, start, stop):
        """x[:, start:stop] of a C-contiguous 2-D array: a view."""
        return x[:, start:stop]

    def normalized(self, x, ln):
        """LayerNorm(x) (ln = (w, b, eps)) in a scratch buffer: what gemm multiplies where it does
        not fuse the normalisation into its product; x itself for ln None."""
        if ln is None:
            return x
        h = self.scratch("gemm.ln", x.shape)
        self.layernorm(x, ln[0], ln[1], h, np.float32(ln[2]))
        return h

    def gemm_add(self, x, w, out, bias=None):
        """out += x @ w.T (+ bias), as gemm into a scratch buffer and add_elem; a backend may fuse
        the two."""
        tmp = self.scratch("gemm_add", out.shape)
        self.gemm(x, w, tmp, bias)
        add(self, out, tmp, out)

    HEADS_COPY = False    # whether heads() returns a copy of x (else x itself)

    def heads(self, x, n_head):
        """Keys or values (n, H*hd) that many queries will attend to, in the layout this
        backend's attention reads fastest: here as they are."""
        return x

    def softmax_rows(self, x, scale=1.0, nq=1, causal=False, q_offset=0):
        """x = softmax(scale * x) along rows, in place, masked as reduce.softmax_row says;
        x (rows, n) f32. The portable body; a backend may run a faster equivalent."""
        self.launch(softmax_row, x.shape[0], x, x.shape[1], np.float32(scale), nq, causal,
                    q_offset, work=x.size)

    # LayerNorm is shared out over threads from this many rows (an encoder's), never for a decoder
    # step's few: a row's sums may round one way in the serial launcher and another in the
    # parallel one (each vectorised on its own: seen on AVX2), and a row decoded in a batch of
    # windows or beams must round as it does alone.
    LAYERNORM_PARALLEL_ROWS = 64

    def layernorm(self, x, w, b, out, eps):
        """out = LayerNorm(x) row by row (kernels.norm.layernorm); the portable body here."""
        rows = x.shape[0]
        self.launch(layernorm_row, rows, x, w, b, out, x.shape[1], eps,
                    work=x.size if rows >= self.LAYERNORM_PARALLEL_ROWS else 0)

    def attention_fast(self, q, k, v, out, p, causal, q_offset, at):
        """kernels.attention's product by this backend's own kernels; False where it has none
        (then the portable launches run)."""
        return False

    def reads_position(self, nq, hd, k):
        """Whether this backend's own attention of nq queries over keys k (attention_fast) reads
        their causal offset from a device array (kernels.attention's `at`); the portable bodies
        do not."""
        return False

    def note_host_position(self):
        """An op of the launches being run took a position from the host: a replay of them would
        repeat it, so replay() does not record these."""
        self._position_from_host = True

    def constant(self, key, make):
        """make()'s arrays, made once per backend and `key` and kept as long as the backend
        (tables such as the log-mel's filters)."""
        value = self._constants.get(key)
        if value is None:
            value = self._constants[key] = make()
        return value

    def write(self, dst, src):
        """dst[...] = host array src, dst from this backend (of src's shape and dtype)."""
        dst[...] = src

    def replay(self, rec, run):
        """run() -- launches that read whatever changes from one call to the next from device
        memory, so that they are the same launches, with the same arguments, every time -- as
        cheaply as this backend can repeat them; `rec` (a StepRecording) keeps the recording and
        lives as long as the arrays run() reads (a decoder state holds it).

        The first call runs run() and sees whether an op took a position from the host
        (note_host_position); the second records it as it runs (_record); later calls play the
        recording (_play) and return the recorded result (the same arrays, new contents). All
        of this starts again when a scratch buffer was reallocated (its arrays may be gone); a
        step that took a position from the host, or a backend that does not replay
        (`replays`), always runs."""
        if rec.generation != self.scratch_generation:
            rec.reset(self.scratch_generation)
        if rec.tape is not None:
            self._play(rec.tape)
            return rec.result
        if rec.fixed is None or not self.replays:
            self._position_from_host = False
            result = run()
            rec.fixed = self.replays and not self._position_from_host
            return result
        if not rec.fixed:
            return run()
        result, tape = self._record(run)
        if tape is not None and rec.generation == self.scratch_generation:
            rec.tape, rec.result = tape, result
        return result
