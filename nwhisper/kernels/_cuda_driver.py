"""Launching compiled CUDA kernels for a fraction of what Numba's `kernel[grid, block](*args)` costs.

Numba's launch builds a configuration object, types every argument, and marshals each array
through several layers of Python: tens of microseconds of host time per launch, while a decoder
step's small kernels each run for a few microseconds on the GPU, so launching would be most of
a step.

`Launcher` remembers, per kernel and per argument types, the compiled function Numba chose, and
passes the arguments as Numba's own `_Kernel._prepare_args` lays them out: an array as meminfo,
parent, size, itemsize, data pointer, shape, strides in bytes; a scalar as a ctypes value of its
Numba type. The first call with new types goes through Numba (which compiles or loads the cache)
and is recorded. Whatever it does not know -- an argument other than a device array or a plain
scalar, a cooperative or launch-configuration-sensitive kernel, a numba-cuda without the
internals it reads (`launcher()` then returns the plain launch) -- takes Numba's normal path, as
the simulator always does.

`Launcher.capture(run)` records run()'s launches as a CUDA graph instead of running them, and
`replay(graph)` runs them all in one call (CudaBackend.replay: a decoder step). Every launch in
it must be one made before with the same argument types; any other raises Uncapturable.
"""

import ctypes
import warnings
import weakref

NUMBA = object()  # a cache entry meaning "launch these argument types through Numba"


class Uncapturable(Exception):
    """A launch during Launcher.capture that only Numba's own launch could make."""


def plain_launch(kernel, grid, block, *args):
    """Numba's own launch: what the simulator (which runs kernels in Python threads) needs."""
    kernel[grid, block](*args)


def launcher(simulator):
    """The backend's `launch(kernel, grid, block, *args)`: a Launcher on a GPU, the plain launch
    under the simulator or where this numba-cuda lacks what Launcher reads."""
    if simulator:
        return plain_launch
    try:
        return Launcher()
    except (ImportError, AttributeError):
        return plain_launch


def _ctype(ty):
    """The ctypes value Numba passes for a scalar of Numba type `ty` (None: passed as is)."""
    from numba.core import types
    if isinstance(ty, types.Integer):
        return getattr(ctypes, f"c_{ty}")
    return {types.float32: ctypes.c_float, types.float64: ctypes.c_double}.get(ty)


_PACKED = weakref.WeakKeyDictionary()   # an array's buffer and shape never change: packed once


def _array_args(a, flat):
    """Append device array `a` as Numba's kernel ABI spells an array argument."""
    packed = _PACKED.get(a)
    if packed is None:
        ptr = a.device_ctypes_pointer.value or 0
        packed = _PACKED[a] = (0, 0, a.size, a.dtype.itemsize, ptr) + tuple(a.shape) + tuple(a.strides)
    flat.extend(packed)


def _as_is(v, flat):
    flat.append(v)


