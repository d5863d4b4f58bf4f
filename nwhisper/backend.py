"""The dispatch object that model code talks to: arrays, transfers, GEMM and kernel launches.

    be = backend.get("auto")                  # CpuBackend or CudaBackend
    x = be.empty((1500, d), np.float32)
    be.launch(layernorm_row, rows, x, w, b, y, d, np.float32(1e-5))   # one body, either target
    be.gemm(y, W, out, bias)                  # out = y @ W.T + bias

CpuBackend: arrays are NumPy arrays; a kernel body runs as a Numba parallel loop; GEMMs run on
BLAS, called from Numba's own threads (kernels/blas.py: one thread pool). Numba has no float16
on the CPU and NumPy no float16 BLAS, so f16 data is widened to f32 once, when it is uploaded or
prepared as a weight (or read as f16 bits by the decoder's GEMV). Both backends replay a
decoder step (replay): CUDA as a graph, the CPU as the list of calls it made.

CudaBackend: arrays are numba.cuda device arrays; a kernel body runs as a CUDA grid, one thread
per work item; f16 weights stay f16 on the device and are widened where they are read. The
GEMMs, softmax, layernorm and attention have block-per-row fast paths (kernels/_cuda_fast.py),
and every launch goes through kernels/_cuda_launch.py, a fraction of Numba's per-call cost. With
NUMBA_ENABLE_CUDASIM=1 (set before numba is imported) it runs on Numba's CUDA simulator.
"""

import ctypes
import importlib.util
import math
import os
import sys

import numpy as np
from numba.core import config as numba_config

