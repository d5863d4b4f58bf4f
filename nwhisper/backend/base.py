"""The backend protocol: what model code and kernels may call on a backend, grouped, each with a
one-line contract. Nothing else of a backend is read from outside it. Ops choose their variants
by the capabilities declared here (`on_host`, the fast-path hooks), never by a backend's name.

    memory    empty, zeros, upload, download, write, scratch, workspace, constant, flat, columns
    weights   weight, weight_rows, weight_int8, table: a matrix prepared for kernels.matmul
    launch    launch (a kernel body over work items), serial, host (a host call), sync
    fast      a backend's own version of an op, where it has one (a portable body runs where not):
              gemm_fast, layernorm, softmax_rows, attention_fast, reads_position, heads
    replay    replay (a decoder step repeated as cheaply as the backend can), note_host_position

The base class gives the portable defaults and the shared mechanisms (launcher lookup, scratch
buffers, the replay's bookkeeping); cpu.py and cuda.py implement the rest.
"""

import math
import os

import numpy as np

from nwhisper.kernels import _compile
from nwhisper.kernels.matmul import Int8Weight, quantize_int8
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
    """The protocol (the module docstring groups it) and what both backends share."""

    name = None   # for people and reports ("cpu", "cuda"); no op reads it
    # The arrays are NumPy arrays in host memory, so NumPy, BLAS and array views work on them
    # where they lie (and host() may be called).
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

    # --- memory ---------------------------------------------------------------------------------

    def empty(self, shape, dtype=np.float32):
        """An uninitialised array of this backend."""
        raise NotImplementedError

    def zeros(self, shape, dtype=np.float32):
        """An array of this backend filled with zeros."""
        raise NotImplementedError

    def upload(self, a):
        """Host array `a` as this backend's kernels take it (C-contiguous; no copy where none is
        needed)."""
        raise NotImplementedError

    def download(self, a):
        """A host copy of this backend's array `a`, which later kernels do not change."""
        raise NotImplementedError

    def write(self, dst, src):
        """dst[...] = host array src, dst from this backend (of src's shape and dtype)."""
        dst[...] = src

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

    def constant(self, key, make):
        """make()'s arrays, made once per backend and `key` and kept as long as the backend
        (tables such as the log-mel's filters)."""
        value = self._constants.get(key)
        if value is None:
            value = self._constants[key] = make()
        return value

    def flat(self, a):
        """`a` as one dimension (an elementwise kernel's view)."""
        return a.reshape(-1)

    def columns(self, x, start, stop):
        """x[:, start:stop] of a C-contiguous 2-D array: a view."""
        return x[:, start:stop]

    # --- weights: matrices prepared for kernels.matmul ----------------------------------------

    def weight(self, a, gemv=False):
        """A matrix for kernels.matmul's products, in the form this backend multiplies fastest
        (gemv=True: mostly by a few rows, the decoder's)."""
        raise NotImplementedError

    def weight_rows(self, a):
        """A matrix that only products of many rows multiply (an encoder's, compute_type
        float32): as weight(a) here; a backend may keep it in the checkpoint's precision and
        widen it for each product instead (the CPU's HalfRows)."""
        return self.weight(a)

    def has_bfloat16(self):
        """Whether weight_bf16's matrices multiply in bfloat16 here (compute_type "bfloat16");
        where not, a model asked for it is float32."""
        return False

    def weight_bf16(self, a):
        """A matrix that products of many rows multiply on bfloat16 operands with float32 sums
        (compute_type "bfloat16"'s encoder), where has_bfloat16(); weight_rows(a) elsewhere."""
        return self.weight_rows(a)

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

        columns (i,) f32: the matrix is a · diag(columns) (kernels.matmul.column_scales)."""
        if columns is not None:
            a = np.asarray(a, np.float32) * columns   # the full-precision matrix as well
        full = self.weight(a)
        return Int8Weight(*quantize_int8(self, full), full, quantized_rows=quantized_rows)

    # --- launch ---------------------------------------------------------------------------------

    def launch(self, kernel, count, *args, work=None):
        """Run body `kernel(i, *args)` for i in range(count) (`work`: its scalar steps, which the
        CPU decides a serial loop by)."""
        raise NotImplementedError

    def serial(self, work):
        """Whether a launch of `work` scalar steps runs in the calling thread, not shared out."""
        return False

    def host(self, fn, *args):
        """fn(*args), a compiled host function or a NumPy/BLAS call on this backend's arrays, as a
        step of the launches replay() repeats (on_host backends only)."""
        raise NotImplementedError(f"{type(self).__name__} has no host arrays")

    def sync(self):
        """Wait until every launch made so far has finished."""
        raise NotImplementedError

    # --- fast paths: a backend's own version of an op (the portable body runs where it has none) --

    def gemm_fast(self, x, w, bias, out, ln, accumulate):
        """matmul's product out (+)= [LayerNorm](x) @ w.T + bias by this backend's own GEMM;
        False where it has none."""
        return False

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

    def softmax_rows(self, x, scale=1.0, nq=1, causal=False, q_offset=0):
        """x = softmax(scale * x) along rows, in place, masked as reduce.softmax_row says;
        x (rows, n) f32. The portable body; a backend may run a faster equivalent."""
        self.launch(softmax_row, x.shape[0], x, x.shape[1], np.float32(scale), nq, causal,
                    q_offset, work=x.size)

    def attention_fast(self, q, k, v, out, p, causal, q_offset, at):
        """kernels.attention's product by this backend's own kernels; False where it has none
        (then the portable launches run)."""
        return False

    def reads_position(self, nq, hd, k):
        """Whether this backend's own attention of nq queries over keys k (attention_fast) reads
        their causal offset from a device array (kernels.attention's `at`); the portable bodies
        do not."""
        return False

    HEADS_COPY = False    # whether heads() returns a copy of x (else x itself)

    def heads(self, x, n_head):
        """Keys or values (n, H*hd) that many queries will attend to, in the layout this
        backend's attention reads fastest: here as they are."""
        return x

    # --- replay ---------------------------------------------------------------------------------

    def note_host_position(self):
        """An op of the launches being run took a position from the host: a replay of them would
        repeat it, so replay() does not record these."""
        self._position_from_host = True

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

    def _record(self, run):
        """(run()'s result, a recording of its launches that _play repeats, or None where they
        cannot be recorded)."""
        raise NotImplementedError

    def _play(self, tape):
        """The launches of a _record's recording again."""
        raise NotImplementedError
