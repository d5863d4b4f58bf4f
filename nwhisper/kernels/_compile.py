"""One kernel source, two backends: the machinery that compiles a body for the CPU and for CUDA.

A *body* is a plain module-level Python function that does ONE work item, given its index and its
arrays (``def layernorm_row(i, x, w, b, out, n, eps)``). ``@kernel`` registers it; nothing else is
written per kernel. Each body gets a thin launcher:

    CPU   numba.njit(inline='always') body, inlined into
          @njit(cache=True) def name_range(lo, hi, spread, chunks, *args):
              for i in [lo, hi): body(i, *args),
          which a launch too small to share out calls for [0, count) (a parallel region costs a
          few µs when quiet, ~50 where the workers sleep between launches: backend.CpuBackend,
          and milliseconds when another process holds a core: its workers wait at the barrier
          for a descheduled thread); every other launch gives it the address of the one parallel
          loop all launches share, which runs it again on one block of [0, count) per thread
          (trampoline.py)
    CUDA  cuda.jit(device=True) body, called from
          @cuda.jit(cache=True) def name(count, *args): i = cuda.grid(1); if i < count: body(i, *args)

Why generated source files rather than a factory: Numba's on-disk cache misses launchers made by a
closure in every new process (1-2 s per launcher and signature), while module-level ``cache=True``
launchers calling module-level bodies load from the cache (measured with numba 0.68: the second
process ran a layernorm in 0.7 s, imports included). So the launchers are written out as real modules, ``_launch_cpu.py`` and
``_launch_cuda.py``, by ``python -m nwhisper.kernels``, and committed.

A cached launcher has its body compiled into it, and Numba keys that cache on the launcher's own
file only: an edited body would keep running its old code. Each generated file therefore records
a digest of the bodies' sources; ``launchers()`` refuses a stale file (rewriting it would write
into the installed package at run time), and a test keeps the committed files fresh.

The CUDA launchers are imported only when a CUDA backend asks for them: the CPU path never imports
``numba.cuda``. Under the simulator ``cuda`` must be a module-level global of the module that
defines a kernel, which the generated file satisfies.
"""

import hashlib
import importlib
import inspect
import linecache
import os
import types

# Modules of nwhisper.kernels that hold bodies, in the order their launchers are written.
BODY_MODULES = ("norm", "activation", "reduce", "pick", "elementwise", "conv", "matmul", "attention", "spectral", "vad_ops", "speaker_ops")
# Modules whose functions bodies call: compiled into the launchers too, so part of the digest.
HELPER_MODULES = ("widen", "vecmath")

# CPU: float reassociation lets Numba vectorise the reductions; no 'nnan'/'ninf', because
# attention masks and decoding rules use -inf. NumPy's error model: a division gives inf or nan
# instead of testing its divisor to raise ZeroDivisionError (Python's model, @njit's default),
# a branch per division that keeps LLVM from vectorising any loop that divides (prange's loops
# are compiled under NumPy's model anyway). CUDA: exact IEEE (its fastmath flushes
# denormals and approximates division). Numba's cache does not key on these flags: after a change
# here, delete the kernels' cached objects (__pycache__/*.nbi, *.nbc) or set NUMBA_CACHE_DIR anew.
CPU_JIT = "cache=True, error_model='numpy', fastmath={'arcp', 'contract', 'nsz', 'reassoc'}"
# Every CPU body is inlined into its range function in Numba's IR, so that it is one function,
# compiled the same way whether this process compiles it or loads it from Numba's cache. A body
# compiled on its own and linked in rounds its reassociated sums one way when the launcher is
# compiled in the same process and another when the launcher comes from the cache (layernorm,
# attend_row, Silero's cells: the first run after an install then transcribed a long int8
# recording differently from every later run); and a big body (linear_elem, vectorised) costs
# a call per work item, every array passed field by field.
# The parallel loop does no arithmetic of its own: it calls the range function's compiled code
# by address, so a launch's floats are the same on one thread or many, and wherever the code
# was compiled (a prange loop holding the body would be a gufunc that Numba optimises in a
# library of its own and again linked into the launcher: a process that compiled it and one
# that loaded it from the cache rounded exp_row by up to 3e-5 apart).
# A body writes a float's maximum or minimum as a conditional expression (`zero if v < zero else
# v`: the builtins' own result, NaN and -0.0 included), never max() or min(): inlined this way
# into a range function, the builtins keep LLVM from vectorising the loop around them (numba
# 0.68: GELU over 2048 floats 6.1 µs against 1.0).
CPU_BODY_JIT = "inline='always', error_model='numpy', fastmath={'arcp', 'contract', 'nsz', 'reassoc'}"
CUDA_DEVICE_JIT = "device=True"
CUDA_KERNEL_JIT = "cache=True"

_BODIES = {}  # name -> body function


def kernel(body):
    """Register `body` (one work item: ``body(i, *args)``) for both backends; returns it unchanged."""
    name = body.__name__
    if name in _BODIES and _BODIES[name].__module__ != body.__module__:
        raise ValueError(f"two kernel bodies are named {name!r}: "
                         f"{_BODIES[name].__module__} and {body.__module__}")
    _BODIES[name] = body
    return body


def bodies():
    """All registered bodies, {name: function}, in BODY_MODULES and source order."""
    for mod in BODY_MODULES:
        importlib.import_module(f"nwhisper.kernels.{mod}")

    def place(item):
        body = item[1]
        return BODY_MODULES.index(body.__module__.rsplit(".", 1)[1]), body.__code__.co_firstlineno
    return dict(sorted(_BODIES.items(), key=place))