from nwhisper.kernels import _compile, blas, gemm_int8
from nwhisper.kernels.elementwise import add, fill_elem
from nwhisper.kernels.attention import FEW_QUERIES, SHORT_KEYS, Int8Heads
from nwhisper.kernels.matmul import Int8Weight, linear_elem, quantize_int8
from nwhisper.kernels.norm import layernorm_row
from nwhisper.kernels.reduce import softmax_row



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
        self._position_from_host = False

    def _launcher(self, kernel, suffix=""):
        fn = self._fns.get((kernel, suffix))
        if fn is None:
            fn = getattr(self._launchers, kernel.__name__ + suffix, None)
            if fn is None:
                raise KeyError(f"{kernel.__module__}.{kernel.__name__} is not a kernel body: "
                               "decorate it with @kernel in a module of _compile.BODY_MODULES")
            self._fns[(kernel, suffix)] = fn
        return fn

    def scratch(self, name, shape, dtype=np.float32):
        """A reusable array of `shape` for the op called `name`; contents undefined.

        One buffer per (name, dtype), grown geometrically, so a decoder whose key count grows by
        one each step does not allocate each step. Valid until the next scratch(name) call.
        """
        shape = tuple(shape)
        key = (name, np.dtype(dtype))
        buf, views = self._scratch.get(key, (None, None))
        view = views.get(shape) if views else None
        if view is not None:
            return view  # the same view again: a device array's slicing is costly Python
        size = math.prod(shape)
        if buf is None or buf.size < size:
            grown = size if buf is None else max(size, 2 * buf.size)
            buf, views = self.empty((max(grown, 1),), dtype), {}
            self._scratch[key] = buf, views
            self.scratch_generation += 1
        if len(views) >= 512:  # shapes that grow by a key each step: keep the cache bounded
            views.clear()
        view = views[shape] = buf[:size].reshape(shape)
        return view

    # Up to this many rows an int8 weight runs linear_elem (a GEMV streaming the int8 rows once
    # for all rows); above, a GEMM: the CPU's int8 GEMM when the weight was packed for it, the
    # full matrix's on CUDA.
    GEMV_ROWS = 8

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

    def heads(self, x, n_head):
        """Keys or values (n, H*hd) that many queries will attend to, in the layout this
        backend's attention reads fastest: here as they are."""
        return x

    def softmax_rows(self, x, scale=1.0, nq=1, causal=False, q_offset=0):
        """x = softmax(scale * x) along rows, in place, masked as reduce.softmax_row says;
        x (rows, n) f32. The portable body; a backend may run a faster equivalent."""
        self.launch(softmax_row, x.shape[0], x, x.shape[1], np.float32(scale), nq, causal,
                    q_offset, work=x.size)

    def layernorm(self, x, w, b, out, eps):
        """out = LayerNorm(x) row by row (kernels.norm.layernorm); the portable body here."""
        self.launch(layernorm_row, x.shape[0], x, w, b, out, x.shape[1], eps, work=x.size)

    def attention_fast(self, q, k, v, out, p, causal, q_offset, at):
        """kernels.attention's product by this backend's own kernels; False where it has none
        (then the portable launches run)."""
        return False

    def attends_at(self, nq, hd, k):
        """Whether this backend's attention of nq queries over keys k reads their causal offset
        from a device array (kernels.attention's `at`). Where it does not, a replay of the
        launches being run would repeat a position taken from the host: noted, so that replay()
        does not record them."""
        self._position_from_host = True
        return False

    def write(self, dst, src):
        """dst[...] = host array src, dst from this backend (of src's shape and dtype)."""
        dst[...] = src

    def replay(self, owner, run):
        """run() -- launches that read whatever changes from one call to the next from device
        memory, so that they are the same launches, with the same arguments, every time -- as
        cheaply as this backend can repeat them; `owner` holds the recording and lives as long
        as the arrays run() reads (a decoder state).

        The first call runs run() and sees whether it read a position from the host
        (attends_at); the second records it as it runs (_record); later calls play the
        recording (_play) and return the recorded result (the same arrays, new contents). It is
        recorded anew when a scratch buffer was reallocated (its arrays may be gone), never when
        the position came from the host or the backend does not replay (`replays`)."""
        rec = owner.__dict__.get("_nw_replay")
        if rec is not None and rec[0] == self.scratch_generation:
            if rec[1] is None:
                return run()
            self._play(rec[1])
            return rec[2]
        if rec is None or not self.replays:  # first call (or no replays): run it, see what it reads
            self._position_from_host = False
            result = run()
            fixed = self.replays and not self._position_from_host
            owner.__dict__["_nw_replay"] = ("run once", None, None) if fixed else (
                self.scratch_generation, None, None)
            return result
        generation = self.scratch_generation
        result, recording = self._record(run)
        if recording is None or generation != self.scratch_generation:
            owner.__dict__["_nw_replay"] = ("run once", None, None)   # try again next call
        else:
            owner.__dict__["_nw_replay"] = (generation, recording, result)
        return result


