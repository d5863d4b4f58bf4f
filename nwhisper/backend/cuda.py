"""CudaBackend: arrays are numba.cuda device arrays; a kernel body runs as a CUDA grid, one thread
per work item; f16 weights stay f16 on the device and are widened where they are read. The
GEMMs, softmax, layernorm and attention have block-per-row fast paths (kernels/_cuda_fast.py),
and every launch goes through kernels/_cuda_driver.py, a fraction of Numba's per-call cost; a
decoder step is replayed as a CUDA graph. With NUMBA_ENABLE_CUDASIM=1 (set before numba is
imported) it runs on Numba's CUDA simulator.
"""

import ctypes
import importlib.util
import sys
import weakref

import numpy as np
from numba.core import config as numba_config

from nwhisper.kernels.elementwise import fill_elem
from nwhisper.kernels.matmul import normalized
from nwhisper.backend.base import Backend


class CudaBackend(Backend):
    """Kernels as CUDA grids over numba.cuda device arrays (or the simulator's).

    fast_paths: use kernels/_cuda_fast.py for gemm, softmax_rows, layernorm and attention
    (default: yes on a GPU, no on the simulator, where their big blocks are many Python threads: a
    51865-word logits GEMV is 1.7 M of them, against 52 K for the portable body;
    tests/helpers/cudasim_check.py turns them on).
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
        # views of device arrays made by flat() and columns(), each kept while its array lives
        # (the views hold the memory, not the array)
        self._views = weakref.WeakKeyDictionary()
        self.fast_paths = not self.simulator if fast_paths is None else fast_paths
        from nwhisper.kernels import _cuda_driver
        # run(kernel, grid, block, *args): every launch goes through it (_cuda_driver.py says why)
        self.run = _cuda_driver.launcher(self.simulator)
        self._uncapturable = _cuda_driver.Uncapturable
        # replay() records graphs where the launcher can (not the simulator's) and the decoder's
        # attention reads its position on the device (the fast paths)
        self.replays = self.replays and self.fast_paths and getattr(self.run, "can_capture", False)
        if self.fast_paths:
            from nwhisper.kernels import _cuda_fast
            self._fast = _cuda_fast
        self._none = self.empty((0,), np.float32)
        self._no_ln = (self._none, self._none, np.float32(0.0))   # _cuda_fast.gemm's "no LayerNorm"
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

    def gemm_fast(self, x, w, bias, out, ln, accumulate):
        """As Backend.gemm_fast: a tiled GEMM, or a GEMV for a few rows (kernels/_cuda_fast.py),
        which normalises x as it reads it and adds into out itself."""
        if not self.fast_paths:
            return False
        fused = ln is not None and self._fast.fuses_layernorm(x.shape[0])
        self._fast.gemm(self.run, x if fused else normalized(self, x, ln), w,
                        self._none if bias is None else bias, out,
                        (ln[0], ln[1], np.float32(ln[2])) if fused else self._no_ln,
                        accumulate=accumulate)
        return True

    def softmax_rows(self, x, scale=1.0, nq=1, causal=False, q_offset=0):
        """As Backend.softmax_rows; with fast paths one block of threads per row."""
        if self.fast_paths:
            self._fast.softmax(self.run, x, np.float32(scale), nq, causal, q_offset)
        else:
            super().softmax_rows(x, scale, nq, causal, q_offset)

    def flat(self, a):
        """As Backend.flat, made once per array: a device array's reshape is costly Python, and
        the model passes the same scratch views step after step."""
        if self.simulator:
            return a.reshape(-1)
        views = self._views.setdefault(a, {})
        f = views.get("flat")
        if f is None:
            f = views["flat"] = a.reshape(-1)
        return f

    def columns(self, x, start, stop):
        """As Backend.columns, the view made directly (and once per array and columns): Numba's
        slicing walks every row of a non-contiguous result to find the memory it spans (Python
        over 1500 rows for each layer's cross-attention keys and values, every window)."""
        if self.simulator:
            return super().columns(x, start, stop)
        views = self._views.setdefault(x, {})
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
            self.run, q, k, v, out, p, causal, q_offset, at, self.scratch)

    def reads_position(self, nq, hd, k):
        """As Backend.reads_position: where _cuda_fast's attend_part runs."""
        return self.fast_paths and self._fast.reads_position(nq, k.shape[0], hd)

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
        call in place of a decoder step's many launches (each costs host time). No recording
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