def digest(found):
    """Hash of the bodies' sources and the compile options: it changes when any launcher must."""
    h = hashlib.sha256()
    h.update(f"{CPU_JIT}|{CPU_BODY_JIT}|{CUDA_DEVICE_JIT}|{CUDA_KERNEL_JIT}".encode())
    for mod in HELPER_MODULES + ("trampoline",):
        h.update(inspect.getsource(importlib.import_module(f"nwhisper.kernels.{mod}")).encode())
    for name, body in found.items():
        h.update(f"{body.__module__}.{name}\n".encode())
        h.update(_text(body).encode())
    return h.hexdigest()[:16]


def _text(fn):
    """A function's source, its decorators included, cut from its file at the lines its code
    records (inspect.getsource finds the same lines by tokenising the module: ~17 ms of every
    process that checks its launchers)."""
    code = fn.__code__
    last = max(line for c in _codes(code) for _, _, line in c.co_lines() if line is not None)
    return "".join(linecache.getlines(code.co_filename)[code.co_firstlineno - 1:last])


def _codes(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def for_cuda(body):
    """`body` with the helpers it calls bound to their CUDA forms (each helper module's
    CUDA_FORMS: the CPU forms are overloads with bit casts, vecmath.py and widen.py say why)."""
    forms = {}
    for mod in HELPER_MODULES:
        forms.update(importlib.import_module(f"nwhisper.kernels.{mod}").CUDA_FORMS)
    used = {name: form for name, form in forms.items() if name in body.__code__.co_names}
    if not used:
        return body
    f = types.FunctionType(body.__code__, dict(body.__globals__, **used), body.__name__,
                           body.__defaults__, body.__closure__)
    f.__module__, f.__qualname__, f.__doc__ = body.__module__, body.__qualname__, body.__doc__
    return f


def _params(body):
    names = list(inspect.signature(body).parameters)
    return names[1:]  # the first parameter is the work-item index


def source(target):
    """Text of the generated launcher module for `target` ('cpu' or 'cuda')."""
    found = bodies()
    if target == "cpu":
        doc = ("CPU launchers: `name_range(lo, hi, spread, chunks, ...)` runs body(i, ...) for i "
               "in [lo, hi): in this\nthread where spread is 0, else shared out in `chunks` "
               "blocks by the parallel loop at address\n`spread` (kernels/trampoline.py). "
               "Their own names start with _ (no body's parameter does).")
        head = ["from numba import njit", "",
                "from nwhisper.kernels.trampoline import NoAlias, nonneg, shared"]
    elif target == "cuda":
        doc = ("CUDA launchers: `i = cuda.grid(1); if i < count: body(i, ...)`, one per kernel "
               "body.\nImported only by the CUDA backend; `cuda` is a module global so that the "
               "simulator can swap it.")
        head = ["from numba import cuda", "", "from nwhisper.kernels._compile import for_cuda"]
    else:
        raise ValueError(f"unknown target {target!r}: expected 'cpu' or 'cuda'")
    lines = [f'"""{doc}\n\nGENERATED by `python -m nwhisper.kernels` from the bodies in '
             f'nwhisper/kernels/ -- do not edit.\n"""',
             f"# bodies digest: {digest(found)}", ""]
    lines += head
    # The bodies are imported by name from their modules: `from nwhisper.kernels import attention`
    # would give the op that the package re-exports under that name, not the module.
    lines += [f"from {body.__module__} import {name} as {name}_body" for name, body in found.items()]
    for name, body in found.items():
        args = ", ".join(_params(body))
        lines += ["", ""]
        if target == "cpu":
            lines += [f"_{name} = njit({CPU_BODY_JIT})({name}_body)", "", "",
                      f"@njit(pipeline_class=NoAlias, {CPU_JIT})",
                      f"def {name}_range(_lo, _hi, _spread, _chunks, {args}):",
                      "    if _spread:",
                      "        shared(_spread, _chunks, _lo, _hi)",
                      "        return",
                      "    _lo = nonneg(_lo)",
                      "    for _j in range(_hi - _lo):",
                      f"        _{name}(_lo + _j, {args})"]
        else:
            lines += [f"_{name} = cuda.jit({CUDA_DEVICE_JIT})(for_cuda({name}_body))", "", "",
                      f"@cuda.jit({CUDA_KERNEL_JIT})",
                      f"def {name}(count, {args}):",
                      "    i = cuda.grid(1)",
                      "    if i < count:",
                      f"        _{name}(i, {args})"]
    return "\n".join(lines) + "\n"


def path(target):
    return os.path.join(os.path.dirname(__file__), f"_launch_{target}.py")


def is_fresh(target):
    """Whether the generated launcher file for `target` matches the current bodies."""
    try:
        with open(path(target), encoding="utf-8") as f:
            return f.read() == source(target)
    except FileNotFoundError:
        return False


def write(target):
    with open(path(target), "w", encoding="utf-8") as f:
        f.write(source(target))


def launchers(target):
    """The launcher module for `target`. Nothing under the package is written at run time (an
    install may be read-only, and two processes may start at once): a file that no longer
    matches the bodies is refused, naming the command that writes it."""
    if not is_fresh(target):
        raise RuntimeError(f"{path(target)} does not match the kernel bodies (a body was edited): "
                           "run `python -m nwhisper.kernels` in the checkout to write it again")
    return importlib.import_module(f"nwhisper.kernels._launch_{target}")