class CpuBackend(Backend):
    """Kernels as Numba parallel loops over NumPy arrays; GEMMs on BLAS."""

    name = "cpu"
    on_host = True
    # Below this many scalar steps a launch runs serially: about the cost of starting and joining
    # a parallel region on a quiet machine, 2-5 µs while Numba's workers spin between launches
    # (one thread pool: kernels/blas.py), ~50 µs where they must sleep (NumPy's BLAS has a pool
    # of its own). Measured on 2 cores, a decoder step with the first against 1 << 15: tiny.en
    # 1.26 -> 0.99 ms (int8), 2.24 -> 1.81 ms (float32); base 2.35 -> 1.77, 4.46 -> 3.49 ms.
    PARALLEL_WORK = 1 << 11
    PARALLEL_WORK_ASLEEP = 1 << 15

    def __init__(self):
        super().__init__("cpu")
        self._none = np.empty((0,), np.float32)
        self._zero_at = np.zeros((1,), np.int32)   # attend_row's `at` where there is none
        self._tape = None   # while replay() records: [(function, args)] of every call
        if not blas.available():
            # NumPy's BLAS keeps a thread pool of its own (kernels/blas.py says why that
            # matters): Numba's OpenMP workers must then sleep after each parallel loop, or
            # their spinning takes the cores from the next GEMM's threads and the other way
            # round (2 cores, measured: a one-row layernorm right after a GEMM took 4-5 ms
            # instead of 0.05 ms). Read when Numba first loads its OpenMP layer, so before the
            # first parallel launch; a user's setting wins.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            self.PARALLEL_WORK = self.PARALLEL_WORK_ASLEEP

    def empty(self, shape, dtype=np.float32):
        return np.empty(shape, dtype)

    def zeros(self, shape, dtype=np.float32):
        return np.zeros(shape, dtype)

    def upload(self, a):
        """The array as the kernels take it: C-contiguous, f16 widened to f32; no copy otherwise."""
        a = np.asarray(a)
        if a.dtype == np.float16:
            return a.astype(np.float32)
        return np.require(a, requirements=("C", "A"))

    def download(self, a):
        """A host copy (as from a device: later kernels do not change it)."""
        return np.array(a)

    def weight(self, a, gemv=False):
        """A matrix for gemm: C-contiguous f32 (f16 widened once; f32 kept without a copy).

        gemv=True, for a matrix that is mostly multiplied by a few rows (the decoder's): an f16
        matrix stays f16, as its bits in a uint16 array (kernels/widen.py), which linear_elem
        reads at half the bytes, for any number of rows (a prompt's too: measured at or above
        BLAS's speed up to 224 rows, where widening the matrix for BLAS cost more than the
        product). A uint16 matrix is taken as such bits."""
        a = np.asarray(a)
        if a.dtype == np.float16 and gemv:
            return np.require(a, requirements=("C", "A")).view(np.uint16)
        if a.dtype == np.uint16:
            a = a.view(np.float16)
        return np.require(a, np.float32, ("C", "A"))

    def weight_int8(self, a, quantized_rows=True, columns=None):
        """As Backend.weight_int8, without the full-precision matrix: every product reads the
        int8 rows, quantised from the checkpoint's own (f16) weights, the columns' scales
        applied in the quantiser. Many rows run on the int8 GEMM where it runs (gemm_int8.available, the rows
        packed for it here), else on linear_elem with float activations, as do all products of
        a matrix with quantized_rows=False (a decoder's prompt: at BLAS's speed, measured)."""
        w = Int8Weight(*quantize_int8(self, self.weight(a, gemv=True), columns), None)  # f16 bits
        if quantized_rows and gemm_int8.available() and w.shape[0] % gemm_int8.COLS == 0:
            w.packed = gemm_int8.PackedInt8(w.q, w.scale)
        return w

    def _on_body(self, x, w):
        """Whether gemm multiplies x by w with linear_elem (not BLAS, not the int8 GEMM)."""
        if isinstance(w, Int8Weight):
            return x.shape[0] <= self.GEMV_ROWS or w.packed is None
        return w.dtype == np.uint16

    def gemm_add(self, x, w, out, bias=None):
        """As Backend.gemm_add; on linear_elem and on BLAS (kernels/blas.py) the sum is added as
        it is stored (one launch)."""
        if self._on_body(x, w):
            self._linear_body(x, w, out, bias, accumulate=True)
        elif isinstance(w, Int8Weight):
            super().gemm_add(x, w, out, bias)
        else:
            self.host(blas.gemm, x, w, out, True, 1.0, True, bias)

    def gemm(self, x, w, out, bias=None, ln=None):
        """out[n, o] = x[n, i] @ w[o, i].T (+ bias[o]), of LayerNorm(x) when ln = (w, b, eps) is
        given (normalized: here a launch of its own); x, out f32 2-D; w from weight() or
        weight_int8(). f32 on BLAS in Numba's threads (kernels/blas.py; it matches or beats
        linear_elem from one row up, bench/kernels.py); f16 bits on linear_elem; int8 on
        linear_elem, or above GEMV_ROWS rows on the int8 GEMM (activations quantised per row)
        when the weight was packed for it."""
        x = self.normalized(x, ln)
        if self._on_body(x, w):    # int8 rows, or f16 bits (weight(gemv=True))
            self._linear_body(x, w, out, bias)
            return
        if isinstance(w, Int8Weight):
            gemm_int8.gemm(x, w.packed, bias, out, self.scratch)
            return
        if w.dtype != np.float32:
            raise TypeError(f"gemm: the weight is {w.dtype}; prepare it with be.weight() "
                            "(NumPy has no BLAS for it)")
        self.host(blas.gemm, x, w, out, True, 1.0, False, bias)

    def heads(self, x, n_head):
        """Head-major (H, n, hd) copy of keys or values (n, H*hd): each head's rows contiguous,
        so one batched BLAS call per product reads them as a stream (a decoder step's
        cross-attention reads all 1500 of them per layer; measured 1.5-2x faster than
        per-head products over the interleaved rows)."""
        n, width = x.shape
        return np.ascontiguousarray(x.reshape(n, n_head, width // n_head).transpose(1, 0, 2))

    def launch(self, kernel, count, *args, work=None):
        """Run body `kernel(i, *args)` for i in range(count): in parallel when the launch has at
        least PARALLEL_WORK scalar steps (`work`, default `count`: one per item), else serially
        in this thread: sharing out a smaller one costs more than it saves (_compile.py says
        why)."""
        if count <= 0:
            return
        serial = (count if work is None else work) < self.PARALLEL_WORK
        try:
            self.host(self._launcher(kernel, "_serial" if serial else ""), count, *args)
        except Exception as e:
            if any(getattr(a, "dtype", None) == np.float16 for a in args):
                raise TypeError(f"{kernel.__name__}: float16 arrays cannot reach CPU kernels; "
                                "pass them through be.upload() or be.weight()") from e
            raise

    def host(self, fn, *args):
        """fn(*args): a compiled launcher, or a NumPy or BLAS call on this backend's arrays,
        written into the recording when replay() is recording (every op of a CPU decoder step
        comes here, so that a replay repeats all of them)."""
        fn(*args)
        if self._tape is not None:
            self._tape.append((fn, args))

    def attends_at(self, nq, hd, k):
        """As Backend.attends_at: kernels.attention's attend_row (a decoder's few queries over
        its row-major cache) reads it from `at`."""
        if nq <= FEW_QUERIES and getattr(k, "ndim", 0) == 2 and k.shape[0] <= SHORT_KEYS:
            return True
        return super().attends_at(nq, hd, k)

    def _record(self, run):
        """replay()'s recording: run() with every call noted (host)."""
        self._tape = tape = []
        try:
            result = run()
        finally:
            self._tape = None
        return result, [(self._entry(fn, args), args) for fn, args in tape]

    @staticmethod
    def _entry(fn, args):
        """What a replay calls for fn(*args): the compiled code that the Numba dispatcher `fn`
        chose for these arguments, called directly -- a replay's arguments never change type,
        and typing them and finding the overload again was ~0.2 µs of every call (measured when a
        tiny.en step was 63 launches, with no work: 67 -> 55 µs). `fn` itself where it is not a dispatcher (NumPy,
        blas.gemm) or chose by converting the arguments (no overload of their exact types)."""
        overloads = getattr(fn, "overloads", None)
        if overloads is None:
            return fn
        compiled = overloads.get(tuple(fn.typeof_pyval(a) for a in args))
        return fn if compiled is None else compiled.entry_point

    @staticmethod
    def _play(tape):
        """The recorded calls again: a decoder step without the Python that chose them (~60
        calls; the model's code, scratch lookups and dispatch cost ~0.1 ms a step)."""
        for fn, args in tape:
            fn(*args)

    def sync(self):
        pass


class CudaBackend(Backend):
    """Kernels as CUDA grids over numba.cuda device arrays (or the simulator's).

    fast_paths: use kernels/_cuda_fast.py for gemm, softmax_rows, layernorm and attention
    (default: yes on a GPU, no on the simulator, where their big blocks are many Python threads: a
    51865-word logits GEMV is 1.7 M of them, against 52 K for the portable body;
    tests/cudasim_check.py turns them on).
    """

    name = "cuda"
    threads_per_block = 256

    def __init__(self, fast_paths=None):
        from numba import config, cuda  # here, not at the top: the CPU path never imports it
        from numba.cuda.cudadrv.driver import CudaAPIError
        self._cuda = cuda
        self._api_error = CudaAPIError
        self.simulator = bool(config.ENABLE_CUDASIM)
        if self.simulator:
            self.threads_per_block = 32  # the simulator runs one Python thread per CUDA thread
        super().__init__("cuda")
        self.fast_paths = not self.simulator if fast_paths is None else fast_paths
        from nwhisper.kernels import _cuda_launch
        # run(kernel, grid, block, *args): every launch goes through it (_cuda_launch.py says why)
        self.run = _cuda_launch.launcher(self.simulator)
        self._uncapturable = _cuda_launch.Uncapturable
        # replay() records graphs where the launcher can (not the simulator's) and the decoder's
        # attention reads its position on the device (the fast paths)
        self.replays = self.replays and self.fast_paths and getattr(self.run, "can_capture", False)
        if self.fast_paths:
            from nwhisper.kernels import _cuda_fast
            self._fast = _cuda_fast
        self._none = self.empty((0,), np.float32)
        self._no_ln = (self._none, self._none, np.float32(0.0))   # _cuda_fast.gemm's "no LayerNorm"
        self._zero_at = self.zeros((1,), np.int32)   # attend_part's `at` where there is none
        self._memcpy = None   # cuMemcpyHtoD(device pointer, host pointer, bytes), or Numba's copy
        if not self.simulator:
            try:
                from cuda.bindings import driver as cu
            except ImportError:
                pass
            else:
                def memcpy(dst, src, nbytes, call=cu.cuMemcpyHtoD, ok=cu.CUresult.CUDA_SUCCESS):
                    err, = call(dst, src, nbytes)
                    if err != ok:
                        raise RuntimeError(f"cuMemcpyHtoD: {err}")
                self._memcpy = memcpy

    def _memory_error(self, nbytes, err):
        free, total = self._cuda.current_context().get_memory_info()
        dev = self._cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
        return MemoryError(f"CUDA device {name}: cannot allocate {nbytes / 2**20:.1f} MiB; "
                           f"{free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB ({err})")

    def _alloc(self, make, nbytes):
        try:
            return make()
        except self._api_error as e:
            if "OUT_OF_MEMORY" in str(e) or "OUT_OF_MEMORY" in str(getattr(e, "code", "")):
                raise self._memory_error(nbytes, e) from e
            raise

    def empty(self, shape, dtype=np.float32):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return self._alloc(lambda: self._cuda.device_array(shape, dtype), nbytes)

    def zeros(self, shape, dtype=np.float32):
        a = self.empty(shape, dtype)
        self.launch(fill_elem, a.size, a.reshape(-1), np.dtype(dtype).type(0))
        return a

    def upload(self, a):
        """A device copy of host array `a` (a device array is returned as it is)."""
        if hasattr(a, "copy_to_host"):
            return a
        a = np.ascontiguousarray(a)
        return self._alloc(lambda: self._cuda.to_device(a), a.nbytes)

    def download(self, a):
        return a.copy_to_host()

    def weight(self, a, gemv=False):
        """A matrix for gemm on the device, f16 or f32 as given (other floats become f32);
        f16 is read as f16 by every product here, so `gemv` changes nothing."""
        if not hasattr(a, "copy_to_host") and a.dtype not in (np.float16, np.float32):
            a = np.asarray(a, np.float32)
        return self.upload(a)

    def _matrix(self, x, w):
        """What gemm multiplies x by: an Int8Weight's int8 rows (the Int8Weight itself, read by
        linear_elem) up to GEMV_ROWS rows of x, its full matrix above; any other weight as is."""
        return w.full if isinstance(w, Int8Weight) and x.shape[0] > self.GEMV_ROWS else w

    def gemm(self, x, w, out, bias=None, ln=None):
        """out[n, o] = x[n, i] @ w[o, i].T (+ bias[o]) (of LayerNorm(x) with ln, as
        CpuBackend.gemm): a tiled GEMM, or a GEMV for a few rows (kernels/_cuda_fast.py), which
        normalises x as it reads it; without fast paths, or for int8 rows, the portable body
        matmul.linear_elem."""
        w = self._matrix(x, w)
        if self.fast_paths and not isinstance(w, Int8Weight):
            fused = ln is not None and self._fast.fuses_layernorm(x.shape[0])
            self._fast.gemm(self.run, x if fused else self.normalized(x, ln), w,
                            self._none if bias is None else bias, out,
                            (ln[0], ln[1], np.float32(ln[2])) if fused else self._no_ln)
        else:
            self._linear_body(self.normalized(x, ln), w, out, bias)

    def gemm_add(self, x, w, out, bias=None):
        """As Backend.gemm_add; the GEMM, GEMV or linear_elem adds its result to out itself (one
        launch, where a decoder step's launches are what it costs)."""
        w = self._matrix(x, w)
        if self.fast_paths and not isinstance(w, Int8Weight):
            self._fast.gemm(self.run, x, w, self._none if bias is None else bias, out, self._no_ln,
                            accumulate=True)
        else:
            self._linear_body(x, w, out, bias, accumulate=True)

    def softmax_rows(self, x, scale=1.0, nq=1, causal=False, q_offset=0):
        """As Backend.softmax_rows; with fast paths one block of threads per row."""
        if self.fast_paths:
            self._fast.softmax(self.run, x, np.float32(scale), nq, causal, q_offset)
        else:
            super().softmax_rows(x, scale, nq, causal, q_offset)

    def flat(self, a):
        """As Backend.flat, kept on the array: a device array's reshape is costly Python, and
        the model passes the same scratch views step after step."""
        f = a.__dict__.get("_nw_flat")
        if f is None:
            f = a.__dict__["_nw_flat"] = a.reshape(-1)
        return f

    def columns(self, x, start, stop):
        """As Backend.columns, the view made directly: Numba's slicing walks every row of a
        non-contiguous result to find the memory it spans (1500 rows: ~1 ms of Python for each
        layer's cross-attention keys and values, every window)."""
        if self.simulator:
            return super().columns(x, start, stop)
        views = x.__dict__.setdefault("_nw_columns", {})   # scratch views are asked again and again
        view = views.get((start, stop))
        if view is None:
            view = views[(start, stop)] = self._columns(x, start, stop)
        return view

    @staticmethod
    def _columns(x, start, stop):
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
        n, width = x.shape
        if not 0 <= start <= stop <= width or not x.is_c_contiguous():
            raise ValueError(f"columns {start}:{stop} of a {tuple(x.shape)} array (C-contiguous)")
        item = x.dtype.itemsize
        span = ((n - 1) * width + stop - start) * item if n else 0
        data = x.gpu_data.view(start * item, start * item + span)
        return DeviceNDArray((n, stop - start), (width * item, item), x.dtype, gpu_data=data)

    def layernorm(self, x, w, b, out, eps):
        """As Backend.layernorm; with fast paths one block of threads per row."""
        if self.fast_paths:
            self._fast.layernorm(self.run, x, w, b, out, eps)
        else:
            super().layernorm(x, w, b, out, eps)

    def attention_fast(self, q, k, v, out, p, causal, q_offset, at):
        """kernels.attention's product on _cuda_fast.py's kernels; False when there is none for
        this case (then the portable launches run)."""
        return self.fast_paths and self._fast.attention(
            self.run, q, k, v, out, p, causal, q_offset, self._zero_at if at is None else at,
            self.scratch)

    def attends_at(self, nq, hd, k):
        """As Backend.attends_at: where attend_part runs."""
        if (self.fast_paths and not isinstance(k, Int8Heads)
                and self._fast.reads_position(nq, k.shape[0], hd)):
            return True
        return super().attends_at(nq, hd, k)

    def write(self, dst, src):
        """As Backend.write: one synchronous copy on the default stream (ordered with the
        launches), by the driver's call itself where it can (Numba's copy_to_device costs tens
        of µs of Python, and a decoder step writes its token this way)."""
        if self._memcpy is None:
            dst.copy_to_device(src)
            return
        src = np.ascontiguousarray(src, dst.dtype)
        if src.shape != tuple(dst.shape):
            raise ValueError(f"write: {src.shape} into {tuple(dst.shape)}")
        self._memcpy(dst.device_ctypes_pointer.value, src.ctypes.data, src.nbytes)

    def _record(self, run):
        """As Backend.replay records, as a CUDA graph (Launcher.capture), which then runs: one
        call in place of a decoder step's ~60 launches (each ~10 µs of host time). No recording
        (run() just runs) where a launch could not be captured, or a scratch buffer was
        reallocated while capturing (the graph's pointers may be stale)."""
        generation = self.scratch_generation
        try:
            result, graph = self.run.capture(run)
        except self._uncapturable:
            return run(), None
        if generation != self.scratch_generation:
            return run(), None
        self.run.replay(graph)
        return result, graph

    def _play(self, graph):
        self.run.replay(graph)

    def launch(self, kernel, count, *args, work=None):
        """Run body `kernel(i, *args)` for i in range(count), one CUDA thread each (`work` is the
        CPU's hint for choosing a serial loop; a GPU wants every launch wide)."""
        if count <= 0:
            return
        tpb = self.threads_per_block
        self.run(self._launcher(kernel), (count + tpb - 1) // tpb, tpb, count, *args)

    def sync(self):
        self._cuda.synchronize()


def _driver_loads():
    """Whether the CUDA driver library loads, searched for as Numba's driver will (dlopen;
    Linux's name for it — elsewhere Numba is left to find it)."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def cuda_unusable():
    """Why the CUDA backend cannot run here (a sentence), or None when it can."""
    if importlib.util.find_spec("numba_cuda") is None:
        return ("numba-cuda is not installed (Numba's CUDA target lives in that package): "
                "pip install 'nwhisper[cuda]'")
    if not numba_config.ENABLE_CUDASIM and not _driver_loads():
        # Asked before importing numba.cuda, which costs ~0.15 s of every CPU-only command.
        return "no NVIDIA driver: libcuda.so.1 cannot be loaded"
    try:
        from numba import config, cuda
    except ImportError as e:
        return f"numba.cuda cannot be imported: {e}"
    if config.ENABLE_CUDASIM:
        return None
    try:
        n = len(cuda.gpus)
    except Exception as e:  # the driver library is missing or failed to initialise
        return " ".join(str(e).split())
    if n == 0 or not cuda.is_available():
        return "the CUDA driver found no usable GPU"
    return None


def get(kind="auto"):
    """A backend: 'cpu', 'cuda' (RuntimeError saying why when unusable), or 'auto' (CUDA if usable)."""
    if kind == "cpu":
        return CpuBackend()
    if kind not in ("auto", "cuda"):
        raise ValueError(f"unknown backend {kind!r}: expected 'auto', 'cpu' or 'cuda'")
    why = cuda_unusable()
    if why is None:
        return CudaBackend()
    if kind == "cuda":
        raise RuntimeError(f"the CUDA backend cannot run: {why}")
    return CpuBackend()
