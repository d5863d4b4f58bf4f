"""Numba's cache of nwhisper's compiled kernels: where it is kept when the installed package cannot
be written, and how a kernel loads from it.

A wheel carries its kernels compiled at build (nwhisper/precompile.py), in the `__pycache__` beside
each module, where Numba looks first. Where that folder is read-only to the user running nwhisper
(a system-wide install), Numba would fall back to the user's cache folder and compile everything
again; the locator registered here copies a function's shipped files there first, so they load
instead. `NUMBA_CACHE_DIR`, when set, is left to mean exactly that folder: nothing is copied into it.
Wherever it is cached, a kernel loads without Numba first readying everything a compilation needs
(_load_overload): a third of a second of every command.

A parallel launcher is compiled in a helper process (ApartCompiler), never in the one that runs it,
which then loads it from the cache like every later process: a `prange` loop becomes a gufunc that
Numba optimises once in the process that compiles it and once more in the code it caches, and the
two can round a sum differently, so a first run and a second would otherwise differ in the last
bits of an encoder pass (and so, now and then, in a word). Where the cache cannot be written the
launcher compiles here, as before.

With an empty cache the process and its helper would take turns (the process waits for each
launcher while the helper idles through the process's own compiles), so at a process's first
miss the helper is also sent the functions a first transcription loads (FIRST, in the order it
loads them: `python -m nwhisper.kernels` records them) and compiles them ahead on the other
core: the parallel launchers in that order, then the rest from the last back, towards the
process compiling its own from the first (whichever comes second loads it from the cache);
whatever the process asks for meanwhile comes first. The process's exit stops the helper
wherever it is: what it still compiles then, this process did not need.

Imported by nwhisper/__init__.py before any module defines a cached function (Numba picks a
function's cache folder when the function is defined).
"""

import atexit
import inspect
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading

from numba.core import caching, cpu
from numba.core.runtime import rtsys

PACKAGE = os.path.dirname(os.path.abspath(__file__))


def _shipped_files(shipped, base):
    """The index and data files of one function in a `__pycache__`: {name: path}."""
    try:
        names = os.listdir(shipped)
    except OSError:
        return {}
    return {n: os.path.join(shipped, n) for n in names
            if n == base + ".nbi" or (n.startswith(base + ".") and n.endswith(".nbc"))}


def seed(shipped, cache, base):
    """Copy function `base`'s files from `shipped` into `cache` unless `cache` already holds an
    index at least as new. Data first, the index last and atomically: a process starting at the
    same time sees either no index or one whose data are all there."""
    files = _shipped_files(shipped, base)
    index = files.pop(base + ".nbi", None)
    if index is None:
        return False
    target = os.path.join(cache, base + ".nbi")
    try:
        if os.stat(target).st_mtime >= os.stat(index).st_mtime:
            return False
    except FileNotFoundError:
        pass
    for name, src in sorted(files.items()) + [(base + ".nbi", index)]:
        fd, tmp = tempfile.mkstemp(dir=cache, prefix=name + ".")
        try:
            with os.fdopen(fd, "wb") as out, open(src, "rb") as f:
                shutil.copyfileobj(f, out)
            os.replace(tmp, os.path.join(cache, name))
        except BaseException:
            os.unlink(tmp)
            raise
    return True


class SeededUserWideCacheLocator(caching.UserWideCacheLocator):
    """Numba's user-wide locator, which for a function of this package first copies in what the
    package's own `__pycache__` holds for it (Numba then checks the source's content hash, its own
    version and the CPU as for any cached function, and compiles anew if any differs)."""

    @classmethod
    def from_function(cls, py_func, py_file):
        self = super().from_function(py_func, py_file)
        if self is not None and os.path.abspath(py_file).startswith(PACKAGE + os.sep):
            module = os.path.splitext(os.path.basename(py_file))[0]
            base = "%s.%s-%s.py%d%d%s" % (module, py_func.__qualname__, self.get_disambiguator(),
                                         sys.version_info[0], sys.version_info[1],
                                         getattr(sys, "abiflags", ""))
            try:
                seed(os.path.join(os.path.dirname(py_file), "__pycache__"), self.get_cache_path(), base)
            except OSError:
                pass        # the function compiles as it would have without a shipped copy
        return self


