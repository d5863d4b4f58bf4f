"""kernels/_cuda_driver.py without a GPU: its argument layout against numba-cuda's own, its graphs.

The Launcher passes a kernel's arguments the way numba-cuda's `_Kernel._prepare_args` lays them
out. Both run here on device arrays whose memory is a stand-in (an address, no allocation: no
driver is needed to describe an array), and must produce the same values of the same types.
The launch itself (cuda.core's `launch`) is replaced by a recorder; on a GPU,
bench/gpu_session.sh runs every op through the real one against the CPU.
"""

import ctypes

import numpy as np
import pytest

import numba_cuda  # noqa: F401  (the test extra installs it: a missing one fails here, never skips)

from numba import typeof  # noqa: E402
from numba.core.typing.typeof import Purpose  # noqa: E402
from numba.cuda.cudadrv.devicearray import DeviceNDArray  # noqa: E402
from numba.cuda.dispatcher import _Kernel  # noqa: E402

from nwhisper.backend import StepRecording  # noqa: E402
from nwhisper.kernels import _cuda_driver  # noqa: E402


class _Memory:
    def __init__(self, address):
        self.device_ctypes_pointer = ctypes.c_void_p(address)


def device_array(shape, dtype, strides=None, address=0x7F0000001000):
    dtype = np.dtype(dtype)
    if strides is None:
        strides = np.empty(shape, dtype).strides
    return DeviceNDArray(shape, strides, dtype, gpu_data=_Memory(address))


class _Compiled:
    """What Launcher reads of a compiled kernel: its cuda.core kernel, and its flags."""

    def __init__(self):
        self.cooperative = False
        self._codelibrary = self

    def get_cufunc(self):
        return self

    @property
    def kernel(self):
        return "the cuda.core kernel"


class _Dispatcher:
    """A numba.cuda dispatcher as Launcher sees it: `kernel[grid, block](*args)` compiles (here:
    records the types) and launches through Numba; `overloads` maps argument types to the
    compiled kernel."""

    def __init__(self):
        self.overloads, self.targetoptions, self.numba_launches = {}, {}, 0

    def __getitem__(self, config):
        def launch(*args):
            self.overloads.setdefault(tuple(typeof(a, Purpose.argument) for a in args), _Compiled())
            self.numba_launches += 1
        return launch


class _NoExtensions:
    extensions = ()


def numba_layout(args):
    """The kernel arguments numba-cuda itself would pass for `args`."""
    flat = []
    for a in args:
        _Kernel._prepare_args(_NoExtensions(), typeof(a, Purpose.argument), a, 0, [], flat)
    return flat


def same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert type(g) is type(w), (g, w)
        assert (g.value if isinstance(g, ctypes._SimpleCData) else g) == \
               (w.value if isinstance(w, ctypes._SimpleCData) else w), (g, w)


def decoder_step_args():
    return (1500, device_array((1500, 384), np.float32),
            device_array((384,), np.float16, address=0x7F0000200000))


def attention_args():
    return (device_array((6, 1, 448), np.float32), np.float32(0.125), 7, True, np.int32(3))


def layout_args():
    return (device_array((4, 8), np.float32, strides=(4, 16)),    # F-ordered
            device_array((4, 8), np.float32, strides=(64, 4)),    # rows of a wider one: layout A
            np.bool_(False), 2.5, np.int64(-1))


def int_args():
    return (device_array((2, 3, 64), np.int8), device_array((51865,), np.uint16))


@pytest.mark.parametrize("make", [decoder_step_args, attention_args, layout_args, int_args])
def test_launcher_passes_what_numba_passes(monkeypatch, make):
    args = make()
    launched = []
    launcher = _cuda_driver.Launcher()
    monkeypatch.setattr(launcher, "_launch", lambda stream, config, fn, *flat: launched.append((fn, flat)))
    kernel = _Dispatcher()
    launcher(kernel, 3, 128, *args)            # the first: through Numba, which compiles
    assert kernel.numba_launches == 1 and not launched
    launcher(kernel, 3, 128, *args)            # then straight to cuda.core
    assert kernel.numba_launches == 1 and len(launched) == 1
    fn, flat = launched[0]
    assert fn == "the cuda.core kernel"
    same(list(flat), numba_layout(args))


