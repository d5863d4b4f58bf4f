"""CpuBackend: arrays are NumPy arrays; a kernel body runs as a Numba parallel loop; the ops' host
variants (BLAS, called from Numba's own threads: kernels/blas.py, one thread pool; the int8 GEMM;
linear_tiles) run on them through host(). Numba has no float16
on the CPU and NumPy no float16 BLAS, so f16 data is widened to f32: once, when it is uploaded or
prepared as a weight; for each product, an encoder's matrices (HalfRows); or as it is read, as
f16 bits, by the decoder's GEMV. A decoder step is replayed as the list of calls it made.
"""

import os

import numba
import numpy as np

from nwhisper.kernels import blas, gemm_bf16, gemm_int8, trampoline
from nwhisper.kernels.matmul import HalfRows, Int8Weight, quantize_int8
from nwhisper.kernels.widen import to_float32
from nwhisper.backend.base import Backend


_ENTRIES = {}   # CpuBackend._entry's choices, by (dispatcher, its arguments' _signature)


def _signature(fn, a):
    """What Numba types argument `a` by, cheaply: an array's type, dtype, dimensions, layout
    and flags (numba's typeof reads no more of it), a scalar's Python type; anything else as
    Numba types it."""
    if isinstance(a, np.ndarray):
        f = a.flags
        return type(a), a.dtype, a.ndim, f.c_contiguous, f.f_contiguous, f.writeable, f.aligned
    if isinstance(a, (bool, np.generic)) or (isinstance(a, (int, float)) and abs(a) < 2 ** 62):
        return type(a)
    return fn.typeof_pyval(a)


