"""kernels/_cuda_launch.py's argument layout against numba-cuda's own, without a GPU.

The Launcher passes a kernel's arguments the way numba-cuda's `_Kernel._prepare_args` lays them
out. Both run here on device arrays whose memory is a stand-in (an address, no allocation: no
driver is needed to describe an array), and must produce the same values of the same types.
The launch itself (cuda.core's `launch`) is replaced by a recorder; on a GPU,
bench/gpu_session.sh runs every op through the real one against the CPU.
"""

import ctypes

import numpy as np
import pytest

pytest.importorskip("numba_cuda", reason="numba-cuda is not installed (the [cuda] extra)")

from numba import typeof  # noqa: E402
from numba.core.typing.typeof import Purpose  # noqa: E402
from numba.cuda.cudadrv.devicearray import DeviceNDArray  # noqa: E402
from numba.cuda.dispatcher import _Kernel  # noqa: E402

from nwhisper.kernels import _cuda_launch  # noqa: E402


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
    launcher = _cuda_launch.Launcher()
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
    launcher = _cuda_launch.Launcher()
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
    launcher = _cuda_launch.Launcher()
    monkeypatch.setattr(launcher, "_launch", lambda *a: pytest.fail("launched past Numba"))
    plain, cooperative = _Dispatcher(), _CooperativeDispatcher()
    for _ in range(3):
        # a host array (Numba copies it over and back) and a float16 scalar
        launcher(plain, 1, 32, np.zeros(4, np.float32), np.float16(1.0))
        launcher(cooperative, 1, 32, device_array((4,), np.float32))
    assert plain.numba_launches == 3 and cooperative.numba_launches == 3