def _load_overload(self, sig, target_context):
    """Numba's Cache.load_overload for nwhisper's CPU functions, without refreshing the target
    context first: that refresh imports and installs every typing and lowering registry (~0.3 s,
    a fifth of a cold command) so that code can be compiled; machine code loaded from the cache
    needs only Numba's runtime (NRT) in place, and a parallel launcher's thread pool, which its
    own reload hook starts. Any compilation still refreshes the context before it begins. A
    parallel launcher not in the cache is compiled by the ApartCompiler and then loaded."""
    if not (isinstance(target_context, cpu.CPUContext) and _ours(self._py_func)):
        return _numba_load_overload(self, sig, target_context)
    rtsys.initialize(target_context)
    if _asked is not None:
        _asked.append((_name(self._py_func), repr(tuple(sig))))
    with self._guard_against_spurious_io_errors():
        cres = self._load_overload(sig, target_context)
    if cres is None and _apart():
        helper = ApartCompiler.get()    # at the first miss: FIRST ahead of its turn
        if _compiled_apart(self._py_func) and helper.compile(self._py_func, sig):
            with self._guard_against_spurious_io_errors():
                cres = self._load_overload(sig, target_context)
    return cres


APART = "NWHISPER_COMPILE_APART"   # "0": compile every launcher in the process that runs it
LAUNCHERS = "nwhisper.kernels._launch_cpu"
# The cached functions a first `nwhisper transcribe` loads, in order: module:name<TAB>repr(types)
FIRST = os.path.join(PACKAGE, "kernels", "first_functions.txt")
_asked = None    # while recording(): the (module:name, repr(types)) of each function loaded


def _name(py_func):
    return f"{py_func.__module__}:{py_func.__qualname__}"


def _apart():
    """Whether launchers compile in a helper (not in the helper itself, nor where
    NWHISPER_COMPILE_APART=0)."""
    return os.environ.get(APART, "1") != "0"


def _compiled_apart(py_func):
    """Whether py_func is a parallel CPU launcher, compiled in the helper process where _apart()."""
    return py_func.__module__ == LAUNCHERS and not py_func.__name__.endswith("_serial") and _apart()


class recording:
    """`with recording() as asked:` this package's cached functions loaded meanwhile (from the
    cache or compiled), as FIRST lists them: [(module:name, repr(argument types))], each once, in
    the order loaded."""

    def __enter__(self):
        global _asked
        _asked = []
        return _asked

    def __exit__(self, *exc):
        global _asked
        _asked[:] = dict.fromkeys(_asked)
        _asked = None


def first_functions():
    """FIRST's lines as (module:name, repr(argument types)); none where it is missing."""
    try:
        with open(FIRST, encoding="utf-8") as f:
            return [tuple(line.rstrip("\n").split("\t")) for line in f if "\t" in line]
    except OSError:
        return []