class Launcher:
    """`launcher(kernel, grid, block, *args)`: kernel a numba.cuda dispatcher, args device arrays
    and scalars, on the default stream (as Numba's own launch), or into the graph being captured."""

    def __init__(self):
        from numba import typeof
        from numba.cuda.core.errors import NumbaPerformanceWarning
        from numba.core import types
        from numba.core.typing.typeof import Purpose
        from numba.cuda.cudadrv import driver
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
        from numba.cuda.dispatcher import LaunchConfig, launch
        self._launch, self._config = launch, LaunchConfig
        self._performance_warning = NumbaPerformanceWarning
        self._stream = driver._to_core_stream(0)
        self._target = self._stream  # where launches go: the stream, or a graph being built
        self._typeof = lambda v: typeof(v, Purpose.argument)
        self._array_type, self._boolean, self._device_array = types.Array, types.boolean, DeviceNDArray
        self._entries = {}   # (kernel, argument keys) -> (cuda.core kernel, packers) or NUMBA
        self._configs = {}   # (grid, block) -> LaunchConfig
        self._keys = weakref.WeakKeyDictionary()   # device array -> _key's value
        try:
            from cuda.core import Device
            self.can_capture = hasattr(Device, "create_graph_builder")
        except ImportError:   # a cuda.core from before graphs left its experimental namespace
            self.can_capture = False

    def _key(self, v):
        """What selects the compiled kernel for argument v: a device array's dtype, ndim and
        layout (plain values, kept while the array lives: hashing Numba's type objects was ~600 calls a
        decoder step), a scalar's Python type."""
        if isinstance(v, self._device_array):
            key = self._keys.get(v)
            if key is None:
                ty = v._numba_type_
                key = self._keys[v] = (v.dtype.str, ty.ndim, ty.layout)
            return key
        return type(v)

    def _entry(self, kernel, args):
        """Compile or load through Numba for these argument types; how to launch them after."""
        argtypes = tuple(self._typeof(a) for a in args)
        compiled = kernel.overloads.get(argtypes)
        if (compiled is None or kernel.targetoptions.get("extensions")
                or any(getattr(compiled, flag, False)
                       for flag in ("debug", "cooperative", "launch_config_sensitive"))):
            return NUMBA
        packers = []
        for a, ty in zip(args, argtypes):
            if isinstance(ty, self._array_type):
                if not isinstance(a, self._device_array):
                    return NUMBA  # a host array: Numba copies it over and back
                packers.append(_array_args)
            elif ty == self._boolean:
                packers.append(_as_is)
            elif _ctype(ty) is not None:
                packers.append(lambda v, flat, make=_ctype(ty): flat.append(make(v)))
            else:
                return NUMBA
        try:
            return compiled._codelibrary.get_cufunc().kernel, tuple(packers)
        except AttributeError:  # another numba-cuda's internals
            return NUMBA

    def __call__(self, kernel, grid, block, *args):
        key = (kernel,) + tuple(self._key(a) for a in args)
        entry = self._entries.get(key)
        if self._target is not self._stream and (entry is None or entry is NUMBA):
            raise Uncapturable(f"{getattr(kernel, '__name__', kernel)}: not launched before with these "
                               "argument types")
        if entry is NUMBA:
            kernel[grid, block](*args)
            return
        if entry is None:
            with warnings.catch_warnings():
                # Numba warns of grids under 128 blocks; a decoder step's are small by design
                warnings.filterwarnings("ignore", "Grid size", self._performance_warning)
                kernel[grid, block](*args)   # compiles or loads the kernel
            self._entries[key] = self._entry(kernel, args)
            return
        function, packers = entry
        flat = []
        for pack, a in zip(packers, args):
            pack(a, flat)
        config = self._configs.get((grid, block))
        if config is None:
            config = self._configs[(grid, block)] = self._config(grid=grid, block=block)
        self._launch(self._target, config, function, *flat)

    def capture(self, run):
        """(run()'s result, a graph of its launches): run() with every launch recorded instead of
        made. The graph is built on a stream of its own (the legacy default stream, where the
        launches otherwise go, cannot be captured) and replayed on the default stream, ordered
        with Numba's copies as the launches were. Raises Uncapturable (nothing recorded is kept)
        when a launch cannot be recorded, and ImportError where cuda.core has no graphs."""
        from cuda.core import Device
        from numba import cuda
        device = Device()
        device.set_current()   # the primary context, which Numba has made current already
        builder = device.create_graph_builder()
        # No frees while capturing (cuMemFree waits for the device, which a capture forbids);
        # allocating is allowed in the relaxed mode (CudaBackend.replay drops such a graph).
        with cuda.defer_cleanup():
            builder.begin_building("relaxed")
            self._target = builder
            try:
                result = run()
            finally:
                self._target = self._stream
                builder.end_building()
        return result, builder.complete()

    def replay(self, graph):
        """Run a graph from capture() on the default stream."""
        graph.launch(self._stream)