def test_new_argument_types_compile_anew(monkeypatch):
    """The same kernel with arrays of another layout or dtype goes back through Numba once."""
    launched = []
    launcher = _cuda_driver.Launcher()
    monkeypatch.setattr(launcher, "_launch", lambda stream, config, fn, *flat: launched.append(flat))
    kernel = _Dispatcher()
    variants = [(device_array((4, 8), np.float32),), (device_array((4, 8), np.float32, strides=(4, 16)),),
                (device_array((4, 8), np.float16),), (device_array((32,), np.float32),)]
    for args in variants + variants:
        launcher(kernel, 1, 32, *args)
    assert kernel.numba_launches == len(variants) and len(kernel.overloads) == len(variants)
    for args, flat in zip(variants, launched):
        same(list(flat), numba_layout(args))


class _CooperativeDispatcher(_Dispatcher):
    """One whose compiled kernels are cooperative (grid-synchronising): Numba launches those its
    own way."""

    def __getitem__(self, config):
        launch = super().__getitem__(config)

        def run(*args):
            launch(*args)
            for compiled in self.overloads.values():
                compiled.cooperative = True
        return run


def test_launcher_leaves_what_it_does_not_know_to_numba(monkeypatch):
    launcher = _cuda_driver.Launcher()
    monkeypatch.setattr(launcher, "_launch", lambda *a: pytest.fail("launched past Numba"))
    plain, cooperative = _Dispatcher(), _CooperativeDispatcher()
    for _ in range(3):
        # a host array (Numba copies it over and back) and a float16 scalar
        launcher(plain, 1, 32, np.zeros(4, np.float32), np.float16(1.0))
        launcher(cooperative, 1, 32, device_array((4,), np.float32))
    assert plain.numba_launches == 3 and cooperative.numba_launches == 3


class _Builder:
    """A cuda.core GraphBuilder as Launcher.capture uses it."""

    def __init__(self, log):
        self.log = log

    def begin_building(self, mode):
        self.log.append(("begin", mode))

    def end_building(self):
        self.log.append("end")

    def complete(self):
        self.log.append("complete")
        return "the graph"


@pytest.fixture
def capturing(monkeypatch):
    """Launcher.capture's cuda.core and Numba parts replaced by recorders (no driver here)."""
    import contextlib

    import cuda.core as cuda_core
    from numba import cuda as numba_cuda_target
    log = []

    class Device:
        def set_current(self):
            pass

        def create_graph_builder(self):
            return _Builder(log)
    monkeypatch.setattr(cuda_core, "Device", Device)
    monkeypatch.setattr(numba_cuda_target, "defer_cleanup", contextlib.nullcontext)
    return log


def test_capture_records_launches_into_a_graph(monkeypatch, capturing):
    """Launches made before with the same types go into the graph being built, then to the
    stream again; the graph replays on the stream."""
    targets = []
    launcher = _cuda_driver.Launcher()
    monkeypatch.setattr(launcher, "_launch", lambda target, config, fn, *flat: targets.append(target))
    kernel, args = _Dispatcher(), decoder_step_args()
    launcher(kernel, 3, 128, *args)                    # compiled and launched by Numba
    result, graph = launcher.capture(lambda: launcher(kernel, 3, 128, *args) or "logits")
    assert (result, graph) == ("logits", "the graph")
    assert capturing == [("begin", "relaxed"), "end", "complete"]
    assert isinstance(targets[0], _Builder) and kernel.numba_launches == 1
    launcher(kernel, 3, 128, *args)
    assert targets[1] is launcher._stream
    replayed = []
    monkeypatch.setattr(launcher, "_stream", type("S", (), {})())
    launcher.replay(type("G", (), {"launch": lambda self, stream: replayed.append(stream)})())
    assert replayed == [launcher._stream]