class CpuBackend(Backend):
    """Kernels as Numba parallel loops over NumPy arrays; host calls recorded for replay."""

    name = "cpu"
    on_host = True
    # Below this many scalar steps a launch runs serially: about the cost of starting and joining
    # a parallel region, small while Numba's workers spin between launches (one thread pool:
    # kernels/blas.py), far larger where they must sleep (NumPy's BLAS has a pool of its own).
    PARALLEL_WORK = 1 << 11
    PARALLEL_WORK_ASLEEP = 1 << 15

    def __init__(self):
        super().__init__("cpu")
        self._tape = None   # while replay() records: [(function, args)] of every call
        if not blas.available():
            # NumPy's BLAS keeps a thread pool of its own (kernels/blas.py says why that
            # matters): Numba's OpenMP workers must then sleep after each parallel loop, or
            # their spinning takes the cores from the next GEMM's threads and the other way
            # round, and a one-row launch after a GEMM waits for milliseconds. Read when Numba
            # first loads its OpenMP layer, so before the first parallel launch; a user's
            # setting wins.
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
        """A matrix for matmul's products: C-contiguous f32 (f16 widened once, widen.to_float32; f32 kept
        without a copy).

        gemv=True, for a matrix that is mostly multiplied by a few rows (the decoder's): an f16
        matrix stays f16, as its bits in a uint16 array (kernels/widen.py), which linear_elem
        reads at half the bytes (on linear_tiles where it runs), for any number of rows (a prompt's too: up to 224 rows,
        widening the matrix for BLAS costs more than the product saves). A uint16 matrix is taken as such bits."""
        a = np.asarray(a)
        if a.dtype == np.float16 and gemv:
            bits = np.require(a, requirements=("C", "A")).view(np.uint16)
            # read-only whether it lies in the mapped file or was copied (unaligned there): one
            # array type, so each kernel that reads weights compiles once
            bits.flags.writeable = False
            return bits
        if a.dtype in (np.float16, np.uint16):
            return to_float32(a)
        return np.require(a, np.float32, ("C", "A"))

    def weight_rows(self, a):
        """As Backend.weight_rows: float16 kept as HalfRows (read in place where it is aligned),
        anything else as weight(a)."""
        a = np.asarray(a)
        return HalfRows(self.weight(a, gemv=True)) if a.dtype == np.float16 else self.weight(a)

    def has_bfloat16(self):
        """The CPU has AVX-512 BF16 (kernels/gemm_bf16.py)."""
        return gemm_bf16.available()

    def weight_bf16(self, a):
        """As Backend.weight_bf16: packed for the bfloat16 GEMM from the checkpoint's own values
        (f16 or f32), where it runs and the width is a multiple of its panel."""
        a = np.asarray(a)
        if not (self.has_bfloat16() and a.shape[0] % gemm_bf16.COLS == 0):
            return self.weight_rows(a)
        return gemm_bf16.PackedBf16(self.weight(a, gemv=True) if a.dtype == np.float16
                                    else np.require(a, np.float32, ("C", "A")))

    def table(self, a):
        """As Backend.table, read where it lies, aligned or not (Numba reads unaligned arrays; a
        CT2 file's tensors often are): a memory-mapped tensor is not copied, so only the rows
        looked up are paged in once the model has let the file's pages go."""
        a = np.asarray(a)
        return a.view(np.uint16) if a.dtype == np.float16 else a

    def weight_int8(self, a, quantized_rows=True, columns=None):
        """As Backend.weight_int8, without the full-precision matrix: every product reads the
        int8 rows, quantised from the checkpoint's own (f16) weights, the columns' scales
        applied in the quantiser; packed for the int8 GEMM where it runs and may (matmul.variant
        says which product takes what)."""
        w = Int8Weight(*quantize_int8(self, self.weight(a, gemv=True), columns), None,
                       quantized_rows=quantized_rows)   # f16 bits
        if quantized_rows and gemm_int8.available() and w.shape[0] % gemm_int8.COLS == 0:
            w.packed = gemm_int8.PackedInt8(w.q, w.scale)
            w.keep_packed_only()
        return w

    HEADS_COPY = True

    def heads(self, x, n_head):
        """Head-major (H, n, hd) copy of keys or values (n, H*hd): each head's rows contiguous,
        so one batched BLAS call per product reads them as a stream (a decoder step's
        cross-attention reads all 1500 of them per layer)."""
        n, width = x.shape
        return np.ascontiguousarray(x.reshape(n, n_head, width // n_head).transpose(1, 0, 2))

    def launch(self, kernel, count, *args, work=None):
        """Run body `kernel(i, *args)` for i in range(count): in parallel when the launch has at
        least PARALLEL_WORK scalar steps (`work`, default `count`: one per item), else serially
        in this thread: sharing out a smaller one costs more than it saves (_compile.py says
        why)."""
        if count <= 0:
            return
        try:
            self.share(self._launcher(kernel, "_range"), count, *args,
                       serial=self.serial(count if work is None else work))
        except Exception as e:
            if any(getattr(a, "dtype", None) == np.float16 for a in args):
                raise TypeError(f"{kernel.__name__}: float16 arrays cannot reach CPU kernels; "
                                "pass them through be.upload() or be.weight()") from e
            raise

    def share(self, ranged, count, *args, serial=False):
        """Range function `ranged` over [0, count) with *args: in this thread where `serial` (or
        Numba has one thread), else on one block of it per thread (kernels/trampoline.py)."""
        chunks = numba.get_num_threads()
        if serial or chunks == 1:
            self.host(ranged, 0, count, 0, 1, *args)
        else:
            self.host(ranged, 0, count, trampoline.spread_address(), chunks, *args)

    def serial(self, work):
        """Whether a launch of `work` scalar steps runs in this thread (below PARALLEL_WORK)."""
        return work < self.PARALLEL_WORK

    def host(self, fn, *args):
        """fn(*args): a compiled launcher, or a NumPy or BLAS call on this backend's arrays,
        written into the recording when replay() is recording (every op of a CPU decoder step
        comes here, so that a replay repeats all of them)."""
        fn(*args)
        if self._tape is not None:
            self._tape.append((fn, args))

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
        so typing them and finding the overload again on every call would be wasted. `fn` itself
        where it is not a dispatcher (NumPy, blas.gemm) or chose by converting the arguments
        (no overload of their exact types). Remembered by the arguments' _signature: Numba's
        typing of a step's ~80 calls cost 3 ms, at every window's recording."""
        overloads = getattr(fn, "overloads", None)
        if overloads is None:
            return fn
        key = (fn, tuple(_signature(fn, a) for a in args))
        entry = _ENTRIES.get(key)
        if entry is None:
            compiled = overloads.get(tuple(fn.typeof_pyval(a) for a in args))
            entry = _ENTRIES[key] = fn if compiled is None else compiled.entry_point
        return entry

    @staticmethod
    def _play(tape):
        """The recorded calls again: a decoder step without the Python that chose them (the
        model's code, scratch lookups and dispatch)."""
        for fn, args in tape:
            fn(*args)

    def sync(self):
        pass