IDLE_S = 30   # the helper leaves after this long without work (a server compiles only at first)
# The helper: compiles what it is sent into the cache: each ("want", launcher name, types) at
# once, answering whether it did; each ("ahead", module:name, repr(types)) when nothing is
# wanted, silently (one that no longer exists or no longer types is skipped)
_HELPER = f"""
import functools, importlib, os, pickle, select, sys
out = os.fdopen(os.dup(1), "wb")   # the answers; anything printed goes to stderr
os.dup2(2, 1)
sys.path.insert(0, sys.argv[1])
os.environ[{APART!r}] = "0"
from numba.core import types
from nwhisper.kernels import _launch_cpu as launchers, blas
blas.register_symbol()      # the GEMM loops' call into OpenBLAS links to it
inp = open(0, "rb", buffering=0, closefd=False)   # unbuffered: select() sees every message
wanted, ahead = [], []

def function(name):
    module, _, qualname = name.partition(":")
    return functools.reduce(getattr, qualname.split("."), importlib.import_module(module))

def read(timeout):
    if not select.select([inp], [], [], timeout)[0]:
        return False
    kind, name, sig = pickle.load(inp)     # EOFError: the process has gone
    (wanted if kind == "want" else ahead).append((name, sig))
    return True

try:
    while True:
        while read(0):
            pass
        if not (wanted or ahead or read({IDLE_S})):
            break
        if wanted:
            name, sig = wanted.pop(0)
            try:
                getattr(launchers, name).compile(sig)
                ok = True
            except Exception as e:
                print(f"nwhisper: compiling {{name}}{{sig}} apart failed: {{e}}", file=sys.stderr)
                ok = False
            pickle.dump(ok, out)
            out.flush()
        elif ahead:
            name, sig = ahead.pop(0)
            try:
                function(name).compile(eval(sig, dict(vars(types), bool=types.boolean)))
            except Exception:
                pass
except EOFError:
    pass
"""


class ApartCompiler:
    """One helper process per process, started at its first function missing from the cache
    (sent FIRST's functions to compile ahead) and kept while there is work (it imports Numba
    once; each compilation then costs what it would have cost here); it leaves after IDLE_S idle
    seconds, and the next miss starts another."""

    _one = None
    _lock = threading.Lock()

    @classmethod
    def get(cls):
        with cls._lock:
            if cls._one is None:
                cls._one = cls()
            elif cls._one.proc.poll() is not None:    # it left, idle
                cls._one._start()
            return cls._one

    def __init__(self):
        self._start()
        first = first_functions()
        parallel = [f for f in first if f[0].startswith(LAUNCHERS + ":") and not f[0].endswith("_serial")]
        rest = [f for f in first if f not in parallel]
        try:
            self._send([("ahead", name, sig) for name, sig in parallel + rest[::-1]])
        except OSError:
            pass        # it has gone already: compile() starts another
        atexit.register(self.close)

    def _start(self):
        self.proc = subprocess.Popen([sys.executable, "-c", _HELPER, os.path.dirname(PACKAGE)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def _send(self, messages):
        for m in messages:
            pickle.dump(m, self.proc.stdin)
        self.proc.stdin.flush()

    def compile(self, py_func, sig):
        """Whether the helper compiled launcher py_func for argument types `sig` (into the cache);
        asked once more of a new helper where this one had just left."""
        for _ in range(2):
            try:
                self._send([("want", py_func.__name__, tuple(sig))])
                return pickle.load(self.proc.stdout)
            except (OSError, EOFError, pickle.PickleError):
                self.proc.kill()
                self.proc.wait()
                self._start()
        return False

    def close(self):
        """At exit: every launcher this process wanted has been answered, so whatever the helper
        still compiles is ahead of any need (FIRST's rest, or a function this process compiled
        itself meanwhile): it is stopped, not awaited (a first command's exit waited up to 1.6 s
        for it). Numba writes a cache file under a temporary name and renames it: a compile cut
        short leaves nothing half-written."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _ours(py_func):
    return os.path.abspath(inspect.getfile(py_func)).startswith(PACKAGE + os.sep)


_numba_load_overload = caching.Cache.load_overload


def register():
    """Put the seeded locator in place of Numba's user-wide one, and the loader above in place
    of Numba's (once)."""
    classes = caching.CacheImpl._locator_classes
    if SeededUserWideCacheLocator not in classes:
        classes[classes.index(caching.UserWideCacheLocator)] = SeededUserWideCacheLocator
    caching.Cache.load_overload = _load_overload


register()