def test_capture_refuses_what_it_cannot_record(monkeypatch, capturing):
    """A launch Numba would have to make (new types: a compile) stops the capture, which ends
    without a graph; launches go to the stream again."""
    launcher = _cuda_driver.Launcher()
    monkeypatch.setattr(launcher, "_launch", lambda *a: pytest.fail("launched while refusing"))
    kernel = _Dispatcher()
    with pytest.raises(_cuda_driver.Uncapturable):
        launcher.capture(lambda: launcher(kernel, 3, 128, *decoder_step_args()))
    assert capturing == [("begin", "relaxed"), "end"] and kernel.numba_launches == 0
    assert launcher._target is launcher._stream


class _Recorder:
    """CudaBackend.replay's launcher: capture runs run() (as if recording it), replay counts."""

    def __init__(self, refuse=0):
        self.captures, self.replays, self.refuse = 0, 0, refuse

    def capture(self, run):
        self.captures += 1
        if self.refuse:
            self.refuse -= 1
            raise _cuda_driver.Uncapturable("new types")
        return run(), f"graph {self.captures}"

    def replay(self, graph):
        self.replays += 1


def _backend(run):
    """A CudaBackend with just what replay() reads (no device): its launcher is `run`."""
    from nwhisper.backend import CudaBackend
    be = CudaBackend.__new__(CudaBackend)
    be.scratch_generation, be.replays, be.run = 0, True, run
    be._position_from_host, be._uncapturable = False, _cuda_driver.Uncapturable
    return be


def _replay(be, owner, calls, reads_host=False):
    def run():
        calls.append(1)
        if reads_host:
            be.note_host_position()
        return "logits"
    return be.replay(owner, run)


def test_replay_runs_then_records_then_replays():
    """Call 1 runs, call 2 records the graph (and runs it), later calls replay it; a scratch
    buffer reallocated makes it record anew; a refused capture tries again the next call."""
    owner, calls = StepRecording(), []
    be = _backend(_Recorder(refuse=1))
    results = [_replay(be, owner, calls) for _ in range(5)]
    assert results == ["logits"] * 5
    # run; refused capture, so run; capture (its run() stands for the recording); 2 replays
    assert len(calls) == 3 and be.run.captures == 2 and be.run.replays == 3
    be.scratch_generation += 1           # run again, then record anew, then replay
    for _ in range(3):
        _replay(be, owner, calls)
    assert len(calls) == 5 and be.run.captures == 3 and be.run.replays == 5


def test_replay_never_records_a_position_read_on_the_host():
    """A run whose attention read its position from the host (note_host_position) would repeat
    that position: it runs every time."""
    owner, calls = StepRecording(), []
    be = _backend(_Recorder())
    for _ in range(4):
        _replay(be, owner, calls, reads_host=True)
    assert len(calls) == 4 and be.run.captures == 0 and be.run.replays == 0


@pytest.mark.parametrize("start, stop", [(0, 384), (384, 768), (1152, 1536), (5, 6), (1535, 1536)])
def test_columns_view_is_numbas_slice(start, stop):
    """CudaBackend.columns builds x[:, start:stop] itself (Numba's slicing walks all the rows):
    the shape, strides and memory span of Numba's own slice."""
    import weakref
    from types import SimpleNamespace

    from numba.cuda.cudadrv import driver
    from nwhisper.backend import CudaBackend
    address, n, width = 0x7F0000100000, 1500, 1536
    memory = driver.MemoryPointer(None, driver.binding.CUdeviceptr(address), n * width * 4)
    x = DeviceNDArray((n, width), (width * 4, 4), np.dtype(np.float32), gpu_data=memory)
    be = SimpleNamespace(simulator=False, _columns=CudaBackend._columns,
                         _views=weakref.WeakKeyDictionary())
    got = CudaBackend.columns(be, x, start, stop)
    assert CudaBackend.columns(be, x, start, stop) is got     # kept while x lives: made once
    want = x._dummy[:, start:stop]   # Numba's slice arithmetic (x[...] itself needs a driver)
    begin, end = want.extent
    assert got.shape == want.shape and got.strides == want.strides and got.dtype == x.dtype
    assert got.device_ctypes_pointer.value == address + begin and got.gpu_data.size == end - begin
    with pytest.raises(ValueError):
        CudaBackend.columns(be, x, stop, width + 1)
    del x, got
    assert not be._views, "a view kept its array alive"
